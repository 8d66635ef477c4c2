// Scaled dot-product attention against a float64 reference in every floating dtype, causal and not, with
// and without dropout, on odd shapes; the causal mask applied by selection (masked probabilities exactly
// zero, and masked logits that overflow float16 harmless); float16 logits beyond 65504 overflowing as a
// float16 GEMM output does; the float32 logits for inspection; thread-count independence.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mixtrain/ops/attention.h"

#include "attention_reference.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::subnormal_step;
using testing::unit;
using namespace attention_reference;

const Case kCases[] = {
    {{1, 1, 1, 1, 1, 1}, false, 0.0f},   {{1, 1, 1, 1, 1, 1}, true, 0.0f},    {{2, 7, 7, 3, 5, 5}, true, 0.0f},
    {{2, 7, 17, 2, 4, 3}, false, 0.0f},  {{1, 17, 17, 2, 8, 8}, false, 0.3f}, {{2, 17, 17, 1, 7, 9}, true, 0.25f},
    {{1, 31, 31, 4, 3, 3}, true, 0.0f},  {{1, 129, 129, 1, 17, 17}, true, 0.1f},
    // Fewer queries than keys, causal: a generation cache's new rows after S - T cached positions.
    {{1, 1, 17, 2, 4, 4}, true, 0.0f},   {{2, 3, 7, 3, 5, 5}, true, 0.0f},    {{2, 5, 17, 1, 7, 9}, true, 0.25f},
};

TEST(Attention, ForwardAndBackwardMatchFloat64InEveryDType) {
  for (DType dt : kFloatDTypes)
    for (const Case& c : kCases) {
      const Geo& g = c.g;
      AttentionOptions o;
      o.num_heads = g.h;
      o.causal = c.causal;
      o.scale = 1.0f / std::sqrt(static_cast<float>(g.dk));
      o.dropout_rate = c.dropout;
      o.dropout_seed = 1234;
      const std::string what = std::string(dtype_name(dt)) + " B" + std::to_string(g.b) + " T" + std::to_string(g.t) +
                               " S" + std::to_string(g.s) + " H" + std::to_string(g.h) + " dk" + std::to_string(g.dk) +
                               (c.causal ? " causal" : "") + (c.dropout > 0 ? " dropout" : "");
      Tensor q = random_tensor({g.b, g.t, g.h * g.dk}, 1, dt, -1.5f, 1.5f);
      Tensor k = random_tensor({g.b, g.s, g.h * g.dk}, 2, dt, -1.5f, 1.5f);
      Tensor v = random_tensor({g.b, g.s, g.h * g.dv}, 3, dt);
      Tensor dout = random_tensor({g.b, g.t, g.h * g.dv}, 4, dt);
      const Reference r = reference(g, q.to_floats(), k.to_floats(), v.to_floats(), dout.to_floats(), o);

      const AttentionOutput a = scaled_dot_product_attention(q, k, v, o);
      ASSERT_EQ(a.out.dtype(), dt) << what;
      ASSERT_EQ(a.out.shape(), (Shape{g.b, g.t, g.h * g.dv})) << what;
      ASSERT_EQ(a.probs.shape(), (Shape{g.b, g.h, g.t, g.s})) << what;
      ASSERT_EQ(a.probs.dtype(), dt) << what;
      EXPECT_FALSE(a.logits.defined());
      expect_close(a.out.to_floats(), r.out, r.out_mag, dt, g, r.max_logit, what + " out");
      const std::vector<float> probs = a.probs.to_floats();
      for (size_t i = 0; i < probs.size(); ++i) {
        ASSERT_NEAR(probs[i], r.probs[i], 4 * (unit(dt) + 64 * 0x1p-24) * (2 * r.max_logit + 2) * r.probs[i] + subnormal_step(dt))
            << what << " probs " << i;
        if (r.probs[i] == 0.0) {
          ASSERT_EQ(probs[i], 0.0f) << what << " a masked probability is not exactly zero";
        }
      }

      const AttentionGrads gr = scaled_dot_product_attention_backward(dout, q, k, v, a.probs, o);
      ASSERT_EQ(gr.dq.dtype(), dt);
      ASSERT_EQ(gr.dk.shape(), k.shape());
      expect_close(gr.dq.to_floats(), r.dq, r.dq_mag, dt, g, r.max_logit, what + " dq");
      expect_close(gr.dk.to_floats(), r.dk, r.dk_mag, dt, g, r.max_logit, what + " dk");
      expect_close(gr.dv.to_floats(), r.dv, r.dv_mag, dt, g, r.max_logit, what + " dv");

      // Without keeping the probabilities (inference): the same output, bit for bit.
      const AttentionOutput inf = scaled_dot_product_attention(q, k, v, o, /*keep_probs=*/false);
      EXPECT_FALSE(inf.probs.defined());
      EXPECT_EQ(inf.out.to_floats(), a.out.to_floats()) << what;
    }
}

TEST(Attention, DropoutKeepsAboutOneMinusRateAndDependsOnTheSeed) {
  int64_t kept = 0;
  constexpr int64_t kN = 100000;
  for (int64_t i = 0; i < kN; ++i) kept += attention_dropout_keep(7, static_cast<uint64_t>(i), 0.3f);
  EXPECT_NEAR(static_cast<double>(kept) / kN, 0.7, 0.01);
  int64_t same = 0;
  for (int64_t i = 0; i < 1000; ++i)
    same += attention_dropout_keep(7, static_cast<uint64_t>(i), 0.5f) == attention_dropout_keep(8, static_cast<uint64_t>(i), 0.5f);
  EXPECT_LT(same, 600);
  EXPECT_GT(same, 400);
  for (int64_t i = 0; i < 1000; ++i) EXPECT_TRUE(attention_dropout_keep(7, static_cast<uint64_t>(i), 0.0f));
}

// The mask is a selection: logits of masked positions never reach the softmax, so a key that makes them
// overflow float16 (inf) leaves every earlier row finite and exact, while the last row, which attends to
// that key, overflows. Adding a large negative constant instead would turn inf into NaN in every row.
TEST(Attention, CausalMaskSelectsSoOverflowingMaskedLogitsAreHarmless) {
  std::vector<float> q(24), k(24), v(24);
  Rng rng(5);
  for (float& x : q) x = rng.uniform(0.8f, 1.0f);
  for (float& x : k) x = rng.uniform(-1.0f, 1.0f);
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
  for (int d = 0; d < 4; ++d) k[static_cast<size_t>(20 + d)] = 30000.0f;  // last key: logits ~ 6e4 * q > 65504
  for (int e = 0; e < 4; ++e) v[static_cast<size_t>(20 + e)] = 1000.0f;   // and a value that would show if it leaked
  AttentionOptions o;
  o.causal = true;
  o.scale = 1.0f;
  Tensor qt = Tensor::from_floats({1, 6, 4}, q, DType::kFloat16), kt = Tensor::from_floats({1, 6, 4}, k, DType::kFloat16);
  Tensor vt = Tensor::from_floats({1, 6, 4}, v, DType::kFloat16);
  const AttentionOutput a = scaled_dot_product_attention(qt, kt, vt, o, true, true);
  const std::vector<float> out = a.out.to_floats(), probs = a.probs.to_floats();
  // Rows 0..4 against the float64 reference of the first five positions alone.
  const Geo g5{1, 5, 5, 1, 4, 4};
  const std::vector<float> q5(q.begin(), q.begin() + 20), k5(k.begin(), k.begin() + 20), v5(v.begin(), v.begin() + 20);
  const Reference r = reference(g5, Tensor::from_floats({1, 5, 4}, q5, DType::kFloat16).to_floats(),
                                Tensor::from_floats({1, 5, 4}, k5, DType::kFloat16).to_floats(),
                                Tensor::from_floats({1, 5, 4}, v5, DType::kFloat16).to_floats(), std::vector<float>(20, 0.0f), o);
  for (size_t i = 0; i < 20; ++i)
    ASSERT_NEAR(out[i], r.out[i], tolerance(DType::kFloat16, g5, r.max_logit, r.out_mag[i], r.out[i])) << i;
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = i + 1; j < 6; ++j) ASSERT_EQ(probs[static_cast<size_t>(i * 6 + j)], 0.0f) << i << "," << j;
  // The last row attends to the overflowing key: a float16 run yields NaN there, as it should.
  for (size_t e = 20; e < 24; ++e) EXPECT_TRUE(std::isnan(out[e])) << out[e];
  // The float32 logits it reports: the causal triangle (21 values), the last row's last one beyond 65504.
  ASSERT_EQ(a.logits.shape(), Shape({21}));
  EXPECT_GT(a.logits.at(20), kFloat16Max);
  EXPECT_TRUE(std::isfinite(a.logits.at(20)));
}

// A generation cache attends its T new query rows to all S positions: the causal rule with the queries as the last
// T positions gives the last T rows of the full causal attention, and its logits are the full run's last ones.
TEST(Attention, FewerCausalQueriesThanKeysAreTheLastRowsOfTheFullAttention) {
  for (DType dt : kFloatDTypes)
    for (int64_t t : {1, 3, 9}) {
      const int64_t s = 9, w = 8;
      Tensor q = random_tensor({1, s, w}, 21, dt, -1.5f, 1.5f), k = random_tensor({1, s, w}, 22, dt, -1.5f, 1.5f);
      Tensor v = random_tensor({1, s, w}, 23, dt);
      AttentionOptions o;
      o.causal = true;
      o.scale = 0.5f;
      const AttentionOutput full = scaled_dot_product_attention(q, k, v, o, true, true);
      const AttentionOutput part = scaled_dot_product_attention(q.slice(1, s - t, s), k, v, o, true, true);
      const std::string what = std::string(dtype_name(dt)) + " T" + std::to_string(t);
      EXPECT_EQ(part.out.to_floats(), full.out.slice(1, s - t, s).contiguous().to_floats()) << what;
      EXPECT_EQ(part.probs.to_floats(), full.probs.slice(2, s - t, s).contiguous().to_floats()) << what;
      const std::vector<float> all = full.logits.to_floats(), tail = part.logits.to_floats();
      ASSERT_EQ(tail.size(), static_cast<size_t>(t * (t + 1) / 2 + t * (s - t))) << what;
      EXPECT_EQ(tail, std::vector<float>(all.end() - static_cast<std::ptrdiff_t>(tail.size()), all.end())) << what;
    }
}

// Logits beyond float16's range: float16 overflows to inf and the softmax row becomes NaN, exactly as a
// float16 GEMM output followed by a softmax would; bfloat16 (float32's range) and float32 stay finite.
TEST(Attention, Float16LogitsBeyond65504OverflowAsAFloat16GemmOutputWould) {
  const int64_t t = 3, dk = 64;
  // Every q and k element 40: each logit is 64 * 1600 = 102400 (exact in every dtype's float32 sum).
  Tensor v = random_tensor({1, t, 2}, 6, DType::kFloat32);
  for (DType dt : kFloatDTypes) {
    Tensor q = Tensor::full({1, t, dk}, dt, 40.0f), k = Tensor::full({1, t, dk}, dt, 40.0f);
    AttentionOptions o;
    o.scale = 1.0f;
    const AttentionOutput a = scaled_dot_product_attention(q, k, v.to(dt), o, true, true);
    const std::vector<float> out = a.out.to_floats();
    ASSERT_EQ(a.logits.numel(), t * t);
    for (int64_t i = 0; i < a.logits.numel(); ++i) EXPECT_EQ(a.logits.at(i), 102400.0f);
    if (dt == DType::kFloat16) {
      for (float x : out) EXPECT_TRUE(std::isnan(x)) << x;
    } else {
      // Equal logits: a uniform softmax, each output the mean of v's column.
      const std::vector<float> vv = v.to(dt).to_floats();
      for (int64_t i = 0; i < t; ++i)
        for (int64_t e = 0; e < 2; ++e) {
          const double want = (vv[static_cast<size_t>(e)] + vv[static_cast<size_t>(2 + e)] + vv[static_cast<size_t>(4 + e)]) / 3.0;
          EXPECT_NEAR(out[static_cast<size_t>(i * 2 + e)], want, 4 * unit(dt)) << dtype_name(dt);
        }
    }
  }
}

TEST(Attention, ReportsTheFloat32LogitsBeforeRounding) {
  for (bool causal : {false, true}) {
    Tensor q = random_tensor({2, 5, 6}, 7, DType::kBFloat16, -2, 2), k = random_tensor({2, 5, 6}, 8, DType::kBFloat16, -2, 2);
    Tensor v = random_tensor({2, 5, 6}, 9, DType::kBFloat16);
    AttentionOptions o;
    o.num_heads = 2;
    o.causal = causal;
    o.scale = 0.75f;
    const AttentionOutput a = scaled_dot_product_attention(q, k, v, o, false, true);
    const std::vector<float> qv = q.to_floats(), kv = k.to_floats(), lv = a.logits.to_floats();
    ASSERT_EQ(lv.size(), size_t{2 * 2} * (causal ? 15 : 25));
    size_t n = 0;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 5; ++i)
          for (int64_t j = 0; j < (causal ? i + 1 : 5); ++j) {
            double s = 0;
            for (int64_t d = 0; d < 3; ++d)
              s += static_cast<double>(qv[static_cast<size_t>((b * 5 + i) * 6 + h * 3 + d)]) *
                   kv[static_cast<size_t>((b * 5 + j) * 6 + h * 3 + d)];
            // float32 accumulation of 3 exact products, then the scale: a few float32 units.
            ASSERT_NEAR(lv[n++], s * 0.75, 8 * 0x1p-24 * (std::fabs(s) + 1)) << b << h << i << j;
          }
  }
}

TEST(Attention, ViewsAndInvalidArguments) {
  AttentionOptions o;
  o.num_heads = 2;
  Tensor big = random_tensor({2, 5, 12}, 10, DType::kFloat32);
  Tensor q = big.slice(2, 0, 4), k = big.slice(2, 4, 8), v = big.slice(2, 8, 12);  // views of one buffer
  const AttentionOutput a = scaled_dot_product_attention(q, k, v, o);
  const AttentionOutput dense = scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous(), o);
  EXPECT_EQ(a.out.to_floats(), dense.out.to_floats());
  // Gradients written into the three column slices of one buffer, as a fused projection wants them.
  Tensor dout = random_tensor({2, 5, 4}, 11, DType::kFloat32);
  Tensor dqkv = Tensor::full({2, 5, 12}, DType::kFloat32, 7.0f);
  Tensor dq = dqkv.slice(2, 0, 4), dk = dqkv.slice(2, 4, 8), dv = dqkv.slice(2, 8, 12);
  scaled_dot_product_attention_backward_into(dout, q, k, v, a.probs, o, dq, dk, dv);
  const AttentionGrads want =
      scaled_dot_product_attention_backward(dout, q.contiguous(), k.contiguous(), v.contiguous(), dense.probs, o);
  EXPECT_EQ(dq.contiguous().to_floats(), want.dq.to_floats());
  EXPECT_EQ(dk.contiguous().to_floats(), want.dk.to_floats());
  EXPECT_EQ(dv.contiguous().to_floats(), want.dv.to_floats());
  Tensor transposed = Tensor::zeros({2, 4, 5}, DType::kFloat32).transpose(1, 2);  // (2, 5, 4), columns strided
  EXPECT_THROW(scaled_dot_product_attention_backward_into(dout, q, k, v, a.probs, o, transposed, dk, dv), Error);
  EXPECT_EQ(scaled_dot_product_attention(transposed, k, v, o).out.shape(), (Shape{2, 5, 4}));  // read via a copy
  o.num_heads = 3;
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, o), Error);  // 4 columns do not split into 3 heads
  o.num_heads = 2;
  o.causal = true;
  EXPECT_THROW(scaled_dot_product_attention(q, k.slice(1, 0, 3), v.slice(1, 0, 3), o), Error);  // T != S
  o.causal = false;
  EXPECT_THROW(scaled_dot_product_attention(q, k.to(DType::kFloat16), v, o), Error);
  EXPECT_THROW(scaled_dot_product_attention(q, k, v.slice(1, 0, 4), o), Error);
  o.dropout_rate = 1.0f;
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, o), Error);
  o.dropout_rate = 0.0f;
  const AttentionOutput no_probs = scaled_dot_product_attention(q, k, v, o, false);
  EXPECT_THROW(scaled_dot_product_attention_backward(a.out, q, k, v, no_probs.probs, o), Error);
  EXPECT_THROW(scaled_dot_product_attention_backward(a.out.slice(1, 0, 2), q, k, v, a.probs, o), Error);
}

// Pairs across threads (8 pairs) and one pair with its rows across threads (160 x 160): the same bits for
// 1, 2 and 3 threads.
// Without the probabilities kept (evaluation, a generation step) the forward takes the query rows 128 at a time,
// holding (128, S) scratch per pair instead of (T, S): the output and the reported logits are the bits of the call
// that keeps them, past two blocks, causal or not, with dropout, for the queries alone as the last positions too,
// on 1 and 2 threads (one pair: the rows' loop then runs across threads).
TEST(Attention, WithoutKeptProbabilitiesTheRowBlocksGiveTheWholeCallsBits) {
  const int64_t s = 300, h = 2, d = 8, w = h * d;
  const int saved = omp_get_max_threads();
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (bool causal : {false, true})
      for (int64_t t : {s, s - 40})
        for (int64_t b : {1, 2}) {
          if (!causal && t != s) continue;
          Tensor q = random_tensor({b, t, w}, 51, dt, -1.5f, 1.5f), k = random_tensor({b, s, w}, 52, dt, -1.5f, 1.5f);
          Tensor v = random_tensor({b, s, w}, 53, dt);
          AttentionOptions o;
          o.num_heads = h;
          o.causal = causal;
          o.scale = 0.4f;
          o.dropout_rate = 0.1f;
          o.dropout_seed = 5;
          const AttentionOutput kept = scaled_dot_product_attention(q, k, v, o, true, true);
          for (int threads : {1, 2}) {
            omp_set_num_threads(threads);
            const AttentionOutput unkept = scaled_dot_product_attention(q, k, v, o, false, true);
            const std::string what = std::string(dtype_name(dt)) + (causal ? " causal" : "") + " T" +
                                     std::to_string(t) + " B" + std::to_string(b) + " threads " +
                                     std::to_string(threads);
            EXPECT_FALSE(unkept.probs.defined()) << what;
            EXPECT_EQ(unkept.out.to_floats(), kept.out.to_floats()) << what;
            EXPECT_EQ(unkept.logits.to_floats(), kept.logits.to_floats()) << what;
          }
          omp_set_num_threads(saved);
        }
}

TEST(Attention, ResultsDoNotDependOnTheThreadCount) {
  struct Shape5 {
    int64_t b, t, h, d;
  };
  for (const Shape5 s : {Shape5{4, 33, 2, 8}, Shape5{1, 160, 1, 16}})
    for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      Tensor q = random_tensor({s.b, s.t, s.h * s.d}, 11, dt), k = random_tensor({s.b, s.t, s.h * s.d}, 12, dt);
      Tensor v = random_tensor({s.b, s.t, s.h * s.d}, 13, dt), dout = random_tensor({s.b, s.t, s.h * s.d}, 14, dt);
      AttentionOptions o;
      o.num_heads = s.h;
      o.causal = true;
      o.scale = 0.3f;
      o.dropout_rate = 0.2f;
      o.dropout_seed = 99;
      const int saved = omp_get_max_threads();
      std::vector<std::vector<float>> results;
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        const AttentionOutput a = scaled_dot_product_attention(q, k, v, o, true, true);
        const AttentionGrads g = scaled_dot_product_attention_backward(dout, q, k, v, a.probs, o);
        std::vector<float> all;
        for (const Tensor& x : {a.out, a.probs, a.logits, g.dq, g.dk, g.dv}) {
          const std::vector<float> f = x.to_floats();
          all.insert(all.end(), f.begin(), f.end());
        }
        results.push_back(all);
      }
      omp_set_num_threads(saved);
      for (size_t i = 1; i < results.size(); ++i)
        EXPECT_EQ(0, std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)))
            << dtype_name(dt) << " B" << s.b << " T" << s.t;
    }
}

}  // namespace
}  // namespace mixtrain::ops
