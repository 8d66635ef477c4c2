// Optimizers driven by a LearningRateSchedule: the rate each update uses, the arena path, refusals and
// checkpoints that resume in the middle of a schedule.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <random>

#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/parameter_arena.h"
#include "mixtrain/optim/rmsprop.h"
#include "mixtrain/optim/schedules.h"
#include "mixtrain/optim/sgd.h"

namespace mixtrain {
namespace {

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.raw(), bc.raw(), ac.nbytes()) == 0;
}

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = dist(rng);
  return Tensor::from_floats(shape, v);
}

// Rates that differ at every step, so an off-by-one in the step a rate is read at shows in the weights.
std::shared_ptr<const LearningRateSchedule> steep() {
  return std::make_shared<PiecewiseConstantDecay>(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6},
                                                  std::vector<double>{0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625,
                                                                      0.0078125, 0.00390625});
}

TEST(OptimizerSchedule, EachUpdateUsesTheScheduleAtIterations) {
  Sgd opt(0.1f);
  auto sched = steep();
  opt.set_learning_rate_schedule(sched);
  EXPECT_EQ(opt.learning_rate_schedule(), sched);
  Var w(Tensor::from_floats({2}, {1.0f, -2.0f}), true, "w");
  const Tensor g = Tensor::from_floats({2}, {0.75f, -0.5f});
  float want[2] = {1.0f, -2.0f};
  for (int64_t s = 0; s < 8; ++s) {
    ASSERT_EQ(opt.iterations(), s);
    const float lr = (*sched)(s);
    EXPECT_EQ(opt.learning_rate(), lr) << "the rate the next update uses";
    opt.apply({g}, {w});
    // SGD without momentum is w -= g * lr in float32: exact, so the rate of each step is pinned down.
    for (int i = 0; i < 2; ++i) want[i] -= g.at(i) * lr;
    EXPECT_EQ(w.value().at(0), want[0]) << "step " << s;
    EXPECT_EQ(w.value().at(1), want[1]) << "step " << s;
  }
}

// Odd sizes, one above the arena's block size so the pass runs several blocks.
std::vector<Var> make_vars() {
  const std::vector<Shape> shapes = {{7, 3}, {17}, {40001}};
  const std::vector<std::string> names = {"d0/kernel", "d0/bias", "d1/kernel"};
  std::vector<Var> vars;
  for (size_t i = 0; i < shapes.size(); ++i) {
    vars.emplace_back(random_tensor(shapes[i], 10 + static_cast<uint32_t>(i)), true, names[i]);
  }
  return vars;
}

std::vector<Tensor> grads_at(const std::vector<Var>& vars, int step) {
  std::vector<Tensor> g;
  for (size_t i = 0; i < vars.size(); ++i) g.push_back(random_tensor(vars[i].shape(), 1000 * step + i));
  return g;
}

using Factory = std::function<std::unique_ptr<Optimizer>()>;

std::vector<std::pair<std::string, Factory>> factories() {
  return {{"sgd_momentum", [] { return std::make_unique<Sgd>(0.1f, 0.9f); }},
          {"adam", [] { return std::make_unique<Adam>(); }},
          {"adamw", [] { return std::make_unique<AdamW>(1e-3f, 0.05f); }},
          {"rmsprop", [] { return std::make_unique<RMSprop>(1e-3f, RMSpropOptions{0.9, 0.5, 1e-7f, true}); }}};
}

std::shared_ptr<const LearningRateSchedule> warmup_cosine() {
  return std::make_shared<CosineDecay>(0.0, 6, 0.1, 0.01, 3);
}

TEST(OptimizerSchedule, ArenaPassReadsTheSameRatePerStepAsApply) {
  for (const auto& [name, make] : factories()) {
    SCOPED_TRACE(name);
    std::vector<Var> ref = make_vars(), flat = make_vars();
    auto opt_ref = make(), opt_flat = make();
    opt_ref->set_learning_rate_schedule(warmup_cosine());
    opt_flat->set_learning_rate_schedule(warmup_cosine());
    ParameterArena arena(flat);
    for (int step = 0; step < 10; ++step) {
      const std::vector<Tensor> g = grads_at(ref, step);
      opt_ref->apply(g, ref);
      arena.zero_grad();
      for (size_t i = 0; i < flat.size(); ++i) flat[i].accumulate_grad(g[i]);
      opt_flat->apply_arena(arena);
      for (size_t i = 0; i < ref.size(); ++i) EXPECT_TRUE(bit_equal(ref[i].value(), flat[i].value())) << step;
      EXPECT_EQ(opt_flat->learning_rate(), (*warmup_cosine())(step + 1));
    }
  }
}

TEST(OptimizerSchedule, SetLearningRateIsRefusedWhileAScheduleIsSet) {
  Adam opt(0.5f);
  opt.set_learning_rate_schedule(warmup_cosine());
  try {
    opt.set_learning_rate(0.1f);
    FAIL() << "set_learning_rate was accepted under a schedule";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(e.message().find("CosineDecay("), std::string::npos) << e.message();
  }
  Var w(Tensor::from_floats({1}, {1.0f}), true, "w");
  opt.apply({Tensor::from_floats({1}, {1.0f})}, {w});
  opt.apply({Tensor::from_floats({1}, {1.0f})}, {w});
  // Removing the schedule fixes the rate where it stood; then it is settable again.
  const float reached = (*warmup_cosine())(2);
  opt.set_learning_rate_schedule(nullptr);
  EXPECT_EQ(opt.learning_rate_schedule(), nullptr);
  EXPECT_EQ(opt.learning_rate(), reached);
  opt.apply({Tensor::from_floats({1}, {1.0f})}, {w});
  EXPECT_EQ(opt.learning_rate(), reached);
  opt.set_learning_rate(0.1f);
  EXPECT_EQ(opt.learning_rate(), 0.1f);
}

TEST(OptimizerSchedule, InvalidRatesFailBeforeAnythingChanges) {
  Sgd opt(0.1f);
  // Negative from the start: refused when set, and the previous rate stays.
  EXPECT_THROW(opt.set_learning_rate_schedule(std::make_shared<ConstantSchedule>(-1.0)), Error);
  EXPECT_EQ(opt.learning_rate_schedule(), nullptr);
  EXPECT_EQ(opt.learning_rate(), 0.1f);
  // Negative from step 2: the third update throws and leaves the variable, slots and iterations alone.
  opt.set_learning_rate_schedule(std::make_shared<PiecewiseConstantDecay>(std::vector<int64_t>{1},
                                                                          std::vector<double>{0.1, -0.1}));
  Var w(Tensor::from_floats({2}, {1.0f, 2.0f}), true, "w");
  const Tensor g = Tensor::from_floats({2}, {1.0f, 1.0f});
  opt.apply({g}, {w});
  opt.apply({g}, {w});  // step 1 still reads values[0] (step <= boundary)
  const Tensor before = w.value().clone();
  try {
    opt.apply({g}, {w});
    FAIL() << "a negative scheduled rate was applied";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("at step 2"), std::string::npos) << e.message();
  }
  EXPECT_TRUE(bit_equal(w.value(), before));
  EXPECT_EQ(opt.iterations(), 2);

  ParameterArena arena(std::vector<Var>{w});
  arena.zero_grad();
  w.accumulate_grad(g);
  EXPECT_THROW(opt.apply_arena(arena), Error);
  EXPECT_TRUE(bit_equal(w.value(), before));
  EXPECT_EQ(opt.iterations(), 2);
}

// Six updates straight, or three, a checkpoint into a fresh optimizer given the same schedule, and three more.
std::vector<Tensor> run_six(const Factory& make, bool resume, std::vector<float>* rates) {
  auto opt = make();
  opt->set_learning_rate_schedule(warmup_cosine());
  std::vector<Var> vars = make_vars();
  for (int step = 0; step < 6; ++step) {
    if (resume && step == 3) {
      const NamedTensors saved = opt->state();
      for (const auto& [key, t] : saved) {
        if (key == "learning_rate") {
          EXPECT_EQ(t.at(0), (*warmup_cosine())(3)) << "state() records the current rate";
        }
      }
      opt = make();
      opt->set_learning_rate_schedule(warmup_cosine());
      opt->load_state(saved);
      EXPECT_EQ(opt->iterations(), 3);
    }
    rates->push_back(opt->learning_rate());
    opt->apply(grads_at(vars, step), vars);
  }
  std::vector<Tensor> out;
  for (const Var& v : vars) out.push_back(v.value());
  for (const auto& [key, t] : opt->state()) out.push_back(t);
  return out;
}

TEST(OptimizerSchedule, CheckpointMidScheduleResumesBitIdentically) {
  for (const auto& [name, make] : factories()) {
    SCOPED_TRACE(name);
    std::vector<float> rates_straight, rates_resumed;
    const std::vector<Tensor> straight = run_six(make, false, &rates_straight);
    const std::vector<Tensor> resumed = run_six(make, true, &rates_resumed);
    EXPECT_EQ(rates_straight, rates_resumed);
    ASSERT_EQ(straight.size(), resumed.size());
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_TRUE(bit_equal(straight[i], resumed[i])) << "entry " << i;
  }
}

TEST(OptimizerSchedule, LoadStateKeepsTheScheduleAndIgnoresTheStoredRate) {
  Adam opt;
  opt.set_learning_rate_schedule(warmup_cosine());
  NamedTensors st = {{"iterations", Tensor::from_ints({1}, {4})}, {"learning_rate", Tensor::from_floats({1}, {0.9f})}};
  opt.load_state(st);
  EXPECT_EQ(opt.learning_rate(), (*warmup_cosine())(4));
  // Without a schedule the stored rate is the rate.
  Adam plain;
  plain.load_state(st);
  EXPECT_EQ(plain.learning_rate(), 0.9f);
  // The stored entry is still checked.
  st[1].second = Tensor::from_ints({1}, {1});
  EXPECT_THROW(opt.load_state(st), Error);
}

}  // namespace
}  // namespace mixtrain
