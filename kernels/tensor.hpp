// Tensor: a shape, a dtype, a device tag and shared storage. Contiguous row-major only; views share the
// storage of the tensor they come from (a byte offset plus a shape). Copying a Tensor copies the
// handle, not the data (use clone()).
//
// Thread safety: a Tensor handle is a value; the storage it points to is not synchronised. Whoever owns
// a tensor decides who may write it (in troupe, the rank actor that holds it).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "troupe/check.hpp"

namespace troupe {

// f32 is the compute type (f64 for the gradient checks); bf16/f16 are storage types: the CPU ops widen
// them to f32 and round results back (kernels/half.hpp, docs/PRECISION.md).
enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u16, u8 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType t);
// bf16 or f16: the storage types of mixed precision (every op computes them in f32).
inline bool is_16bit(DType t) { return t == DType::bf16 || t == DType::f16; }
const char* dtype_name(DType t);
const char* device_name(Device d);

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::u16; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }

class Shape {
 public:
  static constexpr int kMaxRank = 6;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  template <class It> Shape(It begin, It end) {
    for (; begin != end; ++begin) push_back(*begin);
  }
  int rank() const { return rank_; }
  int64_t operator[](int i) const {
    TROUPE_CHECK(i >= 0 && i < rank_, "shape index out of range");
    return dims_[i];
  }
  int64_t numel() const;
  void push_back(int64_t d);
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }
  bool operator==(const Shape& o) const;
  std::string str() const;  // "(3, 7, 12)"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// Owns one allocation. CPU memory is 64-byte aligned.
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::cpu;
  std::shared_ptr<void> owner;  // frees `data` when the last reference goes (or keeps a mapping alive)
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor; defined() is false
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  // Wraps memory someone else owns; `owner` keeps it alive (may be null when the caller guarantees it).
  static Tensor wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                     Device device = Device::cpu);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + shape_.rank() : i]; }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const { return static_cast<char*>(storage_->data) + offset_; }
  // The start of the whole allocation (views start at raw(); device allocators key blocks by this).
  void* storage_data() const { return storage_ ? storage_->data : nullptr; }
  // Host access to the elements: a device tensor's are not addressable here (to_host() first).
  template <class T> T* data() const {
    TROUPE_CHECK(dtype_ == dtype_of<T>(), "tensor dtype does not match the requested element type");
    TROUPE_CHECK(device() == Device::cpu,
                 "host code read a GPU tensor's elements: copy it with to_host() first (a bug in troupe)");
    return static_cast<T*>(raw());
  }

  // Same storage, new shape with the same number of elements.
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) along dimension 0, sharing storage.
  Tensor rows(int64_t begin, int64_t end) const;
  // Device tensors (Device::cuda): empty, zeros, clone, zero_ and copy_from work on the calling
  // thread's current GPU and stream (kernels/device_memory.hpp: DeviceScope), asynchronously on it,
  // except that a copy to or from host memory waits for the stream (the host may read or reuse its
  // buffer at once). Failures (no GPU, out of memory) throw DeviceError with the message to show.
  Tensor clone() const;
  void zero_() const;
  void copy_from(const Tensor& src) const;  // same shape and dtype; any devices
  // A new CPU tensor of the given dtype: any of f32, f64, bf16, f16 into any of them, narrowing with
  // one round-to-nearest-even (kernels/half.hpp's rules); the same dtype gives a host copy. A device
  // tensor is copied to the host first.
  Tensor to(DType dtype) const;
  // This tensor on `device`: itself when it is there already, else a copy.
  Tensor on(Device device) const;
  Tensor to_host() const { return on(Device::cpu); }
  bool shares_storage(const Tensor& o) const { return storage_ == o.storage_; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  DType dtype_ = DType::f32;
};

}  // namespace troupe
