#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/sgd.h"
#include "mixtrain/precision/loss_scale_optimizer.h"

namespace mixtrain {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

Var make_var(const std::string& name = "w") { return Var(Tensor::from_floats({2}, {1.0f, -2.0f}), true, name); }
Tensor finite_grad(float s = 1.0f) { return Tensor::from_floats({2}, {0.5f * s, -0.25f * s}); }
Tensor inf_grad() { return Tensor::from_floats({2}, {kInf, 1.0f}); }
Tensor nan_grad() { return Tensor::from_floats({2}, {1.0f, std::nanf("")}); }

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

bool state_equal(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !bit_equal(a[i].second, b[i].second)) return false;
  }
  return true;
}

LossScaleOptimizer make_lso(LossScaleOptions o, float lr = 0.1f) {
  return LossScaleOptimizer(std::make_unique<Sgd>(lr), std::move(o));
}

TEST(LossScaleOptimizer, KerasParityBackoff) {
  LossScaleOptions o;
  o.initial_scale = 400.0f;
  o.min_scale = 1.0f;
  LossScaleOptimizer opt = make_lso(o);
  Var w = make_var();
  for (int i = 0; i < 4; ++i) opt.apply({inf_grad()}, {w});
  EXPECT_EQ(opt.loss_scale(), 25.0f);
  EXPECT_EQ(opt.skipped_steps(), 4);
}

TEST(LossScaleOptimizer, KerasParityGrowth) {
  LossScaleOptions o;
  o.initial_scale = 2.0f;
  o.dynamic_growth_steps = 2;
  LossScaleOptimizer opt = make_lso(o);
  Var w = make_var();
  for (int i = 0; i < 8; ++i) opt.apply({finite_grad()}, {w});
  EXPECT_EQ(opt.loss_scale(), 32.0f);
  EXPECT_EQ(opt.good_steps_in_a_row(), 8);
  EXPECT_EQ(opt.iterations(), 8);
}

TEST(LossScaleOptimizer, SkippedStepLeavesVariablesAndInnerStateBitIdentical) {
  LossScaleOptimizer opt(std::make_unique<Adam>(0.01f));
  Var w = make_var();
  opt.apply({finite_grad(32768.0f)}, {w});
  const Tensor w_before = w.value().clone();
  const NamedTensors inner_before = opt.inner().state();
  const uint64_t version = w.version();
  const float scale = opt.loss_scale();
  for (const Tensor& bad : {inf_grad(), nan_grad()}) {
    opt.apply({bad}, {w});
    EXPECT_TRUE(opt.last_step_skipped());
  }
  EXPECT_TRUE(bit_equal(w.value(), w_before));
  EXPECT_TRUE(state_equal(opt.inner().state(), inner_before));
  EXPECT_EQ(w.version(), version);
  EXPECT_EQ(opt.loss_scale(), scale / 4);
  EXPECT_EQ(opt.iterations(), 1);
  EXPECT_EQ(opt.good_steps_in_a_row(), 0);
  opt.apply({finite_grad()}, {w});
  EXPECT_FALSE(opt.last_step_skipped());
  EXPECT_FALSE(bit_equal(w.value(), w_before));
}

TEST(LossScaleOptimizer, LowPrecisionScaledGradientsAreAccepted) {
  LossScaleOptimizer opt(std::make_unique<Sgd>(1.0f), LossScaleOptions{.initial_scale = 1024.0f});
  Var w = make_var();
  opt.apply({Tensor::from_floats({2}, {512.0f, -256.0f}, DType::kFloat16)}, {w});
  EXPECT_EQ(w.value().at(0), 0.5f);
  EXPECT_EQ(w.value().at(1), -1.75f);
  // float16 inf (a scaled gradient that overflowed float16) is caught.
  opt.apply({Tensor::from_floats({2}, {70000.0f, 1.0f}, DType::kFloat16)}, {w});
  EXPECT_TRUE(opt.last_step_skipped());
  opt.apply({Tensor::from_floats({2}, {0.0f, 1024.0f}, DType::kBFloat16)}, {w});
  EXPECT_FALSE(opt.last_step_skipped());
}

TEST(LossScaleOptimizer, MinAndMaxClamps) {
  LossScaleOptions o;
  o.initial_scale = 4.0f;
  o.min_scale = 1.0f;
  o.floor_alarm_steps = 0;
  LossScaleOptimizer low = make_lso(o);
  Var w = make_var();
  for (int i = 0; i < 200; ++i) low.apply({inf_grad()}, {w});
  EXPECT_EQ(low.loss_scale(), 1.0f);
  EXPECT_EQ(low.min_scale_seen(), 1.0f);

  // Default floor is below 1 and never reaches 0 (Keras 3 would hit 0 after ~165 halvings).
  LossScaleOptimizer deflt = make_lso({.floor_alarm_steps = 0});
  for (int i = 0; i < 300; ++i) deflt.apply({inf_grad()}, {w});
  EXPECT_EQ(deflt.loss_scale(), 1.0f / 16384.0f);
  EXPECT_GT(deflt.loss_scale(), 0.0f);

  LossScaleOptimizer high = make_lso({.initial_scale = 16.0f, .dynamic_growth_steps = 1, .max_scale = 64.0f});
  for (int i = 0; i < 10; ++i) high.apply({finite_grad()}, {w});
  EXPECT_EQ(high.loss_scale(), 64.0f);

  // Doubling never produces inf even with the largest float ceiling.
  const float big = std::ldexp(1.0f, 127);
  LossScaleOptimizer top = make_lso(
      {.initial_scale = big, .dynamic_growth_steps = 1, .max_scale = std::numeric_limits<float>::max()});
  top.apply({finite_grad()}, {w});
  EXPECT_EQ(top.loss_scale(), big);
}

TEST(LossScaleOptimizer, HysteresisHalvesOnlyOnTheSecondOverflow) {
  LossScaleOptimizer opt = make_lso({.initial_scale = 64.0f, .dynamic_growth_steps = 3, .hysteresis = 2});
  Var w = make_var();
  opt.apply({inf_grad()}, {w});
  EXPECT_TRUE(opt.last_step_skipped());
  EXPECT_EQ(opt.loss_scale(), 64.0f);
  opt.apply({inf_grad()}, {w});
  EXPECT_EQ(opt.loss_scale(), 32.0f);
  opt.apply({inf_grad()}, {w});  // tolerance spent: halves until the scale grows again
  EXPECT_EQ(opt.loss_scale(), 16.0f);
  for (int i = 0; i < 3; ++i) opt.apply({finite_grad()}, {w});
  EXPECT_EQ(opt.loss_scale(), 32.0f);
  opt.apply({inf_grad()}, {w});  // refilled by the growth
  EXPECT_EQ(opt.loss_scale(), 32.0f);
  opt.apply({inf_grad()}, {w});
  EXPECT_EQ(opt.loss_scale(), 16.0f);
  EXPECT_EQ(opt.skipped_steps(), 5);
}

TEST(LossScaleOptimizer, FloorAlarmFiresOncePerEpisode) {
  std::vector<std::string> events;
  LossScaleOptions o;
  o.initial_scale = 4.0f;
  o.min_scale = 1.0f;
  o.floor_alarm_steps = 3;
  o.on_event = [&](const std::string& m) { events.push_back(m); };
  LossScaleOptimizer opt = make_lso(o);
  Var w = make_var();
  // 4 -> 2 -> 1 take two skips above the floor; the alarm counts skips taken at the floor.
  for (int i = 0; i < 4; ++i) opt.apply({nan_grad()}, {w});
  EXPECT_FALSE(opt.stuck_at_floor());
  opt.apply({nan_grad()}, {w});
  EXPECT_TRUE(opt.stuck_at_floor());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].find("forward pass"), std::string::npos);
  for (int i = 0; i < 20; ++i) opt.apply({nan_grad()}, {w});
  EXPECT_EQ(events.size(), 1u);
  opt.apply({finite_grad()}, {w});
  EXPECT_FALSE(opt.stuck_at_floor());
  for (int i = 0; i < 3; ++i) opt.apply({nan_grad()}, {w});
  EXPECT_EQ(events.size(), 2u) << "a new episode after a finite step alarms again";
}

TEST(LossScaleOptimizer, RestartReturnsToTheInitialScaleAndKeepsTheHistory) {
  LossScaleOptimizer opt =
      make_lso({.initial_scale = 64.0f, .dynamic_growth_steps = 3, .min_scale = 1.0f, .hysteresis = 2,
                .floor_alarm_steps = 2});
  Var w = make_var();
  opt.apply({finite_grad()}, {w});
  opt.apply({finite_grad()}, {w});  // two of three growth steps
  for (int i = 0; i < 12; ++i) opt.apply({inf_grad()}, {w});  // down to the floor, alarm raised
  ASSERT_EQ(opt.loss_scale(), 1.0f);
  ASSERT_TRUE(opt.stuck_at_floor());
  const Tensor before = w.value().clone();
  opt.restart_loss_scale();
  EXPECT_EQ(opt.loss_scale(), 64.0f);
  EXPECT_FALSE(opt.stuck_at_floor());
  EXPECT_EQ(opt.good_steps_in_a_row(), 0);
  EXPECT_EQ(opt.skipped_steps(), 12) << "the skip history stays";
  EXPECT_TRUE(bit_equal(w.value(), before)) << "a restart touches no variable";
  // Hysteresis refilled: the first overflow after the restart does not halve; growth counts from zero.
  opt.apply({inf_grad()}, {w});
  EXPECT_EQ(opt.loss_scale(), 64.0f);
  for (int i = 0; i < 2; ++i) opt.apply({finite_grad()}, {w});
  EXPECT_EQ(opt.loss_scale(), 64.0f);
  opt.apply({finite_grad()}, {w});
  EXPECT_EQ(opt.loss_scale(), 128.0f);
}

TEST(LossScaleOptimizer, FixedScaleModeSkipsButNeverRescales) {
  LossScaleOptimizer opt = make_lso({.initial_scale = 8.0f, .dynamic_growth_steps = 2, .dynamic = false});
  Var w = make_var();
  for (int i = 0; i < 5; ++i) opt.apply({finite_grad()}, {w});
  EXPECT_EQ(opt.loss_scale(), 8.0f);
  const Tensor before = w.value().clone();
  opt.apply({inf_grad()}, {w});
  EXPECT_TRUE(opt.last_step_skipped());
  EXPECT_TRUE(bit_equal(w.value(), before));
  EXPECT_EQ(opt.loss_scale(), 8.0f);
  // Fixed mode accepts a scale outside the dynamic bounds.
  EXPECT_NO_THROW(make_lso({.initial_scale = 1e-6f, .dynamic = false}));
}

TEST(LossScaleOptimizer, SkippedStepsAdvanceIterationsOnlyWhenAsked) {
  for (bool advance : {false, true}) {
    LossScaleOptimizer opt = make_lso({.skipped_steps_advance_iterations = advance});
    Var w = make_var();
    opt.apply({finite_grad()}, {w});
    opt.apply({inf_grad()}, {w});
    opt.apply({inf_grad()}, {w});
    EXPECT_EQ(opt.iterations(), advance ? 3 : 1);
    EXPECT_EQ(opt.inner().iterations(), opt.iterations());
  }
}

TEST(LossScaleOptimizer, FusedUnscaleIsExactlyGTimesReciprocal) {
  const float scale = 400.0f;  // not a power of two, so g * (1/S) and g / S can differ
  LossScaleOptimizer opt = make_lso({.initial_scale = scale, .min_scale = 1.0f});
  const float inv = static_cast<float>(1.0 / 400.0);
  std::vector<float> vals;
  for (int i = 0; i < 1000; ++i) vals.push_back(std::ldexp(1.0f + i * 0.001234f, i % 34 - 20));
  const Tensor g32 = Tensor::from_floats({1000}, vals);
  const Tensor g16 = Tensor::from_floats({1000}, vals, DType::kFloat16);
  bool finite = false;
  std::vector<Tensor> out = opt.get_unscaled_gradients({g32, g16, Tensor()}, &finite);
  EXPECT_TRUE(finite);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_FALSE(out[2].defined());
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(float_bits(out[0].at(i)), float_bits(vals[i] * inv)) << i;
    EXPECT_EQ(float_bits(out[1].at(i)), float_bits(g16.at(i) * inv)) << i;
  }
  // A large tensor takes the threaded path and must give the same answer.
  Tensor big = Tensor::full({300000}, DType::kFloat32, 3.0f);
  out = opt.get_unscaled_gradients({big}, &finite);
  EXPECT_EQ(out[0].at(299999), 3.0f * inv);
  big.data<float>()[250000] = kInf;
  opt.get_unscaled_gradients({big}, &finite);
  EXPECT_FALSE(finite);
}

TEST(LossScaleOptimizer, ScaleBelowOneCatchesOverflowOnUnscale) {
  LossScaleOptimizer opt = make_lso({.initial_scale = 0.25f, .min_scale = 0.125f});
  Var w = make_var();
  opt.apply({Tensor::from_floats({2}, {3e38f, 0.0f})}, {w});  // finite scaled, infinite unscaled
  EXPECT_TRUE(opt.last_step_skipped());
}

TEST(LossScaleOptimizer, CustomLoopUnscaleClipApply) {
  LossScaleOptimizer opt(std::make_unique<Sgd>(1.0f), LossScaleOptions{.initial_scale = 4.0f});
  Var w = make_var();
  bool finite = false;
  std::vector<Tensor> g = opt.get_unscaled_gradients({Tensor::from_floats({2}, {12.0f, 16.0f})}, &finite);
  clip_by_global_norm(g, 1.0f);  // unscaled norm 5 -> 1
  opt.apply_unscaled(g, {w}, finite);
  EXPECT_NEAR(w.value().at(0), 1.0f - 0.6f, 1e-6f);
  EXPECT_NEAR(w.value().at(1), -2.0f - 0.8f, 1e-6f);
  opt.apply_unscaled(g, {w}, false);
  EXPECT_TRUE(opt.last_step_skipped());
  EXPECT_EQ(opt.loss_scale(), 2.0f);
}

TEST(LossScaleOptimizer, ClipnormOnInnerSeesUnscaledGradients) {
  LossScaleOptimizer opt(std::make_unique<Sgd>(1.0f), LossScaleOptions{.initial_scale = 1024.0f});
  opt.set_global_clipnorm(1.0f);
  EXPECT_EQ(opt.inner().global_clipnorm(), 1.0f);
  Var w = make_var();
  opt.apply({Tensor::from_floats({2}, {0.3f * 1024, 0.4f * 1024})}, {w});  // unscaled norm 0.5: not clipped
  EXPECT_NEAR(w.value().at(0), 0.7f, 1e-6f);
}

// 10 steps with overflows mixed in, optionally checkpointed after step 5 into a fresh wrapper.
std::pair<Tensor, NamedTensors> run_ten(bool resume) {
  auto make = [] {
    return std::make_unique<LossScaleOptimizer>(
        std::make_unique<Adam>(0.01f),
        LossScaleOptions{.initial_scale = 64.0f, .dynamic_growth_steps = 2, .hysteresis = 2});
  };
  auto opt = make();
  Var w = make_var("dense/kernel");
  for (int s = 0; s < 10; ++s) {
    if (resume && s == 5) {
      NamedTensors saved = opt->state();
      opt = make();
      opt->load_state(saved);
    }
    opt->apply({s % 3 == 1 ? inf_grad() : finite_grad(16.0f * (s + 1))}, {w});
  }
  return {w.value(), opt->state()};
}

TEST(LossScaleOptimizer, StateRoundTripResumesBitIdentically) {
  auto [w1, st1] = run_ten(false);
  auto [w2, st2] = run_ten(true);
  EXPECT_TRUE(bit_equal(w1, w2));
  EXPECT_TRUE(state_equal(st1, st2));
  bool has_scale = false, has_inner = false;
  for (auto& [k, t] : st1) {
    has_scale |= k == "loss_scale/scale";
    has_inner |= k == "dense/kernel/m";
  }
  EXPECT_TRUE(has_scale && has_inner);

  LossScaleOptimizer fresh(std::make_unique<Adam>());
  NamedTensors missing;
  for (auto& e : st1) {
    if (e.first != "loss_scale/scale") missing.push_back(e);
  }
  EXPECT_THROW(fresh.load_state(missing), Error);
  EXPECT_EQ(fresh.iterations(), 0) << "a rejected load changes nothing";
  NamedTensors bogus = st1;
  bogus.emplace_back("loss_scale/bogus", Tensor::from_ints({1}, {1}));
  EXPECT_THROW(fresh.load_state(bogus), Error);
}

TEST(LossScaleOptimizer, ScaleLossDelegationAndValidation) {
  LossScaleOptimizer opt(make_optimizer("adam", 0.5f));
  EXPECT_EQ(opt.name(), "loss_scale_optimizer");
  EXPECT_EQ(opt.learning_rate(), 0.5f);
  opt.set_learning_rate(0.25f);
  EXPECT_EQ(opt.inner().learning_rate(), 0.25f);
  EXPECT_EQ(opt.scale_loss_factor(), 32768.0f);
  Tensor scaled = opt.scale_loss(Tensor::from_floats({1}, {3.0f}, DType::kFloat16));
  EXPECT_EQ(scaled.dtype(), DType::kFloat32);
  EXPECT_EQ(scaled.item(), 3.0f * 32768.0f);  // 98304 would overflow float16

  EXPECT_THROW(LossScaleOptimizer(nullptr), Error);
  EXPECT_THROW(LossScaleOptimizer(std::make_unique<LossScaleOptimizer>(make_optimizer("sgd", 0.1f))), Error);
  EXPECT_THROW(make_lso({.initial_scale = 0.0f}), Error);
  EXPECT_THROW(make_lso({.initial_scale = 1e9f}), Error);  // above max_scale
  EXPECT_THROW(make_lso({.min_scale = 0.0f}), Error);
  EXPECT_THROW(make_lso({.dynamic_growth_steps = 0}), Error);
  EXPECT_THROW(make_lso({.hysteresis = 0}), Error);

  // A shape mismatch is an error even when the step would be skipped.
  Var w = make_var();
  EXPECT_THROW(opt.apply({Tensor::full({3}, DType::kFloat32, kInf)}, {w}), Error);
  EXPECT_THROW(opt.apply({}, {w}), Error);
  EXPECT_EQ(opt.skipped_steps(), 0);
}

}  // namespace
}  // namespace mixtrain
