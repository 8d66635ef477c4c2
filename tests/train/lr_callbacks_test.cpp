// LearningRateScheduler and ReduceLROnPlateau in fit(): the rate changes on the epochs Keras changes it, each
// epoch trains with it, and the logs (History, CSVLogger) record it as "learning_rate".
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mixtrain/nn/layers.h"
#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/schedules.h"
#include "mixtrain/optim/sgd.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/callbacks.h"
#include "mixtrain/train/model.h"

#include "blobs.h"

namespace mixtrain {
namespace {

using train_test::blobs;

std::unique_ptr<Model> tiny_model(std::unique_ptr<Optimizer> opt) {
  auto m = std::make_unique<Model>("tiny", 3);
  m->emplace<Dense>(8, "relu");
  m->emplace<Dense>(3);
  m->compile(std::move(opt), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

FitOptions fit_options(int epochs, std::vector<Callback*> callbacks) {
  FitOptions o;
  o.epochs = epochs;
  o.batch_size = 16;
  o.validation_split = 0.25;
  o.callbacks = std::move(callbacks);
  return o;
}

// The weights at the end of every epoch, flattened.
class WeightLog : public Callback {
 public:
  void on_epoch_end(int, const Logs&) override {
    std::vector<float> all;
    for (const Var& w : model_->weights()) {
      const std::vector<float> v = w.value().to_floats();
      all.insert(all.end(), v.begin(), v.end());
    }
    epochs.push_back(all);
  }
  std::vector<std::vector<float>> epochs;
};

// A scripted metric, so a plateau callback sees exactly the values a test chooses.
class ScriptedMetric : public Callback {
 public:
  ScriptedMetric(std::string name, std::vector<double> values) : name_(std::move(name)), values_(std::move(values)) {}
  void on_epoch_logs(int epoch, Logs& logs) override { logs.emplace_back(name_, values_.at(static_cast<size_t>(epoch))); }

 private:
  std::string name_;
  std::vector<double> values_;
};

std::vector<float> as_floats(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

TEST(LearningRateScheduler, KerasDocumentedExample) {
  // keras.callbacks.LearningRateScheduler's example: SGD (0.01), lr kept for 10 epochs, then * exp(-0.1) per
  // epoch; after 15 epochs round(lr, 5) == 0.00607.
  auto [x, y] = blobs(60, 1);
  auto m = tiny_model(std::make_unique<Sgd>());
  std::ostringstream out;
  LearningRateScheduler sched([](int epoch, float lr) { return epoch < 10 ? lr : lr * std::exp(-0.1f); }, 1, &out);
  History h = m->fit(x, y, fit_options(15, {&sched}));
  EXPECT_EQ(std::lround(m->optimizer().learning_rate() * 1e5), 607);  // Keras: round(lr, 5) == 0.00607
  std::vector<float> want;
  float lr = 0.01f;
  for (int e = 0; e < 15; ++e) {
    if (e >= 10) lr = lr * std::exp(-0.1f);
    want.push_back(lr);
  }
  ASSERT_EQ(h.history["learning_rate"].size(), 15u);
  EXPECT_EQ(as_floats(h.history["learning_rate"]), want) << "the rate set at each epoch's start, logged at its end";
  EXPECT_NE(out.str().find("Epoch 11: LearningRateScheduler setting learning rate to 0.00904837."), std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("Epoch 1: LearningRateScheduler setting learning rate to 0.01."), std::string::npos);
}

TEST(LearningRateScheduler, EachEpochTrainsWithTheRateSetAtItsStart) {
  auto [x, y] = blobs(60, 2);
  auto m = tiny_model(std::make_unique<Sgd>(0.05f));
  std::vector<int> seen_epochs;
  LearningRateScheduler sched([&](int epoch, float) {
    seen_epochs.push_back(epoch);
    return epoch == 1 ? 0.0f : 0.05f;  // epoch 1 must leave the weights exactly as epoch 0 left them
  });
  WeightLog weights;
  History h = m->fit(x, y, fit_options(3, {&sched, &weights}));
  ASSERT_EQ(weights.epochs.size(), 3u);
  EXPECT_EQ(weights.epochs[1], weights.epochs[0]);
  EXPECT_NE(weights.epochs[2], weights.epochs[1]);
  EXPECT_EQ(as_floats(h.history["learning_rate"]), (std::vector<float>{0.05f, 0.0f, 0.05f}));

  // A resumed fit passes absolute epoch indices, as Keras does.
  seen_epochs.clear();
  FitOptions resumed = fit_options(5, {&sched});
  resumed.initial_epoch = 3;
  m->fit(x, y, resumed);
  EXPECT_EQ(seen_epochs, (std::vector<int>{3, 4}));
}

TEST(LearningRateScheduler, RefusesBadRatesAndOptimizersWithASchedule) {
  auto [x, y] = blobs(30, 3);
  auto m = tiny_model(std::make_unique<Sgd>(0.05f));
  LearningRateScheduler nan_rate([](int, float) { return std::nanf(""); });
  EXPECT_THROW(m->fit(x, y, fit_options(1, {&nan_rate})), Error);
  LearningRateScheduler negative([](int, float) { return -0.1f; });
  EXPECT_THROW(m->fit(x, y, fit_options(1, {&negative})), Error);

  auto scheduled = tiny_model(std::make_unique<Sgd>(0.05f));
  scheduled->optimizer().set_learning_rate_schedule(std::make_shared<ExponentialDecay>(0.05, 10, 0.9));
  LearningRateScheduler halve([](int, float lr) { return lr * 0.5f; });
  try {
    scheduled->fit(x, y, fit_options(1, {&halve}));
    FAIL() << "a LearningRateScheduler overrode a LearningRateSchedule";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("follows the schedule ExponentialDecay("), std::string::npos) << e.message();
  }
}

// Runs fit for values.size() epochs with a ReduceLROnPlateau and a scripted metric `metric` (which the plateau
// callback may or may not monitor); returns the logged rates.
std::vector<float> plateau_rates(const ReduceLROnPlateauOptions& o, const std::string& metric,
                                 const std::vector<double>& values, float lr0, float* final_lr) {
  auto [x, y] = blobs(40, 4);
  auto m = tiny_model(std::make_unique<Sgd>(lr0));
  ScriptedMetric script(metric, values);
  ReduceLROnPlateau plateau(o);
  History h = m->fit(x, y, fit_options(static_cast<int>(values.size()), {&plateau, &script}));
  *final_lr = m->optimizer().learning_rate();
  return as_floats(h.history["learning_rate"]);
}

// What ReduceLROnPlateau stores: float32(max(double(lr) * factor, min_lr)).
float reduced(float lr, double factor, double min_lr = 0.0) {
  return static_cast<float>(std::max(static_cast<double>(lr) * factor, min_lr));
}

TEST(ReduceLROnPlateau, KerasTestScenarios) {
  // Keras' tests: patience 1, factor 0.1, min_delta 100 (no epoch after the first improves enough).
  ReduceLROnPlateauOptions o;
  o.monitor = "val_loss";
  o.patience = 1;
  o.factor = 0.1;
  o.min_delta = 100;
  float final_lr = 0;
  const std::vector<double> flat(4, 1.0);
  // 2 epochs: one reduction, at the end of epoch 1 (logged rates are those the epochs trained with).
  EXPECT_EQ(plateau_rates(o, "unused", {1.0, 1.0}, 0.1f, &final_lr), (std::vector<float>{0.1f, 0.1f}));
  EXPECT_EQ(final_lr, reduced(0.1f, 0.1));
  EXPECT_NEAR(final_lr, 0.01, 1e-9);
  // min_lr 0.005 (min_delta 10), 4 epochs: 0.1 -> 0.01 -> 0.005, then no further reduction.
  ReduceLROnPlateauOptions with_min = o;
  with_min.min_delta = 10;
  with_min.min_lr = 0.005;
  const std::vector<float> rates = plateau_rates(with_min, "unused", flat, 0.1f, &final_lr);
  EXPECT_EQ(rates, (std::vector<float>{0.1f, 0.1f, reduced(0.1f, 0.1), 0.005f}));
  EXPECT_EQ(final_lr, 0.005f);
  // cooldown 2, 4 epochs: reductions at the ends of epochs 1 and 3 only.
  ReduceLROnPlateauOptions cool = o;
  cool.cooldown = 2;
  const float once = reduced(0.1f, 0.1);
  EXPECT_EQ(plateau_rates(cool, "unused", flat, 0.1f, &final_lr), (std::vector<float>{0.1f, 0.1f, once, once}));
  EXPECT_EQ(final_lr, reduced(once, 0.1));
}

TEST(ReduceLROnPlateau, PatienceCooldownAndMinDeltaOnAScriptedPlateau) {
  // Hand-traced with Keras' on_epoch_end: improvements at epochs 0, 1 and 5 (min_delta 0.05 rejects 0.95,
  // 0.92 and 0.91 against the best 0.9); reductions at the ends of epochs 3, 7 and 9. Cooldown 1 only resets
  // the wait: its counter drops to 0 at the start of the next epoch's check, which then counts (as in Keras).
  ReduceLROnPlateauOptions o;
  o.monitor = "score";
  o.patience = 2;
  o.cooldown = 1;
  o.min_delta = 0.05;
  o.factor = 0.5;
  o.mode = "min";
  float final_lr = 0;
  const std::vector<float> rates =
      plateau_rates(o, "score", {1.0, 0.9, 0.95, 0.92, 0.91, 0.5, 0.6, 0.6, 0.6, 0.6}, 0.1f, &final_lr);
  const float r1 = reduced(0.1f, 0.5), r2 = reduced(r1, 0.5), r3 = reduced(r2, 0.5);
  EXPECT_EQ(rates, (std::vector<float>{0.1f, 0.1f, 0.1f, 0.1f, r1, r1, r1, r1, r2, r2}));
  EXPECT_EQ(final_lr, r3);
}

TEST(ReduceLROnPlateau, ModeAutoMaximisesAccuracyLikeMetrics) {
  ReduceLROnPlateauOptions o;
  o.patience = 1;
  o.factor = 0.5;
  o.min_delta = 0.0;
  float final_lr = 0;
  const std::vector<double> rising_then_flat = {0.5, 0.6, 0.6, 0.6};
  // "auto" on a name with "acc": higher is better, so epoch 1 improves; epochs 2 and 3 reduce.
  o.monitor = "val_acc_script";
  EXPECT_EQ(plateau_rates(o, o.monitor, rising_then_flat, 0.1f, &final_lr),
            (std::vector<float>{0.1f, 0.1f, 0.1f, reduced(0.1f, 0.5)}));
  EXPECT_EQ(final_lr, reduced(reduced(0.1f, 0.5), 0.5));
  // "min" on the same values: epochs 1, 2 and 3 all reduce.
  o.mode = "min";
  const float r1 = reduced(0.1f, 0.5), r2 = reduced(r1, 0.5);
  EXPECT_EQ(plateau_rates(o, o.monitor, rising_then_flat, 0.1f, &final_lr),
            (std::vector<float>{0.1f, 0.1f, r1, r2}));
  EXPECT_EQ(final_lr, reduced(r2, 0.5));
  // "auto" on a loss: lower is better, as "min".
  o.mode = "auto";
  o.monitor = "val_loss_script";
  EXPECT_EQ(plateau_rates(o, o.monitor, rising_then_flat, 0.1f, &final_lr),
            (std::vector<float>{0.1f, 0.1f, r1, r2}));
}

TEST(ReduceLROnPlateau, TheReducedRateTrainsTheNextEpochAndCsvLoggerSeesIt) {
  auto [x, y] = blobs(40, 5);
  auto m = tiny_model(std::make_unique<Sgd>(0.05f));
  ReduceLROnPlateauOptions o;
  o.monitor = "score";
  o.patience = 1;
  o.factor = 0.0;  // a reduction to 0: later epochs must leave the weights exactly where they were
  const std::filesystem::path csv = std::filesystem::temp_directory_path() / "mixtrain_lr_callbacks_test.csv";
  CSVLogger logger(csv.string());  // before the plateau callback in the list, and still sees its entry
  ScriptedMetric script("score", {1.0, 1.0, 1.0, 1.0});
  ReduceLROnPlateau plateau(o);
  WeightLog weights;
  History h = m->fit(x, y, fit_options(4, {&logger, &script, &plateau, &weights}));
  EXPECT_EQ(as_floats(h.history["learning_rate"]), (std::vector<float>{0.05f, 0.05f, 0.0f, 0.0f}));
  EXPECT_NE(weights.epochs[1], weights.epochs[0]);
  EXPECT_EQ(weights.epochs[2], weights.epochs[1]);
  EXPECT_EQ(weights.epochs[3], weights.epochs[1]);
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  EXPECT_NE(header.find("learning_rate"), std::string::npos) << header;
  std::filesystem::remove(csv);
}

TEST(ReduceLROnPlateau, StateResetsAtEachFitAndWorksThroughLossScaling) {
  auto [x, y] = blobs(40, 6);
  auto m = tiny_model(std::make_unique<LossScaleOptimizer>(std::make_unique<Sgd>(0.1f)));
  ReduceLROnPlateauOptions o;
  o.monitor = "score";
  o.patience = 2;
  o.factor = 0.5;
  ScriptedMetric script("score", {1.0, 1.0, 1.0});
  ReduceLROnPlateau plateau(o);
  m->fit(x, y, fit_options(2, {&script, &plateau}));
  EXPECT_EQ(plateau.wait(), 1);
  EXPECT_EQ(m->optimizer().learning_rate(), 0.1f);
  // A second fit starts from a fresh best: epoch 0 improves again, so two epochs cannot reduce.
  m->fit(x, y, fit_options(2, {&script, &plateau}));
  EXPECT_EQ(m->optimizer().learning_rate(), 0.1f);
  m->fit(x, y, fit_options(3, {&script, &plateau}));
  EXPECT_EQ(m->optimizer().inner_optimizer().learning_rate(), reduced(0.1f, 0.5));
  EXPECT_EQ(plateau.cooldown_counter(), 0);
}

TEST(ReduceLROnPlateau, RefusesBadOptionsMissingMetricsAndScheduledOptimizers) {
  ReduceLROnPlateauOptions o;
  o.factor = 1.0;
  EXPECT_THROW(ReduceLROnPlateau{o}, Error);  // Keras: factor >= 1.0 is not supported
  o.factor = 0.5;
  o.mode = "maximum";
  EXPECT_THROW(ReduceLROnPlateau{o}, Error);
  o.mode = "auto";
  o.patience = -1;
  EXPECT_THROW(ReduceLROnPlateau{o}, Error);

  auto [x, y] = blobs(30, 7);
  auto m = tiny_model(std::make_unique<Sgd>(0.05f));
  ReduceLROnPlateauOptions missing;
  missing.monitor = "val_loss";
  ReduceLROnPlateau no_validation(missing);
  FitOptions no_val = fit_options(1, {&no_validation});
  no_val.validation_split = 0.0;
  try {
    m->fit(x, y, no_val);
    FAIL() << "a missing monitored metric was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("available metrics: loss, accuracy, learning_rate"), std::string::npos)
        << e.message();
  }

  // Keras' test: a reduction on an optimizer driven by a LearningRateSchedule is refused.
  auto scheduled = tiny_model(std::make_unique<Adam>());
  scheduled->optimizer().set_learning_rate_schedule(std::make_shared<PolynomialDecay>(0.1, 10));
  ReduceLROnPlateauOptions keras;
  keras.patience = 1;
  keras.min_delta = 100;
  ReduceLROnPlateau reduce(keras);
  EXPECT_THROW(scheduled->fit(x, y, fit_options(2, {&reduce})), Error);
}

}  // namespace
}  // namespace mixtrain
