// The tiled attention (ops/flash_attention.h) against the float64 reference of attention_reference.h in every floating
// dtype, causal and not, T != S, sizes that are not multiples of the tile, with dropout; against today's
// scaled_dot_product_attention (float32 rounding in float32, a few units in the last place in 16-bit); the dropout
// mask equal to today's; bit-identical results for 1 and 2 threads; finite differences; views; bad arguments.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "mixtrain/ops/flash_attention.h"

#include "attention_reference.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::unit;
using namespace attention_reference;

// Small shapes, then ones that cross the 128-row and 128-column tiles at odd places.
const Case kCases[] = {
    {{1, 1, 1, 1, 1, 1}, false, 0.0f},     {{1, 1, 1, 1, 1, 1}, true, 0.0f},      {{2, 7, 7, 3, 5, 5}, true, 0.0f},
    {{2, 7, 17, 2, 4, 3}, false, 0.0f},    {{1, 17, 17, 2, 8, 8}, false, 0.3f},   {{2, 17, 17, 1, 7, 9}, true, 0.25f},
    {{1, 1, 17, 2, 4, 4}, true, 0.0f},     {{2, 5, 17, 1, 7, 9}, true, 0.25f},    {{1, 129, 129, 1, 17, 17}, true, 0.1f},
    {{1, 130, 257, 2, 16, 12}, false, 0.0f}, {{1, 65, 300, 1, 9, 9}, true, 0.0f},  {{1, 200, 200, 1, 32, 32}, true, 0.0f},
    {{2, 70, 259, 1, 8, 8}, false, 0.2f},  {{1, 257, 257, 1, 8, 8}, true, 0.15f},
};

constexpr uint64_t kDropoutSeed = 1234;

struct Inputs {
  Tensor q, k, v, dout;
};
Inputs inputs_of(const Geo& g, DType dt) {
  return {random_tensor({g.b, g.t, g.h * g.dk}, 1, dt, -1.5f, 1.5f), random_tensor({g.b, g.s, g.h * g.dk}, 2, dt, -1.5f, 1.5f),
          random_tensor({g.b, g.s, g.h * g.dv}, 3, dt), random_tensor({g.b, g.t, g.h * g.dv}, 4, dt)};
}

// The error bound of attention_reference.h (the one today's op meets), for both results.
TEST(FlashAttention, ForwardAndBackwardMatchFloat64InEveryDType) {
  for (DType dt : kFloatDTypes)
    for (const Case& c : kCases) {
      const Geo& g = c.g;
      const AttentionOptions o = options_of(c, kDropoutSeed);
      const std::string what = name_of(dt, c);
      const Inputs in = inputs_of(g, dt);
      const Reference r = reference(g, in.q.to_floats(), in.k.to_floats(), in.v.to_floats(), in.dout.to_floats(), o);
      const FlashAttentionOutput a = flash_attention(in.q, in.k, in.v, o);
      ASSERT_EQ(a.out.dtype(), dt) << what;
      ASSERT_EQ(a.out.shape(), (Shape{g.b, g.t, g.h * g.dv})) << what;
      ASSERT_EQ(a.lse.dtype(), DType::kFloat32) << what;
      ASSERT_EQ(a.lse.shape(), (Shape{g.b, g.h, g.t})) << what;
      expect_close(a.out.to_floats(), r.out, r.out_mag, dt, g, r.max_logit, what + " out");
      const AttentionGrads gr = flash_attention_backward(in.dout, in.q, in.k, in.v, a.out, a.lse, o);
      ASSERT_EQ(gr.dq.dtype(), dt) << what;
      ASSERT_EQ(gr.dk.shape(), in.k.shape()) << what;
      expect_close(gr.dq.to_floats(), r.dq, r.dq_mag, dt, g, r.max_logit, what + " dq");
      expect_close(gr.dk.to_floats(), r.dk, r.dk_mag, dt, g, r.max_logit, what + " dk");
      expect_close(gr.dv.to_floats(), r.dv, r.dv_mag, dt, g, r.max_logit, what + " dv");
    }
}

// Against today's op on the same inputs, seed and mask: float32 differs by float32 rounding only (the sums run in
// another order: 64 units of 2^-24 of the terms' magnitude); 16-bit by a few units of the compute dtype (today rounds
// the normalised probabilities, the tiles the unnormalised ones; the backward's row dot is rowsum(dout * out) from the
// rounded output rather than rowsum(dp * p)): 3 units of the terms' magnitude for the output, 6 for the gradients.
TEST(FlashAttention, MatchesTodaysAttention) {
  for (DType dt : kFloatDTypes)
    for (const Case& c : kCases) {
      const Geo& g = c.g;
      const AttentionOptions o = options_of(c, kDropoutSeed);
      const std::string what = name_of(dt, c);
      const Inputs in = inputs_of(g, dt);
      const Reference r = reference(g, in.q.to_floats(), in.k.to_floats(), in.v.to_floats(), in.dout.to_floats(), o);
      const FlashAttentionOutput a = flash_attention(in.q, in.k, in.v, o);
      const AttentionOutput today = scaled_dot_product_attention(in.q, in.k, in.v, o);
      const AttentionGrads gf = flash_attention_backward(in.dout, in.q, in.k, in.v, a.out, a.lse, o);
      const AttentionGrads gt = scaled_dot_product_attention_backward(in.dout, in.q, in.k, in.v, today.probs, o);
      const double out_units = dt == DType::kFloat32 ? 64 * 0x1p-24 : 3 * unit(dt);
      const double grad_units = dt == DType::kFloat32 ? 64 * 0x1p-24 : 6 * unit(dt);
      auto check = [&](const Tensor& got, const Tensor& want, const std::vector<double>& mag, double units,
                       const char* which) {
        const std::vector<float> x = got.to_floats(), y = want.to_floats();
        ASSERT_EQ(x.size(), y.size());
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_NEAR(x[i], y[i], units * (mag[i] + std::fabs(y[i])) + testing::subnormal_step(dt))
              << what << " " << which << " element " << i;
      };
      check(a.out, today.out, r.out_mag, out_units, "out");
      check(gf.dq, gt.dq, r.dq_mag, grad_units, "dq");
      check(gf.dk, gt.dk, r.dk_mag, grad_units, "dk");
      check(gf.dv, gt.dv, r.dv_mag, grad_units, "dv");
    }
}

// The mask itself: with q = 0 every probability of a row is 1 / S, and with v the identity the output row is the
// dropped probabilities, so output (i, j) is zero exactly where attention_dropout_keep (today's mask) drops (i, j).
TEST(FlashAttention, DropsTheSameElementsAsTodaysAttention) {
  const int64_t t = 150, s = 140;
  const DropoutMaskInputs in = dropout_mask_inputs(t, s, 4, 5);
  AttentionOptions o;
  o.dropout_rate = 0.4f;
  o.dropout_seed = 77;
  expect_the_dropout_mask({flash_attention(in.q, in.k, in.v, o).out.to_floats(),
                           scaled_dot_product_attention(in.q, in.k, in.v, o).out.to_floats()},
                          t, s, 77, 0.4f, 0.02);
}

// Bit-identical forward and backward with 1 and 2 threads (more tasks than threads, and a shape that runs in
// parallel), from views of one fused projection written back into views of one gradient.
TEST(FlashAttention, ResultsDoNotDependOnTheThreadCountAndReadViews) {
  const int64_t b = 2, t = 150, h = 3, d = 16, w = h * d;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Tensor qkv = random_tensor({b, t, 3 * w}, 31, dt, -1.5f, 1.5f), dout = random_tensor({b, t, w}, 32, dt);
    const Tensor q = qkv.slice(2, 0, w), k = qkv.slice(2, w, 2 * w), v = qkv.slice(2, 2 * w, 3 * w);
    AttentionOptions o;
    o.num_heads = h;
    o.causal = true;
    o.scale = 0.3f;
    o.dropout_rate = 0.2f;
    o.dropout_seed = 99;
    const int saved = omp_get_max_threads();
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      const FlashAttentionOutput a = flash_attention(q, k, v, o);
      Tensor g = Tensor::empty(qkv.shape(), dt);
      Tensor dq = g.slice(2, 0, w), dk = g.slice(2, w, 2 * w), dv = g.slice(2, 2 * w, 3 * w);
      flash_attention_backward_into(dout, q, k, v, a.out, a.lse, o, dq, dk, dv);
      std::vector<float> all;
      for (const Tensor& x : {a.out, a.lse, g}) {
        const std::vector<float> f = x.to_floats();
        all.insert(all.end(), f.begin(), f.end());
      }
      results.push_back(all);
      // The views give what contiguous copies give.
      const AttentionGrads c = flash_attention_backward(dout, q.contiguous(), k.contiguous(), v.contiguous(), a.out,
                                                        a.lse, o);
      EXPECT_EQ(c.dk.to_floats(), dk.contiguous().to_floats()) << dtype_name(dt);
    }
    omp_set_num_threads(saved);
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float))) << dtype_name(dt);
  }
}

// The last n rows of a causal window asked for alone (queries as the last positions of the keys, as a generation
// cache's step asks) give the bits those rows have in the whole window's call, for 1 to 2 key tiles past a tile
// edge and query counts inside one tile and across two (all rows but the first): each row's online softmax sees the
// same key tiles in the same order either way (a tile wholly masked for a row leaves its maximum, sum and
// accumulator as they were).
TEST(FlashAttention, TheLastRowsAloneGiveTheirBitsInTheWholeWindow) {
  const int64_t b = 2, h = 2, d = 16, w = h * d;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int64_t t : {129, 300}) {
      const Tensor qkv = random_tensor({b, t, 3 * w}, 41, dt, -1.5f, 1.5f);
      const Tensor q = qkv.slice(2, 0, w), k = qkv.slice(2, w, 2 * w), v = qkv.slice(2, 2 * w, 3 * w);
      AttentionOptions o;
      o.num_heads = h;
      o.causal = true;
      o.scale = 0.25f;
      const Tensor whole = flash_attention(q, k, v, o).out;
      for (int64_t n : {int64_t{1}, int64_t{5}, t - 1}) {
        const Tensor last = flash_attention(q.slice(1, t - n, t), k, v, o).out;
        EXPECT_EQ(last.to_floats(), whole.slice(1, t - n, t).contiguous().to_floats())
            << dtype_name(dt) << " T " << t << " last " << n;
      }
    }
  }
}

// Finite differences of L = sum(out * dout) in float32 against the backward's dq, dk, dv, on a causal shape with
// two key tiles and two query tiles: central differences with step 1e-2 (error O(h^2) ~ 1e-4 plus float32 rounding
// of L over 1e-2, ~1e-4), so 2e-3 absolute on gradients of order 0.1-1.
TEST(FlashAttention, GradientMatchesFiniteDifferences) {
  const int64_t t = 130, s = 140, d = 4;
  Tensor q = random_tensor({1, t, d}, 41, DType::kFloat32, -1.0f, 1.0f);
  Tensor k = random_tensor({1, s, d}, 42, DType::kFloat32, -1.0f, 1.0f), v = random_tensor({1, s, d}, 43, DType::kFloat32);
  Tensor dout = random_tensor({1, t, d}, 44, DType::kFloat32);
  AttentionOptions o;
  o.causal = true;
  o.scale = 0.5f;
  o.dropout_rate = 0.1f;
  o.dropout_seed = 5;
  auto loss = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv) {
    const std::vector<float> out = flash_attention(qq, kk, vv, o).out.to_floats(), w = dout.to_floats();
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += static_cast<double>(out[i]) * w[i];
    return sum;
  };
  const FlashAttentionOutput a = flash_attention(q, k, v, o);
  const AttentionGrads g = flash_attention_backward(dout, q, k, v, a.out, a.lse, o);
  const double h = 1e-2;
  int which = 0;
  for (Tensor* x : {&q, &k, &v}) {
    const std::vector<float> grad = (which == 0 ? g.dq : which == 1 ? g.dk : g.dv).to_floats();
    std::vector<float> base = x->to_floats();
    for (size_t i = 0; i < base.size(); i += 7) {
      std::vector<float> p = base, m = base;
      p[i] += static_cast<float>(h);
      m[i] -= static_cast<float>(h);
      const Tensor tp = Tensor::from_floats(x->shape(), p), tm = Tensor::from_floats(x->shape(), m);
      const double up = which == 0 ? loss(tp, k, v) : which == 1 ? loss(q, tp, v) : loss(q, k, tp);
      const double down = which == 0 ? loss(tm, k, v) : which == 1 ? loss(q, tm, v) : loss(q, k, tm);
      ASSERT_NEAR(grad[i], (up - down) / (2 * h), 2e-3) << "input " << which << " element " << i;
    }
    ++which;
  }
}

TEST(FlashAttention, RefusesBadArguments) {
  Tensor q = random_tensor({1, 5, 4}, 1, DType::kFloat32), k = random_tensor({1, 6, 4}, 2, DType::kFloat32);
  Tensor v = random_tensor({1, 6, 4}, 3, DType::kFloat32);
  AttentionOptions o;
  EXPECT_THROW(flash_attention(q, k, v.slice(1, 0, 5), o), Error);
  o.causal = true;
  EXPECT_THROW(flash_attention(k, q, q, o), Error);  // more queries than keys
  o.causal = false;
  const FlashAttentionOutput a = flash_attention(q, k, v, o);
  Tensor dout = random_tensor({1, 5, 4}, 4, DType::kFloat32);
  EXPECT_THROW(flash_attention_backward(dout, q, k, v, a.out, a.lse.reshape({5}), o), Error);
  EXPECT_THROW(flash_attention_backward(dout, q, k, v, a.out.to(DType::kBFloat16), a.lse, o), Error);
  EXPECT_THROW(flash_attention_backward(dout.slice(1, 0, 4), q, k, v, a.out, a.lse, o), Error);
  EXPECT_TRUE(flash_attention_supported(Device::cpu()));
}

}  // namespace
}  // namespace mixtrain::ops
