// One checkpoint file (a shard of format version 2 or 3, or a version-1 single-file checkpoint)
// read the way every load reads it: the integrity header, then -- with the whole-file check
// bypassed, as a crafted file carrying a matching checksum would pass it -- the bounded HDF5 parser
// (storage/h5_reader.hpp), the index of every section (names, global shapes, run tables), then
// every tensor whole and in two halves, checksums included. Allocations are bounded by the file:
// a tensor's global shape must be covered by the file's pieces before anything is read.
#include <vector>

#include "fuzz/fuzz_targets.hpp"
#include "storage/h5_reader.hpp"
#include "storage/shard_file.hpp"

namespace troupe::fuzz {

Status checkpoint_shard(const uint8_t* data, size_t size) {
  auto bytes = h5read::memory_source(std::string(reinterpret_cast<const char*>(data), size));
  // As loads open it: the header's checksum first (random damage stops here).
  auto checked = ShardSetReader::open({ShardSource{"shard.h5", bytes}});
  // And as a crafted file with a matching checksum would get past that check.
  auto reader = ShardSetReader::open({ShardSource{"shard.h5", bytes}}, ShardReadOptions{false});
  if (!reader) return reader.status();
  Status result = checked ? Status::ok() : checked.status();
  for (ShardSection section :
       {ShardSection::model, ShardSection::exp_avg, ShardSection::exp_avg_sq}) {
    for (const auto& [name, shape] : (*reader)->tensors(section)) {
      const int64_t n = shape.numel();
      Tensor whole = Tensor::empty({n});
      Status st = (*reader)->read(section, name, shape, {{0, n}}, whole);
      if (st && n > 1) {
        Tensor halves = Tensor::empty({n});
        st = (*reader)->read(section, name, shape, {{n / 2, n - n / 2}, {0, n / 2}}, halves);
        TROUPE_CHECK(!st || std::equal(whole.data<float>(), whole.data<float>() + n / 2,
                                       halves.data<float>() + (n - n / 2)),
                     "two reads of one tensor disagree");
      }
      if (!st && result) result = st;
    }
  }
  return result;
}

}  // namespace troupe::fuzz
