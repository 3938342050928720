// Tensor: a shared handle to Storage + Shape + DType + byte offset. Always
// contiguous row-major; views differ only by offset and shape. A tensor never
// copies between devices behind your back: data<T>() is host memory only.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

namespace dtrain {

// A block of device memory; frees itself through its allocator (if it owns it).
class Storage {
 public:
  Storage(Allocator& alloc, size_t bytes);
  Storage(void* external, size_t bytes, Device device);  // non-owning
  // Host memory mapped by map_held_pages (core/allocator.h), unmapped when freed.
  Storage(size_t bytes, ByteRanges held, Unheld rest = Unheld::absent);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Allocator* alloc_ = nullptr;  // null: external memory, not freed here (or held pages)
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  ByteRanges held_;  // held pages: the ranges backed (empty otherwise)
  bool mapped_ = false;
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised memory from `alloc` (default: the host caching allocator).
  static Tensor empty(const Shape& shape, DType dtype, Allocator* alloc = nullptr);
  // Shape and dtype without memory (defined() is false, raw() throws): what the
  // executor hands an op's backward for a value the op did not ask to keep.
  static Tensor meta(const Shape& shape, DType dtype);
  // Wraps memory owned elsewhere (a flat buffer, a workspace, a test array).
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device = Device::cpu());
  // Host memory of which only the element ranges `held` ([begin, end)) exist, zeros;
  // touching any other element faults, or with Unheld::zeros reads 0 and faults on a
  // write, committing nothing (core/allocator.h, map_held_pages).
  static Tensor held_pages(const Shape& shape, DType dtype,
                           const std::vector<std::pair<int64_t, int64_t>>& held,
                           Unheld rest = Unheld::absent);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return shape_.rank(); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  size_t offset_bytes() const { return offset_; }

  // A view of `shape.numel()` elements starting `elem_offset` elements in.
  Tensor view(int64_t elem_offset, const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;  // same numel, same memory

  void* raw() const;
  template <typename T>
  T* data() const {
    DTRAIN_CHECK(dtype_of<T>() == dtype_, "tensor is {}, accessed as {}", dtype_name(dtype_),
                 dtype_name(dtype_of<T>()));
    DTRAIN_CHECK(device().is_cpu(), "host access to a {} tensor", device().str());
    return static_cast<T*>(raw());
  }
  std::string str() const;  // "f32[2, 3] cpu"

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::f32;
  size_t offset_ = 0;
};

}  // namespace dtrain
