// The recovery ladder's FP8 rung: a layer under a float8 policy whose GEMM input saturates or flushes in its cast is
// blamed, moves to mixed_bfloat16 first (float32 only when blamed again), and a checkpoint saved after the move loads
// into a model built under the float8 policy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/transformer_layers.h"
#include "mixtrain/precision/fp8_gemm_scales.h"
#include "mixtrain/train/callback.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/recovery.h"
#include "quiet_policy_test.h"

namespace mixtrain {
namespace {

class RecoveryFp8Test : public QuietPolicyTest {
 protected:
  void TearDown() override {
    set_fp8_recipe(Fp8Recipe::kDelayed);
    QuietPolicyTest::TearDown();
  }
};

// Rows of 4 features: three of unit scale and column 3 around `offset` (spread 2).
Tensor rows(int64_t n, float offset, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x(static_cast<size_t>(n * 4));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < 3; ++j) x[static_cast<size_t>(i * 4 + j)] = r.normal();
    x[static_cast<size_t>(i * 4 + 3)] = offset + 2.0f * r.normal();
  }
  return Tensor::from_floats({n, 4}, x);
}

// A guard's options that log to `log` and climb the ladder at the first failed step.
RecoveryOptions climbing_at_the_first_failure(std::ostringstream& log) {
  RecoveryOptions o;
  o.log = &log;
  o.max_consecutive_failures = 1;
  return o;
}

std::unique_ptr<Model> model(const char* policy, Fp8Recipe recipe) {
  set_fp8_recipe(recipe);
  set_global_policy(policy);
  auto m = std::make_unique<Model>("m", 5);
  m->emplace<Dense>(16, "relu");
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  m->compile(make_optimizer("adam", 1e-3f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  m->build_for(Shape{4});
  return m;
}

// x through the model without gradients: the casts a training step's forward pass makes, nothing recorded.
void forward(Model& m, const Tensor& x) {
  NoGradGuard ng;
  m.network().call(Var(x), CallContext{});
}

// Inputs around 2000 pass E4M3's 448 at the delayed recipe's first scale (1, before any update): a quarter of the
// values (column 3) saturate, and the layer is blamed for it. Current scaling casts the same values with their own
// amax: nothing saturates, nothing is blamed; bfloat16 holds 2000, so the layer is not blamed under mixed_bfloat16.
TEST_F(RecoveryFp8Test, ALayerWhoseFp8InputSaturatesIsBlamed) {
  const Tensor x = rows(64, 2000.0f, 1);
  auto delayed = model("mixed_float8", Fp8Recipe::kDelayed);
  const std::vector<LayerNumerics> n = measure_layer_numerics(*delayed, x);
  ASSERT_EQ(n.size(), 2u);
  EXPECT_TRUE(n[0].float8);
  EXPECT_FALSE(n[1].float8) << "the float32 output layer quantizes nothing";
  EXPECT_NEAR(n[0].fp8_input.saturated_fraction(), 0.25, 0.01);
  const auto blamed = layers_to_blame(n, /*precision=*/false);
  ASSERT_EQ(blamed.size(), 1u);
  EXPECT_EQ(blamed[0].first, delayed->layers()[0]->name());
  EXPECT_NE(blamed[0].second.find("FP8 input saturates"), std::string::npos) << blamed[0].second;

  auto current = model("mixed_float8", Fp8Recipe::kCurrent);
  const std::vector<LayerNumerics> c = measure_layer_numerics(*current, x);
  EXPECT_EQ(c[0].fp8_input.saturated_fraction(), 0.0);
  EXPECT_TRUE(layers_to_blame(c, false).empty());
  EXPECT_TRUE(layers_to_blame(measure_layer_numerics(*model("mixed_bfloat16", Fp8Recipe::kDelayed), x), false).empty());
}

// The ladder on failing steps: rung 1 (loss scaling), then the FP8 rung moves the saturating layer to
// mixed_bfloat16, not to float32; failing again with nothing left to blame, the model goes to float32.
TEST_F(RecoveryFp8Test, TheFp8RungMovesTheLayerToBfloat16First) {
  const Tensor x = rows(64, 2000.0f, 1);
  auto m = model("mixed_float8", Fp8Recipe::kDelayed);
  std::ostringstream log;
  RecoveryGuard g(climbing_at_the_first_failure(log));
  g.snapshot(*m, FitPosition{});
  const Logs failed{{"loss", NAN}};
  const auto batch = [&] { return std::make_pair(x, Tensor()); };
  g.after_step(*m, failed, batch, 1);
  ASSERT_EQ(g.events().front().action, "enable_loss_scaling") << log.str();
  g.after_step(*m, failed, batch, 2);
  EXPECT_EQ(m->layers()[0]->dtype_policy().name(), "mixed_bfloat16") << log.str();
  EXPECT_EQ(m->layers()[1]->dtype_policy().name(), "float32");
  bool moved = false;
  for (const RecoveryEvent& e : g.events()) {
    EXPECT_NE(e.action, "layers_to_float32") << log.str();
    if (e.action == "layers_to_bfloat16") {
      moved = true;
      EXPECT_EQ(e.layers, std::vector<std::string>{m->layers()[0]->name()});
    }
  }
  EXPECT_TRUE(moved) << log.str();
  RecoveryModelChanges changes = recovery_model_changes(g.state_json());
  EXPECT_EQ(changes.bfloat16_layers, std::vector<std::string>{m->layers()[0]->name()});
  EXPECT_TRUE(changes.float32_layers.empty());
  g.after_step(*m, failed, batch, 3);
  EXPECT_EQ(m->layers()[0]->dtype_policy().name(), "float32") << log.str();
  EXPECT_EQ(g.events().back().action, "rollback");
  changes = recovery_model_changes(g.state_json());
  EXPECT_TRUE(changes.bfloat16_layers.empty()) << "a layer moved on to float32 is listed there only";
  EXPECT_EQ(changes.float32_layers, std::vector<std::string>{m->layers()[0]->name()});
}

// The FP8 rung judges a layer by its casts in training since the last climb, not only by the batch it measures: a
// guarded model casts one batch around 2000 (a quarter of it saturates at the delayed recipe's first scale), then the
// ladder climbs on a unit-scale batch that casts cleanly. The recorded share blames the layer and moves it to
// mixed_bfloat16; without the record nothing would be blamed and the whole model would go to float32. A model the
// ladder does not guard records nothing (the record costs a pass over the input).
TEST_F(RecoveryFp8Test, TheFp8RungJudgesTheCastsSinceTheLastClimb) {
  const Tensor hot = rows(64, 2000.0f, 1), calm = rows(64, 0.0f, 2);
  auto unguarded = model("mixed_float8", Fp8Recipe::kDelayed);
  forward(*unguarded, hot);
  EXPECT_EQ(unguarded->layers()[0]->fp8_layer_scales()->take_input_record().casts, 0);

  auto m = model("mixed_float8", Fp8Recipe::kDelayed);
  std::ostringstream log;
  RecoveryGuard g(climbing_at_the_first_failure(log));
  g.snapshot(*m, FitPosition{});
  const std::vector<LayerNumerics> now = measure_layer_numerics(*m, calm);
  ASSERT_EQ(now[0].fp8_input.saturated_fraction(), 0.0);
  ASSERT_LT(now[0].fp8_input.flushed_fraction(), kFp8FlushedShare);
  forward(*m, hot);
  const Logs failed{{"loss", NAN}};
  const auto batch = [&] { return std::make_pair(calm, Tensor()); };
  g.after_step(*m, failed, batch, 1);  // rung 1: loss scaling on
  g.after_step(*m, failed, batch, 2);
  EXPECT_EQ(m->layers()[0]->dtype_policy().name(), "mixed_bfloat16") << log.str();
  bool moved = false;
  for (const RecoveryEvent& e : g.events()) {
    EXPECT_NE(e.action, "model_to_float32") << log.str();
    if (e.action != "layers_to_bfloat16") continue;
    moved = true;
    EXPECT_NE(e.reason.find("saturates 25%"), std::string::npos) << e.reason;
  }
  EXPECT_TRUE(moved) << log.str();
  EXPECT_EQ(m->layers()[0]->fp8_layer_scales()->take_input_record().casts, 0) << "the climb takes the record";
}

// The FP8 rung climbs on its own when a layer's input saturates on kFp8SaturatedSteps steps in a row, with finite
// losses and no reference to drift from: a guarded model casts a batch around 2000 before each step at the delayed
// recipe's first scale (no update teaches it the amax), so a quarter of the input saturates on every step. One
// saturating step between calm ones (a jump the history absorbs) moves nothing, nor do two in a row; the third in a
// row moves the layer to mixed_bfloat16 and rolls back to the last snapshot.
TEST_F(RecoveryFp8Test, TheFp8RungClimbsWhenSaturationPersists) {
  const Tensor hot = rows(64, 2000.0f, 1), calm = rows(64, 0.0f, 2);
  auto m = model("mixed_float8", Fp8Recipe::kDelayed);
  std::ostringstream log;
  RecoveryOptions o;
  o.log = &log;
  RecoveryGuard g(o);
  g.snapshot(*m, FitPosition{});
  const Logs fine{{"loss", 1.0}};
  const auto batch = [&] { return std::make_pair(calm, Tensor()); };
  int64_t step = 0;
  for (const Tensor* x : {&hot, &calm, &hot, &hot, &calm, &hot, &hot}) {
    forward(*m, *x);
    EXPECT_FALSE(g.after_step(*m, fine, batch, ++step)) << "step " << step << ": " << log.str();
    EXPECT_TRUE(g.events().empty()) << log.str();
  }
  EXPECT_FALSE(g.healthy()) << "a saturating streak is no state to snapshot";
  forward(*m, hot);
  EXPECT_TRUE(g.after_step(*m, fine, batch, ++step)) << log.str();
  EXPECT_EQ(m->layers()[0]->dtype_policy().name(), "mixed_bfloat16") << log.str();
  ASSERT_EQ(g.events().size(), 2u) << log.str();
  EXPECT_EQ(g.events()[0].action, "layers_to_bfloat16");
  EXPECT_EQ(g.events()[0].layers, std::vector<std::string>{m->layers()[0]->name()});
  EXPECT_NE(g.events()[0].reason.find("on 3 steps in a row"), std::string::npos) << g.events()[0].reason;
  EXPECT_EQ(g.events()[1].action, "rollback");
  g.restore(*m);
  EXPECT_TRUE(g.healthy());
}

// The hostile case at the layer level: a Dense under mixed_float8 casts three updates' worth of unit-scale
// inputs, then 3 of its 64 input channels jump 10^4 times larger. Under the delayed recipe the jumped batch is cast
// with the scale the history gave (448 / the old amax, about 4): the jumped channels saturate (3/64 of the input),
// the product loses them (relative error near 1) and the ladder would blame the layer. Current scaling casts the
// batch with its own amax: nothing saturates and the product stays within a few percent of float64's.
TEST_F(RecoveryFp8Test, AfterAJumpDelayedScalingSaturatesAndCurrentDoesNot) {
  constexpr int64_t kRows = 32, kIn = 64, kOut = 8;
  Rng values(3);
  std::vector<float> xv(kRows * kIn);
  for (float& v : xv) v = values.normal();
  std::vector<float> jumped = xv;
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c : {5, 20, 40}) jumped[r * kIn + c] *= 1e4f;
  for (Fp8Recipe recipe : {Fp8Recipe::kDelayed, Fp8Recipe::kCurrent}) {
    set_fp8_recipe(recipe);
    Dense d(kOut, "linear", dtype_arg("mixed_float8"));
    Rng rng(1);
    d.build({kIn}, rng);
    for (int step = 0; step < 3; ++step) {
      backward(sum(cast(d(Var(Tensor::from_floats({kRows, kIn}, xv))), DType::kFloat32)));
      d.on_optimizer_update();
    }
    const Fp8CastView v = fp8_cast_view(*d.fp8_layer_scales(), d.dtype_policy(), "input", jumped, kIn);
    std::vector<float> y;
    {
      NoGradGuard ng;
      y = d(Var(Tensor::from_floats({kRows, kIn}, jumped))).value().to_floats();
    }
    const std::vector<float> w = d.kernel().value().to_floats(), b = d.bias().value().to_floats();
    double err = 0, norm = 0;
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t o = 0; o < kOut; ++o) {
        double want = b[o];
        for (int64_t i = 0; i < kIn; ++i) want += static_cast<double>(jumped[r * kIn + i]) * w[i * kOut + o];
        err += (y[r * kOut + o] - want) * (y[r * kOut + o] - want);
        norm += want * want;
      }
    const double relative = std::sqrt(err / norm);
    std::printf("%s after the jump: input saturated %.4f, relative error of y %.4f\n", fp8_recipe_name(recipe),
                v.stats.saturated_fraction(), relative);
    if (recipe == Fp8Recipe::kDelayed) {
      EXPECT_NEAR(v.stats.saturated_fraction(), 3.0 / kIn, 0.003);
      EXPECT_GT(relative, 0.5);
    } else {
      EXPECT_EQ(v.stats.saturated_fraction(), 0.0);
      EXPECT_LT(relative, 0.05);
    }
  }
}

// Saves a checkpoint from inside fit() once the first layer runs under mixed_bfloat16.
class SaveWhenMoved : public Callback {
 public:
  explicit SaveWhenMoved(std::string path) : path_(std::move(path)) {}
  void on_train_batch_end(int64_t, const Logs&) override {
    if (saved_ || model_->layers()[0]->dtype_policy().name() != "mixed_bfloat16") return;
    save_checkpoint(path_, *model_, {});
    saved_ = true;
  }
  bool saved_ = false;

 private:
  std::string path_;
};

// A fit whose loss "drifts" from the start (a reference it cannot meet) climbs at its second step; its first Dense
// (inputs around 2000, past E4M3's range before its first update) is blamed and moves to mixed_bfloat16. The
// checkpoint saved then loads into a fresh mixed_float8 model: the layer comes back under mixed_bfloat16.
TEST_F(RecoveryFp8Test, ACheckpointLoadsALayerTheFp8RungMoved) {
  const Tensor x = rows(256, 2000.0f, 2);
  std::vector<int32_t> yv(256);
  for (size_t i = 0; i < yv.size(); ++i) yv[i] = static_cast<int32_t>(i % 3);
  const Tensor y = Tensor::from_ints({256}, yv);
  auto m = model("mixed_float8", Fp8Recipe::kDelayed);
  std::ostringstream log;
  RecoveryOptions o;
  o.log = &log;
  o.max_consecutive_failures = 2;  // the replayed first step after the move drifts once: the callback then runs
  o.drift_warmup_steps = 0;
  o.snapshot_every = 1;
  o.reference_step_loss.assign(100, 1e-6);
  RecoveryGuard g(o);
  const std::string path = ::testing::TempDir() + "/recovery_fp8_moved.ckpt";
  SaveWhenMoved saver(path);
  FitOptions f;
  f.epochs = 1;
  f.batch_size = 32;
  f.recovery = &g;
  f.callbacks = {&saver};
  m->fit(x, y, f);
  ASSERT_TRUE(saver.saved_) << log.str();
  auto fresh = model("mixed_float8", Fp8Recipe::kDelayed);
  ASSERT_EQ(fresh->layers()[0]->dtype_policy().name(), "mixed_float8");
  const CheckpointInfo info = load_checkpoint(path, *fresh);
  ASSERT_TRUE(info.fit_state.has_value());
  EXPECT_EQ(fresh->layers()[0]->dtype_policy().name(), "mixed_bfloat16");
  // A model the ladder did not move refuses the layer's other policy when the file names no such move.
  auto plain = model("mixed_float8", Fp8Recipe::kDelayed);
  const std::string moved_by_hand = ::testing::TempDir() + "/recovery_fp8_by_hand.ckpt";
  plain->layers()[0]->set_dtype_policy(DTypePolicy::from_name("mixed_bfloat16"));
  save_checkpoint(moved_by_hand, *plain, {});
  EXPECT_THROW(load_checkpoint(moved_by_hand, *model("mixed_float8", Fp8Recipe::kDelayed)), Error);
  std::remove(path.c_str());
  std::remove(moved_by_hand.c_str());
}

// MultiHeadAttention under mixed_float8 on sequences of 4 positions of 4 features (rows() as sequences), then
// Flatten and a float32 Dense. value_gain multiplies its value kernel: 1e4 makes the values, and so the attention's
// result that the output projection casts, about 10^4 on unit-scale inputs, past E4M3's 448 at the first scale.
std::unique_ptr<Model> attention_model(float value_gain) {
  set_fp8_recipe(Fp8Recipe::kDelayed);
  auto m = std::make_unique<Model>("m", 5);
  m->emplace<MultiHeadAttention>(
      MultiHeadAttentionOptions().with_num_heads(2).with_key_dim(2).with_dtype("mixed_float8").with_name("attention"));
  m->emplace<Flatten>();
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  m->compile(make_optimizer("adam", 1e-3f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  m->build_for(Shape{4, 4});
  for (const Var& w : m->layers()[0]->weights())
    if (w.name().ends_with("/value/kernel")) {
      std::vector<float> v = w.value().to_floats();
      for (float& e : v) e *= value_gain;
      Var(w).set_value(Tensor::from_floats(w.shape(), v));
    }
  return m;
}

Tensor sequences(int64_t n, float offset, uint64_t seed) { return rows(n * 4, offset, seed).reshape({n, 4, 4}); }

// The FP8 rung judges each of the attention's two GEMM inputs: inputs around 2000 saturate the query, key and value
// projection's (a quarter of them, column 3); unit-scale inputs through a value kernel 10^4 times larger saturate
// the output projection's input (the attention's result) while the layer's own input casts cleanly. Either way the
// attention layer is blamed.
TEST_F(RecoveryFp8Test, EitherAttentionProjectionsSaturatingInputBlamesTheLayer) {
  struct Case {
    const char* what;
    float offset, value_gain;
    size_t saturating;
  };
  for (const Case& c : {Case{"hot input", 2000.0f, 1.0f, 0}, Case{"hot values", 0.0f, 1e4f, 1}}) {
    auto m = attention_model(c.value_gain);
    const std::vector<LayerNumerics> n = measure_layer_numerics(*m, sequences(16, c.offset, 1));
    ASSERT_EQ(n.size(), 3u) << c.what;
    EXPECT_TRUE(n[0].float8) << c.what;
    ASSERT_EQ(n[0].fp8_gemm_inputs.size(), 2u) << c.what;
    const Fp8CastStats& hot = n[0].fp8_gemm_inputs[c.saturating];
    const Fp8CastStats& cold = n[0].fp8_gemm_inputs[1 - c.saturating];
    EXPECT_GE(hot.saturated_fraction(), kFp8SaturatedShare) << c.what;
    EXPECT_GT(cold.count, 0) << c.what;
    // The layer's own input is clean when only the values are large (around 2000 it may carry into the values too).
    if (c.saturating == 1) {
      EXPECT_EQ(cold.saturated_fraction(), 0.0) << c.what;
    } else {
      EXPECT_NEAR(hot.saturated_fraction(), 0.25, 0.01) << c.what;
    }
    EXPECT_GE(n[0].fp8_input.saturated_fraction(), hot.saturated_fraction()) << c.what << ": the worst of the two";
    const auto blamed = layers_to_blame(n, /*precision=*/false);
    ASSERT_EQ(blamed.size(), 1u) << c.what;
    EXPECT_EQ(blamed[0].first, "attention") << c.what;
    EXPECT_NE(blamed[0].second.find("FP8 input saturates"), std::string::npos) << blamed[0].second;
  }
  EXPECT_TRUE(layers_to_blame(measure_layer_numerics(*attention_model(1.0f), sequences(16, 0.0f, 1)), false).empty());
}

// The ladder moves the attention layer to mixed_bfloat16 on the record of its training casts (the output
// projection's input, 10^4 at the first scale) though the batch it measures then casts cleanly (a model with an
// ordinary value kernel): both projections' records are switched on by the snapshot and taken by the climb.
TEST_F(RecoveryFp8Test, TheFp8RungMovesAnAttentionLayerToBfloat16) {
  auto m = attention_model(1e4f);
  std::ostringstream log;
  RecoveryGuard g(climbing_at_the_first_failure(log));
  g.snapshot(*m, FitPosition{});
  {
    NoGradGuard ng;
    m->network().call(Var(sequences(16, 0.0f, 1)), CallContext{});  // the output projection's casts saturate
  }
  // Its value kernel back to an ordinary one: the climb's own measurement casts cleanly.
  for (const Var& w : m->layers()[0]->weights())
    if (w.name().ends_with("/value/kernel")) {
      std::vector<float> v = w.value().to_floats();
      for (float& e : v) e *= 1e-4f;
      Var(w).set_value(Tensor::from_floats(w.shape(), v));
    }
  g.snapshot(*m, FitPosition{});  // what a rollback returns to: the ordinary kernel (the records stay on)
  const Tensor calm = sequences(16, 0.0f, 2);
  ASSERT_TRUE(layers_to_blame(measure_layer_numerics(*m, calm), false).empty());
  const Logs failed{{"loss", NAN}};
  const auto batch = [&] { return std::make_pair(calm, Tensor()); };
  g.after_step(*m, failed, batch, 1);  // rung 1: loss scaling on
  g.after_step(*m, failed, batch, 2);
  EXPECT_EQ(m->layers()[0]->dtype_policy().name(), "mixed_bfloat16") << log.str();
  EXPECT_EQ(m->layers()[2]->dtype_policy().name(), "float32");
  bool moved = false;
  for (const RecoveryEvent& e : g.events()) {
    EXPECT_NE(e.action, "model_to_float32") << log.str();
    if (e.action != "layers_to_bfloat16") continue;
    moved = true;
    EXPECT_EQ(e.layers, std::vector<std::string>{"attention"});
  }
  EXPECT_TRUE(moved) << log.str();
  for (const Fp8Gemm& gemm : m->layers()[0]->fp8_gemms())
    EXPECT_EQ(gemm.scales->take_input_record().casts, 0) << gemm.name << ": the climb takes the record";
  // Under mixed_bfloat16 it runs and trains as before.
  const Tensor y = m->network().call(Var(calm), CallContext{}).value();
  EXPECT_EQ(y.shape(), (Shape{16, 3}));
}

}  // namespace
}  // namespace mixtrain
