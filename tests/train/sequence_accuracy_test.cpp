// The accuracy of sequence outputs (scores (B, T, C), labels (B, T)) is the share of the B x T predictions that are
// right, in training logs as in evaluate(): Keras' sparse_categorical_accuracy. A count per sample (up to T) would
// read as an accuracy above 1 beside a val_accuracy below 1, and an EarlyStopping("accuracy") would watch it.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/train/model.h"

namespace mixtrain {
namespace {

constexpr int64_t kSteps = 6, kClasses = 3;

// n windows of kSteps positions; each position's features are its label's one-hot code, so a Dense layer applied
// at every position can learn the task exactly.
std::pair<Tensor, Tensor> one_hot_windows(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x(static_cast<size_t>(n * kSteps * kClasses), 0.0f);
  std::vector<int32_t> y(static_cast<size_t>(n * kSteps));
  for (size_t i = 0; i < y.size(); ++i) {
    y[i] = static_cast<int32_t>(r.next_u64() % kClasses);
    x[i * kClasses + static_cast<size_t>(y[i])] = 1.0f;
  }
  return {Tensor::from_floats({n, kSteps, kClasses}, x), Tensor::from_ints({n, kSteps}, y)};
}

std::unique_ptr<Model> per_position_classifier() {
  auto m = std::make_unique<Model>("per_position", 3);
  m->emplace<Dense>(8, "relu");
  m->emplace<Dense>(kClasses);
  m->compile(make_optimizer("adam", 0.05f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

double log_of(const Logs& logs, const std::string& key) {
  for (const auto& [k, v] : logs)
    if (k == key) return v;
  ADD_FAILURE() << "no log " << key;
  return -1.0;
}

TEST(SequenceAccuracy, TrainStepReportsTheShareEvaluateReports) {
  auto [x, y] = one_hot_windows(32, 5);
  auto m = per_position_classifier();
  // The same weights score the batch in both: evaluate first, then the step (which logs before its update).
  const EvaluateResult before = m->evaluate(x, y, 32);
  const double step_accuracy = log_of(m->train_step(x, y), "accuracy");
  EXPECT_GE(step_accuracy, 0.0);
  EXPECT_LE(step_accuracy, 1.0);
  // float32 loss aside, both divide the same integer count of right predictions by the same 32 x 6.
  EXPECT_NEAR(step_accuracy, before.accuracy, 1e-12);
}

TEST(SequenceAccuracy, ALearnedTaskTrainsAndEvaluatesAtOne) {
  auto [x, y] = one_hot_windows(64, 9);
  auto m = per_position_classifier();
  FitOptions o;
  o.epochs = 40;
  o.batch_size = 16;
  o.verbose = 0;
  const History h = m->fit(x, y, o);
  const EvaluateResult e = m->evaluate(x, y, 16);
  ASSERT_EQ(e.accuracy, 1.0) << "the task is not learned: the test says nothing";
  // The last epoch's batches saw the learned model too (the task is learned well before its end).
  EXPECT_EQ(h.history.at("accuracy").back(), 1.0);
}

}  // namespace
}  // namespace mixtrain
