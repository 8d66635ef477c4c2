// The arithmetic the CUDA kernels share with the CPU (src/ops/shared/), checked on the host against the
// library's own CPU code: loads and stores through core's float16/bfloat16 conversions; softmax, log-softmax,
// their gradients and sparse cross-entropy against the CPU op kernels (a warp's softmax too, where the row's maximum is a zero);
// the elementwise element steps and the reductions' summation order against the CPU's elementwise and reduce
// kernels; layer normalization's rows and column sums and the embedding's gather and scatter-add order against
// their CPU kernels; the Adam element update, AdamW's decay and the fused pass's element against the CPU Adam's
// and AdamW's update_span at every instruction-set level. Each shared function follows its CPU
// counterpart's operation order, so every check is bit for bit. Runs everywhere, with or without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/isa_level.h"
#include "mixtrain/core/random.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/embedding.h"
#include "mixtrain/ops/layer_norm.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/reduce.h"
#include "mixtrain/ops/softmax.h"
#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/rmsprop.h"
#include "mixtrain/optim/sgd.h"
#include "op_test_util.h"
#include "ops/shared/adam_update.h"
#include "ops/shared/fused_update_element.h"
#include "ops/cpu/exp_poly.h"
#include "ops/shared/crossentropy_row.h"
#include "ops/shared/lane_sum.h"
#include "ops/shared/elementwise_math.h"
#include "ops/shared/embedding_rows.h"
#include "ops/shared/exp_poly.h"
#include "ops/shared/float16_convert.h"
#include "ops/shared/layer_norm_row.h"
#include "ops/shared/ordered_sum.h"
#include "ops/shared/softmax_row.h"

namespace mixtrain::ops {
namespace {

using testing::bits;
using testing::kFloatDTypes;
using testing::kOddSizes;
using testing::random_tensor;

// The casts are core/half.h's own conversions (tests/core/half_test.cpp checks them on every pattern and
// midpoint); here, that a kernel's load and store pick the right one for each dtype code.
TEST(CudaSharedMath, LoadAndStoreRoundOnceIntoEachDtype) {
  const std::vector<float> v = {0.1f, -3.7f, 65519.0f, 1e-6f, -0.0f};
  for (DType dt : kFloatDTypes) {
    const Tensor cpu = Tensor::from_floats({static_cast<int64_t>(v.size())}, v, dt);
    std::vector<uint32_t> storage(v.size(), 0);
    for (size_t i = 0; i < v.size(); ++i)
      shared::store_from_float(storage.data(), shared::float_code(dt), static_cast<int64_t>(i), v[i]);
    EXPECT_EQ(std::memcmp(storage.data(), cpu.raw(), cpu.nbytes()), 0) << dtype_name(dt);
    for (size_t i = 0; i < v.size(); ++i)
      EXPECT_EQ(bits(shared::load_as_float(storage.data(), shared::float_code(dt), static_cast<int64_t>(i))),
                bits(cpu.at(static_cast<int64_t>(i))))
          << dtype_name(dt);
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Rows of x (rows, n) through a shared row function, rounded into out_dtype as a kernel does.
template <typename RowFn>
Tensor by_rows(const Tensor& x, const Tensor* x2, DType out_dtype, RowFn&& row_fn) {
  const int64_t n = x.dim(-1), rows = x.numel() / n;
  const std::vector<float> in = x.to_floats();
  const std::vector<float> in2 = x2 ? x2->to_floats() : std::vector<float>();
  std::vector<float> res(static_cast<size_t>(n));
  Tensor out = Tensor::empty(x.shape(), out_dtype);
  for (int64_t r = 0; r < rows; ++r) {
    row_fn(in.data() + r * n, x2 ? in2.data() + r * n : nullptr, res.data(), n);
    for (int64_t j = 0; j < n; ++j)
      shared::store_from_float(out.raw(), shared::float_code(out_dtype), r * n + j, res[j]);
  }
  return out;
}

TEST(CudaSharedMath, SoftmaxRowGivesTheCpuKernelsBits) {
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      // Large logits too: the max subtraction keeps every exponent finite.
      const float spread = n == 31 ? 800.0f : 6.0f;
      const Tensor x = testing::random_tensor({5, n}, 11 + static_cast<uint64_t>(n), dt, -spread, spread);
      for (bool log : {false, true}) {
        const Tensor want = log ? log_softmax(x) : softmax(x);
        const Tensor got = by_rows(x, nullptr, dt, [log](const float* in, const float*, float* out, int64_t len) {
          shared::softmax_row(in, out, len, log);
        });
        EXPECT_TRUE(same_bits(got, want)) << dtype_name(dt) << " n=" << n << " log=" << log;
        for (float v : got.to_floats()) ASSERT_TRUE(std::isfinite(v));
      }
    }
  }
}

TEST(CudaSharedMath, SoftmaxBackwardRowGivesTheCpuKernelsBits) {
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      const Tensor x = testing::random_tensor({4, n}, 21 + static_cast<uint64_t>(n), dt, -4.0f, 4.0f);
      const Tensor dy = testing::random_tensor({4, n}, 31 + static_cast<uint64_t>(n), DType::kFloat32);
      for (bool log : {false, true}) {
        const Tensor y = log ? log_softmax(x) : softmax(x);
        const Tensor want = log ? log_softmax_backward(dy, y) : softmax_backward(dy, y);
        const Tensor got = by_rows(y, &dy, dt, [log](const float* s, const float* d, float* out, int64_t len) {
          shared::softmax_backward_row(s, d, out, len, log);
        });
        EXPECT_TRUE(same_bits(got, want)) << dtype_name(dt) << " n=" << n << " log=" << log;
      }
    }
  }
}

// A softmax row as a warp computes it (cuda/softmax.cu): lane l takes the maximum of elements l, l + 32, ... from
// -inf, the butterfly combines the lanes' maxima (device::warp_max), each lane adds the terms of its elements with
// the maximum it holds, device::warp_sum combines the sums, and each lane writes its elements. The lanes may end
// with maxima of opposite zero signs; each lane's own is used, as on the GPU.
float warp_sum_emulated(std::array<float, shared::kSumLanes> v);  // below

// The maximum each lane of a softmax warp holds after device::warp_max, for row x.
std::array<float, 32> warp_row_maxima(const std::vector<float>& x) {
  constexpr int kWarp = 32;
  std::array<float, kWarp> mx;
  mx.fill(-std::numeric_limits<float>::infinity());
  for (size_t j = 0; j < x.size(); ++j) mx[j % kWarp] = shared::max_f32(mx[j % kWarp], x[j]);
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const std::array<float, kWarp> before = mx;
    for (int i = 0; i < kWarp; ++i)
      mx[static_cast<size_t>(i)] = shared::max_f32(before[static_cast<size_t>(i)], before[static_cast<size_t>(i ^ o)]);
  }
  return mx;
}

std::vector<float> warp_softmax_row(const std::vector<float>& x, bool log) {
  constexpr int kWarp = 32;
  const std::array<float, kWarp> mx = warp_row_maxima(x);
  std::array<float, kWarp> sum{};
  for (size_t j = 0; j < x.size(); ++j) sum[j % kWarp] = shared::add_rn(sum[j % kWarp], shared::softmax_term(x[j], mx[j % kWarp]));
  const float total = warp_sum_emulated(sum);
  std::vector<float> out(x.size());
  for (size_t j = 0; j < x.size(); ++j) {
    const float m = mx[j % kWarp];
    out[j] = log ? shared::log_softmax_value(x[j], shared::log_sum_exp(m, total))
                 : shared::softmax_value(shared::softmax_term(x[j], m), total);
  }
  return out;
}

// A row whose maximum is 0, with zeros of both signs: the warp's lanes may keep different zeros as the maximum, and
// the outputs are still the CPU kernel's bits, signs of zero outputs included. x - (+-0) is x for every x but a
// zero, whose term is e^(+-0) = 1 either way; the log-sum-exp is max + log(sum) with sum >= 1, so log(sum) >= +0 and
// -0 + log(sum) is +0 + log(sum). The other elements are -inf or below -104, whose terms are 0, so the sums are
// exact in any order and the check is bit for bit.
TEST(CudaSharedMath, AZeroRowMaximumGivesTheCpusOutputsWhicheverZeroEachLaneKeeps) {
  Rng r(9);
  int lanes_disagreed = 0;
  for (int64_t n : {1, 2, 31, 33, 64, 100, 1000}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> row(static_cast<size_t>(n));
      for (float& x : row) {
        const float u = r.uniform(0.0f, 1.0f);
        x = u < 0.3f ? 0.0f : u < 0.6f ? -0.0f : u < 0.9f ? -r.uniform(104.0f, 300.0f)
                                                         : -std::numeric_limits<float>::infinity();
      }
      row[static_cast<size_t>(trial) % row.size()] = trial % 2 ? 0.0f : -0.0f;  // the maximum is a zero
      // Do the lanes end with both zeros? (The case this test is about; counted, so it cannot pass vacuously.)
      const std::array<float, 32> mx = warp_row_maxima(row);
      lanes_disagreed += std::any_of(mx.begin(), mx.end(), [&](float m) { return bits(m) != bits(mx[0]); }) ? 1 : 0;
      const Tensor x = Tensor::from_floats({1, n}, row, DType::kFloat32);
      for (bool log : {false, true}) {
        const std::vector<float> want = (log ? log_softmax(x) : softmax(x)).to_floats();
        const std::vector<float> got = warp_softmax_row(row, log);
        for (int64_t j = 0; j < n; ++j)
          ASSERT_EQ(bits(got[static_cast<size_t>(j)]), bits(want[static_cast<size_t>(j)]))
              << "n=" << n << " trial " << trial << " log=" << log << " element " << j;
      }
    }
  }
  EXPECT_GT(lanes_disagreed, 0) << "no row left the lanes with both zeros";
}

TEST(CudaSharedMath, SparseCrossentropyFromLogitsGivesTheCpuKernelsBits) {
  for (DType dt : kFloatDTypes) {
    for (int64_t classes : kOddSizes) {
      const int64_t rows = 9;
      const Tensor x = testing::random_tensor({rows, classes}, 41 + static_cast<uint64_t>(classes), dt, -5.0f, 5.0f);
      std::vector<int32_t> label(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) label[static_cast<size_t>(r)] = static_cast<int32_t>((r * 7 + 3) % classes);
      const Tensor labels = Tensor::from_ints({rows}, label);
      const std::vector<float> z = x.to_floats();

      double total = 0;  // in row order, from 0, then the mean: the CPU kernel's sum
      for (int64_t r = 0; r < rows; ++r)
        total += shared::sparse_logits_row_loss(z.data() + r * classes, classes, label[static_cast<size_t>(r)]);
      const float loss = static_cast<float>(total / static_cast<double>(rows));
      EXPECT_EQ(bits(loss), bits(sparse_categorical_crossentropy(x, labels, true).item()))
          << dtype_name(dt) << " classes=" << classes;

      const float dloss = 0.75f;
      const float k = shared::crossentropy_grad_scale(dloss, rows);
      Tensor dz = Tensor::empty({rows, classes}, dt);
      std::vector<float> g(static_cast<size_t>(classes));
      for (int64_t r = 0; r < rows; ++r) {
        shared::sparse_logits_row_grad(z.data() + r * classes, classes, label[static_cast<size_t>(r)], k, g.data());
        for (int64_t j = 0; j < classes; ++j)
          shared::store_from_float(dz.raw(), shared::float_code(dt), r * classes + j, g[static_cast<size_t>(j)]);
      }
      EXPECT_TRUE(same_bits(dz, sparse_categorical_crossentropy_backward(x, labels, true, dloss)))
          << dtype_name(dt) << " classes=" << classes;
    }
  }
}

// The probability form's element steps (clipping included) against the CPU kernel with sparse labels.
TEST(CudaSharedMath, CrossentropyFromProbabilitiesGivesTheCpuKernelsBits) {
  const int64_t rows = 6, classes = 7;
  std::vector<float> p(static_cast<size_t>(rows * classes));
  Rng rng(5);
  for (float& v : p) v = rng.uniform(0.0f, 1.0f);
  p[0] = 0.0f;    // clipped up
  p[8] = 1.0f;    // clipped down
  p[15] = 1e-9f;  // clipped up
  const Tensor x = Tensor::from_floats({rows, classes}, p);
  const std::vector<int32_t> label = {0, 1, 1, 6, 3, 5};
  const Tensor labels = Tensor::from_ints({rows}, label);
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float w = 1.0f;
    total += shared::crossentropy_term(w, shared::clipped_log_prob(p[static_cast<size_t>(r * classes + label[r])]));
  }
  EXPECT_EQ(bits(static_cast<float>(total / rows)), bits(sparse_categorical_crossentropy(x, labels, false).item()));
  const float k = shared::crossentropy_grad_scale(2.0f, rows);
  const std::vector<float> want = sparse_categorical_crossentropy_backward(x, labels, false, 2.0f).to_floats();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < classes; ++j) {
      const size_t i = static_cast<size_t>(r * classes + j);
      EXPECT_EQ(bits(shared::crossentropy_probs_grad(p[i], j == label[r] ? 1.0f : 0.0f, k)), bits(want[i]))
          << "row " << r << " class " << j;
    }
}

// out (x's shape, out_dtype) = fn(i, x[i]) through the shared load and store, as an elementwise kernel does.
template <typename Fn>
Tensor by_elements(const Tensor& x, DType out_dtype, Fn&& fn) {
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), out_dtype);
  for (int64_t i = 0; i < x.numel(); ++i)
    shared::store_from_float(out.raw(), shared::float_code(out_dtype), i,
                             fn(i, shared::load_as_float(xc.raw(), shared::float_code(x.dtype()), i)));
  return out;
}

float element(const Tensor& t, int64_t i) {
  return shared::load_as_float(t.raw(), shared::float_code(t.dtype()), i);
}

// Inputs for the activations: a spread that reaches GELU's clamp and sigmoid's both branches, and the values
// where the element steps branch (zeros of both signs, infinities, NaN, subnormals, float16's limits).
Tensor activation_inputs(DType dt, uint64_t seed) {
  std::vector<float> v = random_tensor({4001}, seed, DType::kFloat32, -18.0f, 18.0f).to_floats();
  for (float f : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-41f, -1e-41f, 0.7517915f, -0.7517915f, 15.0f, -15.0f, 88.5f,
                  -88.5f, 65504.0f, -65504.0f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN()})
    v.push_back(f);
  return Tensor::from_floats({static_cast<int64_t>(v.size())}, v, dt);
}

const Activation kActivations[] = {Activation::kRelu, Activation::kGelu, Activation::kSigmoid, Activation::kTanh};

TEST(CudaSharedMath, ActivationsGiveTheCpuKernelsBits) {
  for (DType dt : kFloatDTypes) {
    const Tensor x = activation_inputs(dt, 61);
    for (Activation a : kActivations) {
      const Tensor got = by_elements(x, dt, [a](int64_t, float v) { return shared::activation_value(a, v); });
      EXPECT_TRUE(same_bits(got, activation(x, a))) << activation_name(a) << " " << dtype_name(dt);
    }
  }
}

TEST(CudaSharedMath, ActivationGradientsGiveTheCpuKernelsBits) {
  for (DType dt : kFloatDTypes) {
    const Tensor x = activation_inputs(dt, 71);
    // The gradient in dt, and in float32 against a 16-bit saved tensor (the kernel reads each in its own dtype).
    for (DType dy_dt : {dt, DType::kFloat32}) {
      const Tensor dy = random_tensor(x.shape(), 73, dy_dt, -3.0f, 3.0f);
      for (Activation a : kActivations) {
        const Tensor y = activation(x, a);
        const Tensor& saved = a == Activation::kRelu || a == Activation::kGelu ? x : y;
        const Tensor got = by_elements(dy, dy_dt, [&](int64_t i, float d) {
          return shared::activation_grad(a, d, element(saved, i));
        });
        EXPECT_TRUE(same_bits(got, activation_backward(dy, x, y, a)))
            << activation_name(a) << " dy " << dtype_name(dy_dt) << " saved " << dtype_name(dt);
      }
    }
  }
}

// The scalar exponential polynomial the GPU's GELU uses against the CPU's vector form, instantiated on float.
TEST(CudaSharedMath, ExpPolynomialMatchesTheCpuForm) {
  for (float r = -0.4f; r <= 0.4f; r += 1.0f / 4099) {
    float want = 0, scale = 0;
    cpu::expf_poly::exp_reduced(r, want);
    ASSERT_EQ(bits(shared::expf_poly::exp_reduced(r)), bits(want)) << r;
    const float t = static_cast<float>(static_cast<int>(r * 400)) + shared::expf_poly::kRound;
    cpu::expf_poly::pow2_of_rounded<float, uint32_t>(t, 64, scale);
    ASSERT_EQ(bits(shared::expf_poly::pow2_of_rounded(t, 64)), bits(scale)) << r;
  }
}

// The whole scalar exponential (attention's softmax rows on the GPU) against the CPU's vector form as a float,
// over its range, its clamps and the specials.
TEST(CudaSharedMath, ScalarExpGivesTheCpuVectorFormsBits) {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 88.0f, 88.5f, -87.0f, -87.5f, -200.0f, 1e30f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  for (float x = -90.0f; x <= 90.0f; x += 1.0f / 97) xs.push_back(x);
  for (float x : xs) {
    float want = 0;
    cpu::expf_poly::exp<float, uint32_t>(x, want);
    const float got = shared::expf_poly::exp(x);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << x;
      continue;
    }
    ASSERT_EQ(bits(got), bits(want)) << x;
  }
}

TEST(CudaSharedMath, AddScaleBiasAndDropoutGiveTheCpuKernelsBits) {
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      const Tensor a = random_tensor({3, n}, 81 + static_cast<uint64_t>(n), dt, -100.0f, 100.0f);
      for (DType b_dt : kFloatDTypes) {  // the second operand (and the bias) in any floating dtype
        const Tensor b = random_tensor({3, n}, 83 + static_cast<uint64_t>(n), b_dt, -0.01f, 0.01f);
        const Tensor sum = by_elements(a, dt, [&](int64_t i, float u) { return shared::add_rn(u, element(b, i)); });
        EXPECT_TRUE(same_bits(sum, add(a, b))) << dtype_name(dt) << " + " << dtype_name(b_dt) << " n=" << n;
        const Tensor bias = random_tensor({n}, 85 + static_cast<uint64_t>(n), b_dt, -3.0f, 3.0f);
        const Tensor biased =
            by_elements(a, dt, [&](int64_t i, float u) { return shared::add_rn(u, element(bias, i % n)); });
        EXPECT_TRUE(same_bits(biased, bias_add(a, bias))) << dtype_name(dt) << " bias " << dtype_name(b_dt);
      }
      const float s = 0.3f;
      EXPECT_TRUE(same_bits(by_elements(a, dt, [s](int64_t, float u) { return shared::mul_rn(u, s); }), scale(a, s)))
          << dtype_name(dt);
      Tensor mask = Tensor::empty({3, n}, DType::kUInt8);
      for (int64_t i = 0; i < mask.numel(); ++i) mask.data<uint8_t>()[i] = (i * 5 + 1) % 3 != 0;
      const float rate = 0.3f, keep_scale = 1.0f / (1.0f - rate);
      const Tensor dropped = by_elements(a, dt, [&](int64_t i, float u) {
        return shared::dropout_value(u, mask.data<uint8_t>()[i], keep_scale);
      });
      EXPECT_TRUE(same_bits(dropped, dropout(a, mask, rate))) << dtype_name(dt);
    }
  }
}

// Terms of mixed magnitudes, so that a different summation order changes the bits.
Tensor summands(const Shape& shape, uint64_t seed, DType dt) {
  std::vector<float> v = random_tensor(shape, seed, DType::kFloat32).to_floats();
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], static_cast<int>(i * 7 % 23) - 11);
  return Tensor::from_floats(shape, v, dt);
}

TEST(CudaSharedMath, SumRowsAndReduceSumAddInTheCpuKernelsOrder) {
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      const Tensor dy = summands({5, n, 9}, 91 + static_cast<uint64_t>(n), dt);
      // sum_rows: (5 n, 9) -> (9,) float32.
      const int64_t rows = 5 * n;
      Tensor want_rows = Tensor::empty({9}, DType::kFloat32);
      for (int64_t j = 0; j < 9; ++j)
        want_rows.data<float>()[j] = shared::blocked_row_sum(rows, [&](int64_t r) { return element(dy, r * 9 + j); });
      EXPECT_TRUE(same_bits(sum_rows(dy), want_rows)) << dtype_name(dt) << " n=" << n;
      // reduce_sum over each axis, into the input's dtype and into float32.
      for (int axis = 0; axis < 3; ++axis) {
        int64_t outer = 1, inner = 1;
        for (int d = 0; d < axis; ++d) outer *= dy.dim(d);
        for (int d = axis + 1; d < 3; ++d) inner *= dy.dim(d);
        const int64_t len = dy.dim(axis);
        for (DType out_dt : {dt, DType::kFloat32}) {
          const Tensor got = reduce_sum(dy, axis, false, out_dt);
          Tensor want = Tensor::empty(got.shape(), out_dt);
          for (int64_t idx = 0; idx < outer * inner; ++idx) {
            const int64_t base = idx / inner * len * inner + idx % inner;
            // lane_sum.h's order, which a GPU warp follows (cuda/reduce.cu).
            const float sum = shared::lane_sum(len, [&](int64_t k) { return element(dy, base + k * inner); });
            shared::store_from_float(want.raw(), shared::float_code(out_dt), idx, sum);
          }
          EXPECT_TRUE(same_bits(got, want)) << dtype_name(dt) << " -> " << dtype_name(out_dt) << " axis " << axis;
        }
      }
    }
  }
}

TEST(CudaSharedMath, NonfiniteTestCountsWhatTheCpuCounts) {
  for (DType dt : kFloatDTypes) {
    std::vector<float> v = random_tensor({300}, 97, DType::kFloat32, -70000.0f, 70000.0f).to_floats();
    v[3] = std::numeric_limits<float>::infinity();
    v[40] = -std::numeric_limits<float>::infinity();
    v[41] = std::numeric_limits<float>::quiet_NaN();
    v[299] = std::numeric_limits<float>::max();  // overflows float16, stays finite in bfloat16
    const Tensor x = Tensor::from_floats({300}, v, dt);
    int64_t got = 0;
    for (int64_t i = 0; i < x.numel(); ++i) got += shared::is_nonfinite(element(x, i)) ? 1 : 0;
    EXPECT_EQ(got, count_nonfinite(x)) << dtype_name(dt);
    EXPECT_GE(got, 3) << dtype_name(dt);
  }
}

// What a warp's butterfly (device::warp_sum) leaves in its lanes from their 32 partial sums: at each step lane i adds
// lane i ^ o's value to its own, as __shfl_xor_sync hands it over. Every lane must end with the same bits.
float warp_sum_emulated(std::array<float, shared::kSumLanes> v) {
  for (int o = shared::kSumLanes / 2; o > 0; o /= 2) {
    const std::array<float, shared::kSumLanes> before = v;
    for (int i = 0; i < shared::kSumLanes; ++i) v[static_cast<size_t>(i)] = shared::add_rn(before[static_cast<size_t>(i)], before[static_cast<size_t>(i ^ o)]);
  }
  for (int i = 1; i < shared::kSumLanes; ++i)
    EXPECT_EQ(shared::bits_of(v[static_cast<size_t>(i)]), shared::bits_of(v[0])) << "lane " << i;
  return v[0];
}

// A row sum as a warp computes it: each lane's partial sum (shared::lane_partial), then the butterfly.
template <typename Term>
float warp_row_sum(int64_t n, const Term& term) {
  std::array<float, shared::kSumLanes> v{};
  for (int l = 0; l < shared::kSumLanes; ++l) v[static_cast<size_t>(l)] = shared::lane_partial(n, l, term);
  return warp_sum_emulated(v);
}

// lane_sum, the CPU's one pass over the terms, gives the warp's bits; and it is a sum: within n - 1 float32 units
// of the sum of |terms| of the exact sum (the bound of any order).
TEST(CudaSharedMath, TheLanesSumGivesTheWarpsBitsAndIsASum) {
  for (int64_t n : {0, 1, 5, 31, 32, 33, 64, 100, 1000, 4099}) {
    const std::vector<float> t = summands({n}, 77 + static_cast<uint64_t>(n), DType::kFloat32).to_floats();
    const auto term = [&t](int64_t j) { return t[static_cast<size_t>(j)]; };
    const float cpu = shared::lane_sum(n, term);
    EXPECT_EQ(shared::bits_of(cpu), shared::bits_of(warp_row_sum(n, term))) << "n=" << n;
    double exact = 0.0, magnitude = 0.0;
    for (float v : t) {
      exact += v;
      magnitude += std::fabs(v);
    }
    EXPECT_LE(std::fabs(cpu - exact), static_cast<double>(n) * 0x1p-24 * magnitude + 1e-30) << "n=" << n;
  }
  EXPECT_EQ(shared::bits_of(shared::lane_sum(0, [](int64_t) { return 1.0f; })), shared::bits_of(0.0f)) << "+0";
}

// Layer normalization through the shared functions exactly as the GPU kernels call them (FloatView over the
// tensors' own storage, a row's sums in the warp's lanes then its butterfly, the column sums in blocks then in block
// order), against the CPU kernel.
struct LayerNormBySharedMath {
  Tensor y, mean, rstd, dx, dgamma, dbeta;
};

LayerNormBySharedMath layer_norm_by_shared_math(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                                const Tensor& dy) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  const float* gm = gamma.data<float>();
  const float* bt = beta.data<float>();
  const int xc = shared::float_code(x.dtype()), dyc = shared::float_code(dy.dtype());
  const float inv_d = shared::layer_norm_inv_d(d);
  LayerNormBySharedMath o{Tensor::empty(x.shape(), x.dtype()), Tensor::empty({rows}, DType::kFloat32),
                          Tensor::empty({rows}, DType::kFloat32), Tensor::empty(x.shape(), x.dtype()),
                          Tensor::empty({d}, DType::kFloat32), Tensor::empty({d}, DType::kFloat32)};
  float* mp = o.mean.data<float>();
  float* rp = o.rstd.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const shared::FloatView xr{x.raw(), xc, r * d}, dyr{dy.raw(), dyc, r * d};
    shared::LayerNormStats st;
    st.mean = shared::layer_norm_mean(warp_row_sum(d, [&](int64_t j) { return xr[j]; }), inv_d);
    st.rstd = shared::layer_norm_rstd(
        warp_row_sum(d, [&](int64_t j) { return shared::layer_norm_square_deviation(xr[j], st.mean); }), inv_d, eps);
    mp[r] = st.mean;
    rp[r] = st.rstd;
    for (int64_t j = 0; j < d; ++j)
      shared::store_from_float(o.y.raw(), xc, r * d + j,
                               shared::layer_norm_value(xr[j], st.mean, st.rstd, gm[j], bt[j]));
    const float sum_g = warp_row_sum(d, [&](int64_t j) { return shared::layer_norm_g(dyr[j], gm[j]); });
    const float sum_gx = warp_row_sum(d, [&](int64_t j) {
      return shared::layer_norm_gx(shared::layer_norm_g(dyr[j], gm[j]), shared::layer_norm_xhat(xr[j], st.mean, st.rstd));
    });
    const float mean_g = shared::mul_rn(sum_g, inv_d), mean_gx = shared::mul_rn(sum_gx, inv_d);
    for (int64_t j = 0; j < d; ++j) {
      const float xh = shared::layer_norm_xhat(xr[j], st.mean, st.rstd);
      const float g = shared::layer_norm_g(dyr[j], gm[j]);
      shared::store_from_float(o.dx.raw(), xc, r * d + j, shared::layer_norm_dx(g, xh, st.rstd, mean_g, mean_gx));
    }
  }
  const int64_t blocks = (rows + shared::kLayerNormRowsPerBlock - 1) / shared::kLayerNormRowsPerBlock;
  std::vector<float> partial(static_cast<size_t>(blocks * 2 * d));
  const shared::FloatView xv{x.raw(), xc, 0}, dyv{dy.raw(), dyc, 0};
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t j = 0; j < d; ++j) {
      const int64_t r0 = b * shared::kLayerNormRowsPerBlock;
      const int64_t r1 = std::min(rows, r0 + shared::kLayerNormRowsPerBlock);
      shared::layer_norm_column_block(xv, dyv, mp, rp, d, j, r0, r1, partial[static_cast<size_t>(b * 2 * d + j)],
                                      partial[static_cast<size_t>(b * 2 * d + d + j)]);
    }
  for (int64_t j = 0; j < d; ++j) {
    o.dgamma.data<float>()[j] =
        shared::ordered_sum(blocks, [&](int64_t b) { return partial[static_cast<size_t>(b * 2 * d + j)]; });
    o.dbeta.data<float>()[j] =
        shared::ordered_sum(blocks, [&](int64_t b) { return partial[static_cast<size_t>(b * 2 * d + d + j)]; });
  }
  return o;
}

TEST(CudaSharedMath, LayerNormGivesTheCpuKernelsBits) {
  constexpr float kEps = 1e-3f;
  for (DType dt : kFloatDTypes) {
    for (int64_t d : {1, 7, 17, 31, 129, 1000}) {
      // 130 rows: three blocks of the column sums, the last one short. A large offset for some sizes (the second
      // pass's deviations), and terms of mixed magnitudes, so that another summation order would show in the bits.
      for (int64_t rows : {1, 3, 130}) {
        const float offset = d == 17 || d == 129 ? 1000.0f : 0.0f;
        std::vector<float> xv = summands({rows, d}, 301 + static_cast<uint64_t>(d * rows), DType::kFloat32).to_floats();
        for (float& v : xv) v += offset;
        const Tensor x = Tensor::from_floats({rows, d}, xv, dt);
        const Tensor gamma = random_tensor({d}, 303, DType::kFloat32, 0.5f, 1.5f);
        const Tensor beta = random_tensor({d}, 305, DType::kFloat32);
        const LayerNormOutput want = layer_norm(x, gamma, beta, kEps);
        // The gradient in x's dtype and in float32 (the kernels read any floating dy).
        for (DType dy_dt : {dt, DType::kFloat32}) {
          const std::string what = std::string(dtype_name(dt)) + " dy " + dtype_name(dy_dt) + " (" +
                                   std::to_string(rows) + ", " + std::to_string(d) + ")";
          const Tensor dy = summands({rows, d}, 307 + static_cast<uint64_t>(d), dy_dt);
          const LayerNormBySharedMath got = layer_norm_by_shared_math(x, gamma, beta, kEps, dy);
          EXPECT_TRUE(same_bits(got.y, want.y)) << what;
          EXPECT_TRUE(same_bits(got.mean, want.mean)) << what;
          EXPECT_TRUE(same_bits(got.rstd, want.rstd)) << what;
          const LayerNormGrads g = layer_norm_backward(dy, x, want.mean, want.rstd, gamma, true);
          EXPECT_TRUE(same_bits(got.dx, g.dx)) << what;
          EXPECT_TRUE(same_bits(got.dgamma, g.dgamma)) << what;
          EXPECT_TRUE(same_bits(got.dbeta, g.dbeta)) << what;
          // Without dx the column sums are unchanged.
          const LayerNormGrads g2 = layer_norm_backward(dy, x, want.mean, want.rstd, gamma, false);
          EXPECT_TRUE(same_bits(got.dgamma, g2.dgamma)) << what;
          EXPECT_TRUE(same_bits(got.dbeta, g2.dbeta)) << what;
        }
      }
    }
  }
}

// The embedding backward as the GPU runs it (cuda/embedding.cu): (sort key, position) pairs sorted stably by key (CUB's
// radix sort is stable), each row's run marked, then each row's run summed in order.
template <typename Dy>
std::vector<float> embedding_backward_by_runs(const shared::IdView& ids, int64_t n, const Dy& dy, int64_t d,
                                              int64_t rows) {
  std::vector<uint64_t> keys(static_cast<size_t>(n));
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    keys[static_cast<size_t>(i)] = shared::embedding_sort_key(ids[i], rows);
    order[static_cast<size_t>(i)] = i;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return keys[static_cast<size_t>(a)] < keys[static_cast<size_t>(b)]; });
  std::vector<uint64_t> sorted(static_cast<size_t>(n));
  for (int64_t s = 0; s < n; ++s) sorted[static_cast<size_t>(s)] = keys[static_cast<size_t>(order[static_cast<size_t>(s)])];
  // One slot past the rows, which the sentinel key of a bad id must never mark.
  std::vector<int64_t> starts(static_cast<size_t>(rows + 1), 0), ends(static_cast<size_t>(rows + 1), 0);
  for (int64_t s = 0; s < n; ++s) shared::mark_embedding_run(sorted.data(), n, s, rows, starts.data(), ends.data());
  EXPECT_EQ(starts[static_cast<size_t>(rows)], 0);
  EXPECT_EQ(ends[static_cast<size_t>(rows)], 0);
  std::vector<float> out(static_cast<size_t>(rows * d));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < d; ++j) {
      float acc = 0.0f;
      for (int64_t s = starts[static_cast<size_t>(r)]; s < ends[static_cast<size_t>(r)]; ++s)
        acc = shared::embedding_grad_add(acc, dy[order[static_cast<size_t>(s)] * d + j]);
      out[static_cast<size_t>(r * d + j)] = acc;
    }
  return out;
}

// The radix sort's bits hold every key, the sentinel rows included, and no more than that needs.
TEST(CudaSharedMath, TheEmbeddingSortKeysFitTheirBits) {
  for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{255}, int64_t{256}, int64_t{50257},
                       int64_t{1} << 40, std::numeric_limits<int64_t>::max()}) {
    const int b = shared::embedding_key_bits(rows);
    EXPECT_TRUE(b == 64 || (static_cast<uint64_t>(rows) >> b) == 0) << "rows " << rows << " bits " << b;
    EXPECT_NE(static_cast<uint64_t>(rows) >> (b - 1), 0u) << "rows " << rows << " bits " << b;
  }
}

// Ids outside [0, rows) sort after every row's run and reach no row; rows no id names are zeros.
TEST(CudaSharedMath, TheEmbeddingBackwardsRunsLeaveBadIdsOut) {
  const int64_t rows = 6, d = 3;
  const std::vector<int64_t> id = {5, -1, 0, 5, 6, 2, 0, 5, -7, 2};
  const int64_t n = static_cast<int64_t>(id.size());
  const shared::IdView iv{id.data(), true};
  const Tensor dy = summands({n, d}, 331, DType::kFloat32);
  const shared::FloatView dv{dy.raw(), shared::kCodeFloat32, 0};
  const std::vector<float> got = embedding_backward_by_runs(iv, n, dv, d, rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < d; ++j)
      EXPECT_EQ(bits(got[static_cast<size_t>(r * d + j)]), bits(shared::embedding_grad_value(iv, n, dv, d, r, j)))
          << "row " << r << " column " << j;
  for (int64_t j = 0; j < d; ++j) EXPECT_EQ(bits(got[static_cast<size_t>(1 * d + j)]), bits(0.0f)) << "row 1";
}

// The gather converts each element once (a bit copy when the dtypes agree); the scatter-add sums each table row's
// positions from +0 in position order. Special values included: signed zeros (a lone -0 gradient sums to +0),
// infinities, subnormals, float16 overflow, NaN.
TEST(CudaSharedMath, EmbeddingGivesTheCpuKernelsBits) {
  const int64_t input_dim = 11;
  for (int64_t d : {1, 7, 33}) {
    std::vector<float> tv = random_tensor({input_dim, d}, 311, DType::kFloat32, -3.0f, 3.0f).to_floats();
    const float special[] = {-0.0f, std::numeric_limits<float>::infinity(), 1e-41f, 70000.0f,
                             std::numeric_limits<float>::quiet_NaN(), 1.00048828125f};
    for (size_t i = 0; i < std::size(special); ++i) tv[i * 5 % tv.size()] = special[i];
    for (int64_t n : {1, 17, 129}) {
      Rng rng(313 + static_cast<uint64_t>(n));
      std::vector<int64_t> id(static_cast<size_t>(n));
      for (int64_t& v : id) v = static_cast<int64_t>(rng.below(static_cast<uint64_t>(input_dim - 2)));  // 2 unnamed
      for (DType id_dt : {DType::kInt32, DType::kInt64}) {
        const Tensor ids = id_dt == DType::kInt64 ? Tensor::from_int64s({n}, id)
                                                  : Tensor::from_ints({n}, std::vector<int32_t>(id.begin(), id.end()));
        const shared::IdView iv{ids.raw(), id_dt == DType::kInt64};
        for (DType table_dt : kFloatDTypes) {
          const Tensor table = Tensor::from_floats({input_dim, d}, tv, table_dt);
          for (DType out_dt : kFloatDTypes) {
            Tensor want = Tensor::empty({n, d}, out_dt);
            for (int64_t i = 0; i < n; ++i)
              for (int64_t j = 0; j < d; ++j) {
                const int64_t src = iv[i] * d + j;
                if (table_dt == out_dt)
                  std::memcpy(static_cast<char*>(want.raw()) + (i * d + j) * dtype_size(out_dt),
                              static_cast<const char*>(table.raw()) + src * dtype_size(out_dt), dtype_size(out_dt));
                else
                  shared::store_from_float(want.raw(), shared::float_code(out_dt), i * d + j,
                                           shared::load_as_float(table.raw(), shared::float_code(table_dt), src));
              }
            EXPECT_TRUE(same_bits(embedding(ids, table, out_dt), want))
                << dtype_name(table_dt) << " -> " << dtype_name(out_dt) << " n=" << n << " d=" << d;
          }
        }
        for (DType dy_dt : kFloatDTypes) {
          std::vector<float> gv = summands({n, d}, 317 + static_cast<uint64_t>(n), DType::kFloat32).to_floats();
          gv[0] = -0.0f;
          const Tensor dy = Tensor::from_floats({n, d}, gv, dy_dt);
          const shared::FloatView dv{dy.raw(), shared::float_code(dy_dt), 0};
          Tensor want = Tensor::empty({input_dim, d}, DType::kFloat32);
          for (int64_t r = 0; r < input_dim; ++r)
            for (int64_t j = 0; j < d; ++j)
              want.data<float>()[r * d + j] = shared::embedding_grad_value(iv, n, dv, d, r, j);
          EXPECT_TRUE(same_bits(embedding_backward(dy, ids, input_dim), want))
              << "backward dy " << dtype_name(dy_dt) << " ids " << dtype_name(id_dt) << " n=" << n << " d=" << d;
          const std::vector<float> runs = embedding_backward_by_runs(iv, n, dv, d, input_dim);
          EXPECT_TRUE(same_bits(Tensor::from_floats({input_dim, d}, runs, DType::kFloat32), want))
              << "the GPU's runs, dy " << dtype_name(dy_dt) << " ids " << dtype_name(id_dt) << " n=" << n
              << " d=" << d;
        }
      }
    }
  }
}

// Adam's update on raw float32 spans, as the optimizer's fused pass runs it.
class AdamSpanProbe : public Adam {
 public:
  using Adam::Adam;
  void step(float* w, const float* g, float* m, float* v, int64_t n) { adam_step(w, g, m, v, n); }
};

TEST(CudaSharedMath, AdamUpdateGivesTheCpuAdamsBits) {
  const AdamOptions options{0.9, 0.999, 1e-7f};
  const float lr = 3e-3f;
  for (int64_t start : {0, 1, 9, 4000}) {
    AdamSpanProbe adam(lr, options);
    adam.set_iterations(start);
    const int64_t n = 129;
    Rng rng(static_cast<uint64_t>(start) + 3);
    std::vector<float> w(n), m(n), v(n);
    for (int64_t i = 0; i < n; ++i) {
      w[i] = rng.uniform(-1.0f, 1.0f);
      m[i] = start ? rng.uniform(-0.1f, 0.1f) : 0.0f;
      v[i] = start ? rng.uniform(0.0f, 0.01f) : 0.0f;
    }
    std::vector<float> w2 = w, m2 = m, v2 = v;
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g(n);
      for (float& x : g) x = rng.uniform(-2.0f, 2.0f);
      g[5] = 0.0f;
      g[6] = 1e-30f;  // a subnormal square
      adam.step(w.data(), g.data(), m.data(), v.data(), n);
      const shared::AdamCoefficients c =
          shared::adam_coefficients(lr, options.beta1, options.beta2, options.epsilon, adam.iterations());
      for (int64_t i = 0; i < n; ++i) shared::adam_update(w2[i], g[i], m2[i], v2[i], c);
      adam.set_iterations(adam.iterations() + 1);  // what apply() does after the update
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(bits(w2[i]), bits(w[i])) << "start " << start << " step " << step << " i " << i;
        ASSERT_EQ(bits(m2[i]), bits(m[i])) << "start " << start << " step " << step << " i " << i;
        ASSERT_EQ(bits(v2[i]), bits(v[i])) << "start " << start << " step " << step << " i " << i;
      }
    }
  }
}

// update_span of Adam and AdamW, public: what the optimizers' passes call on each block.
class AdamProbe : public Adam {
 public:
  using Adam::Adam;
  using Adam::update_span;
};
class AdamWProbe : public AdamW {
 public:
  using AdamW::AdamW;
  using AdamW::update_span;
};
class SgdProbe : public Sgd {
 public:
  using Sgd::Sgd;
  using Sgd::fused_rule;
  using Sgd::update_span;
};
class RMSpropProbe : public RMSprop {
 public:
  using RMSprop::fused_rule;
  using RMSprop::RMSprop;
  using RMSprop::slot_names;
  using RMSprop::update_span;
};

struct ResetIsa {
  ~ResetIsa() { set_isa_level_for_testing(std::nullopt); }
};

// Random values with edge values at fixed places: zeros of both signs, subnormals, values whose square overflows
// or underflows, the largest float, infinities and NaN (in gradients only when nan_and_inf).
std::vector<float> adam_values(int64_t n, uint64_t seed, float lo, float hi, bool nan_and_inf) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& e : x) e = rng.uniform(lo, hi);
  std::vector<float> edges = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-45f, 1.17549435e-38f, 1e20f, -1e20f,
                              std::numeric_limits<float>::max(), 3e-20f, 1.0f, -1.0f};
  if (nan_and_inf) {
    edges.insert(edges.end(), {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN()});
  }
  if (lo >= 0.0f) {  // second-moment slots are never negative
    for (float& e : edges) e = std::fabs(e);
  }
  for (size_t k = 0; k < edges.size(); ++k) x[(k * 7 + 3) % x.size()] = edges[k];
  return x;
}

// Bit for bit; two NaNs count as equal (which payload survives follows the operand order the compiler picks for a
// commutative operation, and the GPU returns its canonical NaN).
::testing::AssertionResult same_float(float want, float got) {
  if (bits(want) == bits(got) || (std::isnan(want) && std::isnan(got))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "want " << want << " (0x" << std::hex << bits(want) << "), got " << got
                                       << " (0x" << bits(got) << ")";
}

// The shared functions the fused update runs (ops/fused_update.h, on the CPU and the GPU) against the CPU optimizer's
// update_span at every instruction-set level this CPU runs, on lengths below and above its thread threshold: Adam,
// AdamW's decayed class and excluded class, from several iteration counts, with odd hyperparameters too.
TEST(CudaSharedMath, FusedAdamElementGivesUpdateSpansBitsAtEveryIsaLevel) {
  ResetIsa reset;
  struct Rule {
    AdamOptions options;
    float lr;
    float weight_decay;  // < 0: Adam; else AdamW
    int cls;
  };
  const std::vector<Rule> rules = {{{0.9, 0.999, 1e-7f}, 1e-3f, -1.0f, 0},
                                   {{0.5, 0.999999, 1e-3f}, 0.3f, -1.0f, 0},
                                   {{0.0, 0.0, 1e-8f}, 3e-2f, -1.0f, 0},
                                   {{0.9, 0.999, 1e-7f}, 1e-2f, 0.05f, 1},
                                   {{0.9, 0.99, 1e-6f}, 1e-2f, 0.004f, 0}};
  for (IsaLevel level : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (set_isa_level_for_testing(level) != level) {
      std::printf("[ note ] %s not supported here, not compared\n", isa_level_name(level));
      continue;
    }
    for (const Rule& rule : rules) {
      for (int64_t start : {0, 1, 9, 1000000}) {
        for (int64_t n : {37, 70001}) {
          SCOPED_TRACE(std::string(isa_level_name(level)) + " lr " + std::to_string(rule.lr) + " beta1 " +
                       std::to_string(rule.options.beta1) + " decay " + std::to_string(rule.weight_decay) +
                       " iterations " + std::to_string(start) + " n " + std::to_string(n));
          std::unique_ptr<Optimizer> opt;
          if (rule.weight_decay < 0)
            opt = std::make_unique<AdamProbe>(rule.lr, rule.options);
          else
            opt = std::make_unique<AdamWProbe>(rule.lr, rule.weight_decay, rule.options);
          opt->set_iterations(start);
          const uint64_t seed = static_cast<uint64_t>(start * 131 + n);
          std::vector<float> w = adam_values(n, seed, -2.0f, 2.0f, false);
          std::vector<float> m = adam_values(n, seed + 1, -0.1f, 0.1f, false);
          std::vector<float> v = adam_values(n, seed + 2, 0.0f, 0.01f, false);
          const std::vector<float> g = adam_values(n, seed + 3, -3.0f, 3.0f, true);
          std::vector<float> w2 = w, m2 = m, v2 = v;
          float* slots[2] = {m.data(), v.data()};
          if (rule.weight_decay < 0)
            static_cast<AdamProbe&>(*opt).update_span(w.data(), g.data(), slots, n, rule.cls);
          else
            static_cast<AdamWProbe&>(*opt).update_span(w.data(), g.data(), slots, n, rule.cls);

          const shared::AdamCoefficients c = shared::adam_coefficients(
              rule.lr, rule.options.beta1, rule.options.beta2, rule.options.epsilon, start);
          shared::UpdateGroupPointers p;
          p.values = w2.data();
          p.grads = g.data();
          p.slots[0] = m2.data();
          p.slots[1] = v2.data();
          UpdateConstants k;
          k.kind = UpdateKind::kAdam;
          k.one_minus_beta1 = c.one_minus_beta1;
          k.one_minus_beta2 = c.one_minus_beta2;
          k.epsilon = c.epsilon;
          k.weight_decay = rule.weight_decay;
          for (int64_t i = 0; i < n; ++i)
            shared::fused_update_element(p, i, k, c, rule.lr, false, 1.0f, rule.cls == 1, 0);
          for (int64_t i = 0; i < n; ++i) {
            const size_t k = static_cast<size_t>(i);
            ASSERT_TRUE(same_float(w[k], w2[k])) << "w[" << i << "], g " << g[k];
            ASSERT_TRUE(same_float(m[k], m2[k])) << "m[" << i << "], g " << g[k];
            ASSERT_TRUE(same_float(v[k], v2[k])) << "v[" << i << "], g " << g[k];
          }
        }
      }
    }
  }
}

// SGD and RMSprop in every form, the same way: the fused element (with the optimizer's own fused_rule() constants)
// against update_span at every instruction-set level (RMSprop's runs in the widest variant the level allows).
TEST(CudaSharedMath, FusedSgdAndRmspropElementsGiveUpdateSpansBitsAtEveryIsaLevel) {
  ResetIsa reset;
  struct Form {
    std::string name;
    std::function<std::unique_ptr<Optimizer>()> make;
  };
  const std::vector<Form> forms = {
      {"sgd", [] { return std::make_unique<SgdProbe>(0.1f); }},
      {"sgd momentum", [] { return std::make_unique<SgdProbe>(0.03f, 0.9f); }},
      {"sgd nesterov", [] { return std::make_unique<SgdProbe>(0.3f, 0.5f, true); }},
      {"rmsprop", [] { return std::make_unique<RMSpropProbe>(1e-3f); }},
      {"rmsprop momentum", [] { return std::make_unique<RMSpropProbe>(1e-2f, RMSpropOptions{0.8, 0.9, 1e-6f, false}); }},
      {"rmsprop centered", [] { return std::make_unique<RMSpropProbe>(1e-3f, RMSpropOptions{0.9, 0.0, 1e-7f, true}); }},
      {"rmsprop centered momentum",
       [] { return std::make_unique<RMSpropProbe>(3e-3f, RMSpropOptions{0.95, 0.5, 1e-3f, true}); }}};
  for (IsaLevel level : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (set_isa_level_for_testing(level) != level) continue;  // noted by the Adam test above
    for (const Form& form : forms) {
      for (int64_t n : {37, 70001}) {
        SCOPED_TRACE(std::string(isa_level_name(level)) + " " + form.name + " n " + std::to_string(n));
        std::unique_ptr<Optimizer> opt = form.make();
        const bool is_sgd = form.name.rfind("sgd", 0) == 0;
        const std::optional<UpdateConstants> rule =
            is_sgd ? static_cast<SgdProbe&>(*opt).fused_rule() : static_cast<RMSpropProbe&>(*opt).fused_rule();
        ASSERT_TRUE(rule.has_value());
        const int slot_n = slot_count(*rule);
        const uint64_t seed = static_cast<uint64_t>(n) * 17 + static_cast<uint64_t>(slot_n);
        std::vector<float> w = adam_values(n, seed, -2.0f, 2.0f, false);
        const std::vector<float> g = adam_values(n, seed + 3, -3.0f, 3.0f, true);
        // velocity (a square average: never negative), momentum, average gradient.
        std::vector<std::vector<float>> slots = {adam_values(n, seed + 1, is_sgd ? -0.1f : 0.0f, 0.1f, false),
                                                 adam_values(n, seed + 2, -0.1f, 0.1f, false),
                                                 adam_values(n, seed + 4, -0.05f, 0.05f, false)};
        slots.resize(static_cast<size_t>(slot_n));
        std::vector<float> w2 = w;
        std::vector<std::vector<float>> slots2 = slots;
        float* span_slots[3] = {};
        shared::UpdateGroupPointers p;
        p.values = w2.data();
        p.grads = g.data();
        for (int k = 0; k < slot_n; ++k) {
          span_slots[k] = slots[static_cast<size_t>(k)].data();
          p.slots[k] = slots2[static_cast<size_t>(k)].data();
        }
        if (is_sgd)
          static_cast<SgdProbe&>(*opt).update_span(w.data(), g.data(), span_slots, n, 0);
        else
          static_cast<RMSpropProbe&>(*opt).update_span(w.data(), g.data(), span_slots, n, 0);
        const float lr = opt->learning_rate();
        for (int64_t i = 0; i < n; ++i) shared::fused_update_element(p, i, *rule, {}, lr, false, 1.0f, false, 0);
        for (int64_t i = 0; i < n; ++i) {
          const size_t e = static_cast<size_t>(i);
          ASSERT_TRUE(same_float(w[e], w2[e])) << "w[" << i << "], g " << g[e];
          for (int k = 0; k < slot_n; ++k)
            ASSERT_TRUE(same_float(slots[static_cast<size_t>(k)][e], slots2[static_cast<size_t>(k)][e]))
                << "slot " << k << " [" << i << "], g " << g[e];
        }
      }
    }
  }
}

}  // namespace
}  // namespace mixtrain::ops
