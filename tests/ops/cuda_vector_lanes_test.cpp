// The 16-byte elementwise path of the CUDA kernels (src/ops/shared/vector_lanes.h, run by cuda/vector_map.cuh),
// on the host: for every pair of floating dtypes, lengths that leave tails of every size, pointers aligned and not,
// and the loop split over several threads as a grid splits it, every element is written exactly once and gets the
// bits of the scalar step (load_as_float, the function, store_from_float) and of the CPU's cast (ops::cast) and add.
// Inputs are random bit patterns: NaN payloads, infinities and subnormals included. Runs everywhere.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/transfer.h"
#include "op_test_util.h"
#include "ops/shared/elementwise_math.h"
#include "ops/shared/vector_lanes.h"

namespace mixtrain::ops {
namespace {

using shared::kCodeBFloat16;
using shared::kCodeFloat16;
using shared::kCodeFloat32;

DType dtype_of(int code) {
  return code == kCodeFloat16 ? DType::kFloat16 : code == kCodeBFloat16 ? DType::kBFloat16 : DType::kFloat32;
}

// n elements of dtype's storage at byte offset `skew` (0: 16-byte aligned) in buf, filled with random bits.
void* fill_random(std::vector<unsigned char>& buf, int64_t n, DType dtype, size_t skew, uint64_t seed) {
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  buf.assign(bytes + 64, 0);
  unsigned char* p = buf.data() + (16 - reinterpret_cast<uintptr_t>(buf.data()) % 16) % 16 + skew;
  Rng r(seed);
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(r.next_u64());
  return p;
}

struct Identity {
  float operator()(float v) const { return v; }
};
struct Add {
  float operator()(float a, float b) const { return shared::add_rn(a, b); }
};

// The map of In to Out over one case against the scalar step, and the CPU cast, byte for byte.
template <int In, int Out>
void check_pair(int64_t n, size_t skew, int64_t threads) {
  const DType din = dtype_of(In), dout = dtype_of(Out);
  const std::string what = std::string(dtype_name(din)) + " -> " + dtype_name(dout) + " n=" + std::to_string(n) +
                           " skew " + std::to_string(skew) + " threads " + std::to_string(threads);
  std::vector<unsigned char> xb, yb, x2b;
  const void* x = fill_random(xb, n, din, skew, 7 + static_cast<uint64_t>(n));
  const void* x2 = fill_random(x2b, n, din, skew, 11 + static_cast<uint64_t>(n));
  void* y = fill_random(yb, n, dout, skew, 13);  // anything not written would show against the reference
  const bool aligned = shared::aligned16(x) && shared::aligned16(y);
  EXPECT_EQ(aligned, skew == 0) << what;
  std::vector<unsigned char> want(static_cast<size_t>(n) * dtype_size(dout));
  for (int64_t i = 0; i < n; ++i)
    shared::store_from_float(want.data(), Out, i, shared::load_as_float(x, In, i));
  for (int64_t t = 0; t < threads; ++t) shared::map_span<In, Out>(x, y, n, aligned, t, threads, Identity{});
  EXPECT_EQ(std::memcmp(y, want.data(), want.size()), 0) << "cast " << what;
  // The CPU's cast of the same elements: the same bits.
  if (In != Out) {
    Tensor src = Tensor::empty({n}, din), dst = Tensor::empty({n}, dout);
    std::memcpy(src.raw(), x, src.nbytes());
    dst.copy_from(src);
    EXPECT_EQ(std::memcmp(dst.raw(), want.data(), want.size()), 0) << "the CPU's cast " << what;
  }
  // Two inputs: add, against the scalar step.
  for (int64_t i = 0; i < n; ++i)
    shared::store_from_float(want.data(), Out, i,
                             shared::add_rn(shared::load_as_float(x, In, i), shared::load_as_float(x2, In, i)));
  for (int64_t t = 0; t < threads; ++t) shared::map_span2<In, Out>(x, x2, y, n, aligned, t, threads, Add{});
  EXPECT_EQ(std::memcmp(y, want.data(), want.size()), 0) << "add " << what;
}

template <int In>
void check_from(int64_t n, size_t skew, int64_t threads) {
  check_pair<In, kCodeFloat32>(n, skew, threads);
  check_pair<In, kCodeFloat16>(n, skew, threads);
  check_pair<In, kCodeBFloat16>(n, skew, threads);
}

TEST(CudaSharedMath, SixteenByteLanesGiveTheScalarStepsBitsForEveryDtypePair) {
  for (int64_t n : {1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 129, 1000}) {
    for (size_t skew : {size_t{0}, size_t{2}, size_t{4}, size_t{8}}) {
      for (int64_t threads : {1, 3, 64}) {
        check_from<kCodeFloat32>(n, skew, threads);
        check_from<kCodeFloat16>(n, skew, threads);
        check_from<kCodeBFloat16>(n, skew, threads);
      }
    }
  }
}

TEST(CudaSharedMath, AVectorSplitCoversEveryElementOnce) {
  for (int lanes : {4, 8}) {
    for (int64_t n : {0, 1, 7, 8, 9, 64, 65}) {
      const shared::VectorSplit s = shared::vector_split(n, lanes, true);
      EXPECT_EQ(s.vectors, n / lanes);
      EXPECT_EQ(s.tail_begin, s.vectors * lanes);
      EXPECT_LT(n - s.tail_begin, lanes);
      const shared::VectorSplit u = shared::vector_split(n, lanes, false);
      EXPECT_EQ(u.vectors, 0);  // unaligned: all element by element
      EXPECT_EQ(u.tail_begin, 0);
    }
  }
  EXPECT_EQ(shared::kLanes<kCodeFloat32>, 4);
  EXPECT_EQ(shared::kLanes<kCodeFloat16>, 8);
  EXPECT_EQ(shared::kLanes<kCodeBFloat16>, 8);
}

}  // namespace
}  // namespace mixtrain::ops
