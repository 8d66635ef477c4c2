// The tiled attention's CUDA kernels (src/ops/cuda/flash_attention.cu) against their host driver
// (flash_attention_rows_driver.h: the same row functions, so the same bits wherever no logarithm enters) and against
// the CPU kernel. Skips without a GPU (MIXTRAIN_REQUIRE_GPU=1, set by scripts/gpu-check.sh, makes the skip a
// failure). The kernels need no cuBLASLt.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention_reference.h"
#include "cuda_test_util.h"
#include "flash_attention_rows_driver.h"
#include "mixtrain/ops/flash_attention.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::unit;
using namespace attention_reference;

const Case kCases[] = {
    {{1, 1, 1, 1, 8, 8}, false, 0.0f},     {{2, 7, 7, 3, 8, 8}, true, 0.0f},    {{1, 7, 17, 2, 16, 12}, false, 0.25f},
    {{2, 17, 17, 2, 32, 32}, true, 0.2f},  {{1, 129, 129, 1, 64, 48}, true, 0.1f}, {{2, 70, 259, 2, 8, 8}, false, 0.0f},
    {{1, 5, 33, 3, 8, 5}, true, 0.2f},     {{1, 0, 5, 2, 8, 8}, false, 0.0f},
};

constexpr uint64_t kDropoutSeed = 99;

// |got - want| <= units * (mag + |want|) + the dtype's subnormal step, element by element (got read back).
void expect_near(const Tensor& got, const Tensor& want, const std::vector<double>& mag, double units, DType dt,
                 const std::string& what) {
  const std::vector<float> x = to_device(got, Device::cpu()).to_floats(), y = want.to_floats();
  ASSERT_EQ(x.size(), y.size()) << what;
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(x[i], y[i], units * (mag[i] + std::fabs(y[i])) + testing::subnormal_step(dt)) << what << " " << i;
}

TEST(CudaFlashAttention, IsSupportedOnTheGpu) {
  REQUIRE_CUDA_BACKEND();
  EXPECT_TRUE(flash_attention_supported(kGpu));
  EXPECT_TRUE(flash_attention_preferred(kGpu, 129));
  EXPECT_FALSE(flash_attention_preferred(kGpu, 128));
}

// The output is acc / l, no logarithm: the host driver's bits. lse = m + log(l): glibc's logf and CUDA's may differ
// in the last place, so 8 float32 units of |lse| + 1. The backward, given the same out and lse, takes no logarithm
// either: the host driver's bits for dq, dk and dv.
TEST(CudaFlashAttention, ForwardAndBackwardGiveTheHostDriversBits) {
  REQUIRE_CUDA_BACKEND();
  for (DType dt : kFloatDTypes)
    for (const Case& c : kCases) {
      const Geo& g = c.g;
      const AttentionOptions o = options_of(c, kDropoutSeed);
      const std::string what = name_of(dt, c);
      const Tensor q = random_tensor({g.b, g.t, g.h * g.dk}, 31, dt, -1.5f, 1.5f);
      const Tensor k = random_tensor({g.b, g.s, g.h * g.dk}, 32, dt, -1.5f, 1.5f);
      const Tensor v = random_tensor({g.b, g.s, g.h * g.dv}, 33, dt), dout = random_tensor({g.b, g.t, g.h * g.dv}, 34, dt);
      const FlashAttentionOutput host = flash_rows_driver::forward(q, k, v, o);
      const FlashAttentionOutput dev = flash_attention(gpu(q), gpu(k), gpu(v), o);
      EXPECT_EQ(dev.out.device(), kGpu) << what;
      EXPECT_TRUE(bit_equal(dev.out, host.out)) << what << " out";
      const std::vector<float> ld = to_device(dev.lse, Device::cpu()).to_floats(), lh = host.lse.to_floats();
      ASSERT_EQ(ld.size(), lh.size()) << what;
      for (size_t i = 0; i < ld.size(); ++i)
        ASSERT_NEAR(ld[i], lh[i], 8 * 0x1p-24 * (std::fabs(lh[i]) + 1)) << what << " lse " << i;
      const AttentionGrads gh = flash_rows_driver::backward(dout, q, k, v, host.out, host.lse, o);
      const AttentionGrads gd =
          flash_attention_backward(gpu(dout), gpu(q), gpu(k), gpu(v), gpu(host.out), gpu(host.lse), o);
      EXPECT_TRUE(bit_equal(gd.dq, gh.dq)) << what << " dq";
      EXPECT_TRUE(bit_equal(gd.dk, gh.dk)) << what << " dk";
      EXPECT_TRUE(bit_equal(gd.dv, gh.dv)) << what << " dv";
    }
}

// Against the CPU kernel (the tolerances of tests/ops/flash_attention_rows_test.cpp, where the host driver meets
// them: 64 float32 units of the terms' magnitude in float32; 3 units of the compute dtype for the output, 6 for the
// gradients in 16-bit), each backward from its own forward, on inputs that are multiples of 1/4 (both sides round
// the same logits); and a float32 gradient for 16-bit inputs, cast on the GPU first.
TEST(CudaFlashAttention, MatchesTheCpuKernel) {
  REQUIRE_CUDA_BACKEND();
  for (DType dt : kFloatDTypes)
    for (const Case& c : kCases) {
      const Geo& g = c.g;
      const AttentionOptions o = options_of(c, kDropoutSeed);
      const std::string what = name_of(dt, c);
      using flash_rows_driver::quarter_tensor;  // both sides round the same logits
      const Tensor q = quarter_tensor({g.b, g.t, g.h * g.dk}, 41, dt), k = quarter_tensor({g.b, g.s, g.h * g.dk}, 42, dt);
      const Tensor v = quarter_tensor({g.b, g.s, g.h * g.dv}, 43, dt);
      const Tensor dout = quarter_tensor({g.b, g.t, g.h * g.dv}, 44, DType::kFloat32);
      const Reference r = reference(g, q.to_floats(), k.to_floats(), v.to_floats(), dout.to(dt).to_floats(), o);
      const FlashAttentionOutput cpu = flash_attention(q, k, v, o);
      const FlashAttentionOutput dev = flash_attention(gpu(q), gpu(k), gpu(v), o);
      const double out_units = dt == DType::kFloat32 ? 64 * 0x1p-24 : 3 * unit(dt);
      const double grad_units = dt == DType::kFloat32 ? 64 * 0x1p-24 : 6 * unit(dt);
      expect_near(dev.out, cpu.out, r.out_mag, out_units, dt, what + " out");
      const AttentionGrads gc = flash_attention_backward(dout, q, k, v, cpu.out, cpu.lse, o);
      const AttentionGrads gd = flash_attention_backward(gpu(dout), gpu(q), gpu(k), gpu(v), dev.out, dev.lse, o);
      expect_near(gd.dq, gc.dq, r.dq_mag, grad_units, dt, what + " dq");
      expect_near(gd.dk, gc.dk, r.dk_mag, grad_units, dt, what + " dk");
      expect_near(gd.dv, gc.dv, r.dv_mag, grad_units, dt, what + " dv");
    }
}

}  // namespace
}  // namespace mixtrain::ops
