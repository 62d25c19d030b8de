// A checkpoint's metadata.json read as `troupe eval`, `train --load` and `troupe ckpt` read it: the
// bounded parser (parse_checkpoint_metadata), then from a checkpoint directory holding it
// (read_checkpoint_meta, and sharded_checkpoint_files, which checks the shard files it names: they
// are absent here, so that must fail cleanly).
#include <filesystem>

#include "fuzz/fuzz_targets.hpp"
#include "fuzz/fuzz_util.hpp"
#include "storage/checkpoint.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe::fuzz {

Status checkpoint_metadata(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = parse_checkpoint_metadata(text, "metadata.json");
  if (parsed) {
    TROUPE_CHECK(parsed->shards.size() == parsed->digests.size() && !parsed->shards.empty(),
                 "shard list");
    for (const std::string& name : parsed->shards)
      TROUPE_CHECK(name.find('/') == std::string::npos && name.rfind("shard_", 0) == 0,
                   "shard name");
    // A snapshot's lists of the shards each rank reads: one per shard or none, ascending, in range.
    TROUPE_CHECK(parsed->reads.empty() || parsed->reads.size() == parsed->shards.size(), "reads count");
    for (const std::vector<int>& list : parsed->reads)
      for (size_t k = 0; k < list.size(); ++k)
        TROUPE_CHECK(list[k] >= 0 && static_cast<size_t>(list[k]) < parsed->shards.size() &&
                         (k == 0 || list[k] > list[k - 1]),
                     "a read shard out of range or order");
  }
  // The same bytes in a checkpoint directory (iteration 4: other claims are refused there).
  const int64_t iteration = 4;
  const std::string dir = scratch_dir() + "/ck";
  std::error_code ec;
  std::filesystem::create_directories(iteration_dir(dir, iteration), ec);
  write_scratch("ck/latest_checkpointed_iteration.txt", "4\n");
  write_scratch("ck/iter_0000004/metadata.json", text);
  auto meta = read_checkpoint_meta(dir, iteration);
  TROUPE_CHECK(!parsed || meta.is_ok() == (parsed->meta.iteration == iteration),
               "two readings disagree");
  auto files = sharded_checkpoint_files(dir, iteration);
  TROUPE_CHECK(!files || files->empty(), "shard files that do not exist were accepted");
  if (parsed && !parsed->shards.empty()) {  // a rank's own files: absent too
    const int world = static_cast<int>(parsed->shards.size());
    auto own = shards_read_by(dir, iteration, world - 1, world);
    TROUPE_CHECK(!own || !own->has_value() || (*own)->empty(), "a rank's shard files that do not exist were accepted");
  }
  return parsed ? Status::ok() : parsed.status();
}

}  // namespace troupe::fuzz
