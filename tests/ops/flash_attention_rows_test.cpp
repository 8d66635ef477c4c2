// The GPU tiled attention's arithmetic (src/ops/shared/flash_attention_rows.h) driven on the host as its kernels
// drive it (flash_attention_rows_driver.h: one row at a time, 64-column key tiles), on any machine: against the
// float64 reference of attention_reference.h (the bound the CPU kernel meets), against the CPU kernel
// (ops::flash_attention), and the dropout mask element by element. Odd shapes: T = 1, 7, 17, 129 (past two key
// tiles), head sizes 8 to 64, causal and not, T < S, dropout on.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention_reference.h"
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
    {{1, 1, 1, 1, 8, 8}, false, 0.0f},       {{2, 1, 1, 2, 8, 16}, true, 0.0f},
    {{2, 7, 7, 3, 8, 8}, true, 0.0f},        {{1, 7, 17, 2, 16, 12}, false, 0.25f},
    {{2, 17, 17, 2, 32, 32}, true, 0.2f},    {{1, 17, 65, 1, 64, 64}, true, 0.0f},
    {{1, 129, 129, 1, 64, 48}, true, 0.1f},  {{1, 129, 130, 2, 24, 8}, false, 0.0f},
    {{1, 1, 129, 2, 8, 8}, true, 0.3f},
};

constexpr uint64_t kDropoutSeed = 4321;

struct Inputs {
  Tensor q, k, v, dout;
};
Inputs inputs_of(const Geo& g, DType dt) {
  return {random_tensor({g.b, g.t, g.h * g.dk}, 11, dt, -1.5f, 1.5f),
          random_tensor({g.b, g.s, g.h * g.dk}, 12, dt, -1.5f, 1.5f), random_tensor({g.b, g.s, g.h * g.dv}, 13, dt),
          random_tensor({g.b, g.t, g.h * g.dv}, 14, dt)};
}

// The float64 reference's bound (attention_reference.h's tolerance), which the CPU kernel meets too.
TEST(FlashAttentionRows, HostDrivenKernelsMatchFloat64InEveryDType) {
  for (DType dt : kFloatDTypes)
    for (const Case& c : kCases) {
      const Geo& g = c.g;
      const AttentionOptions o = options_of(c, kDropoutSeed);
      const std::string what = name_of(dt, c);
      const Inputs in = inputs_of(g, dt);
      const Reference r = reference(g, in.q.to_floats(), in.k.to_floats(), in.v.to_floats(), in.dout.to_floats(), o);
      const FlashAttentionOutput a = flash_rows_driver::forward(in.q, in.k, in.v, o);
      expect_close(a.out.to_floats(), r.out, r.out_mag, dt, g, r.max_logit, what + " out");
      const AttentionGrads gr = flash_rows_driver::backward(in.dout, in.q, in.k, in.v, a.out, a.lse, o);
      expect_close(gr.dq.to_floats(), r.dq, r.dq_mag, dt, g, r.max_logit, what + " dq");
      expect_close(gr.dk.to_floats(), r.dk, r.dk_mag, dt, g, r.max_logit, what + " dk");
      expect_close(gr.dv.to_floats(), r.dv, r.dv_mag, dt, g, r.max_logit, what + " dv");
    }
}

// Against the CPU kernel on the same inputs and mask. Both round the unnormalised probabilities, but their tiles
// differ (64 columns against 128: the running maximum, and so the scale at which p is rounded, moves at other
// columns), the sums run in another order, and the CPU's rescaling factor is std::exp where the rows take the
// polynomial: float32 differs by float32 rounding (64 units of 2^-24 of the terms' magnitude plus the value's),
// 16-bit by a few units of the compute dtype (3 for the output and lse, 6 for the gradients, as the CPU kernel is
// held to against scaled_dot_product_attention). The inputs are multiples of 1/4 (quarter_tensor), so both sides
// round the same logits.
TEST(FlashAttentionRows, HostDrivenKernelsMatchTheCpuKernel) {
  using flash_rows_driver::quarter_tensor;
  for (DType dt : kFloatDTypes)
    for (const Case& c : kCases) {
      const Geo& g = c.g;
      const AttentionOptions o = options_of(c, kDropoutSeed);
      const std::string what = name_of(dt, c);
      const Inputs in{quarter_tensor({g.b, g.t, g.h * g.dk}, 15, dt), quarter_tensor({g.b, g.s, g.h * g.dk}, 16, dt),
                      quarter_tensor({g.b, g.s, g.h * g.dv}, 17, dt), quarter_tensor({g.b, g.t, g.h * g.dv}, 18, dt)};
      const Reference r = reference(g, in.q.to_floats(), in.k.to_floats(), in.v.to_floats(), in.dout.to_floats(), o);
      const FlashAttentionOutput rows = flash_rows_driver::forward(in.q, in.k, in.v, o);
      const FlashAttentionOutput cpu = flash_attention(in.q, in.k, in.v, o);
      // Both backwards read the CPU's forward, so the gradients compare the backward alone.
      const AttentionGrads grows = flash_rows_driver::backward(in.dout, in.q, in.k, in.v, cpu.out, cpu.lse, o);
      const AttentionGrads gcpu = flash_attention_backward(in.dout, in.q, in.k, in.v, cpu.out, cpu.lse, o);
      const double out_units = dt == DType::kFloat32 ? 64 * 0x1p-24 : 3 * unit(dt);
      const double grad_units = dt == DType::kFloat32 ? 64 * 0x1p-24 : 6 * unit(dt);
      auto check = [&](const Tensor& got, const Tensor& want, const std::vector<double>& mag, double units,
                       const char* which) {
        const std::vector<float> x = got.to_floats(), y = want.to_floats();
        ASSERT_EQ(x.size(), y.size()) << what << " " << which;
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_NEAR(x[i], y[i], units * (mag[i] + std::fabs(y[i])) + testing::subnormal_step(dt))
              << what << " " << which << " element " << i;
      };
      check(rows.out, cpu.out, r.out_mag, out_units, "out");
      // lse: a float32 log of a sum of rounded (16-bit) or float32 exponentials; relative to |lse| + 1.
      const std::vector<float> lr = rows.lse.to_floats(), lc = cpu.lse.to_floats();
      ASSERT_EQ(lr.size(), lc.size()) << what;
      for (size_t i = 0; i < lr.size(); ++i)
        ASSERT_NEAR(lr[i], lc[i], 64 * 0x1p-24 * (std::fabs(lc[i]) + 1)) << what << " lse element " << i;
      check(grows.dq, gcpu.dq, r.dq_mag, grad_units, "dq");
      check(grows.dk, gcpu.dk, r.dk_mag, grad_units, "dk");
      check(grows.dv, gcpu.dv, r.dv_mag, grad_units, "dv");
    }
}

// The mask itself: with q = 0 every probability of a row is 1 / S, and with v the identity the output row is the
// dropped probabilities, so output (i, j) is zero exactly where attention_dropout_keep drops (i, j), the CPU
// kernels' hash at the same flat (batch, head, row, column) index; S = 140 crosses two 64-column tiles.
TEST(FlashAttentionRows, DropsTheElementsTheCpuKernelsDrop) {
  const int64_t t = 19, s = 140;
  const DropoutMaskInputs in = dropout_mask_inputs(t, s, 8, 5);
  AttentionOptions o;
  o.dropout_rate = 0.4f;
  o.dropout_seed = 77;
  expect_the_dropout_mask({flash_rows_driver::forward(in.q, in.k, in.v, o).out.to_floats(),
                           flash_attention(in.q, in.k, in.v, o).out.to_floats()},
                          t, s, 77, 0.4f, 0.03);
}

// A causal row visits only the key tiles up to its last column: a huge value in a masked column changes nothing
// (a tile past the row's end would turn it into a NaN or an infinity).
TEST(FlashAttentionRows, CausalRowsNeverReadMaskedColumns) {
  const int64_t t = 129, s = 129, dk = 8;
  Tensor q = random_tensor({1, t, dk}, 21, DType::kFloat32), k = random_tensor({1, s, dk}, 22, DType::kFloat32);
  Tensor v = random_tensor({1, s, dk}, 23, DType::kFloat32);
  AttentionOptions o;
  o.causal = true;
  o.scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const FlashAttentionOutput before = flash_rows_driver::forward(q, k, v, o);
  // Key and value row 128 (the third 64-column tile) seen only by the last query row.
  std::vector<float> kv = k.to_floats(), vv = v.to_floats();
  for (int64_t c = 0; c < dk; ++c) kv[static_cast<size_t>(128 * dk + c)] = 1e30f, vv[static_cast<size_t>(128 * dk + c)] = NAN;
  const FlashAttentionOutput after =
      flash_rows_driver::forward(q, Tensor::from_floats(k.shape(), kv), Tensor::from_floats(v.shape(), vv), o);
  const std::vector<float> a = before.out.to_floats(), b = after.out.to_floats();
  for (int64_t i = 0; i < (t - 1) * dk; ++i) ASSERT_EQ(a[static_cast<size_t>(i)], b[static_cast<size_t>(i)]) << i;
  EXPECT_TRUE(std::isnan(b[static_cast<size_t>((t - 1) * dk)]));  // the last row does read it
}

}  // namespace
}  // namespace mixtrain::ops
