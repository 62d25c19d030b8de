// model.safetensors.index.json, the weight map of a sharded Hugging Face folder
// (parse_safetensors_index, storage/hf_import.hpp): what it accepts names only plain .safetensors
// files inside the folder.
#include "fuzz/fuzz_targets.hpp"
#include "storage/hf_import.hpp"

namespace troupe::fuzz {

Status hf_index(const uint8_t* data, size_t size) {
  auto map = parse_safetensors_index(std::string_view(reinterpret_cast<const char*>(data), size), "index: ");
  if (!map) return map.status();
  TROUPE_CHECK(!map->empty(), "an accepted weight map names a tensor");
  for (const auto& [name, file] : *map)
    TROUPE_CHECK(!file.empty() && file.find('/') == std::string::npos && file[0] != '.' &&
                     file.size() > 12 && file.compare(file.size() - 12, 12, ".safetensors") == 0,
                 "an accepted file name stays inside the folder");
  return Status::ok();
}

}  // namespace troupe::fuzz
