// The arithmetic the CUDA kernels share with the CPU (src/ops/shared/), checked on the host against the
// library's own CPU code: casts against core's float16/bfloat16 conversions on every 16-bit pattern and every
// rounding boundary; softmax, log-softmax, their gradients and sparse cross-entropy against the CPU op kernels;
// the Adam element update against the CPU Adam. Each shared function follows its CPU counterpart's operation
// order, so every check is bit for bit. Runs everywhere, with or without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/softmax.h"
#include "mixtrain/optim/adam.h"
#include "op_test_util.h"
#include "ops/shared/adam_update.h"
#include "ops/shared/crossentropy_row.h"
#include "ops/shared/float16_convert.h"
#include "ops/shared/softmax_row.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::kOddSizes;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Float32 inputs that probe every rounding decision of a 16-bit conversion: each 16-bit value widened, the
// midpoints to its upper neighbour and the floats just beside them, plus a sweep over all float32 exponents.
std::vector<float> rounding_probes(bool bf16) {
  std::vector<float> out;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const uint32_t lo = bits(bf16 ? shared::bfloat16_to_float(b) : shared::half_to_float(b));
    const uint32_t hi = bits(bf16 ? shared::bfloat16_to_float(static_cast<uint16_t>(b + 1))
                                  : shared::half_to_float(static_cast<uint16_t>(b + 1)));
    for (uint32_t u : {lo, lo + 1, lo - 1}) out.push_back(shared::float_of(u));
    if ((lo & 0x7F800000u) == 0x7F800000u || (hi & 0x7F800000u) == 0x7F800000u || (lo >> 31) != (hi >> 31)) continue;
    // Same sign, both finite: the midpoint (exact in double, and in float32 for both formats' spacings).
    const float mid =
        static_cast<float>((static_cast<double>(shared::float_of(lo)) + static_cast<double>(shared::float_of(hi))) / 2);
    const uint32_t m = bits(mid);
    for (uint32_t u : {m, m + 1, m - 1}) out.push_back(shared::float_of(u));
  }
  // Every float32 exponent (and float16's subnormal and overflow ranges) with assorted significands.
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4093) out.push_back(shared::float_of(static_cast<uint32_t>(u)));
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.98e-8f, 5.96e-8f, 6.1e-5f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::max()})
    out.push_back(f);
  return out;
}

TEST(CudaSharedMath, WideningMatchesCoreOnEvery16BitPattern) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> f16(65536), bf16(65536);
  convert_elements(all.data(), DType::kFloat16, f16.data(), DType::kFloat32, 65536);
  convert_elements(all.data(), DType::kBFloat16, bf16.data(), DType::kFloat32, 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    ASSERT_EQ(bits(shared::half_to_float(b)), bits(half_bits_to_float(b))) << std::hex << h;
    ASSERT_EQ(bits(shared::half_to_float(b)), bits(f16[h])) << std::hex << h;
    ASSERT_EQ(bits(shared::bfloat16_to_float(b)), bits(bf16_bits_to_float(b))) << std::hex << h;
    ASSERT_EQ(bits(shared::bfloat16_to_float(b)), bits(bf16[h])) << std::hex << h;
  }
}

TEST(CudaSharedMath, NarrowingMatchesCoreAtEveryRoundingBoundary) {
  for (bool bf16 : {false, true}) {
    const std::vector<float> in = rounding_probes(bf16);
    // The array conversion the CPU ops use (F16C where the CPU has it) and the scalar rule.
    std::vector<uint16_t> bulk(in.size());
    convert_elements(in.data(), DType::kFloat32, bulk.data(), bf16 ? DType::kBFloat16 : DType::kFloat16,
                     static_cast<int64_t>(in.size()));
    for (size_t i = 0; i < in.size(); ++i) {
      const uint16_t got = bf16 ? shared::float_to_bfloat16(in[i]) : shared::float_to_half(in[i]);
      const uint16_t scalar = bf16 ? float_to_bf16_bits(in[i]) : float_to_half_bits(in[i]);
      ASSERT_EQ(got, scalar) << (bf16 ? "bfloat16" : "float16") << " of float bits " << std::hex << bits(in[i]);
      ASSERT_EQ(got, bulk[i]) << (bf16 ? "bfloat16" : "float16") << " of float bits " << std::hex << bits(in[i]);
    }
  }
}

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

}  // namespace
}  // namespace mixtrain::ops
