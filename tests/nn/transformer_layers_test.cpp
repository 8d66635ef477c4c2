// Transformer layers: shapes, weight names and initial values, dtype policies (float32 variables and
// compute-dtype outputs under the mixed policies), float32 LayerNorm statistics, MultiHeadAttention
// against a float64 computation of its definition, the causal mask, the inspection hook, Dense on
// (batch, T, D) inputs, and a small functional transformer block whose loss falls in a few steps under
// every policy.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/autograd/gradcheck.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/network.h"
#include "mixtrain/nn/transformer_layers.h"
#include "mixtrain/ops/backend.h"

namespace mixtrain {
namespace {

class TransformerLayersTest : public ::testing::Test {
 protected:
  void TearDown() override {
    set_global_policy("float32");
    clear_tape();
  }
};

const char* const kPolicies[] = {"float32", "mixed_float16", "mixed_bfloat16"};

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = r.uniform(lo, hi);
  return Tensor::from_floats(shape, v);
}

Tensor token_ids(const Shape& shape, int64_t vocab, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> v(static_cast<size_t>(shape.numel()));
  for (int32_t& x : v) x = static_cast<int32_t>(r.below(static_cast<uint64_t>(vocab)));
  return Tensor::from_ints(shape, v);
}

std::map<std::string, Shape> weight_shapes(const Layer& l) {
  std::map<std::string, Shape> out;
  for (const Var& w : l.weights()) out[w.name()] = w.shape();
  return out;
}

TEST_F(TransformerLayersTest, ShapesNamesAndInitialValues) {
  Rng rng(1);
  Embedding emb(50, 8);
  Var ids(token_ids({2, 5}, 50, 2));
  Var x = emb(ids, CallContext{false, &rng});
  EXPECT_EQ(x.shape(), (Shape{2, 5, 8}));
  EXPECT_EQ(emb.compute_output_shape({5}), (Shape{5, 8}));
  EXPECT_EQ(weight_shapes(emb), (std::map<std::string, Shape>{{"embedding/embeddings", {50, 8}}}));
  // Keras' uniform(-0.05, 0.05), drawn (not all equal).
  const std::vector<float> table = emb.embeddings().value().to_floats();
  float lo = 1, hi = -1;
  for (float v : table) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_GE(lo, -0.05f);
  EXPECT_LE(hi, 0.05f);
  EXPECT_LT(lo, -0.04f);
  EXPECT_GT(hi, 0.04f);
  // Each output row is its id's table row.
  const std::vector<int32_t> idv = ids.value().to_ints();
  const std::vector<float> xv = x.value().to_floats();
  for (size_t i = 0; i < idv.size(); ++i)
    for (size_t j = 0; j < 8; ++j) ASSERT_EQ(xv[i * 8 + j], table[static_cast<size_t>(idv[i]) * 8 + j]);

  PositionEmbedding pos(6);
  Var p = pos(x, CallContext{false, &rng});
  EXPECT_EQ(p.shape(), (Shape{2, 5, 8}));
  EXPECT_EQ(weight_shapes(pos), (std::map<std::string, Shape>{{"position_embedding/embeddings", {6, 8}}}));
  // It adds its input: x + P[0:T], exactly in float32.
  const std::vector<float> pv = p.value().to_floats(), pt = pos.embeddings().value().to_floats();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t d = 0; d < 8; ++d) {
        const size_t i = static_cast<size_t>((b * 5 + t) * 8 + d);
        ASSERT_EQ(pv[i], xv[i] + pt[static_cast<size_t>(t * 8 + d)]);
      }

  LayerNormalization ln;
  EXPECT_EQ(ln.epsilon(), 1e-3f);
  EXPECT_EQ(ln(p).shape(), (Shape{2, 5, 8}));
  EXPECT_EQ(weight_shapes(ln),
            (std::map<std::string, Shape>{{"layer_normalization/gamma", {8}}, {"layer_normalization/beta", {8}}}));
  EXPECT_EQ(ln.gamma().value().to_floats(), std::vector<float>(8, 1.0f));
  EXPECT_EQ(ln.beta().value().to_floats(), std::vector<float>(8, 0.0f));

  MultiHeadAttention mha({.num_heads = 2, .key_dim = 3});
  EXPECT_EQ(mha(p, CallContext{false, &rng}).shape(), (Shape{2, 5, 8}));
  EXPECT_EQ(weight_shapes(mha), (std::map<std::string, Shape>{{"multi_head_attention/query/kernel", {8, 2, 3}},
                                                               {"multi_head_attention/query/bias", {2, 3}},
                                                               {"multi_head_attention/key/kernel", {8, 2, 3}},
                                                               {"multi_head_attention/key/bias", {2, 3}},
                                                               {"multi_head_attention/value/kernel", {8, 2, 3}},
                                                               {"multi_head_attention/value/bias", {2, 3}},
                                                               {"multi_head_attention/attention_output/kernel", {2, 3, 8}},
                                                               {"multi_head_attention/attention_output/bias", {8}}}));
  EXPECT_EQ(mha.count_params(), 3 * (8 * 6 + 6) + 6 * 8 + 8);
  // Keras' glorot limit for the (D, H, dk) kernel: sqrt(6 / (D * H + D * dk)).
  const float limit = std::sqrt(6.0f / (8 * 2 + 8 * 3));
  for (float v : mha.weights()[0].value().to_floats()) EXPECT_LE(std::fabs(v), limit);
  MultiHeadAttention no_bias({.num_heads = 1, .key_dim = 4, .use_bias = false});
  no_bias(p);
  EXPECT_EQ(no_bias.weights().size(), 4u);

  EXPECT_THROW(Embedding(0, 4), Error);
  EXPECT_THROW(PositionEmbedding(0), Error);
  EXPECT_THROW(LayerNormalization(0.0f), Error);
  EXPECT_THROW(MultiHeadAttention({.num_heads = 0, .key_dim = 4}), Error);
  EXPECT_THROW(MultiHeadAttention({.num_heads = 2, .key_dim = 4, .dropout = 1.0f}), Error);
}

TEST_F(TransformerLayersTest, ClearErrors) {
  Embedding emb(10, 4);
  try {
    emb(Var(Tensor::from_ints({1, 3}, {1, 10, 2})));
    FAIL() << "an id equal to input_dim was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("id 10"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("input_dim 10"), std::string::npos) << e.message();
  }
  try {
    emb(Var(Tensor::from_floats({1, 2}, {1.0f, 2.0f})));
    FAIL() << "floating ids were accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("int32 or int64"), std::string::npos) << e.message();
  }
  PositionEmbedding pos(4);
  EXPECT_THROW(pos(Var(Tensor::zeros({1, 5, 3}, DType::kFloat32))), Error);  // longer than sequence_length
  EXPECT_THROW((*make_layer<PositionEmbedding>(4))(Input({5, 3})), Error);   // found where the model is written
  EXPECT_THROW((*make_layer<PositionEmbedding>(4))(Input({3})), Error);      // no feature axis
  pos(Var(Tensor::zeros({1, 3, 3}, DType::kFloat32)));
  EXPECT_THROW(pos(Var(Tensor::zeros({1, 3, 4}, DType::kFloat32))), Error);  // built for 3 features
  MultiHeadAttention mha({.num_heads = 2, .key_dim = 2});
  EXPECT_THROW((*make_layer<MultiHeadAttention>(MultiHeadAttentionOptions{.num_heads = 2, .key_dim = 2}))(Input({4})),
               Error);
  mha(Var(Tensor::zeros({1, 3, 4}, DType::kFloat32)));
  EXPECT_THROW(mha(Var(Tensor::zeros({1, 3, 5}, DType::kFloat32))), Error);
  MultiHeadAttention with_dropout({.num_heads = 1, .key_dim = 2, .dropout = 0.5f});
  EXPECT_THROW(with_dropout(Var(Tensor::zeros({1, 3, 4}, DType::kFloat32)), CallContext{true, nullptr}), Error);
}

// Every layer under every policy: variables in the variable dtype (float32 under the mixed policies),
// outputs in the compute dtype, weight gradients in float32.
TEST_F(TransformerLayersTest, PoliciesVariablesFloat32OutputsInComputeDType) {
  for (const char* policy : kPolicies) {
    set_global_policy(policy);
    const DType compute = global_policy().compute_dtype();
    Rng rng(3);
    const CallContext ctx{true, &rng};
    Embedding emb(20, 8);
    PositionEmbedding pos(6);
    LayerNormalization ln;
    MultiHeadAttention mha({.num_heads = 2, .key_dim = 4, .dropout = 0.1f, .causal = true});
    Dense up(12, "gelu"), down(8);
    Var x = emb(Var(token_ids({3, 6}, 20, 4)), ctx);
    EXPECT_EQ(x.dtype(), compute) << policy;
    Var h = pos(x, ctx);
    EXPECT_EQ(h.dtype(), compute) << policy;
    Var n = ln(h, ctx);
    EXPECT_EQ(n.dtype(), compute) << policy;
    Var a = mha(n, ctx);
    EXPECT_EQ(a.dtype(), compute) << policy;
    Var f = down(up(a, ctx), ctx);  // Dense on (batch, T, D)
    EXPECT_EQ(f.shape(), (Shape{3, 6, 8})) << policy;
    EXPECT_EQ(f.dtype(), compute) << policy;
    backward(sum(f));
    for (const Layer* l : std::initializer_list<const Layer*>{&emb, &pos, &ln, &mha, &up, &down})
      for (const Var& w : l->weights()) {
        EXPECT_EQ(w.dtype(), DType::kFloat32) << policy << " " << w.name();
        ASSERT_TRUE(w.has_grad()) << policy << " " << w.name();
        EXPECT_EQ(w.grad().dtype(), DType::kFloat32) << policy << " " << w.name();
        EXPECT_TRUE(ops::all_finite({w.grad()})) << policy << " " << w.name();
      }
  }
}

// The pure 16-bit policies keep variables in 16 bits: the layers read them (in float32 where they compute in
// float32) and their gradients arrive in the variables' dtype.
TEST_F(TransformerLayersTest, Pure16BitPoliciesRunForwardAndBackward) {
  for (const char* policy : {"float16", "bfloat16"}) {
    set_global_policy(policy);
    const DType d = global_policy().compute_dtype();
    Embedding emb(20, 8);
    PositionEmbedding pos(6);
    LayerNormalization ln;
    MultiHeadAttention mha({.num_heads = 2, .key_dim = 4, .causal = true});
    Var y = mha(ln(pos(emb(Var(token_ids({2, 6}, 20, 14))))));
    EXPECT_EQ(y.dtype(), d) << policy;
    backward(sum(y));
    for (const Layer* l : std::initializer_list<const Layer*>{&emb, &pos, &ln, &mha})
      for (const Var& w : l->weights()) {
        EXPECT_EQ(w.dtype(), d) << policy << " " << w.name();
        ASSERT_TRUE(w.has_grad()) << policy << " " << w.name();
        EXPECT_EQ(w.grad().dtype(), d) << policy << " " << w.name();
        EXPECT_TRUE(ops::all_finite({w.grad()})) << policy << " " << w.name();
      }
  }
}

// Dense applies to the last axis of a (batch, T, D) input: the same values as the (batch * T, D) product.
TEST_F(TransformerLayersTest, DenseOnSequencesUnderEveryPolicy) {
  for (const char* policy : kPolicies) {
    set_global_policy(policy);
    Dense d(5, "gelu");
    Rng rng(5);
    d.build({7, 4}, rng);
    EXPECT_EQ(d.compute_output_shape({7, 4}), (Shape{7, 5}));
    EXPECT_EQ(d.kernel().shape(), (Shape{4, 5}));
    Tensor x = random_tensor({3, 7, 4}, 6);
    Var y3 = d(Var(x));
    Var y2 = d(Var(x.reshape({21, 4})));
    EXPECT_EQ(y3.shape(), (Shape{3, 7, 5}));
    EXPECT_EQ(y3.dtype(), global_policy().compute_dtype());
    EXPECT_EQ(y3.value().to_floats(), y2.value().to_floats()) << policy;
    Var xv(x, true);
    backward(sum(d(xv)));
    EXPECT_EQ(xv.grad().shape(), x.shape());
    EXPECT_EQ(d.kernel().grad().dtype(), DType::kFloat32);
    EXPECT_THROW(d(Var(Tensor::zeros({3, 7, 5}, DType::kFloat32))), Error);
  }
}

// A float16 input whose rows sit at 1000 with a spread of 0.5: float16 arithmetic could not hold the
// squared sum (over 65504) and would cancel the variance away; the float32 statistics normalize it.
TEST_F(TransformerLayersTest, LayerNormStatisticsAreFloat32) {
  set_global_policy("mixed_float16");
  LayerNormalization ln;
  std::vector<float> v(2 * 64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1000.0f + (i % 2 ? 0.5f : -0.5f);
  Var x(Tensor::from_floats({1, 2, 64}, v, DType::kFloat16));
  Var y = ln(x);
  EXPECT_EQ(y.dtype(), DType::kFloat16);
  EXPECT_EQ(ln.gamma().dtype(), DType::kFloat32);
  // (x - 1000) / sqrt(0.25 + 1e-3) = +-0.998..., rounded once into float16.
  const float want = static_cast<float>(0.5 / std::sqrt(0.25 + 1e-3));
  const std::vector<float> yv = y.value().to_floats();
  for (size_t i = 0; i < yv.size(); ++i) EXPECT_NEAR(yv[i], i % 2 ? want : -want, 1e-3) << i;
}

// RMSNormalization under every policy against its definition in float64 from the rounded input: scale a float32
// variable of ones, output in the compute dtype within one rounding of it (2^-8 relative for bfloat16, 2^-11 for
// float16, float32's sum of 12 squares well inside 1e-6), the scale's gradient float32 and equal to the float64 sum
// of dy * x * rstd over rows within the same rounding.
TEST_F(TransformerLayersTest, RMSNormalizationMatchesItsDefinitionUnderEveryPolicy) {
  for (const char* policy : kPolicies) {
    set_global_policy(policy);
    const DType compute = global_policy().compute_dtype();
    const double tol = compute == DType::kBFloat16 ? 0x1p-7 : compute == DType::kFloat16 ? 0x1p-10 : 1e-6;
    RMSNormalization rn;
    EXPECT_EQ(rn.epsilon(), 1e-6f);
    Var x(random_tensor({2, 3, 12}, 41, -4.0f, 3.0f).to(compute), true);
    Var y = rn(x);
    EXPECT_EQ(weight_shapes(rn), (std::map<std::string, Shape>{{"rms_normalization/scale", {12}}})) << policy;
    EXPECT_EQ(rn.scale().dtype(), DType::kFloat32) << policy;
    EXPECT_EQ(rn.scale().value().to_floats(), std::vector<float>(12, 1.0f)) << policy;
    EXPECT_EQ(y.dtype(), compute) << policy;
    EXPECT_EQ(y.shape(), (Shape{2, 3, 12})) << policy;
    backward(sum(y));
    ASSERT_TRUE(rn.scale().has_grad()) << policy;
    EXPECT_EQ(rn.scale().grad().dtype(), DType::kFloat32) << policy;
    EXPECT_EQ(x.grad().dtype(), compute) << policy;
    const std::vector<float> xv = x.value().to_floats(), yv = y.value().to_floats();
    const std::vector<float> ds = rn.scale().grad().to_floats();
    std::vector<double> want_ds(12, 0.0);
    for (int64_t r = 0; r < 6; ++r) {
      double ss = 0;
      for (int64_t j = 0; j < 12; ++j) {
        const double v = xv[static_cast<size_t>(r * 12 + j)];
        ss += v * v;
      }
      const double rstd = 1.0 / std::sqrt(ss / 12 + 1e-6);
      for (int64_t j = 0; j < 12; ++j) {
        const size_t i = static_cast<size_t>(r * 12 + j);
        EXPECT_NEAR(yv[i], xv[i] * rstd, tol * std::fabs(xv[i] * rstd) + 1e-6) << policy << " y[" << i << "]";
        want_ds[static_cast<size_t>(j)] += xv[i] * rstd;  // dy = 1 (the sum)
      }
    }
    for (size_t j = 0; j < 12; ++j) EXPECT_NEAR(ds[j], want_ds[j], 1e-5 * (1 + std::fabs(want_ds[j]))) << policy;
  }
  EXPECT_THROW(RMSNormalization(0.0f), Error);
}

// A float16 input of 300s: each square (90000) overflows float16, the float32 statistic normalizes the rows to 1.
TEST_F(TransformerLayersTest, RMSNormalizationStatisticIsFloat32) {
  set_global_policy("mixed_float16");
  RMSNormalization rn;
  Var y = rn(Var(Tensor::full({1, 2, 64}, DType::kFloat16, 300.0f)));
  EXPECT_EQ(y.dtype(), DType::kFloat16);
  for (float v : y.value().to_floats()) EXPECT_EQ(v, 1.0f);
}

// The layer against its definition computed in float64 from its own weights: projections with the Keras
// kernel layouts, softmax(q k^T / sqrt(dk)) per head, the output projection. Causal: position i ignores
// every later position.
TEST_F(TransformerLayersTest, MultiHeadAttentionMatchesItsDefinition) {
  constexpr int64_t B = 2, T = 5, D = 6, H = 2, K = 3;
  for (bool causal : {false, true}) {
    MultiHeadAttention mha({.num_heads = H, .key_dim = K, .causal = causal});
    Tensor x = random_tensor({B, T, D}, 7);
    Var y = mha(Var(x));
    const std::vector<Var>& w = mha.weights();
    std::vector<std::vector<float>> p;
    for (const Var& v : w) p.push_back(v.value().to_floats());
    // w: query kernel, bias, key kernel, bias, value kernel, bias, output kernel, bias.
    const std::vector<float> xv = x.to_floats(), yv = y.value().to_floats();
    auto project = [&](int which, int64_t b, int64_t t, int64_t h, int64_t k) {
      double s = p[static_cast<size_t>(which + 1)][static_cast<size_t>(h * K + k)];
      for (int64_t d = 0; d < D; ++d)
        s += static_cast<double>(xv[static_cast<size_t>((b * T + t) * D + d)]) *
             p[static_cast<size_t>(which)][static_cast<size_t>((d * H + h) * K + k)];
      return s;
    };
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> attended(static_cast<size_t>(H * K), 0.0);
        for (int64_t h = 0; h < H; ++h) {
          const int64_t end = causal ? i + 1 : T;
          std::vector<double> logit(static_cast<size_t>(end));
          double mx = -1e300, sum = 0;
          for (int64_t j = 0; j < end; ++j) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k) s += project(0, b, i, h, k) * project(2, b, j, h, k);
            logit[static_cast<size_t>(j)] = s / std::sqrt(static_cast<double>(K));
            mx = std::max(mx, logit[static_cast<size_t>(j)]);
          }
          for (double& l : logit) sum += (l = std::exp(l - mx));
          for (int64_t j = 0; j < end; ++j)
            for (int64_t k = 0; k < K; ++k)
              attended[static_cast<size_t>(h * K + k)] += logit[static_cast<size_t>(j)] / sum * project(4, b, j, h, k);
        }
        for (int64_t d = 0; d < D; ++d) {
          double want = p[7][static_cast<size_t>(d)];
          for (int64_t hk = 0; hk < H * K; ++hk) want += attended[static_cast<size_t>(hk)] * p[6][static_cast<size_t>(hk * D + d)];
          // float32 throughout: a few float32 units of the O(1) terms.
          EXPECT_NEAR(yv[static_cast<size_t>((b * T + i) * D + d)], want, 1e-5) << (causal ? "causal " : "") << b << i << d;
        }
      }
  }
}

TEST_F(TransformerLayersTest, CausalOutputsIgnoreLaterPositionsAndGradientsMatchFiniteDifferences) {
  MultiHeadAttention mha({.num_heads = 2, .key_dim = 2, .causal = true});
  Tensor a = random_tensor({1, 6, 4}, 8), b = a.clone();
  b.slice(1, 3, 6).copy_from(random_tensor({1, 3, 4}, 9, -5.0f, 5.0f));  // change positions 3..5
  const std::vector<float> ya = mha(Var(a)).value().to_floats(), yb = mha(Var(b)).value().to_floats();
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(ya[i], yb[i]) << i;  // positions 0..2 unchanged, bit for bit
  bool later_differs = false;
  for (size_t i = 12; i < 24; ++i) later_differs |= ya[i] != yb[i];
  EXPECT_TRUE(later_differs);
  // The whole layer's input gradient (through the three projections, attention and the output projection).
  const GradCheckResult r = check_gradients(
      [&](const std::vector<Var>& v) { return mean_squared_error(mha(v[0]), random_tensor({2, 4, 4}, 10)); },
      {random_tensor({2, 4, 4}, 11)});
  EXPECT_LT(r.max_rel_error, 5e-3) << r.worst;
}

int g_full_attention_calls = 0;
ops::kernel::AttentionFn* g_full_attention = nullptr;
void counting_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionOptions& o, Tensor& out,
                        Tensor& probs, Tensor& logits) {
  ++g_full_attention_calls;
  g_full_attention(q, k, v, o, out, probs, logits);
}

// Training calls on the CPU with T above one key tile (128) run the tiled attention (ops/flash_attention.h): the full
// kernel is not called, and the output and the input gradient equal the full kernel's (flash_attention off, same
// weights) within float32 rounding; evaluation calls, and training calls of up to 128 positions, keep the full kernel.
TEST_F(TransformerLayersTest, TrainingCallsRunTheTiledAttention) {
  MultiHeadAttention tiled({.num_heads = 2, .key_dim = 4, .causal = true});
  MultiHeadAttention full({.num_heads = 2, .key_dim = 4, .causal = true, .flash_attention = false});
  const Tensor x = random_tensor({2, 130, 8}, 12);
  tiled(Var(x));
  full(Var(x));
  for (size_t i = 0; i < tiled.weights().size(); ++i) {
    Tensor w = full.weights()[i].value();
    w.copy_from(tiled.weights()[i].value());
  }
  ops::KernelOverride<ops::Op::attention> counting(ops::cpu_backend(), &counting_attention);
  g_full_attention = counting.original();
  g_full_attention_calls = 0;
  Var xa(x, true), xb(x, true);
  Var ya = tiled(xa, {.training = true});
  backward(sum(ya));  // runs and clears the tape: one forward and backward at a time
  EXPECT_EQ(g_full_attention_calls, 0);
  Var yb = full(xb, {.training = true});
  backward(sum(yb));
  EXPECT_EQ(g_full_attention_calls, 1);  // the layer with flash_attention off
  const std::vector<float> va = ya.value().to_floats(), vb = yb.value().to_floats();
  for (size_t i = 0; i < va.size(); ++i) ASSERT_NEAR(va[i], vb[i], 1e-5) << "out " << i;
  const std::vector<float> ga = xa.grad().to_floats(), gb = xb.grad().to_floats();
  for (size_t i = 0; i < ga.size(); ++i) ASSERT_NEAR(ga[i], gb[i], 1e-5) << "gradient " << i;
  tiled(Var(x));
  EXPECT_EQ(g_full_attention_calls, 2);  // evaluation
  tiled(Var(x.slice(1, 0, 128).contiguous()), {.training = true});
  EXPECT_EQ(g_full_attention_calls, 3);  // one key tile
  clear_tape();
}

// Rotary positions turn q and k by angles of their positions: at position 0 every angle is 0, so a causal layer's
// first row is the plain layer's bit for bit (same weights), and later rows differ; the whole layer's gradient
// (through the rotation's transpose) matches finite differences.
TEST_F(TransformerLayersTest, RotaryAttentionTurnsLaterPositionsAndGradientsMatchFiniteDifferences) {
  MultiHeadAttention plain({.num_heads = 2, .key_dim = 4, .causal = true});
  MultiHeadAttention rotary(MultiHeadAttentionOptions{}.with_num_heads(2).with_key_dim(4).with_causal(true).with_rotary(
      true));
  const Tensor x = random_tensor({2, 5, 6}, 12);
  const std::vector<float> yp = plain(Var(x)).value().to_floats();
  rotary(Var(x));  // builds
  ASSERT_EQ(plain.weights().size(), rotary.weights().size());
  for (size_t i = 0; i < plain.weights().size(); ++i) {
    Var w = rotary.weights()[i];  // a handle on the layer's variable
    w.set_value(plain.weights()[i].value());
  }
  const std::vector<float> yr = rotary(Var(x)).value().to_floats();
  for (int64_t b = 0; b < 2; ++b) {
    bool later_differs = false;
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t d = 0; d < 6; ++d) {
        const size_t k = static_cast<size_t>((b * 5 + t) * 6 + d);
        if (t == 0) EXPECT_EQ(yr[k], yp[k]) << "batch " << b << " feature " << d;
        else later_differs |= yr[k] != yp[k];
      }
    EXPECT_TRUE(later_differs) << "batch " << b;
  }
  const GradCheckResult r = check_gradients(
      [&](const std::vector<Var>& v) { return mean_squared_error(rotary(v[0]), random_tensor({2, 4, 6}, 13)); },
      {random_tensor({2, 4, 6}, 14)});
  EXPECT_LT(r.max_rel_error, 5e-3) << r.worst;
}

// Records what layers report through the observer in force.
class InternalsRecorder : public LayerObserver {
 public:
  void on_internal(const Layer& layer, std::string_view what, const Tensor& value) override {
    reports.push_back({layer.name(), std::string(what), value});
  }
  struct Report {
    std::string layer, what;
    Tensor value;
  };
  std::vector<Report> reports;
};

// A logit multiplier of 1e5 pushes float16 logits past 65504 on purpose: the float16 run breaks (NaN),
// and the observer sees the float32 logits beyond float16's range, before their rounding. Without an
// observer the layer reports nothing.
TEST_F(TransformerLayersTest, ObserverSeesAttentionLogitsAndFloat16Overflows) {
  for (const char* policy : kPolicies) {
    set_global_policy(policy);
    SymbolicTensor in = Input({4, 8});
    auto mha = make_layer<MultiHeadAttention>(
        MultiHeadAttentionOptions{.num_heads = 2, .key_dim = 4, .causal = true, .logit_multiplier = 1e5f});
    Network net({in}, {(*mha)(in)}, "attention");
    Rng rng(12);
    net.build({4, 8}, rng);
    InternalsRecorder rec;
    net.set_observer(&rec);
    Var y = net.call(Var(random_tensor({3, 4, 8}, 13, -2.0f, 2.0f)));
    ASSERT_EQ(rec.reports.size(), 1u) << policy;
    EXPECT_EQ(rec.reports[0].layer, "multi_head_attention");
    EXPECT_EQ(rec.reports[0].what, "attention_logits");
    const Tensor& logits = rec.reports[0].value;
    EXPECT_EQ(logits.dtype(), DType::kFloat32);
    EXPECT_EQ(logits.numel(), 3 * 2 * (4 * 5 / 2));  // batch, heads, the causal triangle
    float max_abs = 0;
    for (float v : logits.to_floats()) max_abs = std::max(max_abs, std::fabs(v));
    EXPECT_GT(max_abs, kFloat16Max) << policy;
    EXPECT_TRUE(std::isfinite(max_abs));
    const bool finite = ops::all_finite({y.value()});
    EXPECT_EQ(finite, std::string(policy) != "mixed_float16") << policy;
    net.set_observer(nullptr);
    net.call(Var(random_tensor({3, 4, 8}, 13)));
    EXPECT_EQ(rec.reports.size(), 1u);  // no observer, no report
    clear_tape();
  }
}

// Input((T,), int32) -> Embedding -> PositionEmbedding -> [LN -> MHA(causal) -> Add, LN -> Dense(4D, gelu)
// -> Dense(D) -> Add] -> LN -> Dense(V, float32): next-token prediction on sequences that count up modulo V.
// Trained with the loop Model::train_step runs (forward in training mode, loss, backward seeded with the
// loss scale, update, zeroed gradients), here with plain SGD on the float32 variables (optimizers live above
// nn), the loss falls under every policy.
TEST_F(TransformerLayersTest, TinyTransformerBlockTrainsUnderEveryPolicy) {
  constexpr int64_t kVocab = 11, kT = 8, kD = 16, kBatch = 16;
  for (const char* policy : kPolicies) {
    set_global_policy(policy);
    SymbolicTensor ids = Input({kT}, DType::kInt32, "tokens");
    SymbolicTensor x = (*make_layer<Embedding>(kVocab, kD))(ids);
    x = (*make_layer<PositionEmbedding>(kT))(x);
    SymbolicTensor a = (*make_layer<LayerNormalization>())(x);
    a = (*make_layer<MultiHeadAttention>(MultiHeadAttentionOptions{.num_heads = 2, .key_dim = kD / 2, .dropout = 0.1f,
                                                                   .causal = true}))(a);
    x = (*make_layer<Add>())({x, a});
    SymbolicTensor f = (*make_layer<LayerNormalization>())(x);
    f = (*make_layer<Dense>(4 * kD, "gelu"))(f);
    f = (*make_layer<Dense>(kD))(f);
    x = (*make_layer<Add>())({x, f});
    x = (*make_layer<LayerNormalization>())(x);
    SymbolicTensor logits = (*make_layer<Dense>(kVocab, "linear", dtype_arg("float32")))(x);
    EXPECT_EQ(logits.shape(), (Shape{kT, kVocab}));
    Network net({ids}, {logits}, "tiny_transformer");
    Rng init(21), dropout(22), data(23);
    net.build({kT}, init);
    for (const Var& w : net.weights()) EXPECT_EQ(w.dtype(), DType::kFloat32) << policy << " " << w.name();

    // Static loss scaling under float16, as LossScaleOptimizer would: gradients scaled up, then down.
    const float loss_scale = std::string(policy) == "mixed_float16" ? 256.0f : 1.0f;
    constexpr float kLearningRate = 0.3f;
    std::vector<float> losses;
    for (int step = 0; step < 30; ++step) {
      std::vector<int32_t> in(static_cast<size_t>(kBatch * kT)), next(in.size());
      for (int64_t b = 0; b < kBatch; ++b) {
        const int64_t start = static_cast<int64_t>(data.below(kVocab));
        for (int64_t t = 0; t < kT; ++t) {
          in[static_cast<size_t>(b * kT + t)] = static_cast<int32_t>((start + t) % kVocab);
          next[static_cast<size_t>(b * kT + t)] = static_cast<int32_t>((start + t + 1) % kVocab);
        }
      }
      clear_tape();
      Var out = net.call(Var(Tensor::from_ints({kBatch, kT}, in)), CallContext{true, &dropout});
      ASSERT_EQ(out.dtype(), DType::kFloat32);
      ASSERT_EQ(out.shape(), (Shape{kBatch, kT, kVocab}));
      Var loss = sparse_categorical_crossentropy(reshape(out, {kBatch * kT, kVocab}),
                                                 Tensor::from_ints({kBatch * kT}, next), /*from_logits=*/true);
      losses.push_back(loss.value().item());
      backward(loss, loss_scale);
      NoGradGuard no_grad;
      for (Var w : net.trainable_weights()) {
        ASSERT_TRUE(w.has_grad()) << policy << " " << w.name();
        const std::vector<float> g = w.grad().to_floats();
        std::vector<float> v = w.value().to_floats();
        for (size_t i = 0; i < v.size(); ++i) v[i] -= kLearningRate * g[i] / loss_scale;
        w.set_value(Tensor::from_floats(w.shape(), v));
        w.zero_grad();
      }
    }
    for (float l : losses) ASSERT_TRUE(std::isfinite(l)) << policy;
    const float first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[27] + losses[28] + losses[29]) / 3;
    EXPECT_NEAR(first, std::log(static_cast<float>(kVocab)), 0.5f) << policy;  // about uniform at first
    EXPECT_LT(last, 0.5f * first) << policy << ": loss " << first << " -> " << last;
  }
}

}  // namespace
}  // namespace mixtrain
