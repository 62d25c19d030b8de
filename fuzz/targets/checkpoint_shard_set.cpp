// The shard files of one checkpoint read together, as every rank of a resumed job reads them: up to
// four files, each "u32 length (little-endian), then that many bytes" (the last one takes what is
// left when its length runs past the end). Seeds are the four shards of a tensor 2 x data 2 ZeRO-1
// checkpoint (format versions 2 and 3). The whole-file check is bypassed (see
// checkpoint_shard.cpp); every tensor of every section is read whole, and the model's in
// tensor-parallel halves (the resharding reads of another layout).
#include <cstring>
#include <vector>

#include "fuzz/fuzz_targets.hpp"
#include "storage/h5_reader.hpp"
#include "storage/shard_file.hpp"

namespace troupe::fuzz {

Status checkpoint_shard_set(const uint8_t* data, size_t size) {
  std::vector<ShardSource> files;
  size_t at = 0;
  while (at < size && files.size() < 4) {
    uint32_t n = 0;
    if (size - at >= 4) std::memcpy(&n, data + at, 4);
    at += std::min<size_t>(4, size - at);
    const size_t take = std::min<size_t>(n, size - at);
    files.push_back(
        {"shard_0000" + std::to_string(files.size()) + ".h5",
         h5read::memory_source(std::string(reinterpret_cast<const char*>(data) + at, take))});
    at += take;
  }
  auto reader = ShardSetReader::open(files, ShardReadOptions{false});
  if (!reader) return reader.status();
  Status result;
  for (ShardSection section :
       {ShardSection::model, ShardSection::exp_avg, ShardSection::exp_avg_sq}) {
    for (const auto& [name, shape] : (*reader)->tensors(section)) {
      const int64_t n = shape.numel();
      Tensor whole = Tensor::empty({n});
      Status st = (*reader)->read(section, name, shape, {{0, n}}, whole);
      if (st && section == ShardSection::model && shape.rank() == 2 && shape[1] > 1) {
        // The right half of every row: one run per row, as a column split reads it.
        const int64_t rows = shape[0], cols = shape[1], half = cols / 2;
        std::vector<GlobalRun> runs;
        for (int64_t r = 0; r < rows; ++r) runs.push_back({r * cols + half, cols - half});
        Tensor right = Tensor::empty({rows * (cols - half)});
        st = (*reader)->read(section, name, shape, runs, right);
        for (int64_t r = 0; st && r < rows; ++r)
          TROUPE_CHECK(std::memcmp(right.data<float>() + r * (cols - half),
                                   whole.data<float>() + r * cols + half,
                                   sizeof(float) * static_cast<size_t>(cols - half)) == 0,
                       "a column read disagrees with the whole tensor");
      }
      if (!st && result) result = st;
    }
  }
  return result;
}

}  // namespace troupe::fuzz
