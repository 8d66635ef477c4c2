// Tensor: an N-dimensional view (rank up to kMaxRank) of elements of one dtype in a device's storage.
// A tensor is a shape, per-dimension strides (in elements) and an offset into shared storage, so
// reshape, transpose, permute and slice are views that copy nothing (as PyTorch's tensors and NumPy's
// arrays). Copies of a Tensor share storage; clone() and contiguous() copy the data.
// Kernels read dense row-major memory: typed access (data<T>()) demands a contiguous tensor, and an op
// that receives a view calls contiguous() first.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/device.h"
#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/shape.h"

namespace mixtrain {

constexpr int kMaxRank = 8;

// Owns one allocation from its device's allocator.
class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() { return data_; }
  size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor; defined() is false

  // Fresh contiguous tensors. The device defaults to the CPU.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype);
  static Tensor full(const Shape& shape, DType dtype, float value);
  // Rounds each value into dtype.
  static Tensor from_floats(const Shape& shape, const std::vector<float>& values, DType dtype = DType::kFloat32);
  static Tensor from_ints(const Shape& shape, const std::vector<int32_t>& values);
  static Tensor from_int64s(const Shape& shape, const std::vector<int64_t>& values);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  // Negative i counts from the end.
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  // Bytes of the elements this tensor shows (not of its storage).
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  // Element strides per dimension and the offset of element 0, both in elements.
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  // Row-major and dense: the layout every kernel reads.
  bool is_contiguous() const;
  // Whether two tensors show the same storage (views of one another or copies of one handle).
  bool shares_storage(const Tensor& other) const { return storage_ && storage_ == other.storage_; }
  // Whether both begin at the same element of the same storage (what comparing raw() says, without addressing
  // memory that may be a device's).
  bool starts_with(const Tensor& other) const { return shares_storage(other) && offset_ == other.offset_; }

  // Address of element 0 (the offset applied).
  void* raw();
  const void* raw() const;
  // Typed access to a contiguous tensor; throws when T is not this tensor's dtype or the tensor is a
  // non-contiguous view (call contiguous() first).
  template <typename T>
  T* data() {
    check_access(dtype_of<T>());
    return static_cast<T*>(raw());
  }
  template <typename T>
  const T* data() const {
    check_access(dtype_of<T>());
    return static_cast<const T*>(raw());
  }

  // ---- Views (no copy) ----
  // Another shape of the same element count; one dimension may be -1 (inferred). A view when this
  // tensor is contiguous, else a contiguous copy first (as torch.reshape).
  Tensor reshape(const Shape& shape) const;
  // Swaps two dimensions (negative indices count from the end).
  Tensor transpose(int d0, int d1) const;
  // Reorders the dimensions: result dimension i is this tensor's dims[i].
  Tensor permute(const std::vector<int>& dims) const;
  // Elements [begin, end) of dimension dim.
  Tensor slice(int dim, int64_t begin, int64_t end) const;
  // This tensor when contiguous, else a dense row-major copy.
  Tensor contiguous() const;

  // ---- Copies ----
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
  // Writes src (same shape, any dtype, converted) into the elements this tensor shows, which may be a view.
  // Both in host memory, or both on one device whose backend installed a copy (register_device_copy); between
  // devices, ops::to_device copies.
  void copy_from(const Tensor& src);

  std::vector<float> to_floats() const;
  std::vector<int32_t> to_ints() const;
  std::vector<int64_t> to_int64s() const;
  float item() const;  // the value of a one-element tensor
  // Element i (flat row-major index over this tensor's shape) as float.
  float at(int64_t i) const;

  std::string describe() const;  // "float16 (32, 10)", with " on cuda:0" off the CPU

 private:
  void check_access(DType requested) const;
  // Copies the elements of this contiguous host tensor to dst.
  void copy_out(void* dst) const;
  // Storage offset (elements) of the element with flat row-major index i.
  int64_t storage_index(int64_t i) const;

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  std::vector<int64_t> strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::kFloat32;
};

// Row-major strides of a dense tensor of this shape.
std::vector<int64_t> contiguous_strides(const Shape& shape);

// Converts count elements between any two dtypes (floats round to nearest even; ints truncate toward zero).
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count);

// A device backend's copy between two tensors of the same shape on one of its devices, any strides, converting
// between the floating dtypes as convert_elements does (and copying any dtype to itself). Installed once when the
// backend loads (null uninstalls); Tensor::copy_from, and so contiguous(), clone() and to(), call it for tensors
// on such a device, so code above core converts and compacts device tensors as it does host ones.
using DeviceCopyFn = void (*)(const Tensor& src, Tensor& dst);
void register_device_copy(DeviceType type, DeviceCopyFn fn);

// For tests' emulated devices (tests/train/emulated_device.h): a hook that raw() and data<T>() run whenever host
// code takes the address of a non-CPU tensor's memory, so a test can flag a host read of device memory that a GPU
// would not allow. Null (the default): no hook, and no cost beyond the check.
using DeviceMemoryAccessHook = void (*)(const Tensor& t);
void set_device_memory_access_hook(DeviceMemoryAccessHook hook);

}  // namespace mixtrain
