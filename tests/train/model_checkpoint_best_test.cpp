// CheckpointCallback's Keras ModelCheckpoint options: monitor, save_best_only and mode.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "blobs.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;
using train_test::blobs;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("mixtrain_best_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::unique_ptr<Model> mlp() {
  auto m = std::make_unique<Model>("mlp", 11);
  m->emplace<Dense>(8, "relu");
  m->emplace<Dense>(3);
  // A large rate so the validation loss does not fall every epoch.
  m->compile(make_optimizer("sgd", 1.5f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

struct BestRun {
  History history;
  int saves = 0;
  int saved_epoch = 0;  // the completed epochs recorded in the file
};

BestRun run_with(const CheckpointMonitor& monitor, const std::string& file) {
  auto [x, y] = blobs(240, 5);
  auto m = mlp();
  CheckpointCallback cb(file);
  cb.set_monitor(monitor);
  FitOptions o;
  o.epochs = 6;
  o.validation_split = 0.25;
  o.verbose = 0;
  o.callbacks = {&cb};
  BestRun r;
  r.history = m->fit(x, y, o);
  r.saves = cb.saves();
  auto fresh = mlp();
  if (r.saves > 0) r.saved_epoch = load_checkpoint(file, *fresh).epoch;
  return r;
}

// Independently: the epochs where the value beats every earlier one (strictly), and the last such epoch.
std::pair<int, int> improvements(const std::vector<double>& v, bool maximize) {
  int count = 0, last = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    bool best = true;
    for (size_t j = 0; j < i; ++j) best = best && (maximize ? v[i] > v[j] : v[i] < v[j]);
    if (best) ++count, last = static_cast<int>(i) + 1;
  }
  return {count, last};
}

TEST(CheckpointBestOnly, SavesOnlyEpochsThatBeatTheBestInTheMonitorsDirection) {
  const std::string file = temp_path("best.safetensors");
  int total = 0;
  for (const char* mode : {"min", "max"}) {
    const BestRun r = run_with({"val_loss", true, mode}, file);
    const auto [count, last] = improvements(r.history.history.at("val_loss"), std::string(mode) == "max");
    EXPECT_EQ(r.saves, count) << mode;
    EXPECT_EQ(r.saved_epoch, last) << mode << ": the file holds the best epoch";
    total += r.saves;
  }
  // Only the first epoch can improve both ways: saving every epoch would give 12.
  EXPECT_LE(total, 7);
  // "auto" on an accuracy maximizes, on a loss minimizes.
  const BestRun acc = run_with({"val_accuracy", true, "auto"}, file);
  EXPECT_EQ(acc.saves, improvements(acc.history.history.at("val_accuracy"), true).first);
  const BestRun loss = run_with({"val_loss", true, "auto"}, file);
  EXPECT_EQ(loss.saves, improvements(loss.history.history.at("val_loss"), false).first);
  // Without save_best_only every epoch saves, as before.
  EXPECT_EQ(run_with({"val_loss", false, "auto"}, file).saves, 6);
  fs::remove(file);
}

TEST(CheckpointBestOnly, BadModeAndMissingMonitorAreErrors) {
  CheckpointCallback cb(temp_path("never.safetensors"));
  EXPECT_THROW(cb.set_monitor({"val_loss", true, "maximum"}), Error);
  auto [x, y] = blobs(60, 1);
  auto m = mlp();
  cb.set_monitor({"val_loss", true, "auto"});
  FitOptions o;
  o.verbose = 0;
  o.callbacks = {&cb};
  try {
    (void)m->fit(x, y, o);  // no validation data: no val_loss
    ADD_FAILURE() << "a missing monitor was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'val_loss' is not logged"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mixtrain
