// The safetensors format (Hugging Face's model.safetensors), read within bounds and written.
//
//   bytes 0..7      N, little-endian uint64: the length of the header
//   bytes 8..8+N    the header, UTF-8 JSON: {"NAME": {"dtype": "F32", "shape": [d0, d1, ...],
//                   "data_offsets": [BEGIN, END]}, ..., "__metadata__": {"format": "pt"}}, which
//                   may end in spaces (writers pad it so the buffer starts at a multiple of 8)
//   bytes 8+N..     the buffer: each tensor's values at [BEGIN, END) of it, row-major, little-endian
//
// What a reader accepts (the rules of the reference implementation, safetensors' `validate`):
// N at least 2 and at most the file's length - 8 and kMaxSafetensorsHeaderBytes; a header that
// starts with '{' and is one JSON object (no key twice); every entry an object with exactly those
// three keys, a known dtype, at most kMaxSafetensorsRank non-negative dimensions whose product
// times the element size is END - BEGIN (no overflow); the tensors, ordered by BEGIN, tiling the
// buffer from 0 to its end with neither a gap nor an overlap; "__metadata__" (optional) an object
// of strings. Every problem found is listed in one message naming the file and the tensor. Nothing
// is allocated beyond the header's length (itself bounded by the file's) until a tensor is read,
// and a tensor's bytes lie inside the file by the tiling rule.
//
// troupe reads F32, F16 and BF16 (converted to float32 exactly: every F16 and BF16 value is a
// float32 value); other dtypes are named in the error. It writes F32 only.
//
// Thread safety: the functions hold no state; a SafetensorsHeader is immutable once read.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/tensor.hpp"
#include "storage/h5_reader.hpp"
#include "troupe/status.hpp"

namespace troupe {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;  // safetensors' own limit
inline constexpr size_t kMaxSafetensorsRank = Shape::kMaxRank;

enum class SafetensorsDtype : uint8_t { f32, f16, bf16 };

struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::f32;
  Shape shape;         // [] is a scalar (one element)
  uint64_t begin = 0;  // [begin, end) of the buffer
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t buffer_offset = 0;                 // 8 + N: where the buffer starts in the file
  std::vector<SafetensorsTensor> tensors;     // ordered by begin
  std::map<std::string, std::string> metadata;  // "__metadata__"
  // The tensor of that name, or nullptr.
  const SafetensorsTensor* find(const std::string& name) const;
};

// The header JSON (N bytes) of a file whose buffer holds buffer_bytes bytes. `where` starts every
// message ("model.safetensors: ").
Result<SafetensorsHeader> parse_safetensors_header(std::string_view header_json, uint64_t buffer_bytes,
                                                   const std::string& where);
// The length prefix and header of `file`, checked as above.
Result<SafetensorsHeader> read_safetensors_header(const h5read::ByteSource& file, const std::string& where);
// Tensor `t` of `file` into `out`: host f32, numel equal to t's. F16/BF16 are converted.
Status read_safetensors_tensor(const h5read::ByteSource& file, const SafetensorsHeader& header,
                               const SafetensorsTensor& t, const Tensor& out, const std::string& where);

// A float32 tensor to write; `data` holds shape.numel() values and outlives the call.
struct SafetensorsInput {
  std::string name;
  Shape shape;
  const float* data = nullptr;
};
// The file's first bytes for these tensors, in this order, laid out back to back: the length
// prefix and the header padded with spaces to a multiple of 8.
std::string safetensors_prefix(const std::vector<SafetensorsInput>& tensors,
                               const std::map<std::string, std::string>& metadata);
// Writes the file durably (storage/durable.hpp: PATH.tmp, fsync, rename). Names must be unique
// and not "__metadata__" (TROUPE_CHECK: a caller's bug).
Status write_safetensors(const std::string& path, const std::vector<SafetensorsInput>& tensors,
                         const std::map<std::string, std::string>& metadata);

// The float32 value of IEEE half and bfloat16 bits (exact).
float f16_to_f32(uint16_t bits);
float bf16_to_f32(uint16_t bits);

}  // namespace troupe
