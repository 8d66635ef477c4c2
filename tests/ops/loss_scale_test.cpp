// ops::unscale_and_count_nonfinite and unscale_and_check against a float64 reference on odd sizes and every
// floating dtype; ops::apply_loss_scale; ops::update_loss_scale step by step against the rule written out.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/loss_scale.h"

namespace mixtrain::ops {
namespace {

TEST(UnscaleAndCountNonfinite, MatchesReferenceOnOddSizes) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t n : {1, 7, 17, 129, 2049, 70001}) {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 101 - 50) * 3.0f;
      if (n > 7) {
        v[3] = std::numeric_limits<float>::infinity();
        v[static_cast<size_t>(n - 1)] = std::nanf("");
      }
      const Tensor scaled = Tensor::from_floats({n}, v, dt);
      const std::vector<float> rounded = scaled.to_floats();
      const float inv = static_cast<float>(1.0 / 3.0);
      Tensor out = Tensor::empty({n}, DType::kFloat32);
      const int64_t bad = unscale_and_count_nonfinite(scaled, inv, out);
      EXPECT_EQ(bad, n > 7 ? 2 : 0);
      EXPECT_EQ(bad, count_nonfinite(out));
      const std::vector<float> got = out.to_floats();
      for (int64_t i = 0; i < n; ++i) {
        const float want = rounded[static_cast<size_t>(i)] * inv;  // one float32 product, no rounding after
        if (std::isnan(want))
          EXPECT_TRUE(std::isnan(got[static_cast<size_t>(i)]));
        else
          ASSERT_EQ(got[static_cast<size_t>(i)], want) << dtype_name(dt) << " n=" << n << " i=" << i;
      }
      if (dt == DType::kFloat32) {
        Tensor in_place = scaled.clone();
        EXPECT_EQ(unscale_and_count_nonfinite(in_place, inv), bad);
        EXPECT_EQ(std::memcmp(in_place.raw(), out.raw(), out.nbytes()), 0);
      }
    }
  }
}

// A finite scaled value that overflows once unscaled by a scale below 1 counts as non-finite.
TEST(UnscaleAndCountNonfinite, OverflowOnUnscaleCounts) {
  Tensor g = Tensor::from_floats({2}, {3e38f, 1.0f});
  EXPECT_EQ(unscale_and_count_nonfinite(g, 4.0f), 1);
}

TEST(UnscaleAndCountNonfinite, RejectsBadOutputs) {
  const Tensor g16 = Tensor::from_floats({4}, {1, 2, 3, 4}, DType::kFloat16);
  Tensor wrong_dtype = Tensor::empty({4}, DType::kFloat16);
  Tensor wrong_size = Tensor::empty({3}, DType::kFloat32);
  EXPECT_THROW(unscale_and_count_nonfinite(g16, 0.5f, wrong_dtype), Error);
  EXPECT_THROW(unscale_and_count_nonfinite(g16, 0.5f, wrong_size), Error);
  Tensor g16_copy = g16.clone();
  EXPECT_THROW(unscale_and_count_nonfinite(g16_copy, 0.5f), Error);  // in place needs float32
  EXPECT_TRUE(ops::supports<ops::Op::unscale_and_count_nonfinite>(DeviceType::kCpu));
}

Tensor scale_state(float s) { return Tensor::from_floats({2}, {s, s}); }

// The scale is read from the state tensor; the flag is raised by a non-finite buffer and never lowered.
TEST(UnscaleAndCheck, ReadsTheScaleFromItsTensorAndRaisesTheFlag) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t n : {1, 17, 129, 70001}) {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i * 13) % 97 - 48) * 8.0f;
      const Tensor finite = Tensor::from_floats({n}, v, dt);
      v[static_cast<size_t>(n / 2)] = std::numeric_limits<float>::infinity();
      const Tensor overflowing = Tensor::from_floats({n}, v, dt);
      const Tensor state = scale_state(1024.0f);
      Tensor flag = Tensor::zeros({1}, DType::kFloat32);
      Tensor out = Tensor::empty({n}, DType::kFloat32), want = Tensor::empty({n}, DType::kFloat32);
      unscale_and_check(finite, state, flag, out);
      EXPECT_EQ(flag.item(), 0.0f) << dtype_name(dt) << " n=" << n;
      ASSERT_EQ(unscale_and_count_nonfinite(finite, 1.0f / 1024.0f, want), 0);
      EXPECT_EQ(std::memcmp(out.raw(), want.raw(), want.nbytes()), 0);
      unscale_and_check(overflowing, state, flag, out);
      EXPECT_EQ(flag.item(), 1.0f);
      unscale_and_check(finite, state, flag, out);  // a later finite buffer keeps the step's flag raised
      EXPECT_EQ(flag.item(), 1.0f);
      if (dt == DType::kFloat32) {
        Tensor in_place = finite.clone();
        Tensor lowered = Tensor::zeros({1}, DType::kFloat32);
        unscale_and_check(in_place, state, lowered);
        EXPECT_EQ(lowered.item(), 0.0f);
        EXPECT_EQ(std::memcmp(in_place.raw(), want.raw(), want.nbytes()), 0);
      }
    }
  }
}

TEST(UnscaleAndCheck, RejectsBadStateAndFlag) {
  const Tensor g = Tensor::from_floats({2}, {1.0f, 2.0f});
  Tensor out = Tensor::empty({2}, DType::kFloat32);
  Tensor flag = Tensor::zeros({1}, DType::kFloat32);
  Tensor int_flag = Tensor::zeros({1}, DType::kInt32);
  EXPECT_THROW(unscale_and_check(g, Tensor::from_floats({1}, {2.0f}), flag, out), Error);
  EXPECT_THROW(unscale_and_check(g, scale_state(2.0f), int_flag, out), Error);
}

TEST(ApplyLossScale, MultipliesInFloat32ByTheStateScale) {
  const Tensor loss16 = Tensor::from_floats({3}, {60000.0f, 1.5f, -2.0f}, DType::kFloat16);
  const Tensor scaled = apply_loss_scale(loss16, scale_state(32768.0f));
  ASSERT_EQ(scaled.dtype(), DType::kFloat32);
  const std::vector<float> r = loss16.to_floats();
  const std::vector<float> got = scaled.to_floats();
  for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(got[i], r[i] * 32768.0f);  // 60000 * 2^15 is finite in float32
}

struct RuleState {
  Tensor scale = Tensor::from_floats({2}, {8.0f, 8.0f});
  Tensor counters = Tensor::zeros({kLsNumCounters}, DType::kInt32);
  Tensor flag = Tensor::zeros({1}, DType::kFloat32);
  void step(bool overflow, const LossScaleRule& rule) {
    flag.data<float>()[0] = overflow ? 1.0f : 0.0f;
    update_loss_scale(scale, counters, flag, rule);
  }
  float s() const { return scale.to_floats()[0]; }
  int32_t c(LossScaleCounter k) const { return counters.to_ints()[static_cast<size_t>(k)]; }
};

TEST(UpdateLossScale, GrowsHalvesAndStopsAtTheFloorAndCeiling) {
  LossScaleRule rule;
  rule.growth_steps = 2;
  rule.min_scale = 2.0f;
  rule.max_scale = 16.0f;
  rule.hysteresis = 1;
  rule.floor_alarm_steps = 3;
  RuleState st;
  st.counters.data<int32_t>()[kLsHysteresisLeft] = 1;
  st.step(false, rule);
  EXPECT_EQ(st.s(), 8.0f);
  EXPECT_EQ(st.c(kLsGrowth), 1);
  st.step(false, rule);  // two finite steps: doubles
  EXPECT_EQ(st.s(), 16.0f);
  EXPECT_EQ(st.c(kLsGrowth), 0);
  EXPECT_EQ(st.c(kLsGood), 2);
  st.step(false, rule);
  st.step(false, rule);  // 32 would pass max_scale
  EXPECT_EQ(st.s(), 16.0f);
  st.step(true, rule);
  EXPECT_EQ(st.s(), 8.0f);
  EXPECT_EQ(st.c(kLsSkipped), 1);
  EXPECT_EQ(st.c(kLsLastSkipped), 1);
  EXPECT_EQ(st.c(kLsAllFinite), 0);
  EXPECT_EQ(st.c(kLsGood), 0);
  EXPECT_EQ(st.scale.to_floats()[1], 8.0f);  // the smallest scale seen
  st.step(true, rule);
  st.step(true, rule);  // 8 -> 4 -> 2, the floor
  EXPECT_EQ(st.s(), 2.0f);
  EXPECT_EQ(st.c(kLsFloorSkips), 0);  // the step that reached the floor started above it
  st.step(true, rule);
  st.step(true, rule);
  EXPECT_EQ(st.c(kLsAlarms), 0);
  st.step(true, rule);  // the third skip taken at the floor raises the alarm, once
  EXPECT_EQ(st.s(), 2.0f);
  EXPECT_EQ(st.c(kLsFloorSkips), 3);
  EXPECT_EQ(st.c(kLsStuck), 1);
  EXPECT_EQ(st.c(kLsAlarms), 1);
  st.step(true, rule);
  EXPECT_EQ(st.c(kLsAlarms), 1);
  st.step(false, rule);  // a finite step clears the stuck flag, not the alarm count
  EXPECT_EQ(st.c(kLsStuck), 0);
  EXPECT_EQ(st.c(kLsAllFinite), 1);
  EXPECT_EQ(st.c(kLsAlarms), 1);
  EXPECT_EQ(st.c(kLsSkipped), 7);
}

TEST(UpdateLossScale, HysteresisSpendsBeforeHalvingAndRefillsOnGrowth) {
  LossScaleRule rule;
  rule.growth_steps = 1;
  rule.min_scale = 1.0f;
  rule.max_scale = 1024.0f;
  rule.hysteresis = 2;
  RuleState st;
  st.counters.data<int32_t>()[kLsHysteresisLeft] = 2;
  st.step(true, rule);  // tolerated
  EXPECT_EQ(st.s(), 8.0f);
  EXPECT_EQ(st.c(kLsHysteresisLeft), 1);
  st.step(true, rule);  // spent: halves
  EXPECT_EQ(st.s(), 4.0f);
  st.step(true, rule);  // still spent: halves again
  EXPECT_EQ(st.s(), 2.0f);
  st.step(false, rule);  // a completed growth interval doubles and refills
  EXPECT_EQ(st.s(), 4.0f);
  EXPECT_EQ(st.c(kLsHysteresisLeft), 2);
}

TEST(UpdateLossScale, FixedModeKeepsTheScaleAndCountsEverySkipAtTheFloor) {
  LossScaleRule rule;
  rule.dynamic = false;
  rule.floor_alarm_steps = 2;
  RuleState st;
  st.step(true, rule);
  st.step(true, rule);
  EXPECT_EQ(st.s(), 8.0f);
  EXPECT_EQ(st.c(kLsFloorSkips), 2);
  EXPECT_EQ(st.c(kLsAlarms), 1);
  EXPECT_TRUE(ops::supports<ops::Op::update_loss_scale>(DeviceType::kCpu));
  EXPECT_TRUE(ops::supports<ops::Op::unscale_and_check>(DeviceType::kCpu));
}

}  // namespace
}  // namespace mixtrain::ops
