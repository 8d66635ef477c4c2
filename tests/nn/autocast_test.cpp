// Autocast of variables in a custom layer: inside call(), float32 variables read in the compute dtype through
// the layer's cached cast, with their gradients reaching the float32 variables, written explicitly
// (autocast(w)) or not at all (the automatic read, LayerAutocastScope in nn/layer.h), with the same bits; the
// layers that opt out, nested layers, variables outside any call; and the error that names autocast where nothing
// casts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "mixtrain/autograd/autocast.h"
#include "mixtrain/autograd/gradient_tape.h"
#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/layer.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/transformer_layers.h"
#include "mixtrain/precision/hardware_check.h"

namespace mixtrain {
namespace {

// How a custom layer reads its variables: through autocast(w), as they are (the automatic read), or as they
// are in a layer that opts out of the automatic read.
enum class Read { kExplicit, kAutomatic, kOptOut };

// y = x kernel + bias, written as a Keras user writes a custom layer.
class MyLinear : public Layer {
 public:
  explicit MyLinear(int64_t units, Read read = Read::kExplicit) : Layer("my_linear", std::nullopt), units_(units),
                                                                  read_(read) {}
  std::string class_name() const override { return "MyLinear"; }
  Shape compute_output_shape(const Shape& s) const override { return Shape{s[-1] == 0 ? 0 : units_}; }
  bool autocasts_variables() const override { return read_ != Read::kOptOut; }
  Var kernel, bias;
  Var read(const Var& w) { return autocast(w); }

 protected:
  void build_impl(const Shape& in, Rng& rng) override {
    kernel = add_weight("kernel", {in[-1], units_}, Initializer::kGlorotUniform, rng);
    bias = add_weight("bias", {units_}, Initializer::kOnes, rng);
  }
  Var call(const Var& x, const CallContext&) override {
    if (read_ == Read::kExplicit) return bias_add(matmul(x, autocast(kernel)), autocast(bias));
    return bias_add(matmul(x, kernel), bias);  // opted out: a float32 variable meets float16 x
  }

 private:
  int64_t units_;
  Read read_;
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.contiguous().raw(), b.contiguous().raw(), static_cast<size_t>(a.nbytes())) == 0;
}

Tensor wave(const Shape& shape, float step) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(step * static_cast<float>(i)) * 2.0f;
  return Tensor::from_floats(shape, v);
}

// relu(x W + b) + x W: one variable read twice, a bias, an activation; explicit reads at each use.
class TwoUses : public Layer {
 public:
  explicit TwoUses(Read read) : Layer("two_uses"), read_(read) {}
  Shape compute_output_shape(const Shape&) const override { return Shape{6}; }
  Var w, b;

 protected:
  void build_impl(const Shape& in, Rng& rng) override {
    w = add_weight("w", {in[-1], 6}, Initializer::kGlorotUniform, rng);
    b = add_weight("b", {6}, Initializer::kGlorotUniform, rng);  // not zeros: the bias' gradient path counts
  }
  Var call(const Var& x, const CallContext&) override {
    auto r = [&](const Var& v) { return read_ == Read::kExplicit ? autocast(v) : v; };
    const Var h = activation(bias_add(matmul(x, r(w)), r(b)), ops::Activation::kRelu);
    return add(h, matmul(x, r(w)));
  }

 private:
  Read read_;
};

// Reports the dtype in which its call() reads a variable (scale() passes it through), then returns x.
class Probe : public Layer {
 public:
  explicit Probe(bool opt_out = false, const Var* other = nullptr)
      : Layer("probe"), opt_out_(opt_out), other_(other) {}
  bool autocasts_variables() const override { return !opt_out_; }
  Var v;
  DType seen = DType::kUInt8;

 protected:
  void build_impl(const Shape&, Rng& rng) override { v = add_weight("v", {3}, Initializer::kOnes, rng); }
  Var call(const Var& x, const CallContext&) override {
    seen = scale(other_ ? *other_ : v, 1.0f).dtype();
    return x;
  }

 private:
  bool opt_out_;
  const Var* other_;
};

class Autocast : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { set_precision_warning_sink([](const std::string&) {}); }
  void TearDown() override {
    set_global_policy("float32");
    set_precision_warning_sink(nullptr);
  }
};

TEST_P(Autocast, CustomLayerReadsVariablesInTheComputeDtypeAndTrainsThem) {
  set_global_policy(GetParam());
  const DType compute = global_policy().compute_dtype();
  MyLinear layer(3);
  const int64_t b = 7, in = 17;
  std::vector<float> xv(static_cast<size_t>(b * in));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.37f * static_cast<float>(i)) * 2.0f;
  Var x(Tensor::from_floats({b, in}, xv));
  Var y = layer(x);  // builds, autocasts x, runs call()
  EXPECT_EQ(y.dtype(), compute);
  EXPECT_EQ(layer.kernel.dtype(), DType::kFloat32);
  backward(sum(y));  // d/dkernel[i][j] = sum_b x[b][i] (x as rounded to the compute dtype)
  ASSERT_TRUE(layer.kernel.has_grad());
  ASSERT_TRUE(layer.bias.has_grad());
  EXPECT_EQ(layer.kernel.grad().dtype(), DType::kFloat32);
  const Tensor xr = x.value().to(compute).to(DType::kFloat32);
  // The gradient is a float32-accumulated sum rounded once into the compute dtype: half a unit in the last
  // place of that dtype (2^-11 float16, 2^-8 bfloat16) relative to the sum of |x|, plus margin.
  const double ulp = compute == DType::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  for (int64_t i = 0; i < in; ++i) {
    double ref = 0, mag = 0;
    for (int64_t r = 0; r < b; ++r) {
      ref += xr.at(r * in + i);
      mag += std::fabs(xr.at(r * in + i));
    }
    for (int64_t j = 0; j < 3; ++j) EXPECT_NEAR(layer.kernel.grad().at(i * 3 + j), ref, 2 * ulp * mag + 1e-6) << i;
  }
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(layer.bias.grad().at(j), static_cast<float>(b));

  // The cached cast: one conversion per variable version, refreshed when the variable changes.
  const Tensor first = layer.read(layer.kernel).value();
  EXPECT_EQ(first.dtype(), compute);
  EXPECT_EQ(layer.read(layer.kernel).value().raw(), first.raw());
  layer.kernel.set_value(Tensor::full(layer.kernel.shape(), DType::kFloat32, 0.5f));
  EXPECT_EQ(layer.read(layer.kernel).value().at(0), 0.5f);
  EXPECT_NE(layer.read(layer.kernel).value().raw(), first.raw());
}

TEST_P(Autocast, WhereNothingCastsTheErrorSaysHow) {
  set_global_policy(GetParam());
  // A layer that opts out of the automatic read meets the mismatch inside call(), as every custom layer did
  // before variables were read cast automatically.
  MyLinear layer(3, Read::kOptOut);
  try {
    layer(Var(Tensor::full({2, 4}, DType::kFloat32, 1.0f)));
    FAIL() << "a float32 variable met a 16-bit input without an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("differ in dtype"), std::string::npos) << msg;
    EXPECT_NE(msg.find("float32"), std::string::npos) << msg;
    EXPECT_NE(e.hint().find("autocast(variable)"), std::string::npos) << e.hint();
    EXPECT_NE(e.hint().find("cast("), std::string::npos) << e.hint();
  }
  clear_tape();
  // Outside every call, the variable is read as it is: the same error.
  const DType compute = global_policy().compute_dtype();
  EXPECT_THROW(matmul(Var(Tensor::full({2, 4}, compute, 1.0f)), layer.kernel), Error);
  clear_tape();
}

TEST_P(Autocast, VariablesReadWithoutAskingGiveTheBitsOfExplicitAutocast) {
  set_global_policy(GetParam());
  const DType compute = global_policy().compute_dtype();
  const Tensor xv = wave({7, 17}, 0.37f);
  TwoUses explicit_layer(Read::kExplicit), automatic(Read::kAutomatic);
  Rng r1(5), r2(5);
  // backward() replays the whole thread's record: one forward and backward at a time.
  Var y_explicit = explicit_layer(Var(xv), {.rng = &r1});
  backward(sum(y_explicit));
  Var y_automatic = automatic(Var(xv), {.rng = &r2});
  backward(sum(y_automatic));
  ASSERT_TRUE(same_bits(explicit_layer.w.value(), automatic.w.value()));
  EXPECT_EQ(automatic.w.dtype(), DType::kFloat32);
  EXPECT_EQ(y_automatic.dtype(), compute);
  EXPECT_TRUE(same_bits(y_automatic.value(), y_explicit.value()));
  for (const auto& [e, a] : {std::pair{explicit_layer.w, automatic.w}, std::pair{explicit_layer.b, automatic.b}}) {
    ASSERT_TRUE(a.has_grad());
    EXPECT_EQ(a.grad().dtype(), DType::kFloat32);
    EXPECT_TRUE(same_bits(a.grad(), e.grad())) << a.name();
  }

  // An explicit read inside call() is not cast again: both forms record the same steps.
  const size_t before = tape_size();
  explicit_layer(Var(xv));
  const size_t explicit_steps = tape_size() - before;
  automatic(Var(xv));
  EXPECT_EQ(tape_size() - before - explicit_steps, explicit_steps);
  clear_tape();

  // A custom loop's tape sees the same, and so does a prediction (nothing recorded).
  GradientTape t1;
  const std::vector<Tensor> g1 = t1.gradient(sum(explicit_layer(Var(xv))), {explicit_layer.w, explicit_layer.b});
  GradientTape t2;
  const std::vector<Tensor> g2 = t2.gradient(sum(automatic(Var(xv))), {automatic.w, automatic.b});
  EXPECT_TRUE(same_bits(g1[0], g2[0]));
  EXPECT_TRUE(same_bits(g1[1], g2[1]));
  NoGradGuard predicting;
  const size_t recorded = tape_size();
  EXPECT_TRUE(same_bits(automatic(Var(xv)).value(), y_explicit.value()));
  EXPECT_EQ(tape_size(), recorded);
}

TEST_P(Autocast, NormalizationLayersAndLayersThatOptOutKeepFloat32Variables) {
  set_global_policy(GetParam());
  const DType compute = global_policy().compute_dtype();
  EXPECT_FALSE(BatchNormalization().autocasts_variables());
  EXPECT_FALSE(LayerNormalization().autocasts_variables());
  EXPECT_TRUE(Dense(3).autocasts_variables());
  Probe reads, keeps(/*opt_out=*/true);
  reads(Var(Tensor::full({2, 3}, DType::kFloat32, 1.0f)));
  keeps(Var(Tensor::full({2, 3}, DType::kFloat32, 1.0f)));
  EXPECT_EQ(reads.seen, compute);
  EXPECT_EQ(keeps.seen, DType::kFloat32);

  // A normalization layer's subclass reads gamma in float32 inside call() and normalizes as its base does.
  struct Norm : LayerNormalization {
    DType seen = DType::kUInt8;
    Var call(const Var& x, const CallContext& ctx) override {
      seen = scale(gamma(), 1.0f).dtype();
      return LayerNormalization::call(x, ctx);
    }
  } norm;
  struct Batch : BatchNormalization {
    DType seen = DType::kUInt8;
    Var call(const Var& x, const CallContext& ctx) override {
      seen = scale(gamma(), 1.0f).dtype();
      return BatchNormalization::call(x, ctx);
    }
  } batch;
  LayerNormalization plain_norm;
  BatchNormalization plain_batch;
  const Tensor xv = wave({5, 8}, 0.71f);
  EXPECT_TRUE(same_bits(norm(Var(xv)).value(), plain_norm(Var(xv)).value()));
  EXPECT_TRUE(same_bits(batch(Var(xv), {.training = true}).value(), plain_batch(Var(xv), {.training = true}).value()));
  EXPECT_EQ(norm.seen, DType::kFloat32);
  EXPECT_EQ(batch.seen, DType::kFloat32);
  clear_tape();
}

// A custom block around a Dense sublayer, reading its own variables before and after the sublayer's call.
class Block : public Layer {
 public:
  explicit Block(Read read) : Layer("block"), dense(5, "tanh"), read_(read) {}
  Shape compute_output_shape(const Shape&) const override { return Shape{3}; }
  Var w1, w2;
  Dense dense;

 protected:
  void build_impl(const Shape& in, Rng& rng) override {
    w1 = add_weight("w1", {in[-1], 4}, Initializer::kGlorotUniform, rng);
    w2 = add_weight("w2", {5, 3}, Initializer::kGlorotUniform, rng);
  }
  Var call(const Var& x, const CallContext& ctx) override {
    auto r = [&](const Var& v) { return read_ == Read::kExplicit ? autocast(v) : v; };
    Var h = dense(matmul(x, r(w1)), ctx);  // the sublayer casts its own variables, then this layer's read again
    return matmul(h, r(w2));
  }

 private:
  Read read_;
};

TEST_P(Autocast, NestedLayersEachReadTheirOwnVariablesCast) {
  set_global_policy(GetParam());
  const Tensor xv = wave({6, 9}, 0.53f);
  Block explicit_block(Read::kExplicit), automatic(Read::kAutomatic);
  Rng r1(9), r2(9);
  Var y_explicit = explicit_block(Var(xv), {.rng = &r1});
  Var y_automatic = automatic(Var(xv), {.rng = &r2});
  EXPECT_EQ(y_automatic.dtype(), global_policy().compute_dtype());
  EXPECT_TRUE(same_bits(y_automatic.value(), y_explicit.value()));
  GradientTape t1;
  const std::vector<Tensor> g1 = t1.gradient(
      sum(explicit_block(Var(xv))), {explicit_block.w1, explicit_block.w2, explicit_block.dense.weights()[0],
                                     explicit_block.dense.weights()[1]});
  GradientTape t2;
  const std::vector<Tensor> g2 = t2.gradient(sum(automatic(Var(xv))), {automatic.w1, automatic.w2,
                                                                      automatic.dense.weights()[0],
                                                                      automatic.dense.weights()[1]});
  for (size_t i = 0; i < g1.size(); ++i) {
    EXPECT_EQ(g2[i].dtype(), DType::kFloat32) << i;
    EXPECT_TRUE(same_bits(g2[i], g1[i])) << i;
  }

  // A sublayer does not read its caller's variables cast: only a layer's own variables are (a variable of
  // another layer, e.g. a tied weight, is read with autocast(w)).
  Probe inner(/*opt_out=*/false, &automatic.w1);
  inner(Var(Tensor::full({2, 3}, DType::kFloat32, 1.0f)));
  EXPECT_EQ(inner.seen, DType::kFloat32);
}

// Two outputs of one call (x W, relu(x W) V), each reading a variable.
class TwoHeads : public Layer {
 public:
  explicit TwoHeads(Read read) : Layer("two_heads"), read_(read) {}
  int num_outputs() const override { return 2; }
  std::vector<Shape> compute_output_shapes(const std::vector<Shape>&) const override { return {Shape{4}, Shape{2}}; }
  Var w, v;

 protected:
  void build_impl(const Shape& in, Rng& rng) override {
    w = add_weight("w", {in[-1], 4}, Initializer::kGlorotUniform, rng);
    v = add_weight("v", {4, 2}, Initializer::kGlorotUniform, rng);
  }
  std::vector<Var> call_outputs(const std::vector<Var>& xs, const CallContext&) override {
    auto r = [&](const Var& u) { return read_ == Read::kExplicit ? autocast(u) : u; };
    const Var h = matmul(xs[0], r(w));
    return {h, matmul(activation(h, ops::Activation::kRelu), r(v))};
  }

 private:
  Read read_;
};

TEST_P(Autocast, ALayerWithSeveralOutputsReadsItsVariablesCast) {
  set_global_policy(GetParam());
  const Tensor xv = wave({5, 3}, 0.61f);
  TwoHeads explicit_layer(Read::kExplicit), automatic(Read::kAutomatic);
  Rng r1(4), r2(4);
  GradientTape t1;
  const std::vector<Var> y1 = explicit_layer.outputs(Var(xv), {.rng = &r1});
  const std::vector<Tensor> g1 = t1.gradient(add(sum(y1[0]), sum(y1[1])), {explicit_layer.w, explicit_layer.v});
  GradientTape t2;
  const std::vector<Var> y2 = automatic.outputs(Var(xv), {.rng = &r2});
  const std::vector<Tensor> g2 = t2.gradient(add(sum(y2[0]), sum(y2[1])), {automatic.w, automatic.v});
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(y2[i].dtype(), global_policy().compute_dtype());
    EXPECT_TRUE(same_bits(y2[i].value(), y1[i].value())) << i;
    EXPECT_TRUE(same_bits(g2[i], g1[i])) << i;
  }
}

TEST_P(Autocast, VariablesOutsideEveryCallStayAsTheyAre) {
  set_global_policy(GetParam());
  MyLinear layer(3, Read::kAutomatic);
  layer(Var(wave({2, 4}, 0.3f)));
  clear_tape();
  EXPECT_TRUE(autocast_operand(layer.kernel).same(layer.kernel));
  EXPECT_EQ(scale(layer.kernel, 1.0f).dtype(), DType::kFloat32);
  EXPECT_EQ(matmul(Var(wave({2, 4}, 0.3f)), layer.kernel).dtype(), DType::kFloat32);
  EXPECT_EQ(regularization_penalty(layer.kernel, L2(0.5f)).dtype(), DType::kFloat32);
  // A call that fails leaves no scope behind.
  EXPECT_THROW(layer(Var(wave({2, 5}, 0.3f))), Error);
  EXPECT_TRUE(autocast_operand(layer.kernel).same(layer.kernel));
  EXPECT_EQ(layer.kernel.dtype(), DType::kFloat32);
  clear_tape();
}

INSTANTIATE_TEST_SUITE_P(MixedPolicies, Autocast, ::testing::Values("mixed_float16", "mixed_bfloat16"));

TEST(AutocastFloat32, IsTheVariableItself) {
  MyLinear layer(2);
  layer(Var(Tensor::full({1, 3}, DType::kFloat32, 1.0f)));
  EXPECT_TRUE(layer.read(layer.kernel).same(layer.kernel));
}

TEST(AutocastFloat32, TheAutomaticReadChangesNothing) {
  const Tensor xv = wave({3, 5}, 0.9f);
  TwoUses explicit_layer(Read::kExplicit), automatic(Read::kAutomatic);
  Rng r1(2), r2(2);
  EXPECT_TRUE(same_bits(automatic(Var(xv), {.rng = &r2}).value(), explicit_layer(Var(xv), {.rng = &r1}).value()));
  Probe probe;
  probe(Var(xv));
  EXPECT_EQ(probe.seen, DType::kFloat32);
  clear_tape();
}

}  // namespace
}  // namespace mixtrain
