// linear_activation against the two ops it fuses, activation(linear(x, w, bias)), byte for byte: every floating
// dtype, relu and gelu (fused) and the other activations (composed), shapes with edges, inputs holding -0, +0,
// NaN, infinities and values whose products overflow, 1, 2 and 3 threads; its backward against
// linear_backward(activation_backward(...)) on every 16-bit pattern of the pre-activation.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>

#include "mixtrain/core/allocator.h"
#include "mixtrain/ops/matmul.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.raw(), bc.raw(), ac.nbytes()) == 0;
}

// Values in [-2, 2] with, every `stride` elements from `first`, one of: -0, +0, a value large enough that its
// products overflow the dtype (float16's 65504, the others' 3.4e38) once summed, and unless finite, NaN and +-inf.
// zero_row: the second row (of the last dimension) all zeros, so that with a finite kernel the product has a row
// that is the bias alone, zeros included.
Tensor with_specials(const Shape& shape, uint64_t seed, DType dtype, int64_t first, int64_t stride,
                     bool zero_row = false, bool finite = false) {
  const float large = dtype == DType::kFloat16 ? 30000.0f : 2e38f;
  const float specials[] = {-0.0f, 0.0f, large, -large, std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY};
  const int kinds = finite ? 4 : 7;
  std::vector<float> v = random_tensor(shape, seed, DType::kFloat32, -2.0f, 2.0f).to_floats();
  for (int64_t i = first, s = 0; i < static_cast<int64_t>(v.size()); i += stride, ++s)
    v[static_cast<size_t>(i)] = specials[s % kinds];
  const int64_t cols = shape[-1];
  if (zero_row && shape.numel() >= 2 * cols)
    for (int64_t j = cols; j < 2 * cols; ++j) v[static_cast<size_t>(j)] = j % 2 ? -0.0f : 0.0f;
  return Tensor::from_floats(shape, v, dtype);
}

struct Case {
  std::vector<int64_t> x_shape;  // (..., in)
  int64_t out;
};

// Edges of the GEMM's tiles and blocks: single rows and columns, odd sizes, more rows than one chunk (120 on the
// AVX-512 path), no rows, and a batch dimension that linear flattens. (k = 0, which linear() refuses, is the GEMM
// post-op test's.)
const Case kCases[] = {{{1, 1}, 1},     {{7, 17}, 31}, {{129, 33}, 17}, {{250, 40}, 130},
                       {{31, 7}, 1},    {{1, 300}, 129}, {{0, 4}, 3},     {{2, 5, 7}, 13}};

TEST(LinearActivation, EqualsActivationOfLinearByteForByte) {
  const int saved = omp_get_max_threads();
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    for (DType d : kFloatDTypes) {
      const int64_t in = c.x_shape.back();
      const Tensor x = with_specials(Shape(c.x_shape), ++seed, d, 3, 23, /*zero_row=*/true);
      const Tensor w = with_specials({in, c.out}, ++seed, d, 5, 41, false, /*finite=*/true);
      const Tensor bias = with_specials({c.out}, ++seed, DType::kFloat32, 2, 5);
      for (const Tensor& b : {bias, Tensor()}) {
        const Tensor z = linear(x, w, b);
        for (Activation act : {Activation::kRelu, Activation::kGelu, Activation::kSigmoid, Activation::kTanh,
                               Activation::kLinear}) {
          const Tensor expected = activation(z, act);
          for (bool keep : {false, true}) {
            for (int threads : {1, 2, 3}) {
              omp_set_num_threads(threads);
              const LinearActivation r = linear_activation(x, w, b, act, keep);
              std::ostringstream where;
              where << dtype_name(d) << " x " << Shape(c.x_shape) << " out " << c.out << " bias " << b.defined()
                    << " " << activation_name(act) << " keep " << keep << " threads " << threads;
              EXPECT_TRUE(same_bytes(r.y, expected)) << where.str();
              EXPECT_EQ(r.pre_activation.defined(), keep) << where.str();
              if (keep) {
                EXPECT_TRUE(same_bytes(r.pre_activation, z)) << where.str();
              }
            }
          }
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

// The inputs above do reach the corners: NaN, infinities, zeros and negatives in the product.
TEST(LinearActivation, SpecialInputsReachThePreActivation) {
  for (DType d : kFloatDTypes) {
    const Tensor x = with_specials({129, 33}, 3, d, 3, 23, true);
    const Tensor w = with_specials({33, 17}, 4, d, 5, 41, false, true);
    const std::vector<float> z = linear(x, w, with_specials({17}, 5, DType::kFloat32, 2, 5)).to_floats();
    int nan = 0, inf = 0, zero = 0, negative = 0;
    for (float v : z) {
      nan += std::isnan(v);
      inf += std::isinf(v);
      zero += v == 0.0f;
      negative += v < 0.0f;
    }
    EXPECT_GT(nan, 0) << dtype_name(d);
    EXPECT_GT(inf, 0) << dtype_name(d);
    EXPECT_GT(zero, 0) << dtype_name(d);
    EXPECT_GT(negative, 0) << dtype_name(d);
  }
}

// The fused op holds only its outputs: no (..., out) tensor of the product beside y, as the two ops would.
TEST(LinearActivation, AllocatesOnlyItsOutputsOnTheCpu) {
  const Tensor x = random_tensor({64, 48}, 7, DType::kBFloat16), w = random_tensor({48, 80}, 8, DType::kBFloat16);
  const Tensor bias = random_tensor({80}, 9, DType::kFloat32);
  auto peak_of = [](const std::function<void()>& run) {
    reset_peak_memory();
    const int64_t live = memory_stats().live_bytes;
    run();
    return memory_stats().peak_bytes - live;
  };
  const int64_t one = peak_of([] { Tensor t = Tensor::empty({64, 80}, DType::kBFloat16); });
  ASSERT_GT(one, 0);
  EXPECT_EQ(peak_of([&] { activation(linear(x, w, bias), Activation::kRelu); }), 2 * one);
  for (Activation act : {Activation::kRelu, Activation::kGelu}) {
    EXPECT_EQ(peak_of([&] { linear_activation(x, w, bias, act, false); }), one) << activation_name(act);
    EXPECT_EQ(peak_of([&] { linear_activation(x, w, bias, act, true); }), 2 * one) << activation_name(act);
  }
}

// A pre-activation holding every 16-bit pattern (or, in float32, the special values and 65,536 random patterns),
// its relu or gelu, and a gradient with specials: the fused backward (relu from y alone) gives the composition's
// dx, dw and dbias bytes.
Tensor every_pattern(DType d) {
  Tensor t = Tensor::empty({256, 256}, d);
  if (d == DType::kFloat32) {
    std::mt19937 rng(11);
    uint32_t* p = static_cast<uint32_t*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<uint32_t>(rng());
    const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u,
                                 0x7F800001u, 0x00000001u, 0x80000001u, 0x7F7FFFFFu, 0xFF7FFFFFu};
    std::memcpy(p, specials, sizeof(specials));
  } else {
    uint16_t* p = static_cast<uint16_t*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<uint16_t>(i);
  }
  return t;
}

TEST(LinearActivation, BackwardEqualsTheCompositionOnEveryPattern) {
  for (DType d : kFloatDTypes) {
    const Tensor pre = every_pattern(d);
    const Tensor x = random_tensor({256, 24}, 12, d), w = random_tensor({24, 256}, 13, d);
    const Tensor dy = with_specials({256, 256}, 14, d, 1, 97);
    for (Activation act : {Activation::kRelu, Activation::kGelu}) {
      const Tensor y = activation(pre, act);
      const LinearGrads expected = linear_backward(activation_backward(dy, pre, y, act), x, w, true, true);
      const Tensor saved = act == Activation::kRelu ? Tensor() : pre;  // what the autograd function keeps
      const LinearGrads got = linear_activation_backward(dy, x, w, y, saved, act, true, true);
      EXPECT_TRUE(same_bytes(got.dx, expected.dx)) << dtype_name(d) << " " << activation_name(act);
      EXPECT_TRUE(same_bytes(got.dw, expected.dw)) << dtype_name(d) << " " << activation_name(act);
      EXPECT_TRUE(same_bytes(got.dbias, expected.dbias)) << dtype_name(d) << " " << activation_name(act);
    }
  }
}

TEST(LinearActivation, GeluBackwardWithoutThePreActivationIsAnError) {
  const Tensor x = random_tensor({2, 3}, 1, DType::kFloat32), w = random_tensor({3, 4}, 2, DType::kFloat32);
  const LinearActivation r = linear_activation(x, w, Tensor(), Activation::kGelu, false);
  EXPECT_THROW(linear_activation_backward(r.y, x, w, r.y, Tensor(), Activation::kGelu, true, true), Error);
  EXPECT_THROW(linear_activation(x, random_tensor({4, 4}, 3, DType::kFloat32), Tensor(), Activation::kRelu, false),
               Error);
}

}  // namespace
}  // namespace mixtrain::ops
