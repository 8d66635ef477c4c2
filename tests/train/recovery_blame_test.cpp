// Which layers the recovery blames, and when it acts on a loss that leaves a ceiling: the float32 shadow's
// measurement (overflow, and rounding noise against each column's spread), victims downstream of non-finite
// values left alone, the ceiling handed to the drift check through drift_reference_for_ceiling, and the last
// non-finite batch inspected when a drift climbs.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/recovery.h"
#include "quiet_policy_test.h"

namespace mixtrain {
namespace {

using RecoveryBlameTest = QuietPolicyTest;

// Rows of 4 features: three of unit scale, and column 3 = offset + a small reading (sd 2).
Tensor rows(int64_t n, float offset, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x(static_cast<size_t>(n * 4));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < 3; ++j) x[static_cast<size_t>(i * 4 + j)] = r.normal();
    x[static_cast<size_t>(i * 4 + 3)] = offset + 2.0f * r.normal();
  }
  return Tensor::from_floats({n, 4}, x);
}

std::unique_ptr<Model> model(const char* policy, bool batch_norm = false) {
  set_global_policy(policy);
  auto m = std::make_unique<Model>("m", 5);
  m->emplace<Dense>(16, "relu");
  if (batch_norm) m->emplace<BatchNormalization>();
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  m->compile(make_optimizer("adam", 1e-3f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  m->build_for(Shape{4});
  return m;
}

TEST(DriftCeiling, TheReferenceSmoothsBackToTheCeiling) {
  const std::vector<double> ceiling = {2.0, 1.9, 1.7, 1.72, 1.5, 1.4, 1.41, 1.2};
  for (double tolerance : {0.0, 0.25}) {
    const std::vector<double> smoothed = drift_smoothed(drift_reference_for_ceiling(ceiling, tolerance));
    ASSERT_EQ(smoothed.size(), ceiling.size());
    for (size_t i = 0; i < ceiling.size(); ++i) EXPECT_NEAR(smoothed[i] * (1 + tolerance), ceiling[i], 1e-12) << i;
  }
  // drift_smoothed is the guard's average: it starts at the first value.
  EXPECT_EQ(drift_smoothed({3.0, 1.0})[0], 3.0);
  EXPECT_DOUBLE_EQ(drift_smoothed({3.0, 1.0})[1], 0.98 * 3.0 + 0.02 * 1.0);
  // No ceiling from the first non-finite value on.
  EXPECT_EQ(drift_reference_for_ceiling({1.0, NAN, 1.0}, 0.25).size(), 1u);
  EXPECT_THROW(drift_reference_for_ceiling({1.0}, -1.0), Error);
}

TEST_F(RecoveryBlameTest, ALayerThatLosesAnOffsetReadingIsBlamedOnlyForADrift) {
  auto m = model("mixed_bfloat16");
  // bfloat16 keeps 8 significant bits: around 2000 its spacing is 8, four times the reading's spread.
  const std::vector<LayerNumerics> offset = measure_layer_numerics(*m, rows(64, 2000.0f, 1));
  ASSERT_EQ(offset.size(), 2u);
  EXPECT_EQ(offset[0].compute_dtype, DType::kBFloat16);
  EXPECT_GE(offset[0].lost_columns, 1);
  EXPECT_GT(offset[0].worst_noise_ratio, kSignalLossNoiseRatio);
  EXPECT_EQ(offset[0].inputs.overflow, 0);
  EXPECT_EQ(offset[1].columns, 0);  // float32: no rounding measured
  const auto blamed = layers_to_blame(offset, /*precision=*/true);
  ASSERT_EQ(blamed.size(), 1u);
  EXPECT_EQ(blamed[0].first, m->layers()[0]->name());
  EXPECT_NE(blamed[0].second.find("loses precision"), std::string::npos) << blamed[0].second;
  EXPECT_TRUE(layers_to_blame(offset, /*precision=*/false).empty());
  // The same reading without the offset fits bfloat16: rounding noise is ~0.2% of each column's spread.
  const std::vector<LayerNumerics> plain = measure_layer_numerics(*m, rows(64, 0.0f, 1));
  EXPECT_EQ(plain[0].lost_columns, 0);
  EXPECT_LT(plain[0].worst_noise_ratio, 0.05);
  EXPECT_TRUE(layers_to_blame(plain, true).empty());
}

TEST_F(RecoveryBlameTest, OverflowIsBlamedAndItsVictimsAreNot) {
  auto m = model("mixed_float16");
  const std::vector<LayerNumerics> stats = measure_layer_numerics(*m, rows(32, 1e5f, 2));
  EXPECT_GT(stats[0].inputs.overflow, 0);
  const auto blamed = layers_to_blame(stats, false);
  ASSERT_EQ(blamed.size(), 1u);
  EXPECT_EQ(blamed[0].second.rfind("inputs overflow", 0), 0u) << blamed[0].second;

  // A layer whose inputs are already non-finite in float32 is downstream of the damage.
  LayerNumerics victim;
  victim.layer = "after";
  victim.compute_dtype = DType::kFloat16;
  victim.inputs.nan = 3;
  victim.outputs.overflow = 5;
  victim.internal.overflow = 1;
  EXPECT_TRUE(layers_to_blame({victim}, true).empty());
  victim.inputs.nan = 0;
  EXPECT_EQ(layers_to_blame({victim}, true).at(0).second, "outputs overflow, internal values overflow");
  // Layers that compute in float32 are never blamed.
  victim.compute_dtype = DType::kFloat32;
  EXPECT_TRUE(layers_to_blame({victim}, true).empty());
}

TEST_F(RecoveryBlameTest, MeasuringLeavesTheModelAsItWas) {
  auto m = model("mixed_float16", /*batch_norm=*/true);
  auto* bn = dynamic_cast<BatchNormalization*>(m->layers()[1].get());
  ASSERT_NE(bn, nullptr);
  const std::vector<float> mean_before = bn->moving_mean().value().to_floats();
  const auto dropout_state = m->dropout_rng().state();
  measure_layer_numerics(*m, rows(16, 3.0f, 3));
  // Inference mode: no moving-statistics update, no random draws; the real policies are back.
  EXPECT_EQ(bn->moving_mean().value().to_floats(), mean_before);
  EXPECT_EQ(m->dropout_rng().state(), dropout_state);
  EXPECT_EQ(m->layers()[0]->compute_dtype(), DType::kFloat16);
  EXPECT_EQ(m->observer(), nullptr);
  EXPECT_THROW(measure_layer_numerics(*m, Tensor()), Error);
}

// The guard acts once the run's smoothed loss has stayed above the ceiling for max_consecutive_failures steps
// after the warm-up; a drift climb also inspects the last batch whose loss was non-finite.
TEST_F(RecoveryBlameTest, TheGuardActsWhereTheLossLeavesTheCeiling) {
  const Tensor normal = rows(32, 0.0f, 4), y = Tensor::from_ints({32}, std::vector<int32_t>(32, 1));
  auto batch_of = [&](const Tensor& x) { return [x, y] { return std::make_pair(x, y); }; };
  const std::vector<double> ceiling(400, 1.0);
  RecoveryOptions o;
  std::ostringstream log;
  o.log = &log;
  o.reference_step_loss = drift_reference_for_ceiling(ceiling, o.drift_tolerance);

  // Just under the ceiling: nothing happens.
  {
    auto m = model("mixed_bfloat16");
    RecoveryGuard guard(o);
    guard.snapshot(*m, FitPosition{});
    for (int64_t step = 1; step <= 300; ++step) EXPECT_FALSE(guard.after_step(*m, {{"loss", 0.99}}, batch_of(normal), step));
    EXPECT_TRUE(guard.events().empty()) << log.str();
  }
  // Above it from the start: drifting from step 101 (after the 100-step warm-up), acting at step 120. Nothing
  // in the batch is to blame, so the whole model goes to float32.
  {
    auto m = model("mixed_bfloat16");
    RecoveryGuard guard(o);
    guard.snapshot(*m, FitPosition{});
    int64_t acted = 0;
    for (int64_t step = 1; step <= 200 && !acted; ++step)
      if (guard.after_step(*m, {{"loss", 1.2}}, batch_of(normal), step)) acted = step;
    EXPECT_EQ(acted, o.drift_warmup_steps + o.max_consecutive_failures) << log.str();
    ASSERT_EQ(guard.events().size(), 2u);
    EXPECT_EQ(guard.events()[0].action, "model_to_float32");
    EXPECT_NE(guard.events()[0].reason.find("float32 reference (1)"), std::string::npos) << guard.events()[0].reason;
    EXPECT_EQ(guard.events()[1].action, "rollback");
    EXPECT_EQ(guard.events()[1].resume_step, 0);
  }
  // One earlier step overflowed (its loss was NaN, the scaler skipped it): the drift climb finds the overflow on
  // that batch although the current one is fine, and blames only the first Dense.
  {
    auto m = model("mixed_float16");
    RecoveryGuard guard(o);
    guard.snapshot(*m, FitPosition{});
    const Tensor overexposed = rows(32, 1e5f, 5);
    int64_t acted = 0;
    for (int64_t step = 1; step <= 200 && !acted; ++step) {
      const bool bad = step == 50;
      if (guard.after_step(*m, {{"loss", bad ? NAN : 1.2}}, batch_of(bad ? overexposed : normal), step)) acted = step;
    }
    EXPECT_EQ(acted, o.drift_warmup_steps + o.max_consecutive_failures) << log.str();
    ASSERT_FALSE(guard.events().empty());
    EXPECT_EQ(guard.events()[0].action, "layers_to_float32") << log.str();
    EXPECT_EQ(guard.events()[0].layers, std::vector<std::string>{m->layers()[0]->name()});
    EXPECT_EQ(m->layers()[0]->compute_dtype(), DType::kFloat32);
  }
}

}  // namespace
}  // namespace mixtrain
