// One tensor in an HDF5 file (troupe inspect's `dump NAME FILE.h5`): a root dataset named `name`
// (little-endian f32, its CRC-32 as for checkpoints), with string and integer attributes on the
// root (what it is, after which iteration). h5py reads it: h5py.File(FILE)[name][...]. Written to
// FILE.tmp and renamed, as every troupe file.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "kernels/tensor.hpp"
#include "troupe/status.hpp"

namespace troupe {

Status write_tensor_h5(const std::string& path, const std::string& name, const Shape& shape, const float* data,
                       const std::map<std::string, std::string>& text_attrs,
                       const std::map<std::string, int64_t>& int_attrs);

}  // namespace troupe
