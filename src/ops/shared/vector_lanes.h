// Elementwise kernels with 16-byte loads, for host and device: a floating dtype as a storage type (a template
// argument instead of a run-time code read per element), how n elements split into whole 16-byte vectors and a
// tail, and one vector's lanes mapped through a float32 function. Each lane is the element the scalar kernel reads
// (load_as_float), goes through the same function and is rounded the same way (store_from_float), so the vector
// kernels give the scalar kernels' bits; tests/ops/cuda_shared_math_test.cpp checks that on the CPU for every dtype
// pair, odd lengths and unaligned pointers.
#pragma once

#include <cstdint>

#include "float16_convert.h"
#include "host_device.h"

namespace mixtrain::ops::shared {

// The storage of FloatCode Code: its element type, widened to float32 exactly and rounded back once.
template <int Code>
struct FloatStorage;
template <>
struct FloatStorage<kCodeFloat32> {
  using T = float;
  MIXTRAIN_HOST_DEVICE static float load(T v) { return v; }
  MIXTRAIN_HOST_DEVICE static T store(float v) { return v; }
};
template <>
struct FloatStorage<kCodeFloat16> {
  using T = uint16_t;
  MIXTRAIN_HOST_DEVICE static float load(T v) { return half_to_float(v); }
  MIXTRAIN_HOST_DEVICE static T store(float v) { return float_to_half(v); }
};
template <>
struct FloatStorage<kCodeBFloat16> {
  using T = uint16_t;
  MIXTRAIN_HOST_DEVICE static float load(T v) { return bfloat16_to_float(v); }
  MIXTRAIN_HOST_DEVICE static T store(float v) { return float_to_bfloat16(v); }
};

// Lanes of a 16-byte load of Code's storage: 4 float32 or 8 float16 / bfloat16 values.
template <int Code>
inline constexpr int kLanes = static_cast<int>(16 / sizeof(typename FloatStorage<Code>::T));

// N elements of T moved as one aligned unit (one 16-byte load or store, two for 32 bytes, one 8-byte for 8).
template <typename T, int N>
struct alignas(N * sizeof(T) >= 16 ? 16 : N * sizeof(T)) LaneBlock {
  T v[N];
};

// n elements as `vectors` whole vectors of `lanes` elements, [0, vectors * lanes), then the tail [tail_begin, n)
// one element at a time. Without 16-byte aligned pointers everything is tail.
struct VectorSplit {
  int64_t vectors;
  int64_t tail_begin;
};
MIXTRAIN_HOST_DEVICE inline VectorSplit vector_split(int64_t n, int lanes, bool aligned) {
  const int64_t vectors = aligned ? n / lanes : 0;
  return {vectors, vectors * lanes};
}

// Whether every pointer is 16-byte aligned (a view at an odd offset is not: its kernel reads it element by element).
MIXTRAIN_HOST_DEVICE inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Vector v of x (In's storage), each lane through f, rounded into y (Out's storage): y[v * L + j] = f(x[v * L + j]).
template <int In, int Out, typename Fn>
MIXTRAIN_HOST_DEVICE inline void map_lanes(const void* x, void* y, int64_t v, const Fn& f) {
  constexpr int L = kLanes<In>;
  using TI = typename FloatStorage<In>::T;
  using TO = typename FloatStorage<Out>::T;
  const LaneBlock<TI, L> a = static_cast<const LaneBlock<TI, L>*>(x)[v];
  LaneBlock<TO, L> b;
  for (int j = 0; j < L; ++j) b.v[j] = FloatStorage<Out>::store(f(FloatStorage<In>::load(a.v[j])));
  static_cast<LaneBlock<TO, L>*>(y)[v] = b;
}

// The same with two inputs of In's storage: y[i] = f(x1[i], x2[i]) over vector v's lanes.
template <int In, int Out, typename Fn>
MIXTRAIN_HOST_DEVICE inline void map_lanes2(const void* x1, const void* x2, void* y, int64_t v, const Fn& f) {
  constexpr int L = kLanes<In>;
  using TI = typename FloatStorage<In>::T;
  using TO = typename FloatStorage<Out>::T;
  const LaneBlock<TI, L> a = static_cast<const LaneBlock<TI, L>*>(x1)[v];
  const LaneBlock<TI, L> c = static_cast<const LaneBlock<TI, L>*>(x2)[v];
  LaneBlock<TO, L> b;
  for (int j = 0; j < L; ++j)
    b.v[j] = FloatStorage<Out>::store(f(FloatStorage<In>::load(a.v[j]), FloatStorage<In>::load(c.v[j])));
  static_cast<LaneBlock<TO, L>*>(y)[v] = b;
}

// Element i, as the tail (and the scalar kernels) read it.
template <int In, int Out, typename Fn>
MIXTRAIN_HOST_DEVICE inline void map_element(const void* x, void* y, int64_t i, const Fn& f) {
  using TI = typename FloatStorage<In>::T;
  using TO = typename FloatStorage<Out>::T;
  static_cast<TO*>(y)[i] = FloatStorage<Out>::store(f(FloatStorage<In>::load(static_cast<const TI*>(x)[i])));
}
template <int In, int Out, typename Fn>
MIXTRAIN_HOST_DEVICE inline void map_element2(const void* x1, const void* x2, void* y, int64_t i, const Fn& f) {
  using TI = typename FloatStorage<In>::T;
  using TO = typename FloatStorage<Out>::T;
  static_cast<TO*>(y)[i] = FloatStorage<Out>::store(
      f(FloatStorage<In>::load(static_cast<const TI*>(x1)[i]), FloatStorage<In>::load(static_cast<const TI*>(x2)[i])));
}

// The whole map, in the order a grid of `threads` threads runs it (thread t: vectors t, t + threads, ..., then tail
// elements tail_begin + t, ...): the loop a kernel's thread runs, and on the host (threads 1) the reference.
template <int In, int Out, typename Fn>
MIXTRAIN_HOST_DEVICE inline void map_span(const void* x, void* y, int64_t n, bool aligned, int64_t t, int64_t threads,
                                          const Fn& f) {
  const VectorSplit s = vector_split(n, kLanes<In>, aligned);
  for (int64_t v = t; v < s.vectors; v += threads) map_lanes<In, Out>(x, y, v, f);
  for (int64_t i = s.tail_begin + t; i < n; i += threads) map_element<In, Out>(x, y, i, f);
}
template <int In, int Out, typename Fn>
MIXTRAIN_HOST_DEVICE inline void map_span2(const void* x1, const void* x2, void* y, int64_t n, bool aligned,
                                           int64_t t, int64_t threads, const Fn& f) {
  const VectorSplit s = vector_split(n, kLanes<In>, aligned);
  for (int64_t v = t; v < s.vectors; v += threads) map_lanes2<In, Out>(x1, x2, y, v, f);
  for (int64_t i = s.tail_begin + t; i < n; i += threads) map_element2<In, Out>(x1, x2, y, i, f);
}

}  // namespace mixtrain::ops::shared
