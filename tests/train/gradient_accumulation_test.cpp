// Gradient accumulation (Optimizer::gradient_accumulation_steps): a batch trained as N micro-batches against the
// same batch in one pass (the independent definition), and the loss-scaling pitfalls of accumulation elsewhere:
// micro-batch gradients summed instead of averaged, unscaling twice, a skipped update counted (or the scale
// lowered) once per micro-batch, schedules and the scale's growth stepping per micro-batch or on a skipped update,
// and a logged loss left scaled or summed over the micro-batches.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

#include "blobs.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"
#include "quiet_policy_test.h"

namespace mixtrain {
namespace {

using train_test::blobs;
using GradientAccumulation = QuietPolicyTest;

// An MLP on the 8-feature blobs: `policy` for the hidden layer, float32 logits; `opt` already wrapped as wanted.
std::unique_ptr<Model> mlp(const char* policy, std::unique_ptr<Optimizer> opt, int64_t accumulate) {
  auto m = std::make_unique<Model>("mlp", 9);
  m->emplace<Dense>(32, "relu", dtype_arg(policy));
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  m->compile(std::move(opt), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  m->optimizer().set_gradient_accumulation_steps(accumulate);
  m->build_for(Shape{8});
  return m;
}

std::vector<float> flat_weights(const Model& m) {
  std::vector<float> all;
  for (const Var& v : m.weights()) {
    const std::vector<float> f = v.value().to_floats();
    all.insert(all.end(), f.begin(), f.end());
  }
  return all;
}

// Largest |a - b| / (1 + |b|) over the elements: the data-parallel tests' measure (tests/distributed/two_ranks.h),
// relative for weights above 1 and absolute below, where a weight passing near 0 has no relative size to keep.
double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / (1.0 + std::abs(double{b[i]})));
  return worst;
}

FitOptions fit_options(int64_t batch_size) {
  FitOptions o;
  o.epochs = 1;
  o.batch_size = batch_size;
  o.verbose = 0;
  return o;
}

// float32: the micro-batches' gradients are the batch's mean gradient summed in another order (a few ulps per
// update). SGD moves each weight by exactly that gradient times the rate, so an update that counted micro-batches
// wrongly (no 1/N, a missing micro-batch) would differ by far more than 1e-6 (measured: 5e-8). Adam, which
// normalises the gradient's size away, is checked beside it for the iteration count and its moments; it turns the
// ulps of a gradient element near 0 into a step of up to the rate, so its difference grows with the rate (measured:
// 2e-7 at 0.01, 1.0e-6 at 0.05).
TEST_F(GradientAccumulation, FourMicroBatchesEqualOneBatchOfFourTimesTheRowsAfterTwentyUpdates) {
  auto [x, y] = blobs(20 * 64, 21);  // 20 updates of 64 rows, micro-batches of 16
  for (const char* rule : {"sgd", "adam"}) {
    const float rate = std::string(rule) == "sgd" ? 0.05f : 0.01f;
    auto whole = mlp("float32", make_optimizer(rule, rate), 1);
    auto micro = mlp("float32", make_optimizer(rule, rate), 4);
    const History hw = whole->fit(x, y, fit_options(64));
    const History hm = micro->fit(x, y, fit_options(64));
    const double difference = max_relative_difference(flat_weights(*micro), flat_weights(*whole));
    std::cout << rule << ": largest relative weight difference after 20 updates " << difference << "\n";
    EXPECT_LE(difference, 1e-6) << rule;
    EXPECT_NE(flat_weights(*micro), flat_weights(*mlp("float32", make_optimizer(rule, rate), 1))) << "nothing trained";
    EXPECT_EQ(micro->optimizer().iterations(), 20) << rule << ": iterations count updates, not micro-batches";
    ASSERT_EQ(hm.step_loss.size(), 20u) << rule << ": the History has one entry per update";
    // The logged loss is the batch's mean (the micro-batches' row-weighted sum), not their sum.
    for (size_t i = 0; i < 20; ++i) EXPECT_NEAR(hm.step_loss[i], hw.step_loss[i], 1e-5) << rule << " update " << i;
    EXPECT_EQ(hm.samples, hw.samples);
  }
}

TEST_F(GradientAccumulation, UnevenMicroBatchesAndASmallLastBatchWeighEachRowOnce) {
  // 10 rows in 4 micro-batches (3, 3, 2, 2); 96 rows in batches of 10 end with a batch of 6 (2, 2, 1, 1).
  auto [x, y] = blobs(96, 22);
  auto whole = mlp("float32", make_optimizer("sgd", 0.05f), 1);
  auto micro = mlp("float32", make_optimizer("sgd", 0.05f), 4);
  whole->fit(x, y, fit_options(10));
  micro->fit(x, y, fit_options(10));
  EXPECT_LE(max_relative_difference(flat_weights(*micro), flat_weights(*whole)), 1e-6);
  // More micro-batches than rows: one row each.
  auto many = mlp("float32", make_optimizer("sgd", 0.05f), 64);
  many->fit(x, y, fit_options(10));
  EXPECT_LE(max_relative_difference(flat_weights(*many), flat_weights(*whole)), 1e-6);
}

// mixed_float16 under dynamic scaling: one row of micro-batch 3 of 4 is inf. Its gradients are NaN, the sum in
// the arena is NaN, and the one finite check of the update skips it: no weight moves, the scale halves once (not
// once per micro-batch), one skipped step is counted, iterations() stays, exactly as the same batch in one pass.
TEST_F(GradientAccumulation, ANonFiniteMicroBatchSkipsTheWholeUpdateAndLowersTheScaleOnceAsTheWholeBatch) {
  auto [x, y] = blobs(32, 23);
  std::vector<float> xs = x.to_floats();
  xs[20 * 8 + 3] = std::numeric_limits<float>::infinity();  // row 20: micro-batch 3 (rows 16..23)
  const Tensor bad = Tensor::from_floats({32, 8}, xs);
  LossScaleOptions lso;
  lso.initial_scale = 1024.0f;
  auto whole = mlp("mixed_float16", std::make_unique<LossScaleOptimizer>(make_optimizer("adam", 0.01f), lso), 1);
  auto micro = mlp("mixed_float16", std::make_unique<LossScaleOptimizer>(make_optimizer("adam", 0.01f), lso), 4);
  const std::vector<float> before = flat_weights(*micro);
  ASSERT_EQ(before, flat_weights(*whole));
  for (Model* m : {whole.get(), micro.get()}) {
    m->train_step(bad, y);
    const auto& opt = dynamic_cast<const LossScaleOptimizer&>(m->optimizer());
    EXPECT_TRUE(opt.last_step_skipped());
    EXPECT_EQ(opt.skipped_steps(), 1) << "one skipped update, counted once";
    EXPECT_EQ(opt.loss_scale(), 512.0f) << "halved once";
    EXPECT_EQ(opt.iterations(), 0);
    EXPECT_EQ(flat_weights(*m), before) << "a skipped update moves no weight";
  }
  // The next, finite batch: both apply it, from the same weights and the same scale.
  for (Model* m : {whole.get(), micro.get()}) m->train_step(x, y);
  EXPECT_EQ(micro->optimizer().iterations(), 1);
  EXPECT_FALSE(dynamic_cast<const LossScaleOptimizer&>(micro->optimizer()).last_step_skipped());
  // mixed_float16 activations: the micro-batches' float16 passes round as the whole batch's do, row by row; the
  // sums differ in order only, and Adam's first update is lr * sign-like, so the weights agree to float16 ulps.
  EXPECT_LE(max_relative_difference(flat_weights(*micro), flat_weights(*whole)), 1e-3);
  EXPECT_NE(flat_weights(*micro), before);
}

// Unscaling twice (once per micro-batch and again at the update, or twice at the update) would shrink the
// update by the scale. With a power-of-two fixed scale every scaled and unscaled value is exact in float32, so
// the loss-scaled accumulated update must be bit-identical to the unscaled one.
TEST_F(GradientAccumulation, GradientsAreUnscaledExactlyOnce) {
  auto [x, y] = blobs(64, 24);
  LossScaleOptions fixed;
  fixed.dynamic = false;
  fixed.initial_scale = 1024.0f;
  auto scaled = mlp("float32", std::make_unique<LossScaleOptimizer>(make_optimizer("sgd", 0.1f), fixed), 4);
  auto plain = mlp("float32", make_optimizer("sgd", 0.1f), 4);
  const History hs = scaled->fit(x, y, fit_options(16));
  const History hp = plain->fit(x, y, fit_options(16));
  EXPECT_EQ(flat_weights(*scaled), flat_weights(*plain));
  // The logged loss is the unscaled one (not 1024 times it).
  ASSERT_EQ(hs.step_loss.size(), hp.step_loss.size());
  for (size_t i = 0; i < hs.step_loss.size(); ++i) EXPECT_EQ(hs.step_loss[i], hp.step_loss[i]);
}

// A learning-rate schedule reads iterations(): it must advance once per applied update, neither per micro-batch
// nor on an update the loss scale skipped (Keras 3: a skipped step does not count).
TEST_F(GradientAccumulation, SchedulesCountAppliedUpdatesNotMicroBatchesNorSkippedUpdates) {
  auto [x, y] = blobs(32, 25);
  std::vector<float> xs = x.to_floats();
  xs[5] = std::numeric_limits<float>::quiet_NaN();
  const Tensor bad = Tensor::from_floats({32, 8}, xs);
  auto m = mlp("mixed_float16", std::make_unique<LossScaleOptimizer>(make_optimizer("sgd", 0.1f)), 4);
  m->optimizer().set_learning_rate_schedule(std::make_shared<PiecewiseConstantDecay>(
      std::vector<int64_t>{1, 2}, std::vector<double>{0.1, 0.01, 0.001}));
  m->train_step(x, y);
  m->train_step(bad, y);  // skipped
  m->train_step(x, y);
  EXPECT_EQ(m->optimizer().iterations(), 2) << "two applied updates of four micro-batches each, one skipped";
  EXPECT_FLOAT_EQ(m->optimizer().learning_rate(), 0.01f);
}

// The dynamic scale's growth counts finite updates: 2 updates of 4 micro-batches double a scale that doubles
// after every 2 finite steps once, not four times.
TEST_F(GradientAccumulation, TheScaleGrowsPerUpdateNotPerMicroBatch) {
  auto [x, y] = blobs(32, 27);
  LossScaleOptions lso;
  lso.initial_scale = 256.0f;
  lso.dynamic_growth_steps = 2;
  auto m = mlp("mixed_float16", std::make_unique<LossScaleOptimizer>(make_optimizer("sgd", 0.1f), lso), 4);
  m->train_step(x, y);
  m->train_step(x, y);
  const auto& opt = dynamic_cast<const LossScaleOptimizer&>(m->optimizer());
  EXPECT_EQ(opt.loss_scale(), 512.0f);
  EXPECT_EQ(opt.good_steps_in_a_row(), 2);
  EXPECT_EQ(opt.iterations(), 2);
}

// Passes its input through, and ends the process's fit (as a SIGKILL would) at its kill_at-th training call: with
// 4 micro-batches per update, call 4k + 2 is inside update k + 1's accumulation, after its first micro-batch's
// gradients are in the arena.
struct Killed {};
class KillInsidePass : public Layer {
 public:
  explicit KillInsidePass(int64_t kill_at) : Layer("kill_inside_pass"), kill_at_(kill_at) {}

 protected:
  Var call(const Var& x, const CallContext& ctx) override {
    if (ctx.training && ++calls_ == kill_at_) throw Killed{};
    return x;
  }

 private:
  int64_t kill_at_, calls_ = 0;
};

// The state a resumed fit must reproduce bit for bit: weights, optimizer (slots, iterations, loss scale and its
// counters), the random streams, and the History's losses.
std::vector<std::vector<uint8_t>> everything(const Model& m, const History& h) {
  std::vector<std::vector<uint8_t>> out;
  const auto bytes = [&](const Tensor& t) {
    const Tensor c = t.contiguous();
    const auto* p = static_cast<const uint8_t*>(c.raw());
    out.emplace_back(p, p + c.nbytes());
  };
  for (const Var& w : m.weights()) bytes(w.value());
  for (const auto& [k, t] : m.optimizer().state()) bytes(t);
  for (const Rng* rng : {&m.shuffle_rng(), &m.dropout_rng()}) {
    const std::vector<uint64_t> words = rng->state();
    out.emplace_back(reinterpret_cast<const uint8_t*>(words.data()),
                     reinterpret_cast<const uint8_t*>(words.data() + words.size()));
  }
  for (const std::vector<double>* v : {&h.step_loss, &h.step_loss_scale})
    out.emplace_back(reinterpret_cast<const uint8_t*>(v->data()),
                     reinterpret_cast<const uint8_t*>(v->data() + v->size()));
  return out;
}

// A checkpoint is taken between updates (FitState): a fit killed inside an accumulation resumes from the last
// update's checkpoint, redoes the interrupted update's micro-batches from its first, and ends bit-identical to a
// fit never interrupted. mixed_float16 with a scale that rises into overflows, and Dropout (its stream advances
// per micro-batch).
TEST_F(GradientAccumulation, AKillInsideAnAccumulationResumesBitIdentically) {
  auto [x, y] = blobs(80, 26);  // 5 updates of 16 rows per epoch, 4 micro-batches of 4
  const auto make = [](int64_t kill_at) {
    auto m = std::make_unique<Model>("net", 13);
    m->emplace<Dense>(32, "relu", dtype_arg("mixed_float16"));
    m->emplace<Dropout>(0.2f, dtype_arg("mixed_float16"));
    m->emplace<KillInsidePass>(kill_at);
    m->emplace<Dense>(3, "linear", dtype_arg("float32"));
    LossScaleOptions lso;
    lso.initial_scale = 65536.0f * 256.0f;  // overflows and skips at first
    lso.dynamic_growth_steps = 2;
    m->compile(std::make_unique<LossScaleOptimizer>(make_optimizer("adam", 0.01f), lso),
               Loss("sparse_categorical_crossentropy", true));
    m->optimizer().set_gradient_accumulation_steps(4);
    return m;
  };
  FitOptions o = fit_options(16);
  o.epochs = 3;
  auto full = make(0);
  const History hf = full->fit(x, y, o);
  const std::string ckpt = (std::filesystem::temp_directory_path() /
                            ("mixtrain_accumulation_kill_" + std::to_string(::getpid()) + ".safetensors")).string();
  for (const int64_t kill_at : {int64_t{4 * 6 + 2}, int64_t{4 * 5 + 4}, int64_t{4 * 12 + 3}}) {
    std::filesystem::remove(ckpt);
    {
      auto killed = make(kill_at);
      CheckpointCallback saver(ckpt, 1, "", 1);
      FitOptions ok = o;
      ok.callbacks = {&saver};
      EXPECT_THROW(killed->fit(x, y, ok), Killed);
    }
    auto resumed = make(0);
    CheckpointInfo info = load_checkpoint(ckpt, *resumed);
    ASSERT_TRUE(info.fit_state.has_value());
    EXPECT_EQ(info.fit_state->gradient_accumulation_steps, 4);
    FitOptions ro = o;
    ro.resume = info.fit_state;
    const History hr = resumed->fit(x, y, ro);
    EXPECT_TRUE(everything(*resumed, hr) == everything(*full, hf)) << "killed at training pass " << kill_at;
  }
  // Resuming inside an epoch with another number of micro-batches is refused, naming it.
  auto other = make(0);
  CheckpointInfo info = load_checkpoint(ckpt, *other);
  other->optimizer().set_gradient_accumulation_steps(2);
  FitOptions ro = o;
  ro.resume = info.fit_state;
  ASSERT_GT(info.fit_state->step, 0);
  try {
    other->fit(x, y, ro);
    ADD_FAILURE() << "resumed with 2 micro-batches a state saved with 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient_accumulation_steps 4"), std::string::npos) << e.what();
  }
  std::filesystem::remove(ckpt);
}

TEST_F(GradientAccumulation, RefusesZeroSteps) {
  auto m = mlp("float32", make_optimizer("sgd", 0.1f), 1);
  EXPECT_THROW(m->optimizer().set_gradient_accumulation_steps(0), Error);
  EXPECT_EQ(m->optimizer().gradient_accumulation_steps(), 1);
}

}  // namespace
}  // namespace mixtrain
