// MultiHeadAttention's projections under the float8 policies: fp8_fused_projection against float64 products of
// operands quantized by the formats' definitions (tests/core/float8_reference.h), and the layer's FP8 state.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "fp8_reference.h"
#include "mixtrain/autograd/tape.h"
#include "mixtrain/core/allocator.h"
#include "mixtrain/nn/fp8_linear.h"
#include "mixtrain/nn/transformer_layers.h"

namespace mixtrain {
namespace {

namespace ref = float8_reference;
using fp8_test::quantize_ref;
using fp8_test::RefOperand;

class Fp8AttentionTest : public ::testing::Test {
 protected:
  void TearDown() override {
    set_global_policy("float32");
    set_fp8_recipe(Fp8Recipe::kDelayed);
  }
};

std::vector<float> uniform(int64_t n, float lo, float hi, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& e : v) e = rng.uniform(lo, hi);
  return v;
}

// sum_t a(i, t) b(t, j) / (sa sb) (+ bias[j]) in float64 with a read (m, k) and b (k, n) through the index
// functions, and the bound of its float32 evaluation: (k + 2) 2^-24 sum |a b| (the sum, the scaling and the bias)
// plus the output's rounding (out_unit |c|).
template <typename A, typename B>
void expect_product(const std::vector<float>& got, int64_t m, int64_t k, int64_t n, A a, B b, double scale,
                    double out_unit, const char* what, const float* bias = nullptr) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double c = bias ? bias[j] : 0.0, abs_sum = bias ? std::fabs(bias[j]) : 0.0;
      for (int64_t t = 0; t < k; ++t) c += a(i, t) * b(t, j) / scale, abs_sum += std::fabs(a(i, t) * b(t, j) / scale);
      ASSERT_NEAR(got[i * n + j], c, (k + 2) * 0x1p-24 * abs_sum + out_unit * std::fabs(c) + 1e-30) << what << i << j;
    }
}

// Three (12, 2, 3) kernels read as one (12, 18) matrix, quantized as one tensor (current scaling: the scale from the
// amax of all three); y = x_q w_q / (s_x s_w) + b, dx = g_q w_q^T / (s_g s_w), dW = x_q^T g_q / (s_x s_g) split back.
TEST_F(Fp8AttentionTest, FusedProjectionEqualsQuantizedFloat64Products) {
  const int64_t rows = 10, in = 12, width = 6, total = 18;
  auto scales = std::make_shared<Fp8GemmScales>(DTypePolicy::from_name("mixed_float8"), Fp8Recipe::kCurrent);
  std::vector<Var> kernels, biases;
  std::vector<float> w(in * total), bias(total);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> kv = uniform(in * width, -0.5f, 0.5f, 10 + i), bv = uniform(width, -1, 1, 20 + i);
    for (int64_t r = 0; r < in; ++r)
      for (int64_t c = 0; c < width; ++c) w[r * total + i * width + c] = kv[r * width + c];
    for (int64_t c = 0; c < width; ++c) bias[i * width + c] = bv[c];
    kernels.emplace_back(Tensor::from_floats({in, 2, 3}, kv), true);
    biases.emplace_back(Tensor::from_floats({2, 3}, bv), true);
  }
  Var x(Tensor::from_floats({2, 5, in}, uniform(rows * in, -3, 3, 1), DType::kBFloat16), true);
  const Tensor c = Tensor::from_floats({2, 5, total}, uniform(rows * total, -1e-3f, 1e-3f, 2), DType::kBFloat16);
  Var y = fp8_fused_projection(x, kernels, biases, scales);
  ASSERT_EQ(y.shape(), (Shape{2, 5, total}));
  backward(sum(multiply(y, Var(c))));

  const RefOperand qx = quantize_ref(x.value().to_floats(), ref::kE4M3, 448.0f);
  const RefOperand qw = quantize_ref(w, ref::kE4M3, 448.0f);
  const RefOperand qg = quantize_ref(c.to_floats(), ref::kE5M2, 57344.0f);
  expect_product(
      y.value().to_floats(), rows, in, total, [&](int64_t i, int64_t t) { return qx.q[i * in + t]; },
      [&](int64_t t, int64_t j) { return qw.q[t * total + j]; }, qx.scale * qw.scale, 0x1p-8, "y", bias.data());
  expect_product(
      x.grad().to_floats(), rows, total, in, [&](int64_t i, int64_t t) { return qg.q[i * total + t]; },
      [&](int64_t t, int64_t j) { return qw.q[j * total + t]; }, qg.scale * qw.scale, 0x1p-8, "dx");
  std::vector<float> dw(in * total), db(total);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> gk = kernels[i].grad().to_floats(), gb = biases[i].grad().to_floats();
    ASSERT_EQ(kernels[i].grad().shape(), (Shape{in, 2, 3}));
    for (int64_t r = 0; r < in; ++r)
      for (int64_t col = 0; col < width; ++col) dw[r * total + i * width + col] = gk[r * width + col];
    for (int64_t col = 0; col < width; ++col) db[i * width + col] = gb[col];
  }
  expect_product(
      dw, in, rows, total, [&](int64_t i, int64_t t) { return qx.q[t * in + i]; },
      [&](int64_t t, int64_t j) { return qg.q[t * total + j]; }, qx.scale * qg.scale, 0x1p-24, "dW");
  const std::vector<float> cv = c.to_floats();
  for (int64_t j = 0; j < total; ++j) {
    double s = 0, abs_s = 0;
    for (int64_t i = 0; i < rows; ++i) s += cv[i * total + j], abs_s += std::fabs(cv[i * total + j]);
    ASSERT_NEAR(db[j], s, (rows + 1) * 0x1p-24 * abs_s) << "the bias gradient sums the unquantized gradient";
  }
}

MultiHeadAttentionOptions attention(const char* policy) {
  MultiHeadAttentionOptions o;
  o.num_heads = 2;
  o.key_dim = 4;
  o.causal = true;
  o.dtype = dtype_arg(policy);
  return o;
}

// Under mixed_float8 the layer's projections are quantized (its output differs from mixed_bfloat16's), it reads no
// bfloat16 compute copies and neither its input's nor its output's value in backward (the gradients are the same
// with its input let go), and both projections' delayed histories roll per update and travel in its state.
TEST_F(Fp8AttentionTest, MultiHeadAttentionQuantizesBothProjectionsAndKeepsTheirState) {
  const std::vector<float> xv = uniform(3 * 6 * 8, -2, 2, 7), cv = uniform(3 * 6 * 8, -1, 1, 8);
  auto run = [&](const char* policy, bool release, MultiHeadAttention* layer) {
    MultiHeadAttention own(attention(policy));
    MultiHeadAttention& mha = layer ? *layer : own;
    if (!mha.built()) {
      Rng rng(4);
      mha.build({6, 8}, rng);
    }
    Var x(Tensor::from_floats({3, 6, 8}, xv, DType::kBFloat16), true);
    Var y = mha(x);
    std::vector<float> out = y.value().to_floats();
    if (release) x.release_value();
    backward(sum(multiply(y, Var(Tensor::from_floats({3, 6, 8}, cv, DType::kBFloat16)))));
    std::vector<std::vector<float>> grads{out, x.grad().to_floats()};
    for (const Var& w : mha.weights()) grads.push_back(w.grad().to_floats());
    return grads;
  };
  EXPECT_NE(run("mixed_float8", false, nullptr)[0], run("mixed_bfloat16", false, nullptr)[0]);
  EXPECT_EQ(run("mixed_float8", true, nullptr), run("mixed_float8", false, nullptr));

  MultiHeadAttention mha(attention("mixed_float8"));
  EXPECT_FALSE(mha.reads_compute_copies());
  EXPECT_FALSE(mha.backward_reads_inputs());
  EXPECT_FALSE(mha.backward_reads_output());
  run("mixed_float8", false, &mha);
  mha.on_optimizer_update();
  const Layer::LayerState state = mha.extra_state();
  ASSERT_EQ(state.size(), 12u);  // input, weight, grad: a history and a scale each, for both projections
  EXPECT_EQ(state[0].first, "query_key_value/fp8/input/amax_history");
  EXPECT_EQ(state[6].first, "attention_output/fp8/input/amax_history");
  for (const auto& [key, t] : state) {
    if (key.find("/scale") == std::string::npos) continue;
    EXPECT_NE(t.to_floats()[0], 1.0f) << key << " rolled at the update";
  }
  // A fresh layer given the state casts as this one: the same output bits.
  MultiHeadAttention restored(attention("mixed_float8"));
  Rng rng(4);
  restored.build({6, 8}, rng);
  restored.check_extra_state(state);
  restored.load_extra_state(state);
  EXPECT_EQ(run("mixed_float8", false, &restored)[0], run("mixed_float8", false, &mha)[0]);
  Layer::LayerState bad = state;
  bad.emplace_back("query/fp8/input/scale", Tensor::from_floats({1}, {1.0f}));
  EXPECT_THROW(restored.check_extra_state(bad), Error);
}

// Without gradients q, k and v go once the attention has run: the output projection runs beside the attention's
// output alone, so an evaluation batch never holds q, k, v, the attention's output and the projection's at once.
// The allocator's peak above what was held before the call, under mixed_bfloat16 and mixed_float8 (each recipe), on
// short sequences (the attention's own probabilities, batch x heads x T x T float32, a quarter of its output).
TEST_F(Fp8AttentionTest, WithoutGradientsTheOutputProjectionRunsWithoutQKV) {
  const int64_t batch = 256, t = 4, d = 128;
  MultiHeadAttentionOptions o;
  o.num_heads = 4;
  o.key_dim = 32;
  o.causal = true;
  const Var x(Tensor::from_floats({batch, t, d}, uniform(batch * t * d, -2, 2, 9), DType::kBFloat16), true);
  const int64_t column = batch * t * 2;  // bytes of one bfloat16 feature over all rows
  const int64_t qkv_a_y = (3 * d + d + d) * column;
  for (const char* policy : {"mixed_bfloat16", "mixed_float8"}) {
    for (Fp8Recipe recipe : {Fp8Recipe::kDelayed, Fp8Recipe::kCurrent, Fp8Recipe::kBlock}) {
      set_fp8_recipe(recipe);
      o.dtype = dtype_arg(policy);
      MultiHeadAttention mha(o);
      Rng rng(4);
      mha.build({t, d}, rng);
      NoGradGuard ng;
      reset_peak_memory();
      const int64_t before = memory_stats().live_bytes;
      const Var y = mha(x);
      const int64_t peak = memory_stats().peak_bytes - before;
      EXPECT_LT(peak, qkv_a_y) << policy << " " << fp8_recipe_name(recipe);
      EXPECT_EQ(y.value().to_floats().size(), static_cast<size_t>(batch * t * d));
    }
  }
}

}  // namespace
}  // namespace mixtrain
