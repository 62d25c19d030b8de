// ByteLevelTokenizer: one id per byte, 256 = end-of-document.
#include <memory>

#include "storage/tokenizer.hpp"

namespace troupe {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEod = 256;

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }

  // EOD decodes to nothing: it marks a boundary, not text.
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < 256) {
        out.push_back(static_cast<char>(id));
      } else if (id != kEod) {
        out += "\xEF\xBF\xBD";  // U+FFFD
      }
    }
    return out;
  }

  int64_t vocab_size() const override { return 257; }
  int32_t eod() const override { return kEod; }
  std::string name() const override { return "ByteLevelTokenizer"; }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() {
  return std::make_unique<ByteTokenizer>();
}

}  // namespace troupe
