#include "storage/byte_level_bpe.hpp"

namespace troupe {

std::array<int32_t, 256> bytes_to_unicode() {
  std::array<int32_t, 256> map{};
  int32_t n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? b : 256 + n++;
  }
  return map;
}

}  // namespace troupe
