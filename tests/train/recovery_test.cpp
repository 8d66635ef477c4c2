// The recovery ladder through Model::fit: rollback restores the snapshot bit for bit, overflowing layers
// (and only those) move to float32, and a layer that breaks only in 16 bits ends in a float32 revert.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "mixtrain/nn/layers.h"
#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/train/model.h"
#include "quiet_policy_test.h"
#include "mixtrain/train/recovery.h"

namespace mixtrain {
namespace {

using RecoveryTest = QuietPolicyTest;

// Three classes separated along raw, unnormalised features of magnitude ~1e5: beyond float16's 65504.
std::pair<Tensor, Tensor> raw_features(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x(static_cast<size_t>(n * 6));
  std::vector<int32_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<int32_t>(i % 3);
    for (int64_t j = 0; j < 6; ++j) x[i * 6 + j] = 1e5f * (1.0f + 0.2f * r.normal() + (j % 3 == y[i] ? 0.6f : 0.0f));
  }
  return {Tensor::from_floats({n, 6}, x), Tensor::from_ints({n}, y)};
}

std::unique_ptr<Model> mlp(const char* policy) {
  set_global_policy(policy);
  auto m = std::make_unique<Model>("mlp", 4);
  m->emplace<Dense>(32, "relu");
  m->emplace<Dense>(32, "relu");
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  m->compile(make_optimizer("adam", 1e-3f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

TEST_F(RecoveryTest, OverflowingLayersMoveToFloat32AndTrainingFinishes) {
  auto [x, y] = raw_features(1200, 1);
  auto [tx, ty] = raw_features(600, 2);
  FitOptions o;
  o.epochs = 4;
  o.batch_size = 32;
  auto f32 = mlp("float32");
  f32->fit(x, y, o);
  const double f32_acc = f32->evaluate(tx, ty).accuracy;

  auto mixed = mlp("mixed_float16");
  std::ostringstream log;
  RecoveryOptions ro;
  ro.log = &log;
  RecoveryGuard guard(ro);
  o.recovery = &guard;
  History h = mixed->fit(x, y, o);
  ASSERT_EQ(h.epoch.size(), 4u) << log.str();
  EXPECT_FALSE(guard.gave_up()) << log.str();
  // The first Dense sees 1e5 inputs; its float32 outputs (~1e5) overflow the second one's input cast.
  // The output layer is float32 already, so nothing else needs to change and nothing is reverted wholesale.
  ASSERT_FALSE(guard.events().empty());
  bool switched_layers = false;
  for (const RecoveryEvent& e : guard.events()) {
    EXPECT_NE(e.action, "model_to_float32") << log.str();
    if (e.action == "layers_to_float32") {
      switched_layers = true;
      EXPECT_EQ(e.layers.front(), mixed->layers()[0]->name()) << log.str();
    }
  }
  EXPECT_TRUE(switched_layers) << log.str();
  EXPECT_EQ(mixed->layers()[0]->compute_dtype(), DType::kFloat32);
  for (double l : h.history["loss"]) EXPECT_TRUE(std::isfinite(l));
  const double mixed_acc = mixed->evaluate(tx, ty).accuracy;
  std::printf("raw 1e5 features: float32 accuracy %.4f, mixed_float16 with recovery %.4f\n%s", f32_acc, mixed_acc,
              log.str().c_str());
  EXPECT_GT(f32_acc, 0.9);
  EXPECT_NEAR(mixed_acc, f32_acc, 0.01);
}

// Computes fine in float32, but returns NaN whenever it computes in float16 — as an op whose intermediate
// exceeds float16's range would.
class BreaksInHalf : public Layer {
 public:
  BreaksInHalf() : Layer("breaks_in_half", std::nullopt) {}
  std::string class_name() const override { return "BreaksInHalf"; }

 protected:
  Var call(const Var& x, const CallContext&) override {
    return compute_dtype() == DType::kFloat16 ? scale(x, NAN) : x;
  }
};

TEST_F(RecoveryTest, ALayerForcedToProduceNanEndsInAFloat32Revert) {
  Rng r(3);
  std::vector<float> xv(300 * 4);
  std::vector<int32_t> yv(300);
  for (int i = 0; i < 300; ++i) {
    yv[i] = i % 2;
    for (int j = 0; j < 4; ++j) xv[i * 4 + j] = r.normal() + (j == yv[i] ? 2.0f : 0.0f);
  }
  Tensor x = Tensor::from_floats({300, 4}, xv), y = Tensor::from_ints({300}, yv);
  set_global_policy("mixed_float16");
  Model m("fragile", 1);
  m.emplace<Dense>(8, "relu");
  m.emplace<BreaksInHalf>();
  m.emplace<Dense>(2, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  m.compile(make_optimizer("adam", 1e-2f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  std::ostringstream log;
  RecoveryOptions ro;
  ro.log = &log;
  ro.max_consecutive_failures = 5;
  RecoveryGuard guard(ro);
  FitOptions o;
  o.epochs = 3;
  o.batch_size = 30;
  o.recovery = &guard;
  History h = m.fit(x, y, o);
  bool reverted = false;
  for (const RecoveryEvent& e : guard.events()) reverted = reverted || e.action == "model_to_float32";
  EXPECT_TRUE(reverted) << log.str();
  for (auto& l : m.layers()) EXPECT_EQ(l->compute_dtype(), DType::kFloat32) << l->name();
  ASSERT_EQ(h.epoch.size(), 3u);
  EXPECT_TRUE(std::isfinite(h.history["loss"].back()));
  EXPECT_GT(m.evaluate(x, y).accuracy, 0.9);
}

TEST_F(RecoveryTest, RestoreReturnsTheSnapshotBitForBit) {
  auto [x, y] = raw_features(64, 5);
  auto m = mlp("mixed_bfloat16");
  FitOptions o;
  o.epochs = 1;
  o.batch_size = 16;
  m->fit(x.slice_rows(0, 32), y.slice_rows(0, 32), o);  // optimizer slots exist
  RecoveryGuard guard;
  FitPosition p;
  p.epoch = 0;
  p.step = 3;
  guard.snapshot(*m, p);
  auto state = [&] {
    std::vector<std::vector<float>> s;
    for (const Var& w : m->weights()) s.push_back(w.value().to_floats());
    for (auto& [k, t] : m->optimizer().state()) s.push_back(t.to_floats());
    return std::make_pair(s, std::make_pair(m->shuffle_rng().state(), m->dropout_rng().state()));
  };
  const auto before = state();
  m->fit(x, y, o);
  EXPECT_NE(state(), before);
  EXPECT_EQ(guard.restore(*m).step, 3);
  EXPECT_EQ(state(), before);
}

TEST_F(RecoveryTest, LossDriftingFromTheFloat32ReferenceRevertsToFloat32) {
  auto [x, y] = raw_features(1200, 7);
  // Normalised inputs: nothing overflows, so only the drift check can act.
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = p[i] / 1e5f - 1.2f;
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 16;
  auto f32 = mlp("float32");
  History ref = f32->fit(x, y, o);
  // A reference far below what any run reaches: the mixed run must be judged as drifting.
  std::vector<double> unreachable = ref.step_loss;
  for (double& v : unreachable) v *= 0.2;
  auto mixed = mlp("mixed_bfloat16");
  std::ostringstream log;
  RecoveryOptions ro;
  ro.log = &log;
  ro.reference_step_loss = unreachable;
  RecoveryGuard guard(ro);
  o.recovery = &guard;
  mixed->fit(x, y, o);
  ASSERT_FALSE(guard.events().empty()) << log.str();
  EXPECT_EQ(guard.events().front().action, "model_to_float32") << log.str();
  EXPECT_NE(guard.events().front().reason.find("float32 reference"), std::string::npos) << log.str();
  for (auto& l : mixed->layers()) EXPECT_EQ(l->compute_dtype(), DType::kFloat32);
  // A drift cannot be dated: every snapshot since the start may hold it, so the run starts over from the first.
  ASSERT_GE(guard.events().size(), 2u) << log.str();
  EXPECT_EQ(guard.events()[1].action, "rollback");
  EXPECT_NE(guard.events()[1].reason.find("first snapshot of the run (step 0 of epoch 1)"), std::string::npos)
      << guard.events()[1].reason;
  EXPECT_EQ(guard.events()[1].resume_step, 0);

  // The honest reference (the float32 run itself) is tracked: no action.
  auto mixed2 = mlp("mixed_bfloat16");
  RecoveryOptions ro2;
  ro2.log = &log;
  ro2.reference_step_loss = ref.step_loss;
  RecoveryGuard quiet(ro2);
  o.recovery = &quiet;
  mixed2->fit(x, y, o);
  EXPECT_TRUE(quiet.events().empty()) << log.str();
}

// A short run gets the ladder: the options scaled to its length (recovery_options_for_run) act where the
// defaults' 100-step warm-up and 20-step patience would leave a deviating or failing run alone.
TEST_F(RecoveryTest, ShortRunsGetTheLadderWithOptionsScaledToTheirLength) {
  const RecoveryOptions defaults;
  const RecoveryOptions long_run = recovery_options_for_run(5000);
  EXPECT_EQ(long_run.drift_warmup_steps, defaults.drift_warmup_steps);
  EXPECT_EQ(long_run.max_consecutive_failures, defaults.max_consecutive_failures);
  const RecoveryOptions eighty = recovery_options_for_run(80);
  EXPECT_EQ(eighty.drift_warmup_steps, 16);
  EXPECT_EQ(eighty.max_consecutive_failures, 16);
  EXPECT_EQ(recovery_options_for_run(12).max_consecutive_failures, 5);
  EXPECT_EQ(recovery_timing_text(eighty),
            "the drift check starts after step 16; a rung is climbed after 16 failed or drifting steps in a row");

  // Drift: 2 epochs of 300 rows in batches of 16 (38 steps) against an unreachable reference.
  auto [x, y] = raw_features(300, 7);
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = p[i] / 1e5f - 1.2f;
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 16;
  History ref = mlp("float32")->fit(x, y, o);
  const int64_t steps = static_cast<int64_t>(ref.step_loss.size());
  std::vector<double> unreachable = ref.step_loss;
  for (double& v : unreachable) v *= 0.2;
  std::ostringstream log;
  for (const bool scaled : {false, true}) {
    RecoveryOptions ro = scaled ? recovery_options_for_run(steps) : RecoveryOptions{};
    ro.log = &log;
    ro.reference_step_loss = unreachable;
    RecoveryGuard guard(ro);
    o.recovery = &guard;
    mlp("mixed_bfloat16")->fit(x, y, o);
    if (!scaled) {
      EXPECT_TRUE(guard.events().empty()) << log.str();
      continue;
    }
    ASSERT_FALSE(guard.events().empty()) << log.str();
    EXPECT_EQ(guard.events().front().action, "model_to_float32") << log.str();
    const RecoveryOptions timing = recovery_options_for_run(steps);
    EXPECT_LE(guard.events().front().step, timing.drift_warmup_steps + timing.max_consecutive_failures + 1) << log.str();
  }

  // Non-finite steps: 12 steps of raw features that overflow float16 in the first layer.
  auto [rx, ry] = raw_features(192, 3);
  o.epochs = 1;
  for (const bool scaled : {false, true}) {
    RecoveryOptions ro = scaled ? recovery_options_for_run(12) : RecoveryOptions{};
    ro.log = &log;
    RecoveryGuard guard(ro);
    o.recovery = &guard;
    mlp("mixed_float16")->fit(rx, ry, o);
    bool layers_moved = false;
    for (const RecoveryEvent& e : guard.events()) layers_moved |= e.action == "layers_to_float32";
    EXPECT_EQ(layers_moved, scaled) << log.str();
  }
}

}  // namespace
}  // namespace mixtrain
