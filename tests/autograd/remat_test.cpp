// remat(): a function recomputed in backward gives the gradients of running it recorded, bit for bit (dropout
// drawn from a generator included), through backward() and GradientTape, with a function input that other
// operations read too and with several outputs; it keeps none of its intermediates on the tape; outside recording
// it runs once.
#include <gtest/gtest.h>

#include <cstring>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/autograd/gradient_tape.h"
#include "mixtrain/autograd/remat.h"
#include "mixtrain/autograd/tape.h"

namespace mixtrain {
namespace {

Tensor ramp(const Shape& shape, float step, float start) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + step * static_cast<float>(i % 13) - 0.2f * static_cast<float>(i % 3);
  return Tensor::from_floats(shape, v);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.contiguous().raw(), b.contiguous().raw(), static_cast<size_t>(a.nbytes())) == 0;
}

struct Net {
  Var w0{ramp({5, 6}, 0.03f, -0.2f), true, "w0"};
  Var w1{ramp({6, 6}, 0.1f, -0.5f), true, "w1"};
  Var w2{ramp({6, 3}, -0.07f, 0.4f), true, "w2"};
  Tensor x = ramp({7, 5}, 0.2f, -1.0f);
  Tensor y = Tensor::from_ints({7}, {0, 1, 2, 0, 1, 2, 1});
  int runs = 0;

  // Two outputs: the block's activation and a second branch; the dropout draws from rng.
  std::vector<Var> block(const std::vector<Var>& in, Rng& rng) {
    ++runs;
    Var h = activation(matmul(in[0], w1), ops::Activation::kTanh);
    h = dropout(h, 0.3f, rng);
    return {matmul(h, w2), scale(h, 0.5f)};
  }
  // h0 feeds the block and, after it, the loss directly (the block input has another consumer).
  Var loss(bool recompute, Rng& rng) {
    Var h0 = matmul(Var(x), w0);
    std::vector<Var> outs = recompute ? remat([&](const std::vector<Var>& in) { return block(in, rng); }, {h0}, &rng)
                                      : block({h0}, rng);
    Var joined = add(outs[0], matmul(add(outs[1], h0), w2));
    return add(sparse_categorical_crossentropy(joined, y, true), scale(mean(h0), 0.1f));
  }
};

TEST(Remat, BackwardGivesTheBitsOfKeepingEverything) {
  Net kept, recomputed;
  Rng a(5), b(5);
  backward(kept.loss(false, a), 64.0f);
  const size_t before = tape_size();
  Var l = recomputed.loss(true, b);
  EXPECT_EQ(recomputed.runs, 1);
  EXPECT_LT(tape_size() - before, 12u);  // the block's 5 operations are not on the tape
  backward(l, 64.0f);
  EXPECT_EQ(recomputed.runs, 2);
  EXPECT_EQ(a.state(), b.state());  // the generator ends where one run leaves it
  for (auto [p, q] : {std::pair{kept.w0, recomputed.w0}, {kept.w1, recomputed.w1}, {kept.w2, recomputed.w2}})
    EXPECT_TRUE(same_bits(p.grad(), q.grad())) << p.name();
}

TEST(Remat, GradientTapeGivesTheSameBits) {
  Net kept, recomputed;
  Rng a(9), b(9);
  std::vector<Tensor> ga, gb;
  {
    GradientTape tape;
    ga = tape.gradient(kept.loss(false, a), {kept.w0, kept.w1, kept.w2});
  }
  {
    GradientTape tape;
    gb = tape.gradient(recomputed.loss(true, b), {recomputed.w0, recomputed.w1, recomputed.w2});
  }
  ASSERT_EQ(ga.size(), 3u);
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_TRUE(same_bits(ga[i], gb[i])) << i;
  for (const Var& w : {recomputed.w0, recomputed.w1, recomputed.w2}) EXPECT_FALSE(w.has_grad()) << w.name();
  EXPECT_EQ(tape_size(), 0u);
}

TEST(Remat, WithoutRecordingTheFunctionRunsOnce) {
  Net net;
  Rng rng(3);
  NoGradGuard no_grad;
  Var l = net.loss(true, rng);
  EXPECT_EQ(net.runs, 1);
  EXPECT_EQ(tape_size(), 0u);
  EXPECT_FALSE(in_recomputation());
}

}  // namespace
}  // namespace mixtrain
