// Storage lifetime and tensor views.
#include "core/tensor.h"

namespace dtrain {

Storage::Storage(Allocator& alloc, size_t bytes)
    : alloc_(&alloc), data_(alloc.allocate(bytes)), bytes_(bytes), device_(alloc.device()) {}

Storage::Storage(void* external, size_t bytes, Device device)
    : data_(external), bytes_(bytes), device_(device) {}

Storage::Storage(size_t bytes, ByteRanges held, Unheld rest)
    : data_(map_held_pages(bytes, held, rest)),
      bytes_(bytes),
      device_(Device::cpu()),
      held_(std::move(held)),
      mapped_(true) {}

Storage::~Storage() {
  if (alloc_ != nullptr) alloc_->deallocate(data_, bytes_);
  if (mapped_) unmap_held_pages(data_, bytes_, held_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator* alloc) {
  Tensor t;
  Allocator& a = alloc ? *alloc : host_allocator();
  t.storage_ = std::make_shared<Storage>(a, static_cast<size_t>(shape.numel()) * dtype_size(dtype));
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(
      data, static_cast<size_t>(shape.numel()) * dtype_size(dtype), device);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::held_pages(const Shape& shape, DType dtype,
                          const std::vector<std::pair<int64_t, int64_t>>& held, Unheld rest) {
  const size_t esize = dtype_size(dtype);
  ByteRanges bytes;
  for (const auto& [a, b] : held) {
    DTRAIN_CHECK(0 <= a && a <= b && b <= shape.numel(), "held elements [{}, {}) of {}", a, b,
                 shape.numel());
    bytes.emplace_back(static_cast<size_t>(a) * esize, static_cast<size_t>(b) * esize);
  }
  Tensor t;
  t.storage_ =
      std::make_shared<Storage>(static_cast<size_t>(shape.numel()) * esize, std::move(bytes), rest);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::meta(const Shape& shape, DType dtype) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::view(int64_t elem_offset, const Shape& shape) const {
  DTRAIN_CHECK(defined(), "view of an undefined tensor");
  const size_t esize = dtype_size(dtype_);
  const size_t begin = offset_ + static_cast<size_t>(elem_offset) * esize;
  const size_t bytes = static_cast<size_t>(shape.numel()) * esize;
  DTRAIN_CHECK(elem_offset >= 0 && begin + bytes <= storage_->bytes(),
               "view [{}, +{}) out of storage of {} bytes", begin, bytes, storage_->bytes());
  Tensor t = *this;
  t.shape_ = shape;
  t.offset_ = begin;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  DTRAIN_CHECK(shape.numel() == numel(), "reshape {} to {}", shape_.str(), shape.str());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

void* Tensor::raw() const {
  DTRAIN_CHECK(defined(), "data of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_;
}

std::string Tensor::str() const {
  return fmt::format("{}{} {}", dtype_name(dtype_), shape_.str(), device().str());
}

}  // namespace dtrain
