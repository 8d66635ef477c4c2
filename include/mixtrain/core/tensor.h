// Tensor: a contiguous, row-major block of elements with a shape, a dtype and a device tag.
// Copies share storage (like a PyTorch tensor or a NumPy view); clone() copies the data.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/shape.h"

namespace mixtrain {

// Owns one allocation from the counting allocator.
class Storage {
 public:
  explicit Storage(size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor; defined() is false

  static Tensor empty(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype);
  static Tensor full(const Shape& shape, DType dtype, float value);
  // Rounds each value into dtype.
  static Tensor from_floats(const Shape& shape, const std::vector<float>& values, DType dtype = DType::kFloat32);
  static Tensor from_ints(const Shape& shape, const std::vector<int32_t>& values);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  const char* device() const { return "cpu"; }

  void* raw() { return storage_ ? storage_->data() : nullptr; }
  const void* raw() const { return storage_ ? storage_->data() : nullptr; }
  // Typed access; throws when T is not this tensor's storage type.
  template <typename T>
  T* data() {
    check_type(dtype_of<T>());
    return static_cast<T*>(raw());
  }
  template <typename T>
  const T* data() const {
    check_type(dtype_of<T>());
    return static_cast<const T*>(raw());
  }

  // A tensor sharing this storage with another shape of the same element count.
  Tensor reshape(const Shape& shape) const;
  Tensor clone() const;
  // Converts to dtype (rounding to nearest even); returns *this (shared) when the dtype already matches.
  Tensor to(DType dtype) const;
  // Copies rows [begin, end) of the first dimension.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Copies the rows listed in indices (first dimension), in that order.
  Tensor gather_rows(const std::vector<int64_t>& indices) const;
  // The same rows converted to dtype while copying, with no intermediate copy in this tensor's dtype
  // (a float16 model's batch never exists in float32).
  Tensor gather_rows(const std::vector<int64_t>& indices, DType dtype) const;

  std::vector<float> to_floats() const;
  std::vector<int32_t> to_ints() const;
  float item() const;  // the value of a one-element tensor
  // Element i (flat index) as float.
  float at(int64_t i) const;

  std::string describe() const;  // "float16 (32, 10)"

 private:
  void check_type(DType requested) const;

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::kFloat32;
};

// Converts count elements between any two dtypes (floats round to nearest even; ints truncate toward zero).
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count);

}  // namespace mixtrain
