#include "storage/tensor_dump.hpp"

#include "storage/durable.hpp"
#include "storage/h5_file.hpp"

namespace troupe {

Status write_tensor_h5(const std::string& path, const std::string& name, const Shape& shape, const float* data,
                       const std::map<std::string, std::string>& text_attrs,
                       const std::map<std::string, int64_t>& int_attrs) {
  h5::ErrorScope quiet;
  auto write = [&]() -> Status {
    Result<h5::MemoryFile> f = h5::MemoryFile::create(path);
    if (!f) return f.status();
    const hid_t root = f->get();
    TROUPE_RETURN_IF_ERROR(h5::write_f32_dataset(root, name, shape, data));
    for (const auto& [key, value] : text_attrs) TROUPE_RETURN_IF_ERROR(h5::write_attr(root, key, value));
    for (const auto& [key, value] : int_attrs) TROUPE_RETURN_IF_ERROR(h5::write_attr(root, key, value));
    Result<h5::MemoryFile::Image> image = f->finish();
    if (!image) return image.status();
    return write_file_atomically(path, {{image->data.get(), image->size}});
  };
  return write().with_context("writing " + path + ": ");
}

}  // namespace troupe
