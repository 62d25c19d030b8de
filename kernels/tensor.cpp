#include "kernels/tensor.hpp"

#include <new>

#include <cstdlib>
#include <cstring>

#include "kernels/device_memory.hpp"
#include "kernels/half.hpp"

namespace troupe {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u16: return "u16";
    case DType::u8: return "u8";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

void Shape::push_back(int64_t d) {
  TROUPE_CHECK(rank_ < kMaxRank, "tensors have at most 6 dimensions");
  TROUPE_CHECK(d >= 0, "a dimension cannot be negative");
  dims_[rank_++] = d;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + ")";
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  if (device == Device::cuda) {
    const DevicePlacement at = current_placement();
    auto t = device_empty(shape, dtype, at.device, at.stream);
    if (!t.is_ok()) throw DeviceError(t.status().message());
    return t.value();
  }
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  // Out of memory is a failure at run time, not a broken invariant: the caller (an actor, the CLI)
  // reports it and exits 1.
  if (p == nullptr) throw std::bad_alloc();
  Tensor t;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->data = p;
  t.storage_->bytes = bytes;
  t.storage_->device = device;
  t.storage_->owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                    Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->data = data;
  t.storage_->bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  t.storage_->device = device;
  t.storage_->owner = std::move(owner);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  TROUPE_CHECK(shape.numel() == numel(), "view must keep the number of elements");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  TROUPE_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "row range out of bounds");
  Tensor t = *this;
  int64_t row_elems = dim(0) == 0 ? 0 : numel() / dim(0);
  t.offset_ += static_cast<size_t>(begin * row_elems) * dtype_size(dtype_);
  Shape s;
  s.push_back(end - begin);
  for (int i = 1; i < rank(); ++i) s.push_back(dim(i));
  t.shape_ = s;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

void Tensor::zero_() const {
  if (device() == Device::cuda) {
    device_zero(*this, current_placement().stream);
    return;
  }
  if (nbytes()) std::memset(raw(), 0, nbytes());
}

void Tensor::copy_from(const Tensor& src) const {
  TROUPE_CHECK(src.shape() == shape_ && src.dtype() == dtype_, "copy_from needs equal shape and dtype");
  if (device() == Device::cuda || src.device() == Device::cuda) {
    device_copy(*this, src, current_placement().stream);
    return;
  }
  if (nbytes()) std::memmove(raw(), src.raw(), nbytes());
}

Tensor Tensor::on(Device device) const {
  if (this->device() == device) return *this;
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (device() != Device::cpu) {
    const Tensor host = to_host();  // already the copy the same dtype asks for
    return dtype == dtype_ ? host : host.to(dtype);
  }
  if (dtype == dtype_) return clone();
  TROUPE_CHECK(half::is_float_dtype(dtype_) && half::is_float_dtype(dtype),
               "Tensor::to converts between f32, f64, bf16 and f16 only");
  Tensor t = empty(shape_, dtype, Device::cpu);
  half::convert_array(dtype, t.raw(), dtype_, raw(), numel());
  return t;
}

}  // namespace troupe
