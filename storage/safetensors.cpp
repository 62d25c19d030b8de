#include "storage/safetensors.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "storage/durable.hpp"
#include "storage/json_input.hpp"

namespace troupe {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors buffers are little-endian and troupe copies them as they are");

using nlohmann::json;

// The dtypes of safetensors' Dtype enum (its names in headers), with their element sizes; troupe
// reads the first three.
struct DtypeName {
  const char* name;
  uint64_t bytes;
};
constexpr DtypeName kDtypes[] = {{"F32", 4},  {"F16", 2},  {"BF16", 2}, {"F64", 8},    {"I64", 8},
                                 {"I32", 4},  {"I16", 2},  {"I8", 1},   {"U8", 1},     {"U16", 2},
                                 {"U32", 4},  {"U64", 8},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};


// One entry of the header; problems are appended (prefixed by the entry's name).
void parse_entry(const std::string& name, const json& v, SafetensorsTensor& t, std::vector<std::string>& problems) {
  const std::string at = "tensor '" + name + "': ";
  if (!v.is_object()) {
    problems.push_back(at + "is " + json_excerpt(v) + ", not an object with dtype, shape and data_offsets");
    return;
  }
  for (const auto& [key, ignored] : v.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      problems.push_back(at + "unknown key \"" + key + "\" (an entry holds dtype, shape and data_offsets)");
  const size_t before = problems.size();
  uint64_t size = 0;
  auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string()) {
    problems.push_back(at + "no dtype string");
  } else {
    const std::string d = dtype->get<std::string>();
    const auto* known = std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const DtypeName& k) { return d == k.name; });
    if (known == std::end(kDtypes))
      problems.push_back(at + "unknown dtype \"" + d + "\"");
    else if (d != "F32" && d != "F16" && d != "BF16")
      problems.push_back(at + "dtype " + d + " is not supported -- troupe reads F32, F16 and BF16 weights; convert the "
                              "model to one of them");
    else
      t.dtype = d == "F32" ? SafetensorsDtype::f32 : d == "F16" ? SafetensorsDtype::f16 : SafetensorsDtype::bf16;
    size = known == std::end(kDtypes) ? 1 : known->bytes;
  }
  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array() || shape->size() > kMaxSafetensorsRank) {
    problems.push_back(at + "shape must be an array of at most " + std::to_string(kMaxSafetensorsRank) + " sizes");
  } else {
    for (const json& d : *shape) {
      int64_t n = 0;
      if (!json_to_integer(d, 0, std::numeric_limits<int64_t>::max(), &n)) {
        problems.push_back(at + "shape " + json_excerpt(*shape) + " holds a size that is not a non-negative integer");
        break;
      }
      if (n != 0 && size > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(n)) {
        problems.push_back(at + "shape " + json_excerpt(*shape) + " holds more bytes than any file");
        break;
      }
      size *= static_cast<uint64_t>(n);
      t.shape.push_back(n);
    }
  }
  auto offsets = v.find("data_offsets");
  uint64_t se[2] = {0, 0};
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
      !json_to_unsigned((*offsets)[0], std::numeric_limits<uint64_t>::max(), &se[0]) ||
      !json_to_unsigned((*offsets)[1], std::numeric_limits<uint64_t>::max(), &se[1]) || se[1] < se[0]) {
    problems.push_back(at + "data_offsets must be [BEGIN, END] with 0 <= BEGIN <= END");
  } else {
    t.begin = se[0];
    t.end = se[1];
  }
  if (problems.size() == before && t.end - t.begin != size)
    problems.push_back(fmt::format("{}data_offsets [{}, {}] hold {} bytes, but shape {} of {} takes {}", at, t.begin,
                                   t.end, t.end - t.begin, json_excerpt(*shape), dtype->get<std::string>(), size));
}

std::string fail_text(const std::string& where, const std::vector<std::string>& problems) {
  std::string m = where + "not a valid safetensors file:";
  for (const std::string& p : problems) m += "\n  " + p;
  return m + "\n(write it again with save_pretrained or safetensors.torch.save_file)";
}

}  // namespace

const SafetensorsTensor* SafetensorsHeader::find(const std::string& name) const {
  for (const SafetensorsTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Result<SafetensorsHeader> parse_safetensors_header(std::string_view header_json, uint64_t buffer_bytes,
                                                   const std::string& where) {
  if (header_json.empty() || header_json.front() != '{')
    return Status::bad_input(where + "the header does not start with '{' -- not a safetensors file");
  JsonParseOptions options;
  options.reject_duplicate_keys = true;  // a name twice would leave one tensor's bytes unread
  Result<json> parsed = parse_json(header_json, "", options);
  if (!parsed) return Status::bad_input(where + "the header is not valid JSON: " + parsed.status().message());
  const json& j = parsed.value();
  if (!j.is_object()) return Status::bad_input(where + "the header is not a JSON object");
  SafetensorsHeader out;
  out.buffer_offset = 8 + header_json.size();
  std::vector<std::string> problems;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) {
        problems.push_back("__metadata__ must be an object of strings");
        continue;
      }
      for (const auto& [k, s] : v.items()) {
        if (s.is_string())
          out.metadata[k] = s.get<std::string>();
        else
          problems.push_back("__metadata__ key \"" + k + "\" is not a string");
      }
      continue;
    }
    SafetensorsTensor t;
    t.name = name;
    parse_entry(name, v, t, problems);
    out.tensors.push_back(std::move(t));
  }
  if (problems.empty()) {
    std::stable_sort(out.tensors.begin(), out.tensors.end(),
                     [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
                       return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                     });
    uint64_t next = 0;
    for (const SafetensorsTensor& t : out.tensors) {
      if (t.begin < next)
        problems.push_back(fmt::format("tensor '{}': data_offsets [{}, {}] overlap the tensor before it (which ends at {})",
                                       t.name, t.begin, t.end, next));
      else if (t.begin > next)
        problems.push_back(fmt::format("tensor '{}': data_offsets [{}, {}] leave bytes {} to {} of the buffer to no tensor",
                                       t.name, t.begin, t.end, next, t.begin));
      next = std::max(next, t.end);
    }
    if (next != buffer_bytes)
      problems.push_back(fmt::format("the tensors cover {} bytes of the buffer but it holds {} (the file is {})", next,
                                     buffer_bytes, next > buffer_bytes ? "truncated" : "longer than its header says"));
  }
  if (!problems.empty()) return Status::bad_input(fail_text(where, problems));
  return out;
}

Result<SafetensorsHeader> read_safetensors_header(const h5read::ByteSource& file, const std::string& where) {
  const uint64_t size = file.size();
  if (size < 8)
    return Status::bad_input(where + fmt::format("{} bytes, too short for a safetensors file (8-byte length first)", size));
  unsigned char prefix[8];
  TROUPE_RETURN_IF_ERROR(file.read(0, prefix, sizeof prefix).with_context(where));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  if (n < 2 || n > size - 8 || n > kMaxSafetensorsHeaderBytes)
    return Status::bad_input(where + fmt::format("the header length {} is {} -- not a safetensors file, or a damaged one", n,
                                                 n < 2 ? "too small" : n > size - 8 ? fmt::format("beyond the file ({} bytes)", size)
                                                                     : "beyond safetensors' 100 MB limit"));
  std::string header(n, '\0');
  TROUPE_RETURN_IF_ERROR(file.read(8, header.data(), n).with_context(where));
  return parse_safetensors_header(header, size - 8 - n, where);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, NaN (payload kept)
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // 127 - 15 = 112
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: mantissa * 2^-24, exact in float32
    const float v = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(bits);
}

float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

Status read_safetensors_tensor(const h5read::ByteSource& file, const SafetensorsHeader& header,
                               const SafetensorsTensor& t, const Tensor& out, const std::string& where) {
  TROUPE_CHECK(out.dtype() == DType::f32 && out.numel() == t.shape.numel(),
               "read_safetensors_tensor: the caller sizes `out` from the tensor's shape");
  const uint64_t at = header.buffer_offset + t.begin;
  const std::string context = where + "tensor '" + t.name + "': ";
  float* dst = out.data<float>();
  if (t.dtype == SafetensorsDtype::f32) return file.read(at, dst, t.end - t.begin).with_context(context);
  // Half-width values: read in blocks, widened in place.
  constexpr uint64_t kBlock = 1 << 20;
  std::vector<uint16_t> half(std::min<uint64_t>(kBlock, static_cast<uint64_t>(out.numel())));
  const uint64_t count = static_cast<uint64_t>(out.numel());
  for (uint64_t i = 0; i < count; i += kBlock) {
    const uint64_t n = std::min(kBlock, count - i);
    TROUPE_RETURN_IF_ERROR(file.read(at + 2 * i, half.data(), 2 * n).with_context(context));
    for (uint64_t k = 0; k < n; ++k)
      dst[i + k] = t.dtype == SafetensorsDtype::f16 ? f16_to_f32(half[k]) : bf16_to_f32(half[k]);
  }
  return Status::ok();
}

std::string safetensors_prefix(const std::vector<SafetensorsInput>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const SafetensorsInput& t : tensors) {
    TROUPE_CHECK(t.name != "__metadata__" && names.insert(t.name).second,
                 "write_safetensors: tensor names are unique and not __metadata__");
    const uint64_t bytes = static_cast<uint64_t>(t.shape.numel()) * sizeof(float);
    header[t.name] = {{"dtype", "F32"},
                      {"shape", std::vector<int64_t>(t.shape.begin(), t.shape.end())},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the buffer starts 8-aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  return out + text;
}

Status write_safetensors(const std::string& path, const std::vector<SafetensorsInput>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  const std::string prefix = safetensors_prefix(tensors, metadata);
  std::vector<ConstBytes> pieces = {{prefix.data(), prefix.size()}};
  for (const SafetensorsInput& t : tensors)
    pieces.push_back({t.data, static_cast<size_t>(t.shape.numel()) * sizeof(float)});
  return write_file_atomically(path, pieces);
}

}  // namespace troupe
