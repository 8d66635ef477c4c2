// Learning-rate schedules against float64 references of Keras 3's formulas (written here independently, in
// the form of Keras' docstrings and tests) and against the values Keras' own tests expect.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "mixtrain/core/error.h"
#include "mixtrain/optim/schedules.h"

namespace mixtrain {
namespace {

constexpr double kPi = 3.14159265358979323846;

// A schedule evaluates its formula in double and rounds once (at most half a float32 ulp); the reference's
// double formula may order operations differently, a few double ulps apart, which can move the rounding by at
// most one more half ulp. So: within one float32 ulp of the reference.
void expect_rate(float got, double want, int64_t step) {
  const float w = static_cast<float>(want);
  const float ulp = std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity()) - std::fabs(w);
  EXPECT_NEAR(got, want, ulp) << "step " << step;
}

TEST(ExponentialDecay, MatchesReferenceContinuousAndStaircase) {
  const ExponentialDecay smooth(0.05, 10, 0.96);
  const ExponentialDecay stairs(0.1, 3, 0.96, /*staircase=*/true);
  for (int64_t s = 0; s <= 300; ++s) {
    expect_rate(smooth(s), 0.05 * std::pow(0.96, static_cast<double>(s) / 10.0), s);
    expect_rate(stairs(s), 0.1 * std::pow(0.96, static_cast<double>(s / 3)), s);
  }
  // Keras' test values.
  expect_rate(smooth(5), 0.05 * std::pow(0.96, 0.5), 5);
  EXPECT_EQ(stairs(1), 0.1f);
  EXPECT_EQ(stairs(2), 0.1f);
  expect_rate(stairs(100), 0.1 * std::pow(0.96, 33), 100);
}

TEST(PiecewiseConstantDecay, IntervalsCloseOnTheRightAsKeras) {
  const PiecewiseConstantDecay pcd({100, 110, 120}, {1.0, 0.1, 0.01, 0.001});
  EXPECT_EQ(pcd(0), 1.0f);
  EXPECT_EQ(pcd(100), 1.0f);  // step <= boundaries[0]
  EXPECT_EQ(pcd(101), 0.1f);
  EXPECT_EQ(pcd(105), 0.1f);
  EXPECT_EQ(pcd(110), 0.1f);
  EXPECT_EQ(pcd(111), 0.01f);
  EXPECT_EQ(pcd(120), 0.01f);
  EXPECT_EQ(pcd(121), 0.001f);
  EXPECT_EQ(pcd(999), 0.001f);

  const PiecewiseConstantDecay small({1, 2, 3}, {0.4, 0.5, 0.6, 0.7});
  const float want[] = {0.4f, 0.4f, 0.5f, 0.6f, 0.7f};
  for (int64_t s = 0; s < 5; ++s) EXPECT_EQ(small(s), want[s]) << "step " << s;

  EXPECT_THROW(PiecewiseConstantDecay({1, 2}, {0.1, 0.2}), Error);        // one value short
  EXPECT_THROW(PiecewiseConstantDecay({5, 5}, {0.1, 0.2, 0.3}), Error);   // not strictly increasing
  EXPECT_THROW(PiecewiseConstantDecay({5}, {0.1, std::nan("")}), Error);  // not finite
}

double polynomial_reference(double init, double decay_steps, double end, double power, bool cycle, int64_t step) {
  double s = static_cast<double>(step);
  if (cycle) {
    const double mult = step == 0 ? 1.0 : std::ceil(s / decay_steps);
    decay_steps *= mult;
  } else {
    s = std::min(s, decay_steps);
  }
  return (init - end) * std::pow(1.0 - s / decay_steps, power) + end;
}

TEST(PolynomialDecay, MatchesReferenceAndKerasTestValues) {
  for (bool cycle : {false, true}) {
    for (double power : {1.0, 0.5, 2.0}) {
      const PolynomialDecay pd(0.05, 10, 0.001, power, cycle);
      for (int64_t s = 0; s <= 45; ++s) expect_rate(pd(s), polynomial_reference(0.05, 10, 0.001, power, cycle, s), s);
    }
  }
  const double lr = 0.05, end = 0.001;
  expect_rate(PolynomialDecay(lr, 10, 0.0)(5), lr * 0.5, 5);
  expect_rate(PolynomialDecay(lr, 10, end)(10), end, 10);
  expect_rate(PolynomialDecay(lr, 10, end)(5), (lr + end) * 0.5, 5);
  expect_rate(PolynomialDecay(lr, 10, end)(15), end, 15);
  expect_rate(PolynomialDecay(lr, 10, end, 1.0, true)(15), (lr - end) * 0.25 + end, 15);
  expect_rate(PolynomialDecay(lr, 10, end, 0.5, true)(15), (lr - end) * std::pow(0.25, 0.5) + end, 15);
  expect_rate(PolynomialDecay(0.001, 10, 1e-4, 1.0, true)(0), 0.001, 0);
  // Keras' default end_learning_rate is 1e-4.
  expect_rate(PolynomialDecay(0.1, 4)(100), 1e-4, 100);
  EXPECT_THROW(PolynomialDecay(0.1, 0), Error);
}

TEST(InverseTimeDecay, MatchesReference) {
  const InverseTimeDecay smooth(0.1, 10, 0.96);
  const InverseTimeDecay stairs(0.1, 10, 0.96, true);
  for (int64_t s = 0; s <= 100; ++s) {
    expect_rate(smooth(s), 0.1 / (1.0 + static_cast<double>(s) / 10.0 * 0.96), s);
    expect_rate(stairs(s), 0.1 / (1.0 + 0.96 * static_cast<double>(s / 10)), s);
  }
  EXPECT_THROW(InverseTimeDecay(0.1, -1, 0.5), Error);
}

double cosine_reference(int64_t step, double decay_steps, double alpha) {
  const double s = std::min(static_cast<double>(step), decay_steps);
  const double decay = 0.5 * (1.0 + std::cos(kPi * s / decay_steps));
  return (1.0 - alpha) * decay + alpha;
}

TEST(CosineDecay, DecayAndAlphaMatchReference) {
  for (double alpha : {0.0, 0.1}) {
    const CosineDecay cd(1.0, 1000, alpha);
    for (int64_t s = 0; s < 1500; s += 7) expect_rate(cd(s), cosine_reference(s, 1000, alpha), s);
    EXPECT_EQ(cd(0), 1.0f);
    expect_rate(cd(1000), alpha, 1000);
    expect_rate(cd(5000), alpha, 5000);  // clamped after decay_steps
  }
  const CosineDecay scaled(0.003, 80, 0.25);
  for (int64_t s = 0; s <= 100; ++s) expect_rate(scaled(s), 0.003 * cosine_reference(s, 80, 0.25), s);
}

TEST(CosineDecay, Keras3WarmupThenDecayFromTheTarget) {
  // Keras' test: warmup 2000 steps from 0 to 10, then cosine over 1000 steps from 10.
  const CosineDecay cd(0.0, 1000, 0.0, 10.0, 2000);
  for (int64_t s = 0; s < 3000; s += 250) {
    const double want = s < 2000 ? 10.0 * static_cast<double>(s) / 2000.0 : 10.0 * cosine_reference(s - 2000, 1000, 0);
    expect_rate(cd(s), want, s);
  }
  // A warmup that starts above 0, alpha relative to warmup_target, and the clamp after the decay.
  const CosineDecay from(0.01, 50, 0.1, 0.2, 10);
  for (int64_t s = 0; s <= 100; ++s) {
    const double want = s < 10 ? 0.01 + (0.2 - 0.01) * static_cast<double>(s) / 10.0
                               : 0.2 * cosine_reference(s - 10, 50, 0.1);
    expect_rate(from(s), want, s);
  }
  EXPECT_EQ(from(10), 0.2f);  // the warmup ends exactly at the target
  expect_rate(from(60), 0.02, 60);
  expect_rate(from(1000), 0.02, 1000);
  // warmup_target without warmup steps: the decay starts from the target at once.
  expect_rate(CosineDecay(0.5, 10, 0.0, 0.25, 0)(0), 0.25, 0);
  EXPECT_THROW(CosineDecay(0.1, 10, 0.0, 0.2, -1), Error);
}

// Keras' loop reference: walk through the periods.
double restarts_reference(int64_t step, double decay_steps, double t_mul, double m_mul, double alpha) {
  double s = static_cast<double>(step), fac = 1.0;
  while (s >= decay_steps) {
    s -= decay_steps;
    decay_steps *= t_mul;
    fac *= m_mul;
  }
  const double decay = fac * 0.5 * (1.0 + std::cos(kPi * s / decay_steps));
  return (1.0 - alpha) * decay + alpha;
}

TEST(CosineDecayRestarts, MatchesTheLoopReferenceOnEveryStepAndRestart) {
  struct Params {
    double t_mul, m_mul, alpha;
  };
  for (const Params& p : {Params{2.0, 1.0, 0.0}, Params{1.0, 1.0, 0.0}, Params{2.0, 0.9, 0.1}, Params{3.0, 1.0, 0.0},
                          Params{1.5, 0.5, 0.0}, Params{1.0, 0.8, 0.2}}) {
    SCOPED_TRACE("t_mul " + std::to_string(p.t_mul) + " m_mul " + std::to_string(p.m_mul));
    const CosineDecayRestarts sched(0.5, 10, p.t_mul, p.m_mul, p.alpha);
    for (int64_t s = 0; s <= 400; ++s) expect_rate(sched(s), 0.5 * restarts_reference(s, 10, p.t_mul, p.m_mul, p.alpha), s);
  }
  // Each restart lands exactly on its step: t_mul 3 puts them at 10, 40, 130, 400.
  const CosineDecayRestarts three(1.0, 10, 3.0);
  for (int64_t s : {0, 10, 40, 130, 400}) EXPECT_EQ(three(s), 1.0f) << "step " << s;
  EXPECT_LT(three(399), 1e-4f);
  // Keras' test values.
  for (int64_t s = 0; s < 1500; s += 250) {
    expect_rate(CosineDecayRestarts(1.0, 1000)(s), restarts_reference(s, 1000, 2.0, 1.0, 0.0), s);
    expect_rate(CosineDecayRestarts(1.0, 1000, 2.0, 0.9)(s), restarts_reference(s, 1000, 2.0, 0.9, 0.0), s);
  }
  // Shrinking periods all end by first_decay_steps / (1 - t_mul) steps.
  const CosineDecayRestarts shrinking(1.0, 10, 0.5);
  expect_rate(shrinking(12), restarts_reference(12, 10, 0.5, 1.0, 0.0), 12);
  EXPECT_THROW(shrinking(20), Error);
  EXPECT_THROW(CosineDecayRestarts(1.0, 10, 0.0), Error);
}

TEST(LearningRateSchedule, RefusesWhatKerasRefusesAndNonFiniteArguments) {
  EXPECT_THROW(ExponentialDecay(0.1, 0, 0.9), Error);
  EXPECT_THROW(ExponentialDecay(0.1, -5, 0.9), Error);
  EXPECT_THROW(ExponentialDecay(std::nan(""), 5, 0.9), Error);
  EXPECT_THROW(CosineDecay(0.1, 0), Error);
  EXPECT_THROW(CosineDecayRestarts(0.1, 0), Error);
  EXPECT_THROW(CosineDecay(0.1, 10, std::numeric_limits<double>::infinity()), Error);
  EXPECT_THROW(LinearWarmup(nullptr, 5), Error);
  EXPECT_THROW(ExponentialDecay(0.1, 5, 0.9)(-1), Error);
  try {
    CosineDecay(0.1, 0);
    FAIL() << "decay_steps 0 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(e.message().find("decay_steps must be finite and > 0"), std::string::npos) << e.message();
  }
}

TEST(LearningRateSchedule, NamesAndDescriptions) {
  EXPECT_EQ(ExponentialDecay(0.1, 1000, 0.96, true).describe(),
            "ExponentialDecay(initial_learning_rate=0.1, decay_steps=1000, decay_rate=0.96, staircase=true)");
  EXPECT_EQ(PiecewiseConstantDecay({10, 20}, {1, 0.5, 0.1}).describe(),
            "PiecewiseConstantDecay(boundaries=[10, 20], values=[1, 0.5, 0.1])");
  EXPECT_EQ(CosineDecay(0, 900, 0.1, 0.001, 100).describe(),
            "CosineDecay(initial_learning_rate=0, decay_steps=900, alpha=0.1, warmup_target=0.001, warmup_steps=100)");
  EXPECT_EQ(PolynomialDecay(0.1, 10).name(), "PolynomialDecay");
  EXPECT_EQ(InverseTimeDecay(0.1, 10, 0.5).name(), "InverseTimeDecay");
  EXPECT_EQ(CosineDecayRestarts(0.1, 10).name(), "CosineDecayRestarts");
  EXPECT_EQ(LinearWarmup(std::make_shared<ConstantSchedule>(0.5), 4).describe(),
            "LinearWarmup(warmup_steps=4, warmup_learning_rate=0, after=ConstantSchedule(learning_rate=0.5))");
}

TEST(LinearWarmup, RampsToWhereTheNextScheduleStarts) {
  auto after = std::make_shared<ExponentialDecay>(0.2, 10, 0.5);
  const LinearWarmup w(after, 8, 0.04);
  for (int64_t s = 0; s < 8; ++s) expect_rate(w(s), 0.04 + (static_cast<double>((*after)(0)) - 0.04) * s / 8.0, s);
  for (int64_t s = 8; s < 40; ++s) EXPECT_EQ(w(s), (*after)(s - 8)) << "step " << s;
}

TEST(MakeSchedule, ConstantCosineAndLinearWithWarmup) {
  const float lr = 0.002f;
  // Warmup: 0 at step 0, linear, reaching lr at warmup_steps.
  for (const char* name : {"constant", "cosine", "linear"}) {
    SCOPED_TRACE(name);
    auto s = make_schedule(name, lr, 100, 10);
    EXPECT_EQ((*s)(0), 0.0f);
    expect_rate((*s)(5), 0.5 * lr, 5);
    EXPECT_EQ((*s)(10), lr);
    auto no_warmup = make_schedule(name, lr, 100, 0);
    EXPECT_EQ((*no_warmup)(0), lr);
  }
  auto constant = make_schedule("constant", lr, 100, 10);
  EXPECT_EQ((*constant)(99), lr);
  EXPECT_EQ((*constant)(100000), lr);

  // cosine: lr down to 0.1 * lr over the 90 steps after the warmup.
  auto cosine = make_schedule("cosine", lr, 100, 10);
  for (int64_t s = 10; s <= 100; ++s) expect_rate((*cosine)(s), lr * cosine_reference(s - 10, 90, 0.1), s);
  expect_rate((*cosine)(100), 0.1 * lr, 100);
  auto cosine0 = make_schedule("cosine", lr, 100, 0);
  for (int64_t s = 0; s <= 100; ++s) expect_rate((*cosine0)(s), lr * cosine_reference(s, 100, 0.1), s);

  // linear: lr down to 0 over the 90 steps after the warmup.
  auto linear = make_schedule("linear", lr, 100, 10);
  for (int64_t s = 10; s <= 100; ++s) expect_rate((*linear)(s), lr * (1.0 - (s - 10) / 90.0), s);
  EXPECT_EQ((*linear)(100), 0.0f);

  // A warmup as long as the run leaves one decay step.
  auto all_warmup = make_schedule("cosine", lr, 10, 10);
  expect_rate((*all_warmup)(9), 0.9 * lr, 9);
}

TEST(MakeSchedule, RefusesUnknownNamesAndBadArguments) {
  try {
    make_schedule("exponential", 0.1f, 100, 0);
    FAIL() << "an unknown name was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(e.message().find("constant, cosine, linear"), std::string::npos) << e.message();
  }
  EXPECT_THROW(make_schedule("cosine", 0.1f, 0, 0), Error);
  EXPECT_THROW(make_schedule("cosine", 0.1f, 100, -1), Error);
  EXPECT_THROW(make_schedule("cosine", 0.1f, 100, 101), Error);
  EXPECT_THROW(make_schedule("linear", -0.1f, 100, 0), Error);
  EXPECT_THROW(make_schedule("constant", std::numeric_limits<float>::quiet_NaN(), 100, 0), Error);
}

}  // namespace
}  // namespace mixtrain
