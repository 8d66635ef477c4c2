// Layers with several outputs: one call gives them all (Keras layers that return a list), eagerly and in
// functional models, under every policy.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/network.h"
#include "mixtrain/nn/sequential.h"

namespace mixtrain {
namespace {

// (d,) -> [(a,), (b,)]: a linear head and a tanh head on the same input, counting its calls.
class TwoHeads : public Layer {
 public:
  TwoHeads(int64_t a, int64_t b) : Layer("two_heads"), a_(a), b_(b) {}
  std::string class_name() const override { return "TwoHeads"; }
  int num_outputs() const override { return 2; }
  std::vector<Shape> compute_output_shapes(const std::vector<Shape>& in) const override {
    MIXTRAIN_CHECK(in.size() == 1 && in[0].rank() == 1, "TwoHeads takes one (d,) input");
    return {Shape{a_}, Shape{b_}};
  }
  const Var& linear_kernel() const { return k1_; }
  const Var& tanh_kernel() const { return k2_; }
  int calls = 0;

 protected:
  void build_impl(const Shape& in, Rng& rng) override {
    k1_ = add_weight("linear_kernel", {in[0], a_}, Initializer::kGlorotUniform, rng);
    k2_ = add_weight("tanh_kernel", {in[0], b_}, Initializer::kGlorotUniform, rng);
  }
  std::vector<Var> call_outputs(const std::vector<Var>& xs, const CallContext&) override {
    ++calls;
    return {matmul(xs[0], autocast(k1_)), activation(matmul(xs[0], autocast(k2_)), ops::Activation::kTanh)};
  }

 private:
  int64_t a_, b_;
  Var k1_, k2_;
};

Tensor ramp(const Shape& shape, float scale = 0.1f) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % 7) - 3);
  return Tensor::from_floats(shape, v);
}

std::vector<float> grad_of(const Var& w) { return w.grad().to(DType::kFloat32).to_floats(); }

class MultiOutput : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { set_global_policy(GetParam()); }
  void TearDown() override { set_global_policy("float32"); }
};

// A graph that uses both outputs of one call: the layer runs once per model call, and outputs and gradients
// are bit-identical to the same computation written by hand on the layer's own weights.
TEST_P(MultiOutput, OneCallFeedsBothBranchesAndMatchesTheHandWrittenComputation) {
  SymbolicTensor x = Input({6}, DType::kFloat32, "features");
  auto heads = make_layer<TwoHeads>(4, 3);
  std::vector<SymbolicTensor> outs = heads->outputs(x);
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].shape(), Shape{4});
  EXPECT_EQ(outs[1].shape(), Shape{3});
  EXPECT_EQ(outs[1].output_index(), 1);
  EXPECT_EQ(outs[1].dtype(), heads->compute_dtype());
  auto dense = make_layer<Dense>(2, "linear", dtype_arg("float32"));
  SymbolicTensor projected = (*dense)(outs[0]);
  Network net({x}, {projected, outs[1]}, "two_branches");
  Rng rng(3);
  net.build({6}, rng);
  ASSERT_EQ(net.layers().size(), 2u);

  const Tensor in = ramp({5, 6});
  std::vector<Var> ys = net.call(std::vector<Var>{Var(in)});
  EXPECT_EQ(heads->calls, 1);
  ASSERT_EQ(ys.size(), 2u);
  EXPECT_EQ(ys[0].shape(), (Shape{5, 2}));
  EXPECT_EQ(ys[1].shape(), (Shape{5, 3}));
  EXPECT_EQ(ys[1].dtype(), heads->compute_dtype());
  backward(add(sum(cast(ys[0], DType::kFloat32)), sum(cast(ys[1], DType::kFloat32))));
  const std::vector<float> g1 = grad_of(heads->linear_kernel()), g2 = grad_of(heads->tanh_kernel());
  const std::vector<float> gd = grad_of(dense->weights()[0]);
  for (Var w : net.weights()) w.zero_grad();

  // By hand, on the same weights.
  const DType c = heads->compute_dtype();
  Var xc = cast(Var(in), c);
  Var h0 = matmul(xc, cast(heads->linear_kernel(), c));
  Var h1 = activation(matmul(xc, cast(heads->tanh_kernel(), c)), ops::Activation::kTanh);
  Var p = (*dense)(h0);
  EXPECT_EQ(ys[0].value().to_floats(), p.value().to_floats());
  EXPECT_EQ(ys[1].value().to_floats(), h1.value().to_floats());
  backward(add(sum(cast(p, DType::kFloat32)), sum(cast(h1, DType::kFloat32))));
  EXPECT_EQ(grad_of(heads->linear_kernel()), g1);
  EXPECT_EQ(grad_of(heads->tanh_kernel()), g2);
  EXPECT_EQ(grad_of(dense->weights()[0]), gd);
  // Variables stay in the variable dtype; gradients reach them in it.
  EXPECT_EQ(heads->linear_kernel().dtype(), DType::kFloat32);
  EXPECT_EQ(heads->linear_kernel().grad().dtype(), DType::kFloat32);
}

INSTANTIATE_TEST_SUITE_P(Policies, MultiOutput, ::testing::Values("float32", "mixed_float16", "mixed_bfloat16"));

TEST(MultiOutputLayer, EagerCallsGiveEveryOutputAndOneValueCallsSayWhereToGo) {
  TwoHeads heads(2, 3);
  Rng rng(1);
  CallContext ctx;
  ctx.rng = &rng;
  NoGradGuard no_grad;
  std::vector<Var> ys = heads.outputs(Var(ramp({4, 5})), ctx);
  ASSERT_EQ(ys.size(), 2u);
  EXPECT_TRUE(heads.built());
  EXPECT_EQ(ys[0].shape(), (Shape{4, 2}));
  EXPECT_EQ(ys[1].shape(), (Shape{4, 3}));
  EXPECT_EQ(heads.calls, 1);
  try {
    heads(Var(ramp({4, 5})));
    FAIL() << "a one-value call of a layer with two outputs was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has 2 outputs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("outputs(x)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(heads.calls, 1);  // refused before running

  // A layer with one output answers outputs() with a list of one, equal to its call.
  Dense dense(3);
  std::vector<Var> one = dense.outputs(Var(ramp({2, 5})), ctx);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].value().to_floats(), dense(Var(ramp({2, 5}))).value().to_floats());
}

TEST(MultiOutputLayer, GraphErrorsAreClear) {
  SymbolicTensor x = Input({5});
  auto heads = make_layer<TwoHeads>(2, 2);
  EXPECT_THROW((*heads)(x), Error);  // one symbolic value asked of two outputs
  Sequential seq;
  EXPECT_THROW(seq.emplace<TwoHeads>(2, 2), Error);  // cannot sit in a stack
  EXPECT_THROW(heads->outputs(Input({5, 2})), Error);  // compute_output_shapes refuses a rank-2 sample
  // Both outputs of one call into a merge layer: valid, and the call is still made once.
  std::vector<SymbolicTensor> outs = heads->outputs(x);
  SymbolicTensor both = (*make_layer<Add>())({outs[0], outs[1]});
  Network net({x}, {both});
  Rng rng(2);
  net.build({5}, rng);
  NoGradGuard no_grad;
  Var y = net.call(Var(ramp({3, 5})));
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(heads->calls, 1);
}

// Inspection and recovery see each output of the call.
class CountingObserver : public LayerObserver {
 public:
  void on_output(const Layer& l, const Var&) override {
    if (l.class_name() == "TwoHeads") ++outputs;
  }
  void on_gradient(const Layer& l, const Tensor&) override {
    if (l.class_name() == "TwoHeads") ++gradients;
  }
  int outputs = 0, gradients = 0;
};

TEST(MultiOutputLayer, TheObserverSeesEveryOutputAndItsGradient) {
  SymbolicTensor x = Input({4});
  auto heads = make_layer<TwoHeads>(3, 3);
  std::vector<SymbolicTensor> outs = heads->outputs(x);
  Network net({x}, {outs[0], outs[1]});
  Rng rng(4);
  net.build({4}, rng);
  CountingObserver obs;
  net.set_observer(&obs);
  std::vector<Var> ys = net.call(std::vector<Var>{Var(ramp({2, 4}))});
  backward(add(sum(ys[0]), sum(ys[1])));
  EXPECT_EQ(obs.outputs, 2);
  EXPECT_EQ(obs.gradients, 2);
}

TEST(MultiOutputLayer, SummaryListsTheOutputShapesAndNamesEachOutput) {
  SymbolicTensor x = Input({5}, DType::kFloat32, "pixels");
  auto heads = make_layer<TwoHeads>(2, 3);
  std::vector<SymbolicTensor> outs = heads->outputs(x);
  SymbolicTensor y = (*make_layer<Dense>(4))(outs[1]);
  Network net({x}, {outs[0], y}, "heads");
  Rng rng(1);
  net.build({5}, rng);
  std::ostringstream s;
  net.summary(s);
  const std::string t = s.str();
  EXPECT_NE(t.find("[(None, 2), (None, 3)]"), std::string::npos) << t;
  EXPECT_NE(t.find("two_heads[1]"), std::string::npos) << t;
  EXPECT_NE(t.find("Total params: " + std::to_string(5 * 2 + 5 * 3 + 3 * 4 + 4)), std::string::npos) << t;
}

}  // namespace
}  // namespace mixtrain
