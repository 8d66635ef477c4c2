#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/sgd.h"

namespace mixtrain {
namespace {

// Three steps of gradients for a 2-element variable starting at kW0.
const double kW0[2] = {1.0, -2.0};
const double kGrads[3][2] = {{0.5, -1.0}, {0.25, 2.0}, {-0.75, 0.125}};

Var make_var(const std::string& name = "w") {
  return Var(Tensor::from_floats({2}, {static_cast<float>(kW0[0]), static_cast<float>(kW0[1])}), true, name);
}

Tensor grad_at(int step) {
  return Tensor::from_floats({2}, {static_cast<float>(kGrads[step][0]), static_cast<float>(kGrads[step][1])});
}

// Float32 arithmetic drifts from the double reference by a few ulps over three steps.
void expect_close(const Var& v, const double want[2]) {
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(v.value().at(i), want[i], 4e-7 * std::max(1.0, std::fabs(want[i]))) << "element " << i;
  }
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(Sgd, PlainMatchesHandComputedValues) {
  Sgd opt(0.1f);
  Var w = make_var();
  double ref[2] = {kW0[0], kW0[1]};
  for (int s = 0; s < 3; ++s) {
    const uint64_t version = w.version();
    opt.apply({grad_at(s)}, {w});
    EXPECT_GT(w.version(), version) << "apply must bump the version so cached casts refresh";
    for (int i = 0; i < 2; ++i) ref[i] -= 0.1 * kGrads[s][i];
    expect_close(w, ref);
  }
  EXPECT_EQ(opt.iterations(), 3);
  EXPECT_EQ(opt.name(), "sgd");
}

TEST(Sgd, MomentumAndNesterovMatchKerasFormulas) {
  for (bool nesterov : {false, true}) {
    Sgd opt(0.1f, 0.9f, nesterov);
    Var w = make_var();
    double ref[2] = {kW0[0], kW0[1]};
    double vel[2] = {0.0, 0.0};
    for (int s = 0; s < 3; ++s) {
      opt.apply({grad_at(s)}, {w});
      for (int i = 0; i < 2; ++i) {
        vel[i] = 0.9 * vel[i] - 0.1 * kGrads[s][i];
        ref[i] += nesterov ? 0.9 * vel[i] - 0.1 * kGrads[s][i] : vel[i];
      }
      expect_close(w, ref);
    }
  }
}

void adam_reference(double lr, double wd, double ref[2]) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-7;
  double m[2] = {0, 0}, v[2] = {0, 0};
  ref[0] = kW0[0];
  ref[1] = kW0[1];
  for (int s = 0; s < 3; ++s) {
    const double t = s + 1;
    const double alpha = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    for (int i = 0; i < 2; ++i) {
      ref[i] -= ref[i] * wd * lr;
      const double g = kGrads[s][i];
      m[i] += (g - m[i]) * (1 - b1);
      v[i] += (g * g - v[i]) * (1 - b2);
      ref[i] -= alpha * m[i] / (std::sqrt(v[i]) + eps);
    }
  }
}

TEST(Adam, MatchesHandComputedValues) {
  Adam opt(0.01f);
  Var w = make_var();
  for (int s = 0; s < 3; ++s) opt.apply({grad_at(s)}, {w});
  double ref[2];
  adam_reference(0.01, 0.0, ref);
  expect_close(w, ref);
  EXPECT_EQ(opt.name(), "adam");
}

TEST(AdamW, DecoupledDecayMatchesHandComputedValues) {
  AdamW opt(0.01f, 0.1f);
  Var w = make_var();
  for (int s = 0; s < 3; ++s) opt.apply({grad_at(s)}, {w});
  double ref[2];
  adam_reference(0.01, 0.1, ref);
  expect_close(w, ref);
  EXPECT_EQ(opt.name(), "adamw");

  // An excluded variable gets plain Adam.
  AdamW excl(0.01f, 0.1f, {}, {"bias"});
  Var b = make_var("dense/bias");
  for (int s = 0; s < 3; ++s) excl.apply({grad_at(s)}, {b});
  adam_reference(0.01, 0.0, ref);
  expect_close(b, ref);
}

// Runs 6 steps on two variables, optionally checkpointing after step 3 into a fresh optimizer.
std::vector<Tensor> run_six(std::string_view kind, bool resume) {
  auto make = [&] {
    if (kind == "sgd") return std::unique_ptr<Optimizer>(new Sgd(0.05f, 0.9f, true));
    return make_optimizer(kind, 0.01f);
  };
  auto opt = make();
  Var a = make_var("a");
  Var b(Tensor::from_floats({2, 2}, {0.5f, 0.25f, -1.0f, 3.0f}), true, "layer/b");
  for (int s = 0; s < 6; ++s) {
    if (resume && s == 3) {
      NamedTensors saved = opt->state();
      opt = make();
      opt->load_state(saved);
      EXPECT_EQ(opt->iterations(), 3);
    }
    Tensor gb = Tensor::from_floats({2, 2}, {0.1f * s, -0.2f, 0.3f, 0.05f * (s + 1)});
    opt->apply({grad_at(s % 3), gb}, {a, b});
  }
  return {a.value(), b.value()};
}

TEST(Optimizer, StateRoundTripContinuesBitIdentically) {
  for (std::string_view kind : {"sgd", "adam", "adamw"}) {
    std::vector<Tensor> straight = run_six(kind, false);
    std::vector<Tensor> resumed = run_six(kind, true);
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_TRUE(bit_equal(straight[i], resumed[i])) << kind;
  }
}

TEST(Optimizer, StateNamesSlotsByVariable) {
  Adam opt;
  Var a = make_var("dense/kernel");
  Var unnamed(Tensor::from_floats({1}, {1.0f}), true);
  opt.apply({grad_at(0), Tensor::from_floats({1}, {1.0f})}, {a, unnamed});
  NamedTensors st = opt.state();
  std::vector<std::string> keys;
  for (auto& [k, t] : st) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"iterations", "learning_rate", "dense/kernel/m", "dense/kernel/v",
                                            "var_1/m", "var_1/v"}));
  EXPECT_EQ(st[0].second.to_ints()[0], 1);
  EXPECT_EQ(st[2].second.shape(), a.shape());

  // Loading into a different optimizer kind is refused, and leaves it unchanged.
  Sgd sgd(0.1f, 0.5f);
  EXPECT_THROW(sgd.load_state(st), Error);
  EXPECT_EQ(sgd.iterations(), 0);
  EXPECT_THROW(opt.load_state({}), Error);  // no iterations entry
}

TEST(Optimizer, ShapeOrDTypeMismatchThrowsAndChangesNothing) {
  Adam opt;
  Var a = make_var("a");
  Var b = make_var("b");
  Tensor before = a.value().clone();
  EXPECT_THROW(opt.apply({grad_at(0), Tensor::zeros({3}, DType::kFloat32)}, {a, b}), Error);
  EXPECT_THROW(opt.apply({grad_at(0), grad_at(0).to(DType::kFloat16)}, {a, b}), Error);
  EXPECT_THROW(opt.apply({grad_at(0)}, {a, b}), Error);
  EXPECT_TRUE(bit_equal(a.value(), before));
  EXPECT_EQ(opt.iterations(), 0);
  EXPECT_TRUE(opt.state().size() == 2u) << "no slots created by a rejected apply";

  Var same_name = make_var("a");
  EXPECT_THROW(opt.apply({grad_at(0), grad_at(0)}, {a, same_name}), Error);
  Var frozen = make_var("frozen");
  frozen.set_trainable(false);
  EXPECT_THROW(opt.apply({grad_at(0)}, {frozen}), Error);
  Var labels(Tensor::from_ints({2}, {1, 2}), true, "labels");
  EXPECT_THROW(opt.apply({Tensor::from_floats({2}, {0.5f, 0.5f})}, {labels}), Error);

  // A restored slot from a different model is refused before any variable changes.
  NamedTensors st = {{"iterations", Tensor::from_ints({1}, {0})},
                     {"b/m", Tensor::zeros({5}, DType::kFloat32)}};
  opt.load_state(st);
  EXPECT_THROW(opt.apply({grad_at(0), grad_at(0)}, {a, b}), Error);
  EXPECT_TRUE(bit_equal(a.value(), before));
}

// Pure float16 / bfloat16 policies keep 16-bit variables: the update runs in float32 and rounds once.
TEST(Optimizer, SixteenBitVariablesAreUpdatedInFloat32AndRoundedOnce) {
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    Sgd opt(0.1f);
    Var w(Tensor::from_floats({2}, {1.0f, 2.0f}, d), true, "w");
    const uint64_t version = w.version();
    opt.apply({Tensor::from_floats({2}, {0.5f, 0.5f})}, {w});
    EXPECT_EQ(w.dtype(), d);
    EXPECT_GT(w.version(), version);
    const Tensor want = Tensor::from_floats({2}, {1.0f - 0.1f * 0.5f, 2.0f - 0.1f * 0.5f}, d);
    EXPECT_EQ(w.value().to_floats(), want.to_floats()) << dtype_name(d);
  }
}

TEST(Optimizer, UndefinedGradientLeavesVariableAlone) {
  Sgd opt(0.1f);
  Var a = make_var("a");
  Var b = make_var("b");
  opt.apply({Tensor(), grad_at(0)}, {a, b});
  EXPECT_EQ(a.value().at(0), static_cast<float>(kW0[0]));
  EXPECT_EQ(a.version(), 0u);
  EXPECT_NE(b.value().at(0), static_cast<float>(kW0[0]));
}

TEST(Optimizer, LearningRateAndFactory) {
  auto opt = make_optimizer("adam", 0.5f);
  EXPECT_EQ(opt->learning_rate(), 0.5f);
  opt->set_learning_rate(0.25f);
  EXPECT_EQ(opt->learning_rate(), 0.25f);
  EXPECT_THROW(opt->set_learning_rate(-1.0f), Error);
  EXPECT_EQ(make_optimizer("sgd", 0.1f)->name(), "sgd");
  EXPECT_EQ(make_optimizer("adamw", 0.1f)->name(), "adamw");
  try {
    make_optimizer("not_an_optimizer", 0.1f);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(e.message().find("sgd, adam, adamw, rmsprop"), std::string::npos);
  }
  // The learning rate travels with the state.
  NamedTensors st = opt->state();
  auto other = make_optimizer("adam", 1.0f);
  other->load_state(st);
  EXPECT_EQ(other->learning_rate(), 0.25f);
}

TEST(Optimizer, GlobalClipnormClipsBeforeTheUpdate) {
  Sgd opt(1.0f);
  opt.set_global_clipnorm(1.0f);
  Var a = make_var("a");
  Tensor g = Tensor::from_floats({2}, {3.0f, 4.0f});  // norm 5
  opt.apply({g}, {a});
  EXPECT_NEAR(a.value().at(0), kW0[0] - 0.6, 1e-6);
  EXPECT_NEAR(a.value().at(1), kW0[1] - 0.8, 1e-6);
  EXPECT_EQ(g.at(0), 3.0f) << "the caller's gradient is not modified";
  EXPECT_THROW(opt.set_global_clipnorm(0.0f), Error);
  opt.set_global_clipnorm(std::nullopt);
  EXPECT_FALSE(opt.global_clipnorm().has_value());
}

}  // namespace
}  // namespace mixtrain
