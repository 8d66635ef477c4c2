// A learning-rate schedule under LossScaleOptimizer: it belongs to the inner optimizer, and a skipped step does
// not advance it (Keras 3: the wrapper's iterations are the inner optimizer's, which count applied updates).
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>

#include "mixtrain/optim/parameter_arena.h"
#include "mixtrain/optim/schedules.h"
#include "mixtrain/optim/sgd.h"
#include "mixtrain/precision/loss_scale_optimizer.h"

namespace mixtrain {
namespace {

constexpr float kScale = 1024.0f;  // a power of two: unscaling is exact, so the expected weights are exact
const float kGrad[2] = {0.75f, -0.5f};

// A different rate at every step, so the step a rate is read at shows in the weights.
std::shared_ptr<const LearningRateSchedule> steep() {
  return std::make_shared<PiecewiseConstantDecay>(std::vector<int64_t>{0, 1, 2, 3, 4, 5},
                                                  std::vector<double>{0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625,
                                                                      0.0078125});
}

std::unique_ptr<LossScaleOptimizer> make_lso(bool skipped_steps_advance) {
  LossScaleOptions o;
  o.initial_scale = kScale;
  o.min_scale = kScale;  // stays put when steps are skipped, so every scaled gradient unscales exactly
  o.skipped_steps_advance_iterations = skipped_steps_advance;
  return std::make_unique<LossScaleOptimizer>(std::make_unique<Sgd>(0.1f), o);
}

Tensor scaled_grad(bool finite) {
  if (!finite) return Tensor::from_floats({2}, {std::numeric_limits<float>::infinity(), 1.0f});
  return Tensor::from_floats({2}, {kGrad[0] * kScale, kGrad[1] * kScale});
}

TEST(LossScaleSchedule, TheScheduleIsForwardedToTheInnerOptimizer) {
  const std::unique_ptr<LossScaleOptimizer> owner = make_lso(false);
  LossScaleOptimizer& opt = *owner;
  auto sched = steep();
  opt.set_learning_rate_schedule(sched);
  EXPECT_EQ(opt.inner().learning_rate_schedule(), sched);
  EXPECT_EQ(opt.learning_rate_schedule(), sched);
  EXPECT_EQ(opt.learning_rate(), 0.5f);
  EXPECT_THROW(opt.set_learning_rate(0.1f), Error);  // through the wrapper as on the inner optimizer
  opt.set_learning_rate_schedule(nullptr);
  EXPECT_EQ(opt.inner().learning_rate_schedule(), nullptr);
  EXPECT_EQ(opt.learning_rate(), 0.5f);
}

// Five steps, the second and fourth with an inf gradient; returns the weights, checks iterations and the rates.
void run_with_skips(bool skipped_steps_advance, bool arena_path) {
  SCOPED_TRACE(std::string(skipped_steps_advance ? "skips advance" : "skips do not advance") +
               (arena_path ? ", arena" : ", apply"));
  const std::unique_ptr<LossScaleOptimizer> owner = make_lso(skipped_steps_advance);
  LossScaleOptimizer& opt = *owner;
  opt.set_learning_rate_schedule(steep());
  Var w(Tensor::from_floats({2}, {1.0f, -2.0f}), true, "w");
  ParameterArena arena(std::vector<Var>{w});
  float want[2] = {1.0f, -2.0f};
  int64_t iterations = 0;
  for (int step = 0; step < 5; ++step) {
    const bool finite = step != 1 && step != 3;
    const float lr = (*steep())(iterations);
    EXPECT_EQ(opt.learning_rate(), lr) << "step " << step;
    if (arena_path) {
      arena.zero_grad();
      w.accumulate_grad(scaled_grad(finite));
      opt.apply_arena(arena);
    } else {
      opt.apply({scaled_grad(finite)}, {w});
    }
    if (finite) {
      for (int i = 0; i < 2; ++i) want[i] -= kGrad[i] * lr;
    }
    if (finite || skipped_steps_advance) ++iterations;
    EXPECT_EQ(opt.last_step_skipped(), !finite);
    EXPECT_EQ(opt.iterations(), iterations) << "step " << step;
    EXPECT_EQ(w.value().at(0), want[0]) << "step " << step;
    EXPECT_EQ(w.value().at(1), want[1]) << "step " << step;
  }
  EXPECT_EQ(opt.skipped_steps(), 2);
  EXPECT_EQ(opt.loss_scale(), kScale);
}

TEST(LossScaleSchedule, SkippedStepsDoNotAdvanceTheScheduleAsInKeras3) {
  run_with_skips(false, false);
  run_with_skips(false, true);
}

TEST(LossScaleSchedule, SkippedStepsAdvanceTheScheduleWhenAsked) {
  run_with_skips(true, false);
  run_with_skips(true, true);
}

TEST(LossScaleSchedule, CheckpointMidScheduleResumesBitIdentically) {
  auto run = [](bool resume) {
    std::unique_ptr<LossScaleOptimizer> opt = make_lso(false);
    opt->set_learning_rate_schedule(steep());
    Var w(Tensor::from_floats({2}, {1.0f, -2.0f}), true, "w");
    for (int step = 0; step < 6; ++step) {
      if (resume && step == 3) {
        const NamedTensors saved = opt->state();
        opt = make_lso(false);
        opt->set_learning_rate_schedule(steep());
        opt->load_state(saved);
      }
      opt->apply({scaled_grad(step != 2)}, {w});
    }
    EXPECT_EQ(opt->iterations(), 5);
    EXPECT_EQ(opt->learning_rate(), (*steep())(5));
    return w.value();
  };
  const Tensor straight = run(false), resumed = run(true);
  EXPECT_EQ(std::memcmp(straight.raw(), resumed.raw(), straight.nbytes()), 0);
}

}  // namespace
}  // namespace mixtrain
