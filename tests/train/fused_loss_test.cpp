// The transformer's logits Dense and loss fused over chunks of rows (Model::set_fused_loss) against the layers then
// the loss: the same step within float32 rounding under float32, mixed_bfloat16 and mixed_float16 (loss scaling),
// with gradient accumulation too; evaluation's loss and accuracy; the fused kernel really runs in training and
// evaluation, never in predict().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/linear_cross_entropy.h"
#include "mixtrain/train/transformer_model.h"
#include "quiet_policy_test.h"

namespace mixtrain {
namespace {

constexpr int64_t kVocabulary = 37, kWindow = 12, kRows = 9;

class FusedLoss : public QuietPolicyTest {};

std::unique_ptr<Model> tiny(const char* policy, bool fused, int64_t accumulate = 1) {
  set_global_policy(policy);
  TransformerLMOptions o;
  o.vocabulary_size = kVocabulary;
  o.context_length = kWindow;
  o.width = 16;
  o.num_layers = 1;
  o.num_heads = 2;
  o.fused_loss = fused;
  auto m = build_transformer_lm(o, 5);
  // SGD at rate 1: each weight moves by exactly its gradient, which the test reads back.
  auto opt = make_optimizer("sgd", 1.0f);
  opt->set_gradient_accumulation_steps(accumulate);
  m->compile(std::move(opt), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  EXPECT_EQ(m->fused_loss(), fused);
  return m;
}

Tensor ids(uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> v(static_cast<size_t>(kRows * kWindow));
  for (int32_t& i : v) i = static_cast<int32_t>(r.next_u64() % kVocabulary);
  return Tensor::from_ints({kRows, kWindow}, v);
}

std::vector<std::vector<float>> weights_of(const Model& m) {
  std::vector<std::vector<float>> w;
  for (const Var& v : m.trainable_weights()) w.push_back(v.value().to_floats());
  return w;
}

// Largest difference between the two models' gradients (the weights' moves), relative to the largest gradient of
// the same variable, or to 1e-4 of the model's largest where the variable's is pure rounding (the attention's key
// bias: softmax ignores the same shift of a row's logits, so its gradient is 0 but for rounding, about 1e-9).
double gradient_difference(const std::vector<std::vector<float>>& before, const Model& a, const Model& b) {
  const auto wa = weights_of(a), wb = weights_of(b);
  std::vector<double> diffs, sizes;
  double largest = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    double diff = 0, size = 0;
    for (size_t j = 0; j < before[i].size(); ++j) {
      const double ga = before[i][j] - wa[i][j], gb = before[i][j] - wb[i][j];
      diff = std::max(diff, std::abs(ga - gb));
      size = std::max(size, std::abs(gb));
    }
    diffs.push_back(diff);
    sizes.push_back(size);
    largest = std::max(largest, size);
  }
  double worst = 0;
  for (size_t i = 0; i < diffs.size(); ++i) worst = std::max(worst, diffs[i] / std::max(sizes[i], 1e-4 * largest));
  return worst;
}

int g_calls = 0;
ops::KernelFn<ops::Op::linear_cross_entropy>* g_original = nullptr;
void counting_kernel(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& labels, const Tensor& seed,
                     int64_t chunk_rows, Tensor& loss, Tensor& correct, Tensor& dx, Tensor& dw, Tensor& dbias) {
  ++g_calls;
  g_original(x, w, bias, labels, seed, chunk_rows, loss, correct, dx, dw, dbias);
}

// Tolerances: float32 differs by the order of the sums (a few float32 units of the loss and of the gradients), but a
// gradient read back from a weight near 1 moved at rate 1 carries that weight's float32 unit, 1.2e-7, which is 5e-6
// of the norm gains' largest gradient (0.024): 5e-5. Under the mixed policies the head and loss are float32 in both, but a float32 difference in dhidden can
// flip the rounding of a 16-bit element on its way back through the blocks: one 16-bit unit (2^-8 for bfloat16) of
// an element, well under 1e-2 of a variable's largest gradient.
TEST_F(FusedLoss, OneStepEqualsTheLayersThenTheLossUnderEveryPolicy) {
  const Tensor x = ids(1), y = ids(2);
  for (const char* policy : {"float32", "mixed_bfloat16", "mixed_float16"})
    for (int64_t accumulate : {1, 2}) {
      auto fused = tiny(policy, true, accumulate), layers = tiny(policy, false, 1);
      const auto before = weights_of(*layers);
      const Logs lf = fused->train_step(x, y), ll = layers->train_step(x, y);
      const bool f32 = std::string(policy) == "float32";
      EXPECT_NEAR(lf[0].second, ll[0].second, (f32 ? 1e-6 : 1e-5) * ll[0].second) << policy << " " << accumulate;
      EXPECT_NEAR(lf[1].second, ll[1].second, 1.0 / (kRows * kWindow)) << policy << ": accuracy";
      EXPECT_LE(gradient_difference(before, *fused, *layers), f32 ? 5e-5 : 1e-2) << policy << " " << accumulate;
    }
}

TEST_F(FusedLoss, EvaluationReportsTheSameLossAndAccuracy) {
  const Tensor x = ids(3), y = ids(4);
  auto fused = tiny("mixed_bfloat16", true), layers = tiny("mixed_bfloat16", false);
  const EvaluateResult a = fused->evaluate(x, y, 4), b = layers->evaluate(x, y, 4);
  EXPECT_NEAR(a.loss, b.loss, 1e-6 * b.loss);
  EXPECT_NEAR(a.accuracy, b.accuracy, 1.0 / (kRows * kWindow));
  EXPECT_GT(a.loss, 0.5 * std::log(static_cast<double>(kVocabulary)));  // a real loss, not a zero
}

TEST_F(FusedLoss, TheFusedKernelRunsInTrainingAndEvaluationButNotInPredict) {
  auto fused = tiny("float32", true);
  ops::KernelOverride<ops::Op::linear_cross_entropy> count(ops::cpu_backend(), &counting_kernel);
  g_original = count.original();
  g_calls = 0;
  fused->train_step(ids(5), ids(6));
  EXPECT_EQ(g_calls, 1);
  fused->evaluate(ids(5), ids(6), 4);  // 9 rows in batches of 4
  EXPECT_EQ(g_calls, 4);
  const Tensor p = fused->predict(ids(5));
  EXPECT_EQ(g_calls, 4);
  EXPECT_EQ(p.shape(), Shape({kRows, kWindow, kVocabulary}));
  // Off: the layers then the loss.
  auto layers = tiny("float32", false);
  layers->train_step(ids(5), ids(6));
  EXPECT_EQ(g_calls, 4);
}

}  // namespace
}  // namespace mixtrain
