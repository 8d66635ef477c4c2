#include "mixtrain/core/tensor.h"

#include <array>
#include <atomic>
#include <cmath>
#include <cstring>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/isa_level.h"

namespace mixtrain {

Storage::Storage(size_t bytes, Device device)
    : data_(allocator_for(device).allocate(device.index, bytes)), bytes_(bytes), device_(device) {}
Storage::~Storage() { allocator_for(device_).deallocate(device_.index, data_, bytes_); }

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(static_cast<size_t>(shape.rank()));
  int64_t s = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    strides[static_cast<size_t>(i)] = s;
    s *= shape[i];
  }
  return strides;
}

namespace {
int normalize_dim(int d, int rank, const char* op) {
  const int n = d < 0 ? d + rank : d;
  MIXTRAIN_CHECK(n >= 0 && n < rank, op << ": dimension " << d << " out of range for rank " << rank);
  return n;
}

void require_cpu(const Tensor& t, const char* what) {
  MIXTRAIN_CHECK(t.device().is_cpu(), what << ": " << t.describe() << " is not in host memory; copy it to the cpu first");
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  MIXTRAIN_CHECK(shape.rank() <= kMaxRank, "tensor shape " << shape << " has rank " << shape.rank()
                                                             << "; at most " << kMaxRank << " dimensions are supported");
  int64_t count = 1;
  for (int64_t d : shape.dims()) {
    MIXTRAIN_CHECK(d >= 0, "tensor shape " << shape << " has a negative dimension");
    MIXTRAIN_CHECK(!__builtin_mul_overflow(count, d, &count), "tensor shape " << shape << " has too many elements");
  }
  int64_t bytes = 0;
  MIXTRAIN_CHECK(!__builtin_mul_overflow(count, static_cast<int64_t>(dtype_size(dtype)), &bytes),
                 "tensor shape " << shape << " needs more bytes than fit in 64 bits");
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(bytes), device);
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
  if (t.nbytes()) std::memcpy(t.raw(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::from_int64s(const Shape& shape, const std::vector<int64_t>& values) {
  MIXTRAIN_CHECK(static_cast<int64_t>(values.size()) == shape.numel(),
                 "from_int64s: " << values.size() << " values for shape " << shape);
  Tensor t = empty(shape, DType::kInt64);
  if (t.nbytes()) std::memcpy(t.raw(), values.data(), t.nbytes());
  return t;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    const int64_t d = shape_[i];
    if (d != 1 && strides_[static_cast<size_t>(i)] != expected) return false;
    expected *= d;
  }
  return true;
}

namespace {
std::atomic<DeviceMemoryAccessHook> g_device_memory_access_hook{nullptr};
}  // namespace

void set_device_memory_access_hook(DeviceMemoryAccessHook hook) { g_device_memory_access_hook.store(hook); }

void* Tensor::raw() {
  if (!storage_) return nullptr;
  if (const DeviceMemoryAccessHook hook = g_device_memory_access_hook.load(std::memory_order_relaxed);
      hook != nullptr && !storage_->device().is_cpu())
    hook(*this);
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}
const void* Tensor::raw() const { return const_cast<Tensor*>(this)->raw(); }

Tensor Tensor::reshape(const Shape& requested) const {
  std::vector<int64_t> dims = requested.dims();
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      MIXTRAIN_CHECK(infer < 0, "reshape: " << requested << " has more than one -1");
      infer = static_cast<int>(i);
    } else {
      MIXTRAIN_CHECK(dims[i] >= 0, "reshape: " << requested << " has a negative dimension");
      known *= dims[i];
    }
  }
  if (infer >= 0) {
    MIXTRAIN_CHECK(known > 0 && numel() % known == 0, "reshape: cannot view " << describe() << " as " << requested);
    dims[static_cast<size_t>(infer)] = numel() / known;
  }
  const Shape shape(dims);
  MIXTRAIN_CHECK(shape.numel() == numel(), "reshape: cannot view " << describe() << " as " << shape);
  MIXTRAIN_CHECK(shape.rank() <= kMaxRank, "reshape: rank " << shape.rank() << " exceeds " << kMaxRank);
  Tensor t = is_contiguous() ? *this : contiguous();
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::transpose(int d0, int d1) const {
  std::vector<int> order(static_cast<size_t>(rank()));
  for (int i = 0; i < rank(); ++i) order[static_cast<size_t>(i)] = i;
  std::swap(order[static_cast<size_t>(normalize_dim(d0, rank(), "transpose"))],
            order[static_cast<size_t>(normalize_dim(d1, rank(), "transpose"))]);
  return permute(order);
}

Tensor Tensor::permute(const std::vector<int>& order) const {
  MIXTRAIN_CHECK(static_cast<int>(order.size()) == rank(),
                 "permute: " << order.size() << " dimensions given for " << describe());
  std::vector<bool> seen(static_cast<size_t>(rank()), false);
  std::vector<int64_t> dims(order.size()), strides(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const int d = normalize_dim(order[i], rank(), "permute");
    MIXTRAIN_CHECK(!seen[static_cast<size_t>(d)], "permute: dimension " << d << " appears twice");
    seen[static_cast<size_t>(d)] = true;
    dims[i] = shape_[d];
    strides[i] = strides_[static_cast<size_t>(d)];
  }
  Tensor t = *this;
  t.shape_ = Shape(dims);
  t.strides_ = strides;
  return t;
}

Tensor Tensor::slice(int dim, int64_t begin, int64_t end) const {
  const int d = normalize_dim(dim, rank(), "slice");
  MIXTRAIN_CHECK(0 <= begin && begin <= end && end <= shape_[d],
                 "slice: [" << begin << ", " << end << ") out of range for dimension " << d << " of " << describe());
  std::vector<int64_t> dims = shape_.dims();
  dims[static_cast<size_t>(d)] = end - begin;
  Tensor t = *this;
  t.shape_ = Shape(dims);
  t.offset_ = offset_ + begin * strides_[static_cast<size_t>(d)];
  return t;
}

Tensor Tensor::contiguous() const {
  if (!defined() || is_contiguous()) return *this;
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

namespace {
std::array<std::atomic<DeviceCopyFn>, kNumDeviceTypes> g_device_copy{};
}  // namespace

void register_device_copy(DeviceType type, DeviceCopyFn fn) {
  g_device_copy[static_cast<size_t>(type)].store(fn, std::memory_order_release);
}

void Tensor::copy_from(const Tensor& src) {
  MIXTRAIN_CHECK(defined() && src.defined() && src.shape() == shape_,
                 "copy_from: cannot copy " << src.describe() << " into " << describe());
  if (!device().is_cpu() || !src.device().is_cpu()) {
    MIXTRAIN_CHECK(device() == src.device(), "copy_from: " << src.describe() << " and " << describe()
                                                            << " are on different devices; ops::to_device copies between them");
    const DeviceCopyFn fn = g_device_copy[static_cast<size_t>(device().type)].load(std::memory_order_acquire);
    MIXTRAIN_CHECK(fn != nullptr, "copy_from: no copy for tensors on " << device().str()
                                                                        << " (its backend is not loaded)");
    if (numel() > 0) fn(src, *this);
    return;
  }
  require_cpu(*this, "copy_from");
  require_cpu(src, "copy_from");
  const int64_t n = numel();
  if (n == 0) return;
  if (is_contiguous() && src.is_contiguous()) {
    convert_elements(src.raw(), src.dtype_, raw(), dtype_, n);
    return;
  }
  // Walk the outer dimensions with a counter; the last dimension is converted as one run when both
  // sides are dense in it.
  const int r = rank();
  if (r == 0) {
    convert_elements(src.raw(), src.dtype_, raw(), dtype_, 1);
    return;
  }
  const int64_t inner = shape_[r - 1];
  const int64_t s_in = src.strides_[static_cast<size_t>(r - 1)], d_in = strides_[static_cast<size_t>(r - 1)];
  const size_t s_size = dtype_size(src.dtype_), d_size = dtype_size(dtype_);
  std::vector<int64_t> idx(static_cast<size_t>(r), 0);
  const char* s_base = static_cast<const char*>(src.storage_->data());
  char* d_base = static_cast<char*>(storage_->data());
  for (int64_t done = 0; done < n; done += inner) {
    int64_t s_off = src.offset_, d_off = offset_;
    for (int i = 0; i < r - 1; ++i) {
      s_off += idx[static_cast<size_t>(i)] * src.strides_[static_cast<size_t>(i)];
      d_off += idx[static_cast<size_t>(i)] * strides_[static_cast<size_t>(i)];
    }
    if ((s_in == 1 || inner == 1) && (d_in == 1 || inner == 1)) {
      convert_elements(s_base + s_off * static_cast<int64_t>(s_size), src.dtype_,
                       d_base + d_off * static_cast<int64_t>(d_size), dtype_, inner);
    } else {
      for (int64_t j = 0; j < inner; ++j)
        convert_elements(s_base + (s_off + j * s_in) * static_cast<int64_t>(s_size), src.dtype_,
                         d_base + (d_off + j * d_in) * static_cast<int64_t>(d_size), dtype_, 1);
    }
    for (int i = r - 2; i >= 0; --i) {
      if (++idx[static_cast<size_t>(i)] < shape_[i]) break;
      idx[static_cast<size_t>(i)] = 0;
    }
  }
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  if (numel()) t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor t = empty(shape_, dtype, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MIXTRAIN_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0),
                 "slice_rows: rows [" << begin << ", " << end << ") out of range for " << describe());
  return slice(0, begin, end).clone();
}

Tensor Tensor::gather_rows(const std::vector<int64_t>& indices) const { return gather_rows(indices, dtype_); }

Tensor Tensor::gather_rows(const std::vector<int64_t>& indices, DType dtype) const {
  MIXTRAIN_CHECK(rank() >= 1, "gather_rows: " << describe() << " has no rows");
  require_cpu(*this, "gather_rows");
  const Tensor src_t = contiguous();
  std::vector<int64_t> dims = shape_.dims();
  dims[0] = static_cast<int64_t>(indices.size());
  Tensor t = empty(Shape(dims), dtype);
  const int64_t row_elems = dim(0) ? numel() / dim(0) : 0;
  const size_t src_row_bytes = static_cast<size_t>(row_elems) * dtype_size(dtype_);
  const size_t dst_row_bytes = static_cast<size_t>(row_elems) * dtype_size(dtype);
  char* dst = static_cast<char*>(t.raw());
  const char* src = static_cast<const char*>(src_t.raw());
  for (size_t i = 0; i < indices.size(); ++i) {
    MIXTRAIN_CHECK(indices[i] >= 0 && indices[i] < dim(0), "gather_rows: row " << indices[i] << " out of range");
    convert_elements(src + indices[i] * src_row_bytes, dtype_, dst + i * dst_row_bytes, dtype, row_elems);
  }
  return t;
}

std::vector<float> Tensor::to_floats() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  if (!v.empty()) to(DType::kFloat32).contiguous().copy_out(v.data());
  return v;
}

std::vector<int32_t> Tensor::to_ints() const {
  std::vector<int32_t> v(static_cast<size_t>(numel()));
  if (!v.empty()) to(DType::kInt32).contiguous().copy_out(v.data());
  return v;
}

std::vector<int64_t> Tensor::to_int64s() const {
  std::vector<int64_t> v(static_cast<size_t>(numel()));
  if (!v.empty()) to(DType::kInt64).contiguous().copy_out(v.data());
  return v;
}

void Tensor::copy_out(void* dst) const {
  require_cpu(*this, "reading values");
  std::memcpy(dst, raw(), nbytes());
}

float Tensor::item() const {
  MIXTRAIN_CHECK(numel() == 1, "item: " << describe() << " does not hold exactly one element");
  return at(0);
}

int64_t Tensor::storage_index(int64_t i) const {
  int64_t off = offset_;
  for (int d = rank() - 1; d >= 0; --d) {
    const int64_t n = shape_[d];
    off += (i % n) * strides_[static_cast<size_t>(d)];
    i /= n;
  }
  return off;
}

float Tensor::at(int64_t i) const {
  MIXTRAIN_CHECK(i >= 0 && i < numel(), "at: index " << i << " out of range for " << describe());
  require_cpu(*this, "at");
  float v;
  convert_elements(static_cast<const char*>(storage_->data()) + storage_index(i) * static_cast<int64_t>(dtype_size(dtype_)),
                   dtype_, &v, DType::kFloat32, 1);
  return v;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  std::string s = std::string(dtype_name(dtype_)) + " " + shape_.to_string();
  if (!device().is_cpu()) s += " on " + device().str();
  return s;
}

void Tensor::check_access(DType requested) const {
  MIXTRAIN_CHECK(defined(), "data access on an undefined tensor");
  MIXTRAIN_CHECK(requested == dtype_, "tensor is " << describe() << " but was read as " << dtype_name(requested));
  MIXTRAIN_CHECK(is_contiguous(), "typed access to a non-contiguous view " << describe() << "; call contiguous() first");
}

namespace {
// The 16- and 8-bit floating storage types, which widen and round through half.h / float8.h.
template <typename T>
constexpr bool kNarrowFloat = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16> ||
                              std::is_same_v<T, float8_e4m3fn> || std::is_same_v<T, float8_e5m2> ||
                              std::is_same_v<T, float8_e8m0fnu>;

template <typename S>
float load_as_float(const S& s) {
  if constexpr (kNarrowFloat<S>)
    return to_float(s);
  else
    return static_cast<float>(s);
}

template <typename D>
D store_from_float(float f) {
  if constexpr (kNarrowFloat<D> || std::is_same_v<D, float>)
    return from_float<D>(f);
  else
    return static_cast<D>(std::isfinite(f) ? f : 0.0f);
}

template <typename S, typename D>
void convert_typed(const S* src, D* dst, int64_t n) {
  if constexpr (std::is_same_v<S, D>) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(D));
  } else if constexpr (std::is_integral_v<S> && std::is_integral_v<D>) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<D>(src[i]);  // ids and labels stay exact
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
    case DType::kInt64: return fn(int64_t{});
    case DType::kFloat8E4M3FN: return fn(float8_e4m3fn{});
    case DType::kFloat8E5M2: return fn(float8_e5m2{});
    case DType::kFloat8E8M0FNU: return fn(float8_e8m0fnu{});
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
// The conversion paths follow the shared instruction-set level (core/isa_level.h), so MIXTRAIN_ISA and the
// tests' override reach them as they reach the GEMM: F16C comes with the avx2 level, AVX-512 F with avx512.
bool have_f16c() { return for_isa_level(false, true, true); }
bool have_avx512f() { return for_isa_level(false, false, true); }
}  // namespace

namespace {
// E4M3 / E5M2 to and from float32 and bfloat16 through float8.h's array paths (each format's default overflow, as
// from_float); false for any other pair, which the element loop below converts.
bool convert_float8_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count) {
  const auto e4m3_or_e5m2 = [](DType d) { return d == DType::kFloat8E4M3FN || d == DType::kFloat8E5M2; };
  const auto wide = [](DType d) { return d == DType::kFloat32 || d == DType::kBFloat16; };
  if (e4m3_or_e5m2(dst_dtype) && wide(src_dtype)) {
    const bool e5m2 = dst_dtype == DType::kFloat8E5M2;
    const Float8Overflow overflow = e5m2 ? Float8Overflow::kNonSaturating : Float8Overflow::kSaturate;
    if (src_dtype == DType::kFloat32)
      float8_from_float(static_cast<const float*>(src), static_cast<uint8_t*>(dst), count, e5m2, overflow);
    else
      float8_from_bfloat16(static_cast<const bfloat16*>(src), static_cast<uint8_t*>(dst), count, e5m2, overflow);
    return true;
  }
  if (e4m3_or_e5m2(src_dtype) && wide(dst_dtype)) {
    const bool e5m2 = src_dtype == DType::kFloat8E5M2;
    if (dst_dtype == DType::kFloat32)
      float8_to_float(static_cast<const uint8_t*>(src), static_cast<float*>(dst), count, e5m2);
    else
      float8_to_bfloat16(static_cast<const uint8_t*>(src), static_cast<bfloat16*>(dst), count, e5m2);
    return true;
  }
  return false;
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
  if (convert_float8_elements(src, src_dtype, dst, dst_dtype, count)) return;
  dispatch_any(src_dtype, [&](auto s) {
    using S = decltype(s);
    dispatch_any(dst_dtype, [&](auto d) {
      using D = decltype(d);
      convert_typed(static_cast<const S*>(src), static_cast<D*>(dst), count);
    });
  });
}

}  // namespace mixtrain
