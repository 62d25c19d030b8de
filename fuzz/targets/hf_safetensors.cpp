// A model.safetensors file read as `troupe ckpt import --format hf` and `train --load HF_FOLDER` read
// it: the length prefix and header (storage/safetensors.hpp), then every tensor. Allocations are
// bounded by the file: an accepted header's tensors tile the buffer, so no tensor is larger than it.
#include "fuzz/fuzz_targets.hpp"
#include "storage/safetensors.hpp"

namespace troupe::fuzz {

Status hf_safetensors(const uint8_t* data, size_t size) {
  auto bytes = h5read::memory_source(std::string(reinterpret_cast<const char*>(data), size));
  auto header = read_safetensors_header(*bytes, "model.safetensors: ");
  if (!header) return header.status();
  uint64_t covered = 0;
  for (const SafetensorsTensor& t : header->tensors) {
    TROUPE_CHECK(t.begin == covered && t.end >= t.begin, "accepted tensors tile the buffer");
    covered = t.end;
    Tensor out = Tensor::empty(t.shape);
    TROUPE_CHECK(static_cast<uint64_t>(out.numel()) * (t.dtype == SafetensorsDtype::f32 ? 4 : 2) == t.end - t.begin,
                 "an accepted tensor's bytes match its shape");
    TROUPE_RETURN_IF_ERROR(read_safetensors_tensor(*bytes, *header, t, out, "model.safetensors: "));
  }
  TROUPE_CHECK(header->buffer_offset + covered == size, "accepted tensors cover the file");
  return Status::ok();
}

}  // namespace troupe::fuzz
