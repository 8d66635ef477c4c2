// Backward of every transformer function (embedding, position embeddings, layer normalization, scaled
// dot-product attention), checked against central finite differences in float32 (see gradcheck_test.cpp
// for the tolerance's reasoning), plus the dtypes gradients arrive in under a mixed policy. Each output is
// reduced to a scalar by a mean squared error against a fixed random target, so every element has its own
// weight.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/autograd/gradcheck.h"
#include "mixtrain/autograd/transformer_functions.h"

namespace mixtrain {
namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = r.uniform(lo, hi);
  return Tensor::from_floats(shape, v);
}

constexpr double kGradTolerance = 5e-3;

void expect_gradients_match(const std::function<Var(const std::vector<Var>&)>& f, const std::vector<Tensor>& inputs,
                            const std::string& what) {
  const GradCheckResult r = check_gradients(f, inputs);
  EXPECT_LT(r.max_rel_error, kGradTolerance) << what << ": " << r.worst;
}

Var head(const Var& out) { return mean_squared_error(out, random_tensor(out.shape(), 99).to(out.dtype())); }

TEST(TransformerGradCheck, EmbeddingTableWithRepeatedIds) {
  // Id 2 appears three times, id 0 never: its row's gradient must be exactly zero.
  const Tensor ids32 = Tensor::from_ints({2, 3}, {2, 1, 2, 3, 2, 1});
  const Tensor ids64 = Tensor::from_int64s({2, 3}, {2, 1, 2, 3, 2, 1});
  for (const Tensor& ids : {ids32, ids64})
    expect_gradients_match([&](const std::vector<Var>& v) { return head(embedding(ids, v[0], DType::kFloat32)); },
                           {random_tensor({4, 5}, 1)}, std::string("embedding ") + dtype_name(ids.dtype()));
  Var table(random_tensor({4, 5}, 2), true);
  backward(sum(embedding(ids32, table, DType::kFloat32)));
  const std::vector<float> g = table.grad().to_floats();
  for (int j = 0; j < 5; ++j) {
    EXPECT_EQ(g[static_cast<size_t>(j)], 0.0f);        // id 0: never looked up
    EXPECT_EQ(g[static_cast<size_t>(10 + j)], 3.0f);   // id 2: three times
  }
}

// With a gradient buffer attached (as a ParameterArena attaches one), the table's gradient is written into it row by
// row: stale contents of the rows no id names must not survive, and the rows written must match central finite
// differences, on a first step (contents unknown) and on a second one with other ids (the first's rows cleared).
TEST(TransformerGradCheck, EmbeddingTableGradientWrittenIntoItsBufferByRows) {
  const Tensor value = random_tensor({6, 5}, 3);
  Var table(value.clone(), true);
  Tensor buffer = Tensor::full({6, 5}, DType::kFloat32, 9.0f);  // stale: what a previous step might have left
  table.set_grad_buffer(buffer);
  const std::vector<Tensor> steps = {Tensor::from_ints({2, 3}, {2, 1, 2, 3, 2, 1}),
                                     Tensor::from_int64s({2, 2}, {4, 5, 4, 3})};
  for (size_t step = 0; step < steps.size(); ++step) {
    const Tensor& ids = steps[step];
    auto loss = [&](const Var& t) { return head(embedding(ids, t, DType::kFloat32)); };
    table.zero_grad();
    backward(loss(table));
    ASSERT_TRUE(table.grad().starts_with(buffer)) << "step " << step << ": not written into the buffer";
    ASSERT_NE(table.gradient_buffer_rows(), nullptr);
    const std::vector<int64_t> want_rows = step == 0 ? std::vector<int64_t>{1, 2, 3} : std::vector<int64_t>{3, 4, 5};
    EXPECT_EQ(*table.gradient_buffer_rows(), want_rows);
    const std::vector<float> g = buffer.to_floats();
    double worst = 0.0;
    for (int64_t e = 0; e < value.numel(); ++e) {
      const float eps = 1e-2f;
      auto at = [&](float delta) {
        Tensor t = value.clone();
        t.data<float>()[e] += delta;
        return static_cast<double>(loss(Var(t)).value().to_floats()[0]);
      };
      const double numeric = (at(eps) - at(-eps)) / (2.0 * eps);
      worst = std::max(worst, std::fabs(g[static_cast<size_t>(e)] - numeric) / std::max(1.0, std::fabs(numeric)));
      if (std::find(want_rows.begin(), want_rows.end(), e / 5) == want_rows.end()) {
        EXPECT_EQ(g[static_cast<size_t>(e)], 0.0f) << "step " << step << " element " << e;
      }
    }
    EXPECT_LT(worst, kGradTolerance) << "step " << step;
  }
  // Any other write into the buffer (here a second gradient added to the first) forgets the rows.
  table.zero_grad();
  backward(head(embedding(steps[0], table, DType::kFloat32)));
  table.accumulate_grad(Tensor::zeros({6, 5}, DType::kFloat32));
  EXPECT_EQ(table.gradient_buffer_rows(), nullptr);
}

TEST(TransformerGradCheck, PositionEmbeddingInputAndTable) {
  for (int64_t t : {1, 3, 5})  // shorter than the table, and as long
    expect_gradients_match([](const std::vector<Var>& v) { return head(add_position_embedding(v[0], v[1])); },
                           {random_tensor({2, t, 4}, 3), random_tensor({5, 4}, 4)},
                           "add_position_embedding T=" + std::to_string(t));
  EXPECT_THROW(add_position_embedding(Var(random_tensor({2, 6, 4}, 5)), Var(random_tensor({5, 4}, 6))), Error);
  EXPECT_THROW(add_position_embedding(Var(random_tensor({2, 3, 4}, 5)), Var(random_tensor({5, 3}, 6))), Error);
}

TEST(TransformerGradCheck, LayerNormInputGammaAndBeta) {
  for (const Shape& s : {Shape{3, 7}, Shape{2, 3, 5}, Shape{4, 1}})
    expect_gradients_match(
        [](const std::vector<Var>& v) { return head(layer_norm(v[0], v[1], v[2], 1e-3f)); },
        {random_tensor(s, 7, -2.0f, 2.0f), random_tensor({s[-1]}, 8, 0.5f, 1.5f), random_tensor({s[-1]}, 9)},
        "layer_norm " + s.to_string());
}

TEST(TransformerGradCheck, RmsNormInputAndScale) {
  for (const Shape& s : {Shape{3, 7}, Shape{2, 3, 5}, Shape{4, 1}})
    expect_gradients_match([](const std::vector<Var>& v) { return head(rms_norm(v[0], v[1], 1e-6f)); },
                           {random_tensor(s, 7, -2.0f, 2.0f), random_tensor({s[-1]}, 8, 0.5f, 1.5f)},
                           "rms_norm " + s.to_string());
}

TEST(TransformerGradCheck, AttentionQueriesKeysAndValues) {
  struct Case {
    int64_t b, t, s, h, dk, dv;
    bool causal;
    float dropout;
  };
  const Case cases[] = {
      {1, 1, 1, 1, 2, 2, false, 0.0f}, {2, 4, 4, 2, 3, 3, false, 0.0f}, {2, 5, 5, 2, 2, 3, true, 0.0f},
      {1, 3, 6, 3, 2, 1, false, 0.0f}, {2, 4, 4, 1, 3, 2, true, 0.3f},  {1, 5, 5, 2, 2, 2, false, 0.5f},
  };
  for (const Case& c : cases) {
    ops::AttentionOptions o;
    o.num_heads = c.h;
    o.causal = c.causal;
    o.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
    o.dropout_rate = c.dropout;
    o.dropout_seed = 17;  // a fixed mask: the function is deterministic, so differences see the same one
    const std::string what = "attention T=" + std::to_string(c.t) + " S=" + std::to_string(c.s) + " H=" +
                             std::to_string(c.h) + (c.causal ? " causal" : "") + (c.dropout > 0 ? " dropout" : "");
    expect_gradients_match(
        [&](const std::vector<Var>& v) { return head(scaled_dot_product_attention(v[0], v[1], v[2], o)); },
        {random_tensor({c.b, c.t, c.h * c.dk}, 10), random_tensor({c.b, c.s, c.h * c.dk}, 11),
         random_tensor({c.b, c.s, c.h * c.dv}, 12)},
        what);
  }
  // One Var as q, k and v (self-attention without projections): the three gradients add up.
  ops::AttentionOptions o;
  o.num_heads = 2;
  o.causal = true;
  o.scale = 0.5f;
  expect_gradients_match([&](const std::vector<Var>& v) { return head(scaled_dot_product_attention(v[0], v[0], v[0], o)); },
                         {random_tensor({2, 4, 4}, 13)}, "attention q = k = v");
}

TEST(TransformerGradCheck, FusedProjectionInputKernelsAndBiases) {
  // Three (D, heads, key_dim) kernels with (heads, key_dim) biases, as MultiHeadAttention's q, k, v; then one
  // 2-D kernel without a bias beside a 3-D one with.
  expect_gradients_match(
      [](const std::vector<Var>& v) {
        return head(fused_projection(v[0], {v[1], v[2], v[3]}, {v[1].value(), v[2].value(), v[3].value()},
                                     {v[4], v[5], v[6]}));
      },
      {random_tensor({2, 3, 4}, 20), random_tensor({4, 2, 3}, 21), random_tensor({4, 2, 3}, 22),
       random_tensor({4, 2, 3}, 23), random_tensor({2, 3}, 24), random_tensor({2, 3}, 25), random_tensor({2, 3}, 26)},
      "fused_projection q, k, v");
  expect_gradients_match(
      [](const std::vector<Var>& v) {
        return head(fused_projection(v[0], {v[1], v[2]}, {v[1].value(), v[2].value()}, {Var(), v[3]}));
      },
      {random_tensor({5, 3}, 27), random_tensor({3, 2}, 28), random_tensor({3, 2, 2}, 29), random_tensor({2, 2}, 30)},
      "fused_projection, one bias missing");
  // An output projection from heads: x (..., heads * key_dim), kernel (heads, key_dim, out).
  expect_gradients_match(
      [](const std::vector<Var>& v) { return head(fused_projection(v[0], {v[1]}, {v[1].value()}, {v[2]})); },
      {random_tensor({2, 3, 6}, 39), random_tensor({2, 3, 4}, 40), random_tensor({4}, 41)},
      "fused_projection (heads, key_dim, out)");
  // The same values as the separate projections, bit for bit (one GEMM computes each column the same way).
  Var x(random_tensor({2, 3, 4}, 31));
  Var k1(random_tensor({4, 5}, 32)), k2(random_tensor({4, 3}, 33)), b1(random_tensor({5}, 34));
  const std::vector<float> fused = fused_projection(x, {k1, k2}, {k1.value(), k2.value()}, {b1, Var()}).value().to_floats();
  const std::vector<float> p1 = linear(x, k1, k1.value(), b1).value().to_floats();
  const std::vector<float> p2 = linear(x, k2, k2.value(), Var()).value().to_floats();
  for (size_t r = 0; r < 6; ++r)
    for (size_t c = 0; c < 8; ++c) EXPECT_EQ(fused[r * 8 + c], c < 5 ? p1[r * 5 + c] : p2[r * 3 + c - 5]);
  EXPECT_THROW(fused_projection(x, {k1}, {k1.value().to(DType::kFloat16)}, {Var()}), Error);  // cast not in x's dtype
  EXPECT_THROW(fused_projection(x, {k1}, {k1.value()}, {Var(random_tensor({4}, 35))}), Error);  // bias width
}

TEST(TransformerGradCheck, PackedSelfAttentionMatchesSeparateQueriesKeysAndValues) {
  ops::AttentionOptions o;
  o.num_heads = 2;
  o.causal = true;
  o.scale = 0.6f;
  o.dropout_rate = 0.2f;
  o.dropout_seed = 5;
  expect_gradients_match([&](const std::vector<Var>& v) { return head(packed_self_attention(v[0], o)); },
                         {random_tensor({2, 4, 12}, 36)}, "packed_self_attention");
  // Bit for bit what the separate q, k, v give, gradients included.
  Tensor all = random_tensor({2, 4, 12}, 37);
  Var qkv(all, true);
  Var a = packed_self_attention(qkv, o);
  backward(sum(a));
  Var q(all.slice(2, 0, 4).contiguous(), true), k(all.slice(2, 4, 8).contiguous(), true), v(all.slice(2, 8, 12).contiguous(), true);
  Var b = scaled_dot_product_attention(q, k, v, o);
  backward(sum(b));
  EXPECT_EQ(a.value().to_floats(), b.value().to_floats());
  EXPECT_EQ(qkv.grad().slice(2, 0, 4).contiguous().to_floats(), q.grad().to_floats());
  EXPECT_EQ(qkv.grad().slice(2, 4, 8).contiguous().to_floats(), k.grad().to_floats());
  EXPECT_EQ(qkv.grad().slice(2, 8, 12).contiguous().to_floats(), v.grad().to_floats());
  EXPECT_THROW(packed_self_attention(Var(random_tensor({2, 4, 10}, 38)), o), Error);  // not three equal parts
}

// The tiled attention on the fused projection: its gradient against finite differences, and output and gradient equal
// to packed_self_attention's within float32 rounding (a few units of 2^-24 of O(1) terms), dropout included.
TEST(TransformerGradCheck, PackedFlashAttentionMatchesFiniteDifferencesAndThePackedOp) {
  ops::AttentionOptions o;
  o.num_heads = 2;
  o.causal = true;
  o.scale = 0.6f;
  o.dropout_rate = 0.2f;
  o.dropout_seed = 5;
  expect_gradients_match([&](const std::vector<Var>& v) { return head(packed_flash_attention(v[0], o)); },
                         {random_tensor({2, 5, 12}, 36)}, "packed_flash_attention");
  Tensor all = random_tensor({2, 70, 12}, 37);
  Var a(all, true), b(all, true);
  Var ya = packed_flash_attention(a, o);
  backward(sum(ya));  // runs and clears the tape: one forward and backward at a time
  Var yb = packed_self_attention(b, o);
  backward(sum(yb));
  const std::vector<float> va = ya.value().to_floats(), vb = yb.value().to_floats();
  for (size_t i = 0; i < va.size(); ++i) ASSERT_NEAR(va[i], vb[i], 1e-5) << "out " << i;
  const std::vector<float> ga = a.grad().to_floats(), gb = b.grad().to_floats();
  for (size_t i = 0; i < ga.size(); ++i) ASSERT_NEAR(ga[i], gb[i], 1e-5) << "gradient " << i;
  EXPECT_THROW(packed_flash_attention(Var(random_tensor({2, 4, 10}, 38)), o), Error);  // not three equal parts
}

TEST(TransformerGradCheck, MixedPrecisionGradientDTypes) {
  // A bfloat16 activation: its gradient arrives in bfloat16; the float32 tables' and LayerNorm parameters'
  // in float32.
  Var table(random_tensor({6, 4}, 14), true);
  Var x = embedding(Tensor::from_ints({2, 3}, {0, 5, 1, 1, 2, 3}), table, DType::kBFloat16);
  EXPECT_EQ(x.dtype(), DType::kBFloat16);
  Var pos(random_tensor({3, 4}, 15), true);
  Var h = add_position_embedding(x, pos);
  EXPECT_EQ(h.dtype(), DType::kBFloat16);
  Var gamma(Tensor::full({4}, DType::kFloat32, 1.0f), true), beta(Tensor::zeros({4}, DType::kFloat32), true);
  Var n = layer_norm(h, gamma, beta, 1e-3f);
  EXPECT_EQ(n.dtype(), DType::kBFloat16);
  ops::AttentionOptions o;
  o.num_heads = 2;
  o.causal = true;
  o.scale = 0.7f;
  Tensor logits;
  Var a = scaled_dot_product_attention(n, n, n, o, &logits);
  EXPECT_EQ(a.dtype(), DType::kBFloat16);
  EXPECT_EQ(logits.dtype(), DType::kFloat32);
  EXPECT_EQ(logits.numel(), 2 * 2 * 6);  // batch 2, 2 heads, 3 * 4 / 2 causal positions
  backward(sum(a));
  EXPECT_EQ(table.grad().dtype(), DType::kFloat32);
  EXPECT_EQ(pos.grad().dtype(), DType::kFloat32);
  EXPECT_EQ(gamma.grad().dtype(), DType::kFloat32);
  EXPECT_EQ(beta.grad().dtype(), DType::kFloat32);
  // Not recording: no probabilities kept, nothing taped.
  NoGradGuard no_grad;
  EXPECT_EQ(tape_size(), 0u);
  scaled_dot_product_attention(n, n, n, o);
  EXPECT_EQ(tape_size(), 0u);
}

}  // namespace
}  // namespace mixtrain
