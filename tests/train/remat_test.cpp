// Activation recomputation (--remat blocks, nn/remat_scope.h) against keeping every activation: the transformer
// (dropout on, the tiled attention past 128 positions, the fused loss) and the resnet (BatchNormalization) give the
// same gradients, bits included, under float32, mixed_bfloat16 and mixed_float16 with dynamic loss scaling, and
// mixed_float8 with delayed scaling; the moving statistics and the FP8 amax histories advance once per step; an
// observer hears each layer's values and gradients once, the same ones. Each test also checks that recomputation
// is in force (far fewer recorded steps after the forward pass), so equal gradients are not equal by default.
// A recording step lets go of the values no backward pass reads (Network::set_releases_unread_values) and, with
// --remat activations, of each GELU output, which the next Dense's backward makes again from the pre-activation:
// the same bits as keeping them all, and a lower step peak each.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/core/allocator.h"
#include "mixtrain/core/random.h"
#include "mixtrain/nn/network.h"
#include "mixtrain/precision/fp8_gemm_scales.h"
#include "mixtrain/train/losses.h"
#include "mixtrain/train/run.h"
#include "quiet_policy_test.h"

namespace mixtrain {
namespace {

constexpr int64_t kVocabulary = 19, kRows = 3;

class Remat : public QuietPolicyTest {};

RunConfig transformer_config(const std::string& policy, const std::string& remat, int64_t context) {
  RunConfig cfg;
  cfg.model = "transformer";
  cfg.policy = policy;
  cfg.remat = remat;
  cfg.width = 16;
  cfg.num_layers = 2;
  cfg.num_heads = 2;
  cfg.dropout = 0.25f;
  cfg.context_length = context;
  cfg.optimizer = "adamw";
  cfg.learning_rate = 1e-2f;
  cfg.seed = 7;
  return cfg;
}

RunConfig resnet_config(const std::string& policy, const std::string& remat) {
  RunConfig cfg;
  cfg.model = "resnet";
  cfg.policy = policy;
  cfg.remat = remat;
  cfg.optimizer = "adam";
  cfg.learning_rate = 1e-2f;
  cfg.seed = 7;
  return cfg;
}

std::unique_ptr<Model> build(const RunConfig& cfg, bool transformer) {
  auto m = transformer ? build_model(cfg, cfg.context_length, kVocabulary, {cfg.context_length})
                       : build_model(cfg, 16 * 16, 5, {16, 16, 1});
  m->compile(make_run_optimizer(cfg, 10), Loss("sparse_categorical_crossentropy", true));
  return m;
}

// Inputs and labels of one step: token windows and next tokens, or 16 x 16 images and classes.
std::pair<Tensor, Tensor> batch(bool transformer, int64_t context, uint64_t seed) {
  Rng r(seed);
  if (transformer) {
    std::vector<int32_t> ids(static_cast<size_t>(kRows * context)), next(ids.size());
    for (int32_t& i : ids) i = static_cast<int32_t>(r.below(kVocabulary));
    for (int32_t& i : next) i = static_cast<int32_t>(r.below(kVocabulary));
    return {Tensor::from_ints({kRows, context}, ids), Tensor::from_ints({kRows, context}, next)};
  }
  std::vector<float> px(static_cast<size_t>(kRows * 256));
  for (float& p : px) p = r.uniform();
  std::vector<int32_t> y(kRows);
  for (int32_t& c : y) c = static_cast<int32_t>(r.below(5));
  return {Tensor::from_floats({kRows, 256}, px), Tensor::from_ints({kRows}, y)};
}

// Every variable's value (trainable or not: the moving statistics too) as raw bytes.
std::vector<std::vector<uint8_t>> bytes_of(const Model& m) {
  std::vector<std::vector<uint8_t>> out;
  for (const Var& v : m.weights()) {
    const Tensor t = v.value().contiguous();
    const auto* p = static_cast<const uint8_t*>(t.raw());
    out.emplace_back(p, p + t.nbytes());
  }
  return out;
}

// Recorded steps after one training forward pass and loss (then dropped).
size_t recorded_steps(Model& m, const Tensor& x, const Tensor& y) {
  clear_tape();
  Var logits = m.call(Var(x), {.training = true});
  Var loss = sparse_categorical_crossentropy(logits, y, true);
  const size_t n = tape_size();
  clear_tape();
  return n;
}

// Trains `kept` and `recomputed` side by side for three steps and compares every variable's bits after each.
void expect_same_training(Model& kept, Model& recomputed, bool transformer, int64_t context) {
  for (uint64_t step = 0; step < 3; ++step) {
    const auto [x, y] = batch(transformer, context, 100 + step);
    kept.train_step(x, y);
    recomputed.train_step(x, y);
    const auto a = bytes_of(kept), b = bytes_of(recomputed);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_TRUE(a[i] == b[i]) << "step " << step << ": " << kept.weights()[i].name() << " differs";
  }
  const auto [x, y] = batch(transformer, context, 1);
  EXPECT_LT(recorded_steps(recomputed, x, y) * 2, recorded_steps(kept, x, y)) << "recomputation is not in force";
  EXPECT_EQ(kept.dropout_rng().state(), recomputed.dropout_rng().state());
}

TEST_F(Remat, TransformerStepsAreBitIdenticalUnderEachPolicy) {
  for (const char* policy : {"float32", "mixed_bfloat16", "mixed_float16"}) {
    // 24 positions: the full attention; 136: the tiled one (ops::flash_attention, past 128 positions).
    for (int64_t context : {24, 136}) {
      SCOPED_TRACE(std::string(policy) + ", context " + std::to_string(context));
      auto kept = build(transformer_config(policy, "none", context), true);
      auto recomputed = build(transformer_config(policy, "blocks", context), true);
      EXPECT_TRUE(kept->fused_loss());
      expect_same_training(*kept, *recomputed, true, context);
    }
  }
}

TEST_F(Remat, LossScaledGradientsAreBitIdentical) {
  // backward() seeded with a loss scale, gradients read before any optimizer: every weight's gradient, bit for bit.
  auto kept = build(transformer_config("mixed_float16", "none", 24), true);
  auto recomputed = build(transformer_config("mixed_float16", "blocks", 24), true);
  const auto [x, y] = batch(true, 24, 3);
  std::vector<std::vector<uint8_t>> grads[2];
  int k = 0;
  for (Model* m : {kept.get(), recomputed.get()}) {
    Rng rng(11);
    Var loss = sparse_categorical_crossentropy(m->call(Var(x), {.training = true, .rng = &rng}), y, true);
    backward(loss, 32768.0f);
    for (Var w : m->trainable_weights()) {
      ASSERT_TRUE(w.has_grad()) << w.name();
      const Tensor g = w.grad().contiguous();
      const auto* p = static_cast<const uint8_t*>(g.raw());
      grads[k].emplace_back(p, p + g.nbytes());
      w.zero_grad();
    }
    ++k;
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(grads[0][i] == grads[1][i]) << "gradient " << i;
}

TEST_F(Remat, ResnetStepsAreBitIdenticalAndMovingStatisticsUpdateOnce) {
  for (const char* policy : {"float32", "mixed_bfloat16", "mixed_float16"}) {
    SCOPED_TRACE(policy);
    auto kept = build(resnet_config(policy, "none"), false);
    auto recomputed = build(resnet_config(policy, "blocks"), false);
    // The weights compared include every BatchNormalization's moving mean and variance: a second update in the
    // recomputation would move them further.
    expect_same_training(*kept, *recomputed, false, 0);
  }
}

TEST_F(Remat, Float8DelayedHistoriesRollOnce) {
  set_fp8_recipe(Fp8Recipe::kDelayed);
  auto kept = build(transformer_config("mixed_float8", "none", 24), true);
  auto recomputed = build(transformer_config("mixed_float8", "blocks", 24), true);
  expect_same_training(*kept, *recomputed, true, 24);
  size_t compared = 0;
  for (const auto& layer : kept->layers()) {
    const Layer::LayerState a = layer->extra_state(), b = recomputed->layer(layer->name())->extra_state();
    ASSERT_EQ(a.size(), b.size()) << layer->name();
    for (size_t i = 0; i < a.size(); ++i, ++compared)
      EXPECT_EQ(a[i].second.to_floats(), b[i].second.to_floats()) << layer->name() << " " << a[i].first;
  }
  EXPECT_GT(compared, 0u);
}

// Writes down what it hears, in order: the layer, the kind of report and the value's bits summed.
class Transcript : public LayerObserver {
 public:
  std::vector<std::string> lines;
  void on_input(const Layer& l, const Var& x) override { note(l, "input", x.value()); }
  void on_output(const Layer& l, const Var& y) override { note(l, "output", y.value()); }
  void on_gradient(const Layer& l, const Tensor& dy) override { note(l, "gradient", dy); }
  void on_internal(const Layer& l, std::string_view what, const Tensor& v) override { note(l, std::string(what), v); }

 private:
  void note(const Layer& l, const std::string& kind, const Tensor& v) {
    const Tensor t = v.contiguous();
    const auto* p = static_cast<const uint8_t*>(t.raw());
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
    lines.push_back(l.name() + " " + kind + " " + std::to_string(h));
  }
};

TEST_F(Remat, ObserverHearsEachValueAndGradientOnce) {
  auto kept = build(transformer_config("mixed_bfloat16", "none", 24), true);
  auto recomputed = build(transformer_config("mixed_bfloat16", "blocks", 24), true);
  Transcript a, b;
  kept->set_observer(&a);
  recomputed->set_observer(&b);
  const auto [x, y] = batch(true, 24, 5);
  kept->train_step(x, y);
  recomputed->train_step(x, y);
  kept->set_observer(nullptr);
  recomputed->set_observer(nullptr);
  ASSERT_FALSE(a.lines.empty());
  EXPECT_EQ(a.lines, b.lines);
}

TEST_F(Remat, ReleasedActivationsGiveTheBitsOfKeepingThem) {
  for (const char* policy : {"float32", "mixed_bfloat16", "mixed_float16"}) {
    for (int64_t context : {24, 136}) {
      for (const char* remat : {"none", "activations"}) {
        SCOPED_TRACE(std::string(policy) + ", context " + std::to_string(context) + ", --remat " + remat);
        auto kept = build(transformer_config(policy, "none", context), true);
        auto released = build(transformer_config(policy, remat, context), true);
        kept->set_releases_unread_values(false);
        ASSERT_TRUE(released->releases_unread_values());
        EXPECT_EQ(released->recomputes_activations(), std::string(remat) == "activations");
        for (uint64_t step = 0; step < 3; ++step) {
          const auto [x, y] = batch(true, context, 100 + step);
          kept->train_step(x, y);
          released->train_step(x, y);
          const auto a = bytes_of(*kept), b = bytes_of(*released);
          ASSERT_EQ(a.size(), b.size());
          for (size_t i = 0; i < a.size(); ++i)
            ASSERT_TRUE(a[i] == b[i]) << "step " << step << ": " << kept->weights()[i].name() << " differs";
        }
        EXPECT_EQ(kept->dropout_rng().state(), released->dropout_rng().state());
      }
    }
  }
}

// The allocator's peak over one training step (after a first step has made the optimizer state), beyond what
// lives between steps.
int64_t step_peak(Model& m, const Tensor& x, const Tensor& y) {
  m.train_step(x, y);
  const int64_t live = memory_stats(Device::cpu()).live_bytes;
  reset_peak_memory(Device::cpu());
  m.train_step(x, y);
  return memory_stats(Device::cpu()).peak_bytes - live;
}

TEST_F(Remat, ReleasedActivationsLowerTheStepPeak) {
  // mixed_bfloat16, width 64, 136 positions (the tiled attention), 2 blocks, dropout 0.25: by default each block
  // keeps the attention's and the MLP's outputs (read by the dropouts alone, rows x T x width bfloat16 values each)
  // no more, nor the dropouts' outputs (read by the adds); --remat activations neither its MLP's GELU output
  // (rows x T x 4 width).
  RunConfig cfg = transformer_config("mixed_bfloat16", "none", 136);
  cfg.width = 64;
  auto kept = build(cfg, true), released = build(cfg, true);
  kept->set_releases_unread_values(false);
  cfg.remat = "activations";
  auto recomputed = build(cfg, true);
  const auto [x, y] = batch(true, 136, 7);
  const int64_t kept_peak = step_peak(*kept, x, y), released_peak = step_peak(*released, x, y),
                recomputed_peak = step_peak(*recomputed, x, y);
  const int64_t block_output = kRows * 136 * 64 * 2, gelu_output = 4 * block_output;
  EXPECT_GE(kept_peak - released_peak, 2 * 4 * block_output) << "kept " << kept_peak << ", released " << released_peak;
  EXPECT_GE(released_peak - recomputed_peak, 2 * gelu_output)
      << "released " << released_peak << ", recomputed " << recomputed_peak;
}

}  // namespace
}  // namespace mixtrain
