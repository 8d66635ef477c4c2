// Elementwise ops against float64 references, in every floating dtype, on odd shapes of several ranks.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <iostream>

#include "mixtrain/core/half.h"
#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/elementwise.h"
#include "op_test_util.h"
#include "ops/shared/ordered_sum.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::kOddSizes;
using testing::random_tensor;
using testing::to_doubles;
using testing::unit;

double activation_ref(Activation a, double v) {
  switch (a) {
    case Activation::kRelu: return v > 0 ? v : 0;
    case Activation::kGelu: return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    case Activation::kSigmoid: return 1 / (1 + std::exp(-v));
    case Activation::kTanh: return std::tanh(v);
    default: return v;
  }
}

// f'(x) expressed through x (relu, gelu) or through y = f(x) (sigmoid, tanh), as the op reads them.
double activation_grad_ref(Activation a, double x, double y) {
  switch (a) {
    case Activation::kRelu: return x > 0 ? 1 : 0;
    case Activation::kGelu:
      return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    case Activation::kSigmoid: return y * (1 - y);
    case Activation::kTanh: return 1 - y * y;
    default: return 1;
  }
}

const Activation kActivations[] = {Activation::kRelu, Activation::kGelu, Activation::kSigmoid, Activation::kTanh};

TEST(Activations, NanPropagatesThroughRelu) {
  Tensor x = Tensor::from_floats({3}, {NAN, -1.0f, 2.0f});
  const std::vector<float> y = activation(x, Activation::kRelu).to_floats();
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 2.0f);
}

TEST(Activations, ForwardAndBackwardMatchFloat64InEveryDType) {
  for (DType d : kFloatDTypes)
    for (int64_t n : kOddSizes) {
      Tensor x = random_tensor({3, n, 2}, 2 + n, d, -4, 4);
      Tensor dy = random_tensor(x.shape(), 3 + n, d);
      const std::vector<double> in = to_doubles(x), g = to_doubles(dy);
      for (Activation a : kActivations) {
        Tensor y = activation(x, a);
        ASSERT_EQ(y.shape(), x.shape());
        EXPECT_EQ(y.dtype(), d);
        const std::vector<double> out = to_doubles(y);
        const std::vector<double> dx = to_doubles(activation_backward(dy, x, y, a));
        for (size_t i = 0; i < in.size(); ++i) {
          const double want = activation_ref(a, in[i]);
          // float32 erf/exp/tanh are good to a few float32 units; then one rounding into d.
          EXPECT_NEAR(out[i], want, unit(d) * std::fabs(want) + 4e-7) << activation_name(a) << " " << dtype_name(d);
          // The backward reads the saved output y as stored (already rounded into d).
          const double gwant = g[i] * activation_grad_ref(a, in[i], out[i]);
          EXPECT_NEAR(dx[i], gwant, unit(d) * std::fabs(gwant) + 1e-6) << activation_name(a) << " " << dtype_name(d);
        }
      }
    }
}

TEST(Activations, ReadTransposedViews) {
  Tensor base = random_tensor({7, 17}, 4, DType::kFloat16, -2, 2);
  Tensor view = base.transpose(0, 1);  // (17, 7), not contiguous
  ASSERT_FALSE(view.is_contiguous());
  Tensor y = activation(view, Activation::kGelu);
  EXPECT_EQ(y.shape(), Shape({17, 7}));
  EXPECT_EQ(y.to_floats(), activation(view.contiguous(), Activation::kGelu).to_floats());
}

TEST(Elementwise, AddAndScaleMatchFloat64OnAnyRank) {
  for (DType d : kFloatDTypes)
    for (int64_t n : kOddSizes)
      for (const Shape& s : {Shape({n}), Shape({2, n}), Shape({3, 1, n, 2})}) {
        Tensor a = random_tensor(s, 5 + n, d), b = random_tensor(s, 6 + n, DType::kFloat32);
        const std::vector<double> av = to_doubles(a), bv = to_doubles(b);
        Tensor sum = add(a, b), scaled = scale(a, 0.37f);
        EXPECT_EQ(sum.dtype(), d);
        EXPECT_EQ(sum.shape(), s);
        const std::vector<double> sv = to_doubles(sum), cv = to_doubles(scaled);
        for (size_t i = 0; i < av.size(); ++i) {
          // One float32 operation, then one rounding into d.
          const double want = av[i] + bv[i], cwant = av[i] * 0.37f;
          EXPECT_NEAR(sv[i], want, (unit(d) + 0x1p-24) * std::fabs(want) + 1e-12) << dtype_name(d);
          EXPECT_NEAR(cv[i], cwant, (unit(d) + 0x1p-24) * std::fabs(cwant) + 1e-12) << dtype_name(d);
        }
      }
  EXPECT_THROW(add(Tensor::zeros({2, 3}, DType::kFloat32), Tensor::zeros({3, 2}, DType::kFloat32)), Error);
}

// add_into: the accumulator is written in place (same storage), each sum rounded once into its dtype, for a
// gradient of any floating dtype; a view or an integer accumulator is refused.
TEST(Elementwise, AddIntoAccumulatesInPlaceWithOneRounding) {
  for (DType d : kFloatDTypes)
    for (DType gd : kFloatDTypes)
      for (int64_t n : kOddSizes) {
        Tensor acc = random_tensor({3, n}, 7 + n, d), g = random_tensor({3, n}, 8 + n, gd);
        const std::vector<double> av = to_doubles(acc), gv = to_doubles(g);
        const void* storage = acc.raw();
        add_into(acc, g);
        EXPECT_EQ(acc.raw(), storage);
        const std::vector<double> sv = to_doubles(acc);
        for (size_t i = 0; i < av.size(); ++i) {
          const double want = av[i] + gv[i];
          ASSERT_NEAR(sv[i], want, (unit(d) + 0x1p-24) * std::fabs(want) + 1e-12) << dtype_name(d) << dtype_name(gd);
        }
      }
  Tensor view = Tensor::zeros({4, 3}, DType::kFloat32).transpose(0, 1);
  EXPECT_THROW(add_into(view, Tensor::zeros({3, 4}, DType::kFloat32)), Error);
  Tensor ints = Tensor::from_ints({2}, {1, 2});
  EXPECT_THROW(add_into(ints, Tensor::zeros({2}, DType::kFloat32)), Error);
  Tensor acc = Tensor::zeros({2}, DType::kFloat32);
  EXPECT_THROW(add_into(acc, Tensor::zeros({3}, DType::kFloat32)), Error);
}

TEST(Elementwise, BiasAddAndSumRowsOverTheLastAxisOfAnyRank) {
  for (DType d : kFloatDTypes)
    for (int64_t n : kOddSizes)
      for (const Shape& s : {Shape({n}), Shape({17, n}), Shape({2, 3, n}), Shape({2, 1, 3, n})}) {
        Tensor x = random_tensor(s, 7 + n, d), bias = random_tensor({n}, 8 + n, DType::kFloat32);
        const std::vector<double> xv = to_doubles(x), bv = to_doubles(bias);
        const std::vector<double> y = to_doubles(bias_add(x, bias));
        for (size_t i = 0; i < xv.size(); ++i) {
          const double want = xv[i] + bv[i % static_cast<size_t>(n)];
          EXPECT_NEAR(y[i], want, (unit(d) + 0x1p-24) * std::fabs(want) + 1e-12) << dtype_name(d);
        }
        Tensor sums = sum_rows(x);
        EXPECT_EQ(sums.dtype(), DType::kFloat32);
        ASSERT_EQ(sums.shape(), Shape({n}));
        const std::vector<double> sv = to_doubles(sums);
        const size_t rows = xv.size() / static_cast<size_t>(n);
        for (int64_t j = 0; j < n; ++j) {
          double want = 0, mag = 0;
          for (size_t r = 0; r < rows; ++r) {
            want += xv[r * n + j];
            mag += std::fabs(xv[r * n + j]);
          }
          // float32 sums in row order: at most rows float32 units of the sum of magnitudes.
          EXPECT_NEAR(sv[j], want, rows * 0x1p-24 * mag + 1e-12) << dtype_name(d);
        }
      }
  EXPECT_THROW(bias_add(Tensor::zeros({2, 3}, DType::kFloat32), Tensor::zeros({2}, DType::kFloat32)), Error);
}

// sum_rows adds blocks of rows in parallel (the bias gradient of a transformer has thousands of rows): the bits are
// shared::blocked_row_sum's at every thread count, and a sum of up to one block's rows is the plain row-order sum.
TEST(Elementwise, SumRowsAddsBlocksOfRowsInOneOrderAtEveryThreadCount) {
  for (DType d : kFloatDTypes) {
    for (int64_t rows : {int64_t{1}, int64_t{64}, int64_t{65}, int64_t{2656}}) {
      const int64_t cols = 131;  // rows * cols passes the parallel threshold at 2656 rows
      // Mixed magnitudes, so that another order shows in the bits.
      std::vector<float> v = random_tensor({rows, cols}, 31 + static_cast<uint64_t>(rows), DType::kFloat32).to_floats();
      for (size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], static_cast<int>(i * 7 % 23) - 11);
      const Tensor x = Tensor::from_floats({rows, cols}, v, d);
      const std::vector<float> xv = x.to_floats();
      const int saved = omp_get_max_threads();
      std::vector<std::vector<float>> runs;
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        runs.push_back(sum_rows(x).to_floats());
      }
      omp_set_num_threads(saved);
      for (int64_t j = 0; j < cols; ++j) {
        const auto term = [&](int64_t r) { return xv[static_cast<size_t>(r * cols + j)]; };
        const float want = shared::blocked_row_sum(rows, term);
        for (const std::vector<float>& run : runs)
          EXPECT_EQ(std::bit_cast<uint32_t>(run[static_cast<size_t>(j)]), std::bit_cast<uint32_t>(want))
              << dtype_name(d) << " rows " << rows << " column " << j;
        if (rows <= shared::kSumRowsRowsPerBlock) {
          EXPECT_EQ(std::bit_cast<uint32_t>(want), std::bit_cast<uint32_t>(shared::ordered_sum(rows, term)));
        }
      }
    }
  }
}

// scale_in_place writes scale's values into the tensor itself, in every floating dtype and past the parallel
// threshold; views and integer tensors are refused.
TEST(Elementwise, ScaleInPlaceGivesScalesBits) {
  for (DType d : kFloatDTypes) {
    for (int64_t n : {int64_t{1}, int64_t{17}, (int64_t{1} << 17) + 5}) {
      const Tensor x = random_tensor({n}, 41 + static_cast<uint64_t>(n), d, -70000, 70000);
      const Tensor want = scale(x, 0.37f);
      Tensor y = x.clone();
      scale_in_place(y, 0.37f);
      EXPECT_EQ(std::memcmp(y.raw(), want.raw(), want.nbytes()), 0) << dtype_name(d) << " n=" << n;
    }
  }
  Tensor view = random_tensor({4, 6}, 43, DType::kFloat32).transpose(0, 1);
  EXPECT_THROW(scale_in_place(view, 2.0f), Error);
  Tensor ints = Tensor::zeros({3}, DType::kInt32);
  EXPECT_THROW(scale_in_place(ints, 2.0f), Error);
}

TEST(Elementwise, BiasAddOnAView) {
  Tensor x = random_tensor({7, 3}, 9, DType::kFloat32).transpose(0, 1);  // (3, 7) view
  Tensor bias = random_tensor({7}, 10, DType::kBFloat16);
  EXPECT_EQ(bias_add(x, bias).to_floats(), bias_add(x.contiguous(), bias).to_floats());
  EXPECT_EQ(sum_rows(x).to_floats(), sum_rows(x.contiguous()).to_floats());
}

TEST(Dropout, KeepsExpectedFractionAndScales) {
  Tensor x = Tensor::full({1000}, DType::kFloat16, 1.0f);
  Tensor mask = Tensor::empty({1000}, DType::kUInt8);
  for (int64_t i = 0; i < 1000; ++i) mask.data<uint8_t>()[i] = i % 4 != 0;
  const std::vector<float> y = dropout(x, mask, 0.25f).to_floats();
  const float kept = half_bits_to_float(float_to_half_bits(1.0f / 0.75f));  // rounded once into float16
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(y[i], i % 4 ? kept : 0.0f) << i;
}

TEST(Dropout, AnyRankAndBackwardUsesTheSameMask) {
  for (DType d : kFloatDTypes) {
    Tensor x = random_tensor({3, 7, 17}, 11, d);
    Tensor mask = Tensor::empty({3, 7, 17}, DType::kUInt8);
    for (int64_t i = 0; i < mask.numel(); ++i) mask.data<uint8_t>()[i] = (i * 7) % 3 != 0;
    const std::vector<double> xv = to_doubles(x), y = to_doubles(dropout(x, mask, 0.5f));
    const std::vector<double> dx = to_doubles(dropout_backward(x, mask, 0.5f));
    for (size_t i = 0; i < xv.size(); ++i) {
      const double want = mask.data<uint8_t>()[i] ? 2 * xv[i] : 0.0;
      EXPECT_EQ(y[i], want) << dtype_name(d);  // scaling by 2 is exact
      EXPECT_EQ(dx[i], want);
    }
  }
}

// The mask drawn by the op: attention's keep decision at each row-major index, a fraction of kept elements near
// 1 - rate, the same for the same seed and a different one for another, whatever the thread count.
TEST(Dropout, MaskIsTheHashsKeepDecisionPerIndex) {
  const Shape shape({70, 1031});  // above the kernel's parallel threshold
  for (float rate : {0.0f, 0.1f, 0.5f, 0.9f}) {
    const Tensor mask = dropout_mask(shape, rate, 1234, Device::cpu());
    ASSERT_EQ(mask.dtype(), DType::kUInt8);
    ASSERT_EQ(mask.shape(), shape);
    const uint8_t* m = mask.data<uint8_t>();
    int64_t kept = 0;
    for (int64_t i = 0; i < mask.numel(); ++i) {
      ASSERT_EQ(m[i] != 0, attention_dropout_keep(1234, static_cast<uint64_t>(i), rate)) << i;
      ASSERT_LE(m[i], 1);
      kept += m[i];
    }
    const double n = static_cast<double>(mask.numel()), p = 1.0 - rate;
    // Six standard deviations of a binomial count.
    EXPECT_NEAR(static_cast<double>(kept), n * p, 6.0 * std::sqrt(n * p * (1.0 - p)) + 0.5) << "rate " << rate;
    if (rate == 0.0f) {
      EXPECT_EQ(kept, mask.numel());
    }
  }
  const Tensor a = dropout_mask(shape, 0.5f, 7, Device::cpu()), b = dropout_mask(shape, 0.5f, 7, Device::cpu());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  const Tensor c = dropout_mask(shape, 0.5f, 8, Device::cpu());
  EXPECT_NE(std::memcmp(a.raw(), c.raw(), a.nbytes()), 0);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Tensor serial = dropout_mask(shape, 0.5f, 7, Device::cpu());
  omp_set_num_threads(threads);
  EXPECT_EQ(std::memcmp(a.raw(), serial.raw(), a.nbytes()), 0);
  EXPECT_EQ(dropout_mask({0, 3}, 0.5f, 7, Device::cpu()).numel(), 0);
  EXPECT_THROW(dropout_mask(shape, 1.0f, 7, Device::cpu()), Error);
  EXPECT_THROW(dropout_mask(shape, -0.1f, 7, Device::cpu()), Error);
}

TEST(FiniteCheck, CountsInfAndNanInEveryDType) {
  for (DType d : kFloatDTypes)
    for (int64_t n : kOddSizes) {
      std::vector<float> v(static_cast<size_t>(n) * 3, 1.5f);
      v[0] = INFINITY;
      v[v.size() - 1] = NAN;
      if (v.size() > 4) v[2] = -INFINITY;
      Tensor x = Tensor::from_floats({3, n}, v, d);
      EXPECT_EQ(count_nonfinite(x), v.size() > 4 ? 3 : 2) << dtype_name(d) << " n " << n;
      EXPECT_FALSE(all_finite({Tensor::zeros({2}, d), x}));
    }
  // 65504 is float16's largest finite value; 65520 rounds to inf when converted, but not in float32.
  EXPECT_EQ(count_nonfinite(Tensor::from_floats({2}, {65504.0f, -65504.0f}, DType::kFloat16)), 0);
  EXPECT_EQ(count_nonfinite(Tensor::from_floats({1}, {65520.0f}, DType::kFloat32)), 0);
  EXPECT_TRUE(all_finite({Tensor(), Tensor::from_ints({2}, {1, 2}), random_tensor({129, 3}, 12, DType::kBFloat16)}));
  EXPECT_TRUE(all_finite({}));
  // A view is read as the elements it shows.
  Tensor big = Tensor::from_floats({2, 2}, {NAN, 1.0f, 2.0f, 3.0f});
  EXPECT_EQ(count_nonfinite(big.slice(0, 1, 2)), 0);
  EXPECT_EQ(count_nonfinite(big.transpose(0, 1)), 1);
}

TEST(FiniteCheck, LargeTensorsCountedInParallelExactly) {
  const int64_t n = (int64_t{1} << 18) + 17;
  std::vector<float> v(static_cast<size_t>(n), 0.5f);
  for (int64_t i = 0; i < n; i += 1001) v[static_cast<size_t>(i)] = NAN;
  EXPECT_EQ(count_nonfinite(Tensor::from_floats({n}, v, DType::kFloat16)), (n + 1000) / 1001);
}

// GELU's float64 reference in its erfc form, which keeps full relative accuracy for x < 0 (1 + erf would
// cancel), and its derivative Phi(x) + x phi(x); both for the value as stored in its dtype.
double gelu_ref(double x) {
  if (std::isinf(x)) return x > 0 ? x : 0.0;
  return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
}
double gelu_grad_ref(double x) {
  if (std::isinf(x)) return x > 0 ? 1.0 : 0.0;
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

// The spacing of dtype d's values at v (its unit in the last place), subnormals included.
double ulp_in(DType d, double v) {
  const int mantissa = d == DType::kFloat16 ? 10 : d == DType::kBFloat16 ? 7 : 23;
  const int min_exponent = d == DType::kFloat16 ? -14 : -126;
  int e = 0;
  std::frexp(v, &e);  // |v| = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, std::max(v == 0 ? min_exponent : e - 1, min_exponent) - mantissa);
}

// GELU and its derivative in units of the result's dtype: a dense sweep of [-10, 10] (2^20 + 1 points, so
// steps of 2e-5, and the neighbourhood of gelu' = 0 at x = -0.7518), tiny magnitudes down to the
// denormals, the float32 denormal results near x = -13.5, and inf and NaN. float32 computes within 5
// float32 units of the exact value (measured over every seventh float32 in [-16, 16]: 4.9 for gelu, 3.8 for
// gelu'), so a 16-bit result, rounded once from it, is within half a unit of its dtype plus those 5 float32
// units. The backward runs with dy = 1 so that dx is gelu' itself.
TEST(Activations, GeluAndItsDerivativeWithinFewUnitsOfFloat64) {
  std::vector<float> v;
  const int64_t steps = int64_t{1} << 20;
  for (int64_t i = 0; i <= steps; ++i) v.push_back(static_cast<float>(-10.0 + 20.0 * static_cast<double>(i) / steps));
  for (int k = 0; k <= 149; ++k) v.insert(v.end(), {std::ldexp(1.0f, -k), -std::ldexp(1.0f, -k), std::ldexp(1.7f, -k)});
  for (float x : {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-40f, -1e-40f, FLT_MIN, -FLT_MIN, -13.0f, -13.5f, -13.9f, -14.2f,
                  -14.6f, -20.0f, 20.0f, 100.0f, -100.0f, FLT_MAX, -FLT_MAX, INFINITY, -INFINITY, NAN, -NAN})
    v.push_back(x);
  const int64_t n = static_cast<int64_t>(v.size());
  for (DType d : kFloatDTypes) {
    const Tensor x = Tensor::from_floats({n}, v, d);
    const Tensor y = activation(x, Activation::kGelu);
    const Tensor dx = activation_backward(Tensor::full({n}, d, 1.0f), x, y, Activation::kGelu);
    const std::vector<double> in = to_doubles(x), out = to_doubles(y), grad = to_doubles(dx);
    // In units of d: 5 float32 units, and for a 16-bit dtype its own half unit on top.
    auto tolerance = [d](double want) {
      const double f32 = 5.0 * ulp_in(DType::kFloat32, want) / ulp_in(d, want);
      return d == DType::kFloat32 ? f32 : 0.5 + f32;
    };
    // Per function: the largest error, and the input where the error exceeds its tolerance the most
    // (one message per function and dtype, not one per element).
    struct Worst {
      double error = 0, excess = -1, x = 0, got = 0, want = 0;
      void see(double xi, double g, double w, double e, double tol) {
        error = std::max(error, e);
        if (e - tol > excess) excess = e - tol, x = xi, got = g, want = w;
      }
    } value, slope;
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(in[i])) {
        EXPECT_TRUE(std::isnan(out[i]) && std::isnan(grad[i])) << dtype_name(d);
        continue;
      }
      const double want = gelu_ref(in[i]), gwant = gelu_grad_ref(in[i]);
      ASSERT_FALSE(std::isnan(out[i]) || std::isnan(grad[i])) << "x = " << in[i] << " " << dtype_name(d);
      if (std::isinf(want)) {
        EXPECT_EQ(out[i], want) << dtype_name(d);
        continue;
      }
      value.see(in[i], out[i], want, std::fabs(out[i] - want) / ulp_in(d, want), tolerance(want));
      slope.see(in[i], grad[i], gwant, std::fabs(grad[i] - gwant) / ulp_in(d, gwant), tolerance(gwant));
    }
    EXPECT_LE(value.excess, 0) << "gelu(" << value.x << ") = " << value.got << ", want " << value.want << " "
                               << dtype_name(d);
    EXPECT_LE(slope.excess, 0) << "gelu'(" << slope.x << ") = " << slope.got << ", want " << slope.want << " "
                               << dtype_name(d);
    // The float32 sweep is dense enough to meet the arithmetic's own error, not only exact results.
    if (d == DType::kFloat32) {
      EXPECT_GT(value.error, 1.0);
    }
    std::cout << dtype_name(d) << ": gelu within " << value.error << ", gelu' within " << slope.error << " units\n";
  }
}

// Each element's bits depend on its value alone: not on the thread count, nor on where it falls in a block
// (the vector loop or its scalar remainder).
TEST(Activations, GeluBitsDoNotDependOnThreadsOrPosition) {
  const int64_t n = (int64_t{1} << 18) + 13;  // past the parallel threshold, and not a multiple of any width
  for (DType d : kFloatDTypes) {
    const Tensor x = random_tensor({n}, 21, d, -12, 12), dy = random_tensor({n}, 22, d);
    const int saved = omp_get_max_threads();
    std::vector<std::vector<float>> runs;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      const Tensor y = activation(x, Activation::kGelu);
      std::vector<float> all = y.to_floats(), g = activation_backward(dy, x, y, Activation::kGelu).to_floats();
      all.insert(all.end(), g.begin(), g.end());
      runs.push_back(all);
    }
    omp_set_num_threads(saved);
    for (size_t r = 1; r < runs.size(); ++r)
      EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[r].data(), runs[0].size() * sizeof(float))) << dtype_name(d);
    // Short pieces at odd offsets run mostly in the scalar remainder; their bits match the long run's.
    const std::vector<float> xs = x.to_floats(), dys = dy.to_floats();
    for (int64_t offset : {0, 1, 5, 13})
      for (int64_t len : kOddSizes) {
        const std::vector<float> xp(xs.begin() + offset, xs.begin() + offset + len);
        const std::vector<float> dp(dys.begin() + offset, dys.begin() + offset + len);
        const Tensor xt = Tensor::from_floats({len}, xp, d), yt = activation(xt, Activation::kGelu);
        const std::vector<float> y = yt.to_floats();
        const std::vector<float> g = activation_backward(Tensor::from_floats({len}, dp, d), xt, yt, Activation::kGelu).to_floats();
        for (int64_t i = 0; i < len; ++i) {
          EXPECT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(runs[0][offset + i])) << dtype_name(d);
          EXPECT_EQ(std::bit_cast<uint32_t>(g[i]), std::bit_cast<uint32_t>(runs[0][n + offset + i])) << dtype_name(d);
        }
      }
  }
}

}  // namespace
}  // namespace mixtrain::ops
