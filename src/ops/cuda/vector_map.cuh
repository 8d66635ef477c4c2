// Elementwise kernels templated on their dtypes, with 16-byte loads (ops/shared/vector_lanes.h: the split, the lanes
// and the rounding, shared with the host so the CPU tests them), on a grid of one thread per vector that is not
// capped: a 16-bit tensor of a hundred million elements is read in 12.5 million 16-byte loads by as many threads,
// where the scalar kernels ran 4,096 blocks over two-byte loads. Device code only: included by .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "../shared/vector_lanes.h"
#include "device_util.cuh"

namespace mixtrain::ops::cuda::device {

// Blocks of kThreads for one thread per unit of work: as many as it takes (grid x goes to 2^31 - 1).
inline unsigned blocks_uncapped(int64_t units) {
  const int64_t b = (units + kThreads - 1) / kThreads;
  const int64_t cap = std::numeric_limits<int32_t>::max();
  return static_cast<unsigned>(b < 1 ? 1 : b < cap ? b : cap);
}

// Threads a map over n elements of In's storage needs: one per whole vector (or per tail element, when there are
// more of those, at most kLanes - 1).
template <int In>
inline int64_t map_threads(int64_t n, bool aligned) {
  const shared::VectorSplit s = shared::vector_split(n, shared::kLanes<In>, aligned);
  return s.vectors > n - s.tail_begin ? s.vectors : n - s.tail_begin;
}

template <int In, int Out, typename Fn>
__global__ void map_kernel(const void* x, void* y, int64_t n, bool aligned, Fn f) {
  shared::map_span<In, Out>(x, y, n, aligned, blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x,
                            static_cast<int64_t>(gridDim.x) * blockDim.x, f);
}

template <int In, int Out, typename Fn>
__global__ void map2_kernel(const void* x1, const void* x2, void* y, int64_t n, bool aligned, Fn f) {
  shared::map_span2<In, Out>(x1, x2, y, n, aligned, blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x,
                             static_cast<int64_t>(gridDim.x) * blockDim.x, f);
}

// y = f(x) elementwise, x of In's storage, y of Out's, n elements (on the current device).
template <int In, int Out, typename Fn>
void launch_map(const void* x, void* y, int64_t n, const Fn& f) {
  const bool aligned = shared::aligned16(x) && shared::aligned16(y);
  map_kernel<In, Out><<<blocks_uncapped(map_threads<In>(n, aligned)), kThreads>>>(x, y, n, aligned, f);
}

// y = f(x1, x2) elementwise, x1 and x2 of In's storage.
template <int In, int Out, typename Fn>
void launch_map2(const void* x1, const void* x2, void* y, int64_t n, const Fn& f) {
  const bool aligned = shared::aligned16(x1) && shared::aligned16(x2) && shared::aligned16(y);
  map2_kernel<In, Out><<<blocks_uncapped(map_threads<In>(n, aligned)), kThreads>>>(x1, x2, y, n, aligned, f);
}

// fn(std::integral_constant<int, code>{}) for a FloatCode known only at run time: the one switch from a tensor's
// dtype to the templates.
template <typename Fn>
void with_float_code(int code, const Fn& fn) {
  switch (code) {
    case shared::kCodeFloat16: fn(std::integral_constant<int, shared::kCodeFloat16>{}); break;
    case shared::kCodeBFloat16: fn(std::integral_constant<int, shared::kCodeBFloat16>{}); break;
    default: fn(std::integral_constant<int, shared::kCodeFloat32>{}); break;
  }
}

}  // namespace mixtrain::ops::cuda::device
