// Conversions between the floating dtypes on the GPU: tensor casts (the float8 formats E4M3 and E5M2 included), and the final rounding of a float32 product
// (plus its bias) into the output dtype for the GEMM paths cuBLASLt cannot write directly. The rounding rule is
// core's, through ops/shared/float16_convert.h, so a cast gives the CPU's bits, NaN payloads included. A cast is a
// kernel templated on both dtypes with 16-byte loads (vector_map.cuh); the strided copies and the rounding run one
// thread per element, as do casts to or from a float8 format (core/float8.h's scalar rules through
// ops/shared/fp8_element.h: decoding is exact, encoding rounds once to nearest even with the format's cast overflow,
// so the bits are the CPU cast's). Every grid is as large as the tensor asks for.
#include <cuda_runtime.h>

#include "../shared/float16_convert.h"
#include "../shared/fp8_element.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/transfer.h"
#include "vector_map.cuh"

namespace mixtrain::ops::cuda {

namespace {

// A cast's element step: the value itself, rounded by the store into the destination's dtype.
struct Identity {
  MIXTRAIN_HOST_DEVICE float operator()(float v) const { return v; }
};

__global__ void round_rows_kernel(const float* src, const float* bias, int64_t rows, int64_t n, void* dst,
                                  int dst_code) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = src ? src[i] : 0.0f;
    if (bias) v = shared::add_rn(v, bias[i % n]);
    shared::store_from_float(dst, dst_code, i, v);
  }
}

// A cast's side: a float32 / float16 / bfloat16 array (float8 kNotFloat8) or float8 codes.
enum Float8Side : int { kNotFloat8 = 0, kE4M3 = 1, kE5M2 = 2 };

int float8_side(DType dt) {
  return dt == DType::kFloat8E4M3FN ? kE4M3 : dt == DType::kFloat8E5M2 ? kE5M2 : kNotFloat8;
}

// A cast with a float8 format on either side: each element widened exactly to float32, then rounded once into dst.
__global__ void float8_cast_kernel(const void* src, int src_code, int src_f8, void* dst, int dst_code, int dst_f8,
                                   int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = src_f8 != kNotFloat8
                        ? shared::float8_value(static_cast<const uint8_t*>(src)[i], src_f8 == kE5M2)
                        : shared::load_as_float(src, src_code, i);
    if (dst_f8 != kNotFloat8)
      static_cast<uint8_t*>(dst)[i] = shared::float8_code(v, dst_f8 == kE5M2, shared::cast_overflow(dst_f8 == kE5M2));
    else
      shared::store_from_float(dst, dst_code, i, v);
  }
}

// Shape and both sides' strides (elements), passed by value to the kernel.
struct StridedPair {
  int rank;
  int64_t dims[kMaxRank];
  int64_t src_strides[kMaxRank];
  int64_t dst_strides[kMaxRank];
};

// Storage offsets of the element with flat row-major index i on both sides.
__device__ void offsets_of(const StridedPair& layout, int64_t i, int64_t* src_off, int64_t* dst_off) {
  int64_t s = 0, d = 0;
  for (int r = layout.rank - 1; r >= 0; --r) {
    const int64_t c = i % layout.dims[r];
    i /= layout.dims[r];
    s += c * layout.src_strides[r];
    d += c * layout.dst_strides[r];
  }
  *src_off = s;
  *dst_off = d;
}

// Between floating dtypes, core's rounding.
__global__ void strided_cast_kernel(StridedPair layout, const void* src, int src_code, void* dst, int dst_code,
                                    int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t s, d;
    offsets_of(layout, i, &s, &d);
    shared::store_from_float(dst, dst_code, d, shared::load_as_float(src, src_code, s));
  }
}

// Any dtype to itself: elements of `Word` (its size) moved as they are.
template <typename Word>
__global__ void strided_copy_kernel(StridedPair layout, const Word* src, Word* dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t s, d;
    offsets_of(layout, i, &s, &d);
    dst[d] = src[s];
  }
}

}  // namespace

void strided_copy(const Tensor& src, Tensor& dst) {
  const bool same = src.dtype() == dst.dtype();
  MIXTRAIN_CHECK(src.shape() == dst.shape() && src.device() == dst.device() &&
                     (same || (is_float(src.dtype()) && is_float(dst.dtype()))),
                 "copy_from: cannot copy " << src.describe() << " into " << dst.describe()
                                           << " on the GPU (same shape and device; a conversion between floating dtypes)");
  const int64_t n = src.numel();
  if (n == 0) return;
  if (src.is_contiguous() && dst.is_contiguous() && (same || is_float(src.dtype()))) {
    if (same) {
      check_cuda(cudaSetDevice(src.device().index), "cudaSetDevice");
      check_cuda(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
      return;
    }
    return cast(src, dst);
  }
  check_cuda(cudaSetDevice(src.device().index), "cudaSetDevice");
  StridedPair layout{};
  layout.rank = src.rank();
  for (int r = 0; r < layout.rank; ++r) {
    layout.dims[r] = src.dim(r);
    layout.src_strides[r] = src.strides()[r];
    layout.dst_strides[r] = dst.strides()[r];
  }
  const unsigned blocks = device::blocks_uncapped(n);
  if (!same) {
    strided_cast_kernel<<<blocks, device::kThreads>>>(layout, src.raw(), shared::float_code(src.dtype()), dst.raw(),
                                                      shared::float_code(dst.dtype()), n);
  } else if (dtype_size(src.dtype()) == 8) {
    strided_copy_kernel<<<blocks, device::kThreads>>>(layout, static_cast<const uint64_t*>(src.raw()),
                                                      static_cast<uint64_t*>(dst.raw()), n);
  } else if (dtype_size(src.dtype()) == 4) {
    strided_copy_kernel<<<blocks, device::kThreads>>>(layout, static_cast<const uint32_t*>(src.raw()),
                                                      static_cast<uint32_t*>(dst.raw()), n);
  } else if (dtype_size(src.dtype()) == 2) {
    strided_copy_kernel<<<blocks, device::kThreads>>>(layout, static_cast<const uint16_t*>(src.raw()),
                                                      static_cast<uint16_t*>(dst.raw()), n);
  } else {
    strided_copy_kernel<<<blocks, device::kThreads>>>(layout, static_cast<const uint8_t*>(src.raw()),
                                                      static_cast<uint8_t*>(dst.raw()), n);
  }
  device::launched("strided_copy");
}

void cast(const Tensor& src, Tensor& dst) {
  MIXTRAIN_CHECK(cast_converts(src.dtype()) && cast_converts(dst.dtype()) && src.numel() == dst.numel() &&
                     src.is_contiguous() && dst.is_contiguous() && src.device() == dst.device(),
                 "cast: cannot convert " << src.describe() << " into " << dst.describe()
                                         << " (float32, float16, bfloat16, float8_e4m3fn or float8_e5m2, contiguous,"
                                            " same element count and device; float8_e8m0fnu casts run on the CPU)");
  const int64_t n = src.numel();
  if (n == 0) return;
  check_cuda(cudaSetDevice(src.device().index), "cudaSetDevice");
  if (src.dtype() == dst.dtype()) {
    check_cuda(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
    return;
  }
  const int src_f8 = float8_side(src.dtype()), dst_f8 = float8_side(dst.dtype());
  if (src_f8 != kNotFloat8 || dst_f8 != kNotFloat8) {
    float8_cast_kernel<<<device::blocks_uncapped(n), device::kThreads>>>(
        src.raw(), src_f8 ? 0 : shared::float_code(src.dtype()), src_f8, dst.raw(),
        dst_f8 ? 0 : shared::float_code(dst.dtype()), dst_f8, n);
    device::launched("cast");
    return;
  }
  device::with_float_code(shared::float_code(src.dtype()), [&](auto from) {
    device::with_float_code(shared::float_code(dst.dtype()), [&](auto to) {
      device::launch_map<decltype(from)::value, decltype(to)::value>(src.raw(), dst.raw(), n, Identity{});
    });
  });
  device::launched("cast");
}

void round_rows_into(const float* src, const float* bias, int64_t rows, int64_t n, void* dst, DType dst_dtype) {
  const int64_t total = rows * n;
  if (total == 0) return;
  round_rows_kernel<<<device::blocks_uncapped(total), device::kThreads>>>(src, bias, rows, n, dst,
                                                                     shared::float_code(dst_dtype));
  device::launched("round_rows_into");
}

void register_convert_kernels(Kernels& k) {
  k.set<Op::cast>(&cast);
}

}  // namespace mixtrain::ops::cuda
