// Shape arithmetic and printing.
#include "core/shape.h"

#include "core/error.h"

namespace dtrain {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

int64_t Shape::operator[](int i) const {
  if (i < 0) i += rank_;
  DTRAIN_CHECK(i >= 0 && i < rank_, "dim {} out of range for shape {}", i, str());
  return dims_[static_cast<size_t>(i)];
}

int64_t& Shape::operator[](int i) {
  if (i < 0) i += rank_;
  DTRAIN_CHECK(i >= 0 && i < rank_, "dim {} out of range for shape {}", i, str());
  return dims_[static_cast<size_t>(i)];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

void Shape::push_back(int64_t d) {
  DTRAIN_CHECK(rank_ < kMaxDims, "shape has more than {} dims", kMaxDims);
  DTRAIN_CHECK(d >= 0, "negative dim {}", d);
  dims_[static_cast<size_t>(rank_++)] = d;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i)
    s += (i ? ", " : "") + std::to_string(dims_[static_cast<size_t>(i)]);
  return s + "]";
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i) {
    if (dims_[static_cast<size_t>(i)] != o.dims_[static_cast<size_t>(i)]) return false;
  }
  return true;
}

}  // namespace dtrain
