#include "mixtrain/core/tensor.h"

#include <cmath>
#include <cstring>

#include "mixtrain/core/allocator.h"

namespace mixtrain {

Storage::Storage(size_t bytes) : data_(allocate_bytes(bytes)), bytes_(bytes) {}
Storage::~Storage() { free_bytes(data_, bytes_); }

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape.dims())
    MIXTRAIN_CHECK(d >= 0, "tensor shape " << shape << " has a negative dimension");
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes());
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw(), 0, t.nbytes());  // all-zero bits are 0 in every dtype
  return t;
}

Tensor Tensor::full(const Shape& shape, DType dtype, float value) {
  Tensor f = empty(shape, DType::kFloat32);
  float* p = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i) p[i] = value;
  return f.to(dtype);
}

Tensor Tensor::from_floats(const Shape& shape, const std::vector<float>& values, DType dtype) {
  MIXTRAIN_CHECK(static_cast<int64_t>(values.size()) == shape.numel(),
                 "from_floats: " << values.size() << " values for shape " << shape);
  Tensor t = empty(shape, dtype);
  convert_elements(values.data(), DType::kFloat32, t.raw(), dtype, shape.numel());
  return t;
}

Tensor Tensor::from_ints(const Shape& shape, const std::vector<int32_t>& values) {
  MIXTRAIN_CHECK(static_cast<int64_t>(values.size()) == shape.numel(),
                 "from_ints: " << values.size() << " values for shape " << shape);
  Tensor t = empty(shape, DType::kInt32);
  std::memcpy(t.raw(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  MIXTRAIN_CHECK(shape.numel() == numel(), "reshape: cannot view " << describe() << " as " << shape);
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  if (nbytes()) std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor t = empty(shape_, dtype);
  convert_elements(raw(), dtype_, t.raw(), dtype, numel());
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MIXTRAIN_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0),
                 "slice_rows: rows [" << begin << ", " << end << ") out of range for " << describe());
  std::vector<int64_t> dims = shape_.dims();
  dims[0] = end - begin;
  Tensor t = empty(Shape(dims), dtype_);
  const size_t row_bytes = dim(0) ? nbytes() / static_cast<size_t>(dim(0)) : 0;
  if (t.nbytes()) std::memcpy(t.raw(), static_cast<const char*>(raw()) + begin * row_bytes, t.nbytes());
  return t;
}

Tensor Tensor::gather_rows(const std::vector<int64_t>& indices) const { return gather_rows(indices, dtype_); }

Tensor Tensor::gather_rows(const std::vector<int64_t>& indices, DType dtype) const {
  MIXTRAIN_CHECK(rank() >= 1, "gather_rows: " << describe() << " has no rows");
  std::vector<int64_t> dims = shape_.dims();
  dims[0] = static_cast<int64_t>(indices.size());
  Tensor t = empty(Shape(dims), dtype);
  const int64_t row_elems = dim(0) ? numel() / dim(0) : 0;
  const size_t src_row_bytes = static_cast<size_t>(row_elems) * dtype_size(dtype_);
  const size_t dst_row_bytes = static_cast<size_t>(row_elems) * dtype_size(dtype);
  char* dst = static_cast<char*>(t.raw());
  const char* src = static_cast<const char*>(raw());
  for (size_t i = 0; i < indices.size(); ++i) {
    MIXTRAIN_CHECK(indices[i] >= 0 && indices[i] < dim(0), "gather_rows: row " << indices[i] << " out of range");
    convert_elements(src + indices[i] * src_row_bytes, dtype_, dst + i * dst_row_bytes, dtype, row_elems);
  }
  return t;
}

std::vector<float> Tensor::to_floats() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  convert_elements(raw(), dtype_, v.data(), DType::kFloat32, numel());
  return v;
}

std::vector<int32_t> Tensor::to_ints() const {
  std::vector<int32_t> v(static_cast<size_t>(numel()));
  convert_elements(raw(), dtype_, v.data(), DType::kInt32, numel());
  return v;
}

float Tensor::item() const {
  MIXTRAIN_CHECK(numel() == 1, "item: " << describe() << " does not hold exactly one element");
  return at(0);
}

float Tensor::at(int64_t i) const {
  MIXTRAIN_CHECK(i >= 0 && i < numel(), "at: index " << i << " out of range for " << describe());
  float v;
  convert_elements(static_cast<const char*>(raw()) + i * dtype_size(dtype_), dtype_, &v, DType::kFloat32, 1);
  return v;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + " " + shape_.to_string();
}

void Tensor::check_type(DType requested) const {
  MIXTRAIN_CHECK(defined(), "data access on an undefined tensor");
  MIXTRAIN_CHECK(requested == dtype_, "tensor is " << describe() << " but was read as " << dtype_name(requested));
}

namespace {
template <typename S>
float load_as_float(const S& s) {
  if constexpr (std::is_same_v<S, float16> || std::is_same_v<S, bfloat16>)
    return to_float(s);
  else
    return static_cast<float>(s);
}

template <typename D>
D store_from_float(float f) {
  if constexpr (std::is_same_v<D, float16> || std::is_same_v<D, bfloat16> || std::is_same_v<D, float>)
    return from_float<D>(f);
  else
    return static_cast<D>(std::isfinite(f) ? f : 0.0f);
}

template <typename S, typename D>
void convert_typed(const S* src, D* dst, int64_t n) {
  if constexpr (std::is_same_v<S, int32_t> && std::is_same_v<D, int32_t>) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(D));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = store_from_float<D>(load_as_float(src[i]));
  }
}

template <typename Fn>
void dispatch_any(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat16: return fn(float16{});
    case DType::kBFloat16: return fn(bfloat16{});
    case DType::kInt32: return fn(int32_t{});
    case DType::kUInt8: return fn(uint8_t{});
  }
}
}  // namespace

namespace detail {
void half_to_float_f16c(const uint16_t* src, float* dst, int64_t n);
void float_to_half_f16c(const float* src, uint16_t* dst, int64_t n);
void bf16_to_float_avx512(const uint16_t* src, float* dst, int64_t n);
void float_to_bf16_avx512(const float* src, uint16_t* dst, int64_t n);
}  // namespace detail

namespace {
// F16C (and the AVX state it needs) is checked once; the scalar code serves everywhere else.
bool have_f16c() {
  static const bool ok = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
  return ok;
}
bool have_avx512f() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}
}  // namespace

void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count) {
  if (count == 0) return;
  if (src_dtype == DType::kFloat16 && dst_dtype == DType::kFloat32 && have_f16c()) {
    detail::half_to_float_f16c(static_cast<const uint16_t*>(src), static_cast<float*>(dst), count);
    return;
  }
  if (src_dtype == DType::kFloat32 && dst_dtype == DType::kFloat16 && have_f16c()) {
    detail::float_to_half_f16c(static_cast<const float*>(src), static_cast<uint16_t*>(dst), count);
    return;
  }
  if (src_dtype == DType::kBFloat16 && dst_dtype == DType::kFloat32 && have_avx512f()) {
    detail::bf16_to_float_avx512(static_cast<const uint16_t*>(src), static_cast<float*>(dst), count);
    return;
  }
  if (src_dtype == DType::kFloat32 && dst_dtype == DType::kBFloat16 && have_avx512f()) {
    detail::float_to_bf16_avx512(static_cast<const float*>(src), static_cast<uint16_t*>(dst), count);
    return;
  }
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, static_cast<size_t>(count) * dtype_size(src_dtype));
    return;
  }
  dispatch_any(src_dtype, [&](auto s) {
    using S = decltype(s);
    dispatch_any(dst_dtype, [&](auto d) {
      using D = decltype(d);
      convert_typed(static_cast<const S*>(src), static_cast<D*>(dst), count);
    });
  });
}

}  // namespace mixtrain
