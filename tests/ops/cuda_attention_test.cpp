// Scaled dot-product attention's CUDA kernels against the CPU kernels, and the backward passes given a gradient
// of another dtype on the GPU (converted through ops::cast's CUDA kernel, where Tensor::to would refuse device
// memory). Attention's products run through cuBLASLt and its rows sum in a warp's order, so results are compared
// with tolerances written beside each check; the dropout mask is the CPU's. Skips without a GPU, or without
// cuBLASLt (MIXTRAIN_REQUIRE_GPU=1, set by scripts/gpu-check.sh, makes the skip a failure).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/conv2d.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/transfer.h"
#include "op_test_util.h"
#include "ops/cuda/attention_plan.h"
#include "ops/shared/float16_convert.h"
#include "ops/shared/gemm_element.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::subnormal_step;
using testing::unit;

double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.contiguous().to_floats()) m = std::max(m, static_cast<double>(std::fabs(v)));
  return m;
}

// |gpu - cpu| <= tol(cpu value) + extra[i] for every element i (NaN must match NaN; extra empty: none).
template <typename TolFn>
void expect_close(const Tensor& got, const Tensor& want, TolFn&& tol, const std::string& what,
                  const std::vector<double>& extra = {}) {
  const Tensor g = to_device(got, Device::cpu()).contiguous();
  ASSERT_EQ(g.dtype(), want.dtype()) << what;
  ASSERT_EQ(g.shape(), want.shape()) << what;
  const std::vector<float> gv = g.to_floats(), cv = want.contiguous().to_floats();
  int reported = 0;
  for (size_t i = 0; i < cv.size(); ++i) {
    if (gv[i] == cv[i] || (std::isnan(cv[i]) && std::isnan(gv[i]))) continue;
    const double t = tol(static_cast<double>(cv[i])) + (extra.empty() ? 0.0 : extra[i]);
    if (std::fabs(static_cast<double>(gv[i]) - cv[i]) <= t) continue;
    ADD_FAILURE() << what << ": element " << i << " gpu " << gv[i] << " cpu " << cv[i] << " tolerance " << t;
    if (++reported == 5) return;
  }
}

struct Case {
  int64_t b, t, s, h, dk, dv;
  bool causal;
  float rate;
};
const Case kCases[] = {
    {1, 1, 1, 1, 1, 1, false, 0.0f},   {2, 7, 7, 2, 4, 3, true, 0.0f},      {2, 5, 9, 3, 8, 5, false, 0.25f},
    {1, 17, 17, 1, 16, 16, true, 0.1f}, {3, 33, 33, 4, 8, 8, true, 0.0f},   {2, 129, 129, 2, 32, 32, true, 0.2f},
    {2, 31, 65, 2, 7, 9, false, 0.0f},  {1, 0, 5, 2, 4, 4, false, 0.0f},
    // Causal with fewer queries than keys (a generation cache's new rows after the cached ones).
    {2, 1, 17, 2, 8, 8, true, 0.0f},    {2, 5, 33, 3, 8, 5, true, 0.2f},
};

std::string describe(const Case& c, DType dt) {
  return std::string(dtype_name(dt)) + " B=" + std::to_string(c.b) + " T=" + std::to_string(c.t) +
         " S=" + std::to_string(c.s) + " H=" + std::to_string(c.h) + " dk=" + std::to_string(c.dk) +
         " dv=" + std::to_string(c.dv) + (c.causal ? " causal" : "") + " rate=" + std::to_string(c.rate);
}

// q or k: random in [-1, 1] for float32; for the 16-bit dtypes, multiples of 1/4, whose products sum exactly in
// any order, so both devices round the same logits into the compute dtype (a logit on either side of a 16-bit
// rounding boundary would move its probability by a whole 16-bit unit).
Tensor query_key(const Shape& shape, uint64_t seed, DType dt) {
  std::vector<float> v = random_tensor(shape, seed, DType::kFloat32).to_floats();
  if (dt != DType::kFloat32)
    for (float& x : v) x = std::round(x * 4.0f) / 4.0f;
  return Tensor::from_floats(shape, v, dt);
}

// The most that rounding ds into a 16-bit compute dtype moves dq and dk: the GPU multiplies the rounded ds on the
// tensor cores, the CPU the float32 ds (ops/attention.h), so dq_i moves by at most sum_j (u |ds_ij| + sub) |k_j| and
// dk_j by sum_i (u |ds_ij| + sub) |q_i|, u the dtype's unit roundoff and sub a subnormal step (a ds rounded among
// the subnormals), with a 1% margin for the float32 ds each side rounds from. ds from its definition, in float64:
// dp = dout_h v_h^T (dropped as the forward dropped), ds = p (dp - rowsum(dp p)) scale over the causal columns.
// Bounds laid out as q and k (B, L, H * dk); zeros for float32, where ds is not rounded.
struct DsBounds {
  std::vector<double> dq, dk;
  // What the GPU computes, emulated in float64 before the final rounding: sums of ds rounded into the dtype times
  // k (dq) or q (dk), for the CPU-side check of the bounds.
  std::vector<double> dq_rounded_ds, dk_rounded_ds;
};
DsBounds ds_rounding_bounds(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& probs, const AttentionOptions& o) {
  const int64_t nb = q.dim(0), t = q.dim(1), s = k.dim(1), h = o.num_heads, dk = q.dim(2) / h, dv = v.dim(2) / h;
  DsBounds out{std::vector<double>(static_cast<size_t>(q.numel()), 0.0),
               std::vector<double>(static_cast<size_t>(k.numel()), 0.0),
               std::vector<double>(static_cast<size_t>(q.numel()), 0.0),
               std::vector<double>(static_cast<size_t>(k.numel()), 0.0)};
  const DType dt = q.dtype();
  if (dt == DType::kFloat32) return out;
  const std::vector<float> qv = q.contiguous().to_floats(), kv = k.contiguous().to_floats(),
                           vv = v.contiguous().to_floats(), gv = dout.contiguous().to_floats(),
                           pv = probs.contiguous().to_floats();
  const double u = 1.01 * unit(dt), sub = subnormal_step(dt), inv_keep = 1.0 / (1.0 - o.dropout_rate);
  std::vector<double> ds(static_cast<size_t>(s));
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t i = 0; i < t; ++i) {
        const int64_t end = o.causal ? i + 1 + (s - t) : s, row = ((b * h + hh) * t + i) * s;
        const size_t qi = static_cast<size_t>((b * t + i) * h * dk + hh * dk);
        double dot = 0;
        for (int64_t j = 0; j < end; ++j) {
          double dp = 0;
          for (int64_t c = 0; c < dv; ++c)
            dp += static_cast<double>(gv[static_cast<size_t>((b * t + i) * h * dv + hh * dv + c)]) *
                  vv[static_cast<size_t>((b * s + j) * h * dv + hh * dv + c)];
          if (o.dropout_rate > 0)
            dp = attention_dropout_keep(o.dropout_seed, static_cast<uint64_t>(row + j), o.dropout_rate) ? dp * inv_keep
                                                                                                          : 0.0;
          ds[static_cast<size_t>(j)] = dp;
          dot += dp * pv[static_cast<size_t>(row + j)];
        }
        for (int64_t j = 0; j < end; ++j) {
          const double d = pv[static_cast<size_t>(row + j)] * (ds[static_cast<size_t>(j)] - dot) * o.scale;
          const double e = u * std::fabs(d) + sub;
          const double rounded = Tensor::from_floats({1}, {static_cast<float>(d)}, dt).to_floats()[0];
          const size_t kj = static_cast<size_t>((b * s + j) * h * dk + hh * dk);
          for (int64_t c = 0; c < dk; ++c) {
            out.dq[qi + c] += e * std::fabs(kv[kj + c]);
            out.dk[kj + c] += e * std::fabs(qv[qi + c]);
            out.dq_rounded_ds[qi + c] += rounded * kv[kj + c];
            out.dk_rounded_ds[kj + c] += rounded * qv[qi + c];
          }
        }
      }
  return out;
}

AttentionOptions options_of(const Case& c) {
  AttentionOptions o;
  o.num_heads = c.h;
  o.causal = c.causal;
  o.scale = 0.25f;  // a power of two: scaled logits stay exact
  o.dropout_rate = c.rate;
  o.dropout_seed = 1234;
  return o;
}

// Checks forward and backward of one case, q, k, v given on the CPU (possibly views) with their GPU copies.
void check_case(const Case& c, DType dt, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qg,
                const Tensor& kg, const Tensor& vg, const std::string& what) {
  const AttentionOptions o = options_of(c);
  const AttentionOutput want = scaled_dot_product_attention(q, k, v, o, true, true);
  const AttentionOutput got = scaled_dot_product_attention(qg, kg, vg, o, true, true);
  const double u = unit(dt), f32 = 0x1p-24, sub = 2 * subnormal_step(dt);
  // Logits: exact products for the 16-bit dtypes; float32 sums of dk products of |values| <= 1 in another order.
  const double logit_err = dt == DType::kFloat32 ? 2.0 * static_cast<double>(c.dk) * c.dk * f32 * o.scale : 0.0;
  expect_close(got.logits, want.logits, [&](double cv) { return 4 * f32 * std::fabs(cv) + logit_err; },
               "logits " + what);
  // Probabilities: a logit error d moves p by up to 2d relative; the row sums' order by a few float32 units; then
  // one rounding into the compute dtype on each side.
  expect_close(got.probs, want.probs,
               [&](double cv) { return (2 * u + 64 * f32 + 2 * logit_err) * std::fabs(cv) + sub; },
               "probs " + what);
  // Output: each probability within a unit of the compute dtype (and the dropout's 1 / (1 - rate)), times
  // |v| <= 1 summed over the row's probabilities (<= 1 / (1 - rate)), plus the GEMM's order over S terms.
  const double keep = 1.0 / (1.0 - c.rate);
  expect_close(got.out, want.out,
               [&](double cv) {
                 return 2 * u * std::fabs(cv) + (2 * u + 64 * f32 + 2 * logit_err) * keep +
                        2.0 * static_cast<double>(c.s) * f32 * keep + sub;
               },
               "out " + what);

  // Backward from the CPU's probabilities, so that both read the same p: the differences are the GEMMs' order
  // (float32, over S, dk or dv terms) and the row dot products', then one rounding into the compute dtype; and for
  // dq and dk under a 16-bit dtype, the GPU's ds rounded into it (ds_rounding_bounds, per element).
  const Tensor dout = random_tensor(want.out.shape(), 77, dt);
  const AttentionGrads gw = scaled_dot_product_attention_backward(dout, q, k, v, want.probs, o);
  const AttentionGrads gg = scaled_dot_product_attention_backward(gpu(dout), qg, kg, vg, gpu(want.probs), o);
  const DsBounds bounds = ds_rounding_bounds(dout, q, k, v, want.probs, o);
  const std::vector<double> none;
  const double terms = static_cast<double>(c.s + c.t + c.dk + c.dv);
  for (const auto& [g, w, extra, name] :
       {std::tuple{&gg.dq, &gw.dq, &bounds.dq, "dq "}, std::tuple{&gg.dk, &gw.dk, &bounds.dk, "dk "},
        std::tuple{&gg.dv, &gw.dv, &none, "dv "}}) {
    // An absolute slack scaled by the gradient's size: a wrong head, mask or scale moves elements by that size.
    const double m = max_abs(*w) + 1.0;
    expect_close(*g, *w, [&](double cv) { return 2 * u * std::fabs(cv) + 64 * terms * f32 * m + sub; },
                 name + what, *extra);
  }
}

// The bounds the GPU test adds for the rounded ds, checked on every machine: the GPU's arithmetic for dq and dk
// (ds rounded into the 16-bit dtype, products summed exactly, then one rounding), emulated on the host, stays within
// them and the test's other slack of the CPU kernel's dq and dk; and the ds rounding does move results, so the
// bounds are not idle.
TEST(CudaAttentionBounds, TheRoundedDsProductsStayWithinTheGpuTestsTolerance) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    int moved = 0;
    for (const Case& c : kCases) {
      const std::string what = describe(c, dt);
      const Tensor q = query_key({c.b, c.t, c.h * c.dk}, 3, dt), k = query_key({c.b, c.s, c.h * c.dk}, 5, dt);
      const Tensor v = random_tensor({c.b, c.s, c.h * c.dv}, 7, dt);
      const AttentionOptions o = options_of(c);
      const AttentionOutput f = scaled_dot_product_attention(q, k, v, o);
      const Tensor dout = random_tensor(f.out.shape(), 77, dt);
      const AttentionGrads gw = scaled_dot_product_attention_backward(dout, q, k, v, f.probs, o);
      const DsBounds bounds = ds_rounding_bounds(dout, q, k, v, f.probs, o);
      const double u = unit(dt), sub = 2 * subnormal_step(dt);
      const double terms = static_cast<double>(c.s + c.t + c.dk + c.dv);
      for (const auto& [w, emulated, extra, name] :
           {std::tuple{&gw.dq, &bounds.dq_rounded_ds, &bounds.dq, "dq "},
            std::tuple{&gw.dk, &bounds.dk_rounded_ds, &bounds.dk, "dk "}}) {
        std::vector<float> as_floats(emulated->begin(), emulated->end());
        const Tensor got = Tensor::from_floats(w->shape(), as_floats, dt);  // the one rounding into the dtype
        const std::vector<float> gv = got.to_floats(), wv = w->contiguous().to_floats();
        for (size_t i = 0; i < gv.size(); ++i) moved += gv[i] != wv[i];
        const double m = max_abs(*w) + 1.0;
        expect_close(got, *w, [&](double cv) { return 2 * u * std::fabs(cv) + 64 * terms * 0x1p-24 * m + sub; },
                     name + what, *extra);
      }
    }
    EXPECT_GT(moved, 0) << dtype_name(dt) << ": rounding ds changed no gradient, so nothing tests the bounds";
  }
}

// q or k on a grid of 1/64 in [-1, 1]: held exactly by float16 and bfloat16, and up to 24 of their products (multiples
// of 2^-12 below 1) sum exactly in float32 in any order (|sum| < 32: at most 17 significant bits), so the CPU's GEMM
// and the GPU's product hold the same float32 sum, which float16 and bfloat16 cannot always hold.
Tensor fine_query_key(const Shape& shape, uint64_t seed, DType dt) {
  std::vector<float> v = random_tensor(shape, seed, DType::kFloat32).to_floats();
  for (float& x : v) x = std::round(x * 64.0f) / 64.0f;
  return Tensor::from_floats(shape, v, dt);
}

struct ScoreCase {
  int64_t b, t, s, h, dk;
  bool causal;
};
// dk 12, 20, 24: scales 1/sqrt(dk) that are not powers of two, so where the rounding falls matters.
const ScoreCase kScoreCases[] = {{2, 5, 7, 2, 12, false}, {1, 9, 9, 3, 24, true}, {2, 3, 17, 1, 20, false},
                                 {1, 33, 33, 2, 24, true}};

AttentionOptions score_options(const ScoreCase& c) {
  AttentionOptions o;
  o.num_heads = c.h;
  o.causal = c.causal;
  o.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  return o;
}

// The GPU's score tensor under a 16-bit policy, emulated on the host: the plan's dtype (attention_plan.h), written by
// the score product with alpha = scale, whose arithmetic is the fallback kernel's element rule (gemm_element.h: float32
// sum, times alpha, one rounding) and cuBLASLt's epilogue alike. Each score must be the CPU kernel's float32 logit
// rounded into the compute dtype, bit for bit (the float32 scores, when the logits are asked for, the logit itself);
// and rounding the product into the dtype before the scale, what a 16-bit product without alpha gives, must differ
// somewhere, so the check can fail.
TEST(CudaAttentionScores, SixteenBitScoresOfTheScaledProductAreTheCpusRoundedLogits) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    ASSERT_EQ(cuda::attention_score_dtype(dt, false), dt) << dtype_name(dt) << ": the scores stay float32";
    ASSERT_EQ(cuda::attention_score_dtype(dt, true), DType::kFloat32) << dtype_name(dt);
    const int code = shared::float_code(dt);
    int64_t rounded_early = 0;
    for (const ScoreCase& c : kScoreCases) {
      const Tensor q = fine_query_key({c.b, c.t, c.h * c.dk}, 21, dt);
      const Tensor k = fine_query_key({c.b, c.s, c.h * c.dk}, 22, dt);
      const Tensor v = random_tensor({c.b, c.s, c.h * c.dk}, 23, dt);
      const AttentionOptions o = score_options(c);
      const std::vector<float> logits = scaled_dot_product_attention(q, k, v, o, false, true).logits.to_floats();
      const std::vector<float> qv = q.to_floats(), kv = k.to_floats();
      size_t next = 0;  // the CPU's logits: per pair, row by row, the causal rows' selected columns only
      for (int64_t b = 0; b < c.b; ++b)
        for (int64_t hh = 0; hh < c.h; ++hh)
          for (int64_t i = 0; i < c.t; ++i)
            for (int64_t j = 0; j < (c.causal ? i + 1 + (c.s - c.t) : c.s); ++j, ++next) {
              float acc = 0.0f;
              for (int64_t d = 0; d < c.dk; ++d)
                acc = shared::gemm_accumulate(acc, qv[static_cast<size_t>((b * c.t + i) * c.h * c.dk + hh * c.dk + d)],
                                              kv[static_cast<size_t>((b * c.s + j) * c.h * c.dk + hh * c.dk + d)]);
              const float scaled = shared::gemm_finish(acc, o.scale, nullptr, j);
              const float score = shared::through_dtype(scaled, code);  // the one rounding into the score tensor
              const float want = shared::through_dtype(logits[next], code);
              ASSERT_EQ(testing::bits(score), testing::bits(want))
                  << dtype_name(dt) << " b=" << b << " h=" << hh << " i=" << i << " j=" << j << " sum " << acc;
              ASSERT_EQ(testing::bits(scaled), testing::bits(logits[next])) << "float32 scores, " << dtype_name(dt);
              const float early = shared::mul_rn(shared::through_dtype(acc, code), o.scale);
              rounded_early += shared::through_dtype(early, code) != want;
            }
      ASSERT_EQ(next, logits.size());
    }
    EXPECT_GT(rounded_early, 0) << dtype_name(dt) << ": rounding before the scale changed no score";
  }
}

// On the GPU: without the float32 logits the scores are 16-bit under a 16-bit policy; with the CPU's logits bits
// (fine_query_key's exact sums), the probabilities differ from the CPU's only by the row sums' order (a few float32
// units) before their one rounding, and the output by the GEMM's order besides.
TEST(CudaBackend, AttentionWithSixteenBitScoresGivesTheCpusProbabilities) {
  REQUIRE_CUDA_GEMM();
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    for (const ScoreCase& c : kScoreCases) {
      const Tensor q = fine_query_key({c.b, c.t, c.h * c.dk}, 31, dt);
      const Tensor k = fine_query_key({c.b, c.s, c.h * c.dk}, 32, dt);
      const Tensor v = random_tensor({c.b, c.s, c.h * c.dk}, 33, dt);
      const AttentionOptions o = score_options(c);
      const AttentionOutput want = scaled_dot_product_attention(q, k, v, o);
      const AttentionOutput got = scaled_dot_product_attention(gpu(q), gpu(k), gpu(v), o);
      const double u = unit(dt), f32 = 0x1p-24, sub = 2 * subnormal_step(dt);
      const std::string what = std::string(dtype_name(dt)) + " dk=" + std::to_string(c.dk);
      expect_close(got.probs, want.probs, [&](double cv) { return (2 * u + 64 * f32) * std::fabs(cv) + sub; },
                   "probs " + what);
      expect_close(got.out, want.out,
                   [&](double cv) { return 2 * u * std::fabs(cv) + 2 * u + 64 * f32 + 2.0 * c.s * f32 + sub; },
                   "out " + what);
    }
  }
}

TEST(CudaBackend, AttentionAndItsGradientMatchTheCpu) {
  REQUIRE_CUDA_GEMM();
  for (DType dt : kFloatDTypes) {
    for (const Case& c : kCases) {
      const std::string what = describe(c, dt);
      const Tensor q = query_key({c.b, c.t, c.h * c.dk}, 3, dt), k = query_key({c.b, c.s, c.h * c.dk}, 5, dt);
      const Tensor v = random_tensor({c.b, c.s, c.h * c.dv}, 7, dt);
      check_case(c, dt, q, k, v, gpu(q), gpu(k), gpu(v), what);
    }
  }
}

// q, k and v as column slices of one fused (B, T, 3 * H * d) projection, and their gradients written into the
// column slices of one (B, T, 3 * H * d) buffer: read and written in place on the GPU too.
TEST(CudaBackend, AttentionReadsAndWritesFusedProjectionSlicesInPlace) {
  REQUIRE_CUDA_GEMM();
  for (DType dt : kFloatDTypes) {
    const Case c{2, 9, 9, 2, 4, 4, true, 0.0f};
    const int64_t w = c.h * c.dk;
    const Tensor qkv = query_key({c.b, c.t, 3 * w}, 11, dt), qkv_g = gpu(qkv);
    const Tensor q = qkv.slice(2, 0, w), k = qkv.slice(2, w, 2 * w), v = qkv.slice(2, 2 * w, 3 * w);
    const Tensor qg = qkv_g.slice(2, 0, w), kg = qkv_g.slice(2, w, 2 * w), vg = qkv_g.slice(2, 2 * w, 3 * w);
    check_case(c, dt, q, k, v, qg, kg, vg, "fused " + describe(c, dt));

    const AttentionOptions o = options_of(c);
    const AttentionOutput f = scaled_dot_product_attention(q, k, v, o);
    const Tensor dout = random_tensor(f.out.shape(), 13, dt);
    Tensor grad = Tensor::zeros({c.b, c.t, 3 * w}, dt), grad_g = gpu(grad);
    Tensor dq = grad.slice(2, 0, w), dk = grad.slice(2, w, 2 * w), dv = grad.slice(2, 2 * w, 3 * w);
    Tensor dqg = grad_g.slice(2, 0, w), dkg = grad_g.slice(2, w, 2 * w), dvg = grad_g.slice(2, 2 * w, 3 * w);
    scaled_dot_product_attention_backward_into(dout, q, k, v, f.probs, o, dq, dk, dv);
    scaled_dot_product_attention_backward_into(gpu(dout), qg, kg, vg, gpu(f.probs), o, dqg, dkg, dvg);
    const double m = max_abs(grad) + 1.0;
    // dq's and dk's columns also get their ds rounding bounds (ds_rounding_bounds; T == S here, so row r of the
    // buffer is row r of q and of k).
    const DsBounds bounds = ds_rounding_bounds(dout, q, k, v, f.probs, o);
    std::vector<double> extra(static_cast<size_t>(grad.numel()), 0.0);
    for (int64_t r = 0; r < c.b * c.t; ++r)
      for (int64_t col = 0; col < w; ++col) {
        extra[static_cast<size_t>(r * 3 * w + col)] = bounds.dq[static_cast<size_t>(r * w + col)];
        extra[static_cast<size_t>(r * 3 * w + w + col)] = bounds.dk[static_cast<size_t>(r * w + col)];
      }
    expect_close(grad_g, grad,
                 [&](double cv) { return 2 * unit(dt) * std::fabs(cv) + 64 * 30 * 0x1p-24 * m + 2 * subnormal_step(dt); },
                 std::string("fused gradients ") + dtype_name(dt), extra);
  }
}

// A float32 gradient reaching 16-bit operands on the GPU is converted there (ops::cast's CUDA kernel, which gives
// the CPU's bits): each backward pass returns exactly what it returns for the gradient converted beforehand.
TEST(CudaBackend, BackwardPassesTakeAGradientOfAnotherDtypeOnTheGpu) {
  REQUIRE_CUDA_GEMM();
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const std::string name = dtype_name(dt);
    EXPECT_TRUE(bit_equal(cast(gpu(random_tensor({5, 7}, 1, DType::kFloat32)), dt),
                          random_tensor({5, 7}, 1, DType::kFloat32).to(dt)))
        << name;
    {
      const Tensor x = gpu(random_tensor({3, 4, 5}, 2, dt)), w = gpu(random_tensor({5, 6}, 3, dt));
      const Tensor dy = random_tensor({3, 4, 6}, 4, DType::kFloat32);
      const LinearGrads got = linear_backward(gpu(dy), x, w, true, true);
      const LinearGrads want = linear_backward(gpu(dy.to(dt)), x, w, true, true);
      EXPECT_TRUE(bit_equal(got.dx, want.dx) && bit_equal(got.dw, want.dw) && bit_equal(got.dbias, want.dbias))
          << "linear_backward " << name;
    }
    {
      const Tensor x = gpu(random_tensor({2, 6, 5, 3}, 5, dt)), kern = gpu(random_tensor({3, 3, 3, 4}, 6, dt));
      Conv2dOptions o;
      o.padding = Padding::kSame;
      const Tensor dy = random_tensor({2, 6, 5, 4}, 7, DType::kFloat32);
      const Conv2dGrads got = conv2d_backward(gpu(dy), x, kern, o, true, true);
      const Conv2dGrads want = conv2d_backward(gpu(dy.to(dt)), x, kern, o, true, true);
      EXPECT_TRUE(bit_equal(got.dx, want.dx) && bit_equal(got.dkernel, want.dkernel) &&
                  bit_equal(got.dbias, want.dbias))
          << "conv2d_backward " << name;
    }
    {
      const Case c{2, 5, 5, 2, 4, 4, true, 0.0f};
      const Tensor q = gpu(query_key({2, 5, 8}, 8, dt)), k = gpu(query_key({2, 5, 8}, 9, dt));
      const Tensor v = gpu(random_tensor({2, 5, 8}, 10, dt));
      const AttentionOptions o = options_of(c);
      const Tensor probs = scaled_dot_product_attention(q, k, v, o).probs;
      const Tensor dout = random_tensor({2, 5, 8}, 11, DType::kFloat32);
      const AttentionGrads got = scaled_dot_product_attention_backward(gpu(dout), q, k, v, probs, o);
      const AttentionGrads want = scaled_dot_product_attention_backward(gpu(dout.to(dt)), q, k, v, probs, o);
      EXPECT_TRUE(bit_equal(got.dq, want.dq) && bit_equal(got.dk, want.dk) && bit_equal(got.dv, want.dv))
          << "attention backward " << name;
    }
    {
      const Tensor x = gpu(random_tensor({4, 7}, 12, dt));
      const Tensor dy = random_tensor({4, 7}, 13, DType::kFloat32);
      EXPECT_TRUE(bit_equal(activation_backward(gpu(dy), x, x, Activation::kLinear), dy.to(dt)))
          << "activation_backward " << name;
    }
  }
}

}  // namespace
}  // namespace mixtrain::ops
