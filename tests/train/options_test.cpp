// fit, evaluate, compile and the callbacks take their options by name in any order (chained `with_` setters),
// as well as by designated initializers in declaration order; each case checks that the values took effect.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "blobs.h"
#include "mixtrain/core/allocator.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/train/callbacks.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;
using train_test::blobs;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("mixtrain_options_" + std::to_string(::getpid()) + "_" + name)).string();
}

// learning_rate 1e-30 leaves every float32 weight as it is, so the validation values never improve after the first
// epoch: what the monitoring callbacks do is then known in advance.
std::unique_ptr<Model> mlp(float learning_rate) {
  auto m = std::make_unique<Model>("mlp", 3);
  m->emplace<Dense>(8, "relu");
  m->emplace<Dense>(3);
  m->compile(make_optimizer("sgd", learning_rate), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

TEST(Options, FitTakesEpochsValidationSplitAndBatchSizeInAnyOrder) {
  auto [x, y] = blobs(200, 1);
  auto m = mlp(0.1f);
  // Declaration order is epochs, batch_size, validation_split: given here in another.
  History h = m->fit(x, y, FitOptions().with_epochs(3).with_validation_split(0.25).with_batch_size(50).with_verbose(0));
  EXPECT_EQ(h.epoch.size(), 3u);
  EXPECT_EQ(h.history.at("val_loss").size(), 3u);  // the split validated
  EXPECT_EQ(h.samples, 3 * 150);                    // 50 of the 200 rows held out
  EXPECT_EQ(h.steps, 3 * 3);                        // 150 rows in batches of 50
  // Designated initializers in declaration order keep working.
  History d = m->fit(x, y, {.epochs = 2, .batch_size = 100, .verbose = 0});
  EXPECT_EQ(d.steps, 2 * 2);
  EXPECT_EQ(d.history.count("val_loss"), 0u);
}

// The validation pass's peak memory: reset after the epoch's last step, read once the validation logs are in.
class ValidationPeak : public Callback {
 public:
  void on_train_batch_end(int64_t, const Logs&) override {
    reset_peak_memory();
    live_ = memory_stats().live_bytes;
  }
  void on_epoch_logs(int, Logs&) override { peak_ = memory_stats().peak_bytes - live_; }
  int64_t peak() const { return peak_; }

 private:
  int64_t live_ = 0, peak_ = 0;
};

// As Keras' validation_batch_size, the validation pass takes a training batch's rows at a time unless told
// otherwise: its loss is evaluate()'s at that batch size, bit for bit, and it holds a tenth of what the whole split
// at once holds (200 rows of a 512-wide hidden layer: 400 KiB of activations against 40 KiB).
TEST(Options, ValidationTakesTheTrainingBatchsRowsUnlessToldOtherwise) {
  auto [x, y] = blobs(400, 3);
  const ValidationSplit split = split_validation(x, y, 0.5);
  auto wide = [] {
    auto m = std::make_unique<Model>("wide", 3);
    m->emplace<Dense>(512, "relu");
    m->emplace<Dense>(3);
    m->compile(make_optimizer("sgd", 0.01f), Loss("sparse_categorical_crossentropy", true));
    return m;
  };
  ValidationPeak by_default, whole;
  auto a = wide();
  const History ha = a->fit(x, y, FitOptions().with_validation_split(0.5).with_batch_size(20).with_verbose(0)
                                      .with_callbacks({&by_default}));
  EXPECT_EQ(ha.history.at("val_loss").back(), a->evaluate(split.val_x, split.val_y, 20).loss);
  auto b = wide();
  const History hb = b->fit(x, y, FitOptions().with_validation_split(0.5).with_batch_size(20).with_verbose(0)
                                      .with_validation_batch_size(200).with_callbacks({&whole}));
  EXPECT_EQ(hb.history.at("val_loss").back(), b->evaluate(split.val_x, split.val_y, 200).loss);
  EXPECT_GT(by_default.peak(), 0);
  EXPECT_LT(by_default.peak() * 4, whole.peak()) << by_default.peak() << " against " << whole.peak() << " bytes";
  EXPECT_THROW(a->fit(x, y, FitOptions().with_validation_batch_size(-1).with_verbose(0)), Error);
}

TEST(Options, EarlyStoppingPatienceAndRestoreBestWeightsInAnyOrder) {
  EarlyStopping es(EarlyStoppingOptions().with_restore_best_weights(true).with_patience(2).with_monitor("val_loss"));
  EXPECT_EQ(es.patience(), 2);
  EXPECT_TRUE(es.restore_best_weights());
  EXPECT_EQ(es.monitor(), "val_loss");
  auto [x, y] = blobs(120, 2);
  auto m = mlp(1e-30f);
  History h = m->fit(x, y, FitOptions().with_callbacks({&es}).with_verbose(0).with_validation_split(0.25).with_epochs(10));
  // Epoch 0 sets the best and no later epoch beats it: training stops at the second epoch without improvement,
  // epoch 2, as Keras 3 counts (patience 0, the default, and patience 1 would stop at epoch 1).
  EXPECT_EQ(h.epoch.size(), 3u);
  EXPECT_EQ(es.stopped_epoch(), 2);

  EarlyStopping designated({.monitor = "val_accuracy", .patience = 1});
  EXPECT_EQ(designated.patience(), 1);
  EXPECT_FALSE(designated.restore_best_weights());
  EarlyStopping positional("val_loss", 1, 0.0, true);  // the Keras positional order still compiles
  EXPECT_TRUE(positional.restore_best_weights());
}

TEST(Options, CheckpointMonitorAndSaveBestOnlyInAnyOrder) {
  const std::string file = temp_path("best.safetensors");
  CheckpointCallback cb(file, CheckpointOptions().with_save_best_only(true).with_monitor("val_accuracy"));
  EXPECT_EQ(cb.monitor().monitor, "val_accuracy");
  EXPECT_TRUE(cb.monitor().save_best_only);
  auto [x, y] = blobs(120, 3);
  auto m = mlp(1e-30f);
  History h = m->fit(x, y, FitOptions().with_verbose(0).with_callbacks({&cb}).with_validation_split(0.25).with_epochs(3));
  // The value never beats the first epoch's, so only that epoch saved; every epoch would without save_best_only.
  EXPECT_EQ(cb.saves(), 1);
  EXPECT_EQ(cb.best(), h.history.at("val_accuracy").at(0));
  fs::remove(file);

  const std::string every = temp_path("every-{epoch}.safetensors");
  CheckpointCallback periodic(every, {.period = 2});
  EXPECT_FALSE(periodic.monitor().save_best_only);
  m->fit(x, y, FitOptions().with_epochs(4).with_verbose(0).with_callbacks({&periodic}));
  EXPECT_EQ(periodic.saves(), 2);  // epochs 2 and 4
  fs::remove(periodic.path_for(2));
  fs::remove(periodic.path_for(4));
}

TEST(Options, ReduceLROnPlateauEvaluateAndCompileByName) {
  ReduceLROnPlateau plateau(ReduceLROnPlateauOptions().with_min_lr(1e-4).with_patience(1).with_factor(0.5));
  EXPECT_EQ(plateau.options().patience, 1);
  EXPECT_EQ(plateau.options().factor, 0.5);
  EXPECT_EQ(plateau.options().min_lr, 1e-4);

  auto [x, y] = blobs(60, 4);
  auto m = mlp(0.1f);
  std::ostringstream out;
  m->evaluate(x, y, EvaluateOptions().with_verbose_out(&out).with_batch_size(7).with_verbose(1));
  EXPECT_NE(out.str().find("loss: "), std::string::npos) << out.str();

  // auto_scale_loss without giving metrics first; under mixed_float16 it decides the loss-scale wrapping.
  set_precision_warning_sink([](const std::string&) {});
  set_global_policy("mixed_float16");
  Model scaled("scaled", 1), plain("plain", 1);
  for (Model* mm : {&scaled, &plain}) {
    mm->emplace<Dense>(4, "relu");
    mm->emplace<Dense>(3, DenseOptions().with_dtype("float32"));
  }
  const Loss loss("sparse_categorical_crossentropy", true);
  scaled.compile(make_optimizer("adam", 1e-3f), loss, {"accuracy"});
  plain.compile(make_optimizer("adam", 1e-3f), loss, CompileOptions().with_auto_scale_loss(false).with_metrics({"acc"}));
  set_global_policy("float32");
  set_precision_warning_sink(nullptr);
  EXPECT_TRUE(scaled.optimizer().scales_loss());
  EXPECT_FALSE(plain.optimizer().scales_loss());
  EXPECT_EQ(plain.compiled_metrics(), std::vector<std::string>{"accuracy"});
  plain.compile(make_optimizer("adam", 1e-3f), loss, {});  // an empty braced metrics list is still no metrics
  EXPECT_TRUE(plain.compiled_metrics().empty());
}

}  // namespace
}  // namespace mixtrain
