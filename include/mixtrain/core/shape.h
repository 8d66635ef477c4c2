// Shape: the dimensions of a tensor (its strides live in the Tensor).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace mixtrain {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  // Negative indices count from the end, as in NumPy.
  int64_t operator[](int i) const { return dims_[i < 0 ? i + rank() : i]; }
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  std::string to_string() const;  // "(2, 3)"

  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }

 private:
  std::vector<int64_t> dims_;
};

std::ostream& operator<<(std::ostream& os, const Shape& s);

}  // namespace mixtrain
