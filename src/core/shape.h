// A tensor shape: up to 8 dims of int64, row-major (last dim contiguous).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace dtrain {

class Shape {
 public:
  static constexpr int kMaxDims = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  template <typename It>
  Shape(It first, It last) {
    for (; first != last; ++first) push_back(static_cast<int64_t>(*first));
  }

  int rank() const { return rank_; }
  int64_t operator[](int i) const;  // negative i counts from the end
  int64_t& operator[](int i);
  int64_t numel() const;
  void push_back(int64_t d);
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }
  std::string str() const;  // "[2, 3, 4]"
  bool operator==(const Shape& o) const;

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

}  // namespace dtrain
