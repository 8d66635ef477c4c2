// GradientTape: gradients returned for exactly the sources asked for, the same bits as backward(), and no
// gradient left on any variable.
#include <gtest/gtest.h>

#include <cstring>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/autograd/gradient_tape.h"

namespace mixtrain {
namespace {

Tensor ramp(const Shape& shape, float step, float start) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + step * static_cast<float>(i % 11) - 0.3f * static_cast<float>(i % 3);
  return Tensor::from_floats(shape, v);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.contiguous().raw(), b.contiguous().raw(), static_cast<size_t>(a.nbytes())) == 0;
}

struct Net {
  Var w1{ramp({5, 4}, 0.1f, -0.5f), true, "w1"};
  Var b1{ramp({4}, 0.05f, -0.1f), true, "b1"};
  Var w2{ramp({4, 3}, -0.07f, 0.4f), true, "w2"};
  Tensor x = ramp({6, 5}, 0.2f, -1.0f);
  Tensor y = Tensor::from_ints({6}, {0, 1, 2, 0, 1, 2});
  Var loss() const {
    Var h = activation(bias_add(matmul(Var(x), w1), b1), ops::parse_activation("tanh"));
    return sparse_categorical_crossentropy(matmul(h, w2), y, /*from_logits=*/true);
  }
};

TEST(GradientTape, GivesTheBitsOfBackwardAndLeavesNoGradient) {
  Net net;
  backward(net.loss());
  const Tensor g1 = net.w1.grad().clone(), gb = net.b1.grad().clone(), g2 = net.w2.grad().clone();
  for (Var v : {net.w1, net.b1, net.w2}) v.zero_grad();

  GradientTape tape;
  Var loss = net.loss();
  const std::vector<Tensor> g = tape.gradient(loss, {net.w2, net.w1});  // any subset, any order
  ASSERT_EQ(g.size(), 2u);
  EXPECT_TRUE(same_bits(g[0], g2));
  EXPECT_TRUE(same_bits(g[1], g1));
  EXPECT_EQ(g[1].dtype(), DType::kFloat32);
  // Nothing accumulated anywhere, b1 (reached but not asked for) included; the record is consumed.
  EXPECT_FALSE(net.w1.has_grad());
  EXPECT_FALSE(net.b1.has_grad());
  EXPECT_FALSE(net.w2.has_grad());
  EXPECT_EQ(tape_size(), 0u);
  (void)gb;
}

TEST(GradientTape, EarlierAccumulationStaysAsItWas) {
  Net net;
  net.w1.accumulate_grad(Tensor::full({5, 4}, DType::kFloat32, 7.0f));  // a caller's own accumulation
  GradientTape tape;
  const std::vector<Tensor> g = tape.gradient(net.loss(), {net.w1});
  EXPECT_EQ(net.w1.grad().at(3), 7.0f);
  EXPECT_NE(g[0].at(3), 7.0f);
  Net fresh;
  GradientTape again;
  EXPECT_TRUE(same_bits(again.gradient(fresh.loss(), {fresh.w1})[0], g[0]));
}

TEST(GradientTape, SharedGradientsScaleUnconnectedAndIntermediateSources) {
  Var w(Tensor::from_floats({3}, {1, 2, 3}), true, "w");
  Var unused(Tensor::from_floats({3}, {1, 1, 1}), true, "unused");
  GradientTape tape;
  Var h = add(w, w);          // one gradient tensor given to both operands
  Var s = sum(scale(add(h, w), 2.0f));  // d/dw = 2 * 3 = 6
  const std::vector<Tensor> g = tape.gradient(s, {w, unused, h}, /*output_gradient=*/4.0f);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g[0].at(i), 24.0f);
  EXPECT_FALSE(g[1].defined());  // the target does not depend on it (TensorFlow: None)
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g[2].at(i), 8.0f);  // a recorded intermediate value as a source
  EXPECT_FALSE(w.has_grad());
  EXPECT_FALSE(h.has_grad());
}

TEST(GradientTape, RecordsUnderNoGradWatchesInputsAndGivesOnce) {
  Var x(Tensor::from_floats({2}, {3, -1}));  // an input: no gradient unless watched
  NoGradGuard outside;
  GradientTape tape;
  tape.watch(x);
  Var y = sum(scale(x, 5.0f));
  const std::vector<Tensor> g = tape.gradient(y, {x});
  EXPECT_EQ(g[0].at(0), 5.0f);
  EXPECT_THROW(tape.gradient(y, {x}), Error);
  EXPECT_THROW(tape.watch(Var(Tensor::from_ints({1}, {1}))), Error);
}

TEST(GradientTape, OnlyItsOwnRecordAndNothingLeftWhenUnused) {
  Var w(Tensor::from_floats({2}, {1, 2}), true, "w");
  Var before = scale(w, 3.0f);  // recorded before the tape: not replayed
  const size_t outside = tape_size();
  {
    GradientTape tape;
    Var y = sum(scale(w, 2.0f));
    EXPECT_GT(tape_size(), outside);
  }  // never differentiated: its record is dropped
  EXPECT_EQ(tape_size(), outside);
  {
    GradientTape tape;
    const std::vector<Tensor> g = tape.gradient(sum(scale(w, 2.0f)), {w});
    EXPECT_EQ(g[0].at(1), 2.0f);
  }
  EXPECT_EQ(tape_size(), outside);
  // gradients(): everything recorded on the thread, including what came before.
  const std::vector<Tensor> g = gradients(sum(before), {w});
  EXPECT_EQ(g[0].at(0), 3.0f);
  EXPECT_EQ(tape_size(), 0u);
  EXPECT_FALSE(w.has_grad());
  // The target itself as a source.
  GradientTape tape;
  EXPECT_EQ(tape.gradient(w, {w}, 2.0f)[0].at(1), 2.0f);
}


// Nested tapes (tf.GradientTape inside tf.GradientTape): each gives the gradients of what it recorded, and the
// inner one's gradient() leaves the outer one's record whole.
struct TwoStage {
  Var w1{ramp({5, 4}, 0.1f, -0.5f), true, "w1"};
  Var b1{ramp({4}, 0.05f, -0.1f), true, "b1"};
  Var w2{ramp({4, 3}, -0.07f, 0.4f), true, "w2"};
  Var w3{ramp({3, 3}, 0.03f, -0.2f), true, "w3"};
  Tensor x = ramp({6, 5}, 0.2f, -1.0f);
  Tensor y = Tensor::from_ints({6}, {0, 1, 2, 0, 1, 2});
  Var first() const { return activation(bias_add(matmul(Var(x), w1), b1), ops::parse_activation("tanh")); }
  Var second(const Var& h) const { return activation(matmul(h, w2), ops::parse_activation("relu")); }
  Var loss(const Var& z) const { return sparse_categorical_crossentropy(matmul(z, w3), y, /*from_logits=*/true); }
};

TEST(GradientTape, NestedTapesGiveTheirOwnGradientsAndTheOuterRecordStaysWhole) {
  // References, each from a tape of its own.
  TwoStage ref;
  std::vector<Tensor> outer_ref, inner_ref;
  {
    GradientTape tape;
    Var h = ref.first();
    outer_ref = tape.gradient(ref.loss(ref.second(h)), {ref.w1, ref.b1, ref.w2, ref.w3});
  }
  {
    Var h;
    {
      NoGradGuard constant;  // h as the inner tape sees it: a value computed before it started
      h = ref.first();
    }
    GradientTape tape;
    tape.watch(h);
    inner_ref = tape.gradient(sum(ref.second(h)), {ref.w2, h});
  }
  EXPECT_EQ(tape_size(), 0u);

  TwoStage net;
  GradientTape outer;
  Var h = net.first();
  Var z;
  {
    GradientTape inner;
    z = net.second(h);
    const std::vector<Tensor> g = inner.gradient(sum(z), {net.w2, h, net.w1});
    EXPECT_TRUE(same_bits(g[0], inner_ref[0]));
    EXPECT_TRUE(same_bits(g[1], inner_ref[1]));  // h came before the inner tape: a source, not replayed through
    EXPECT_FALSE(g[2].defined());                // the inner tape did not record w1's use
    EXPECT_GT(tape_size(), 0u);                  // the outer tape still holds all it recorded
  }
  const std::vector<Tensor> g = outer.gradient(net.loss(z), {net.w1, net.b1, net.w2, net.w3});
  for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(same_bits(g[i], outer_ref[i])) << i;
  for (const Var& v : {net.w1, net.b1, net.w2, net.w3}) EXPECT_FALSE(v.has_grad());
  EXPECT_EQ(tape_size(), 0u);
}

TEST(GradientTape, AnUnusedInnerTapeLeavesTheOuterRecordAndOrderDoesNotMatter) {
  TwoStage ref;
  std::vector<Tensor> outer_ref;
  {
    GradientTape tape;
    outer_ref = tape.gradient(ref.loss(ref.second(ref.first())), {ref.w1, ref.w3});
  }
  TwoStage net;
  {
    GradientTape outer;
    Var h = net.first();
    Var z;
    {
      GradientTape inner;
      z = net.second(h);
    }  // never asked: what the outer tape recorded with it stays
    const std::vector<Tensor> g = outer.gradient(net.loss(z), {net.w1, net.w3});
    EXPECT_TRUE(same_bits(g[0], outer_ref[0]));
    EXPECT_TRUE(same_bits(g[1], outer_ref[1]));
  }
  EXPECT_EQ(tape_size(), 0u);

  // The outer tape asked first, while the inner one still records: the inner one keeps its record.
  std::vector<Tensor> inner_ref;
  {
    Var h;
    {
      NoGradGuard constant;
      h = ref.first();
    }
    GradientTape tape;
    inner_ref = tape.gradient(sum(ref.second(h)), {ref.w2});
  }
  GradientTape outer;
  Var h = net.first();
  GradientTape inner;
  Var z = net.second(h);
  const std::vector<Tensor> g = outer.gradient(net.loss(z), {net.w1, net.w3});
  EXPECT_TRUE(same_bits(g[0], outer_ref[0]));
  EXPECT_TRUE(same_bits(g[1], outer_ref[1]));
  Var after = sum(z);  // recorded by the inner tape, still alive
  EXPECT_TRUE(same_bits(inner.gradient(after, {net.w2})[0], inner_ref[0]));
  EXPECT_EQ(tape_size(), 0u);
}

}  // namespace
}  // namespace mixtrain
