// The callbacks' and the recovery ladder's own state in checkpoints saved during fit(): a fit killed after any
// step and resumed from its last checkpoint stops, lowers its rate and restores its best weights exactly where the
// uninterrupted fit does (Keras' BackupAndRestore keeps none of it, so there a resumed EarlyStopping waits its
// whole patience again).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>

#include "mixtrain/io/safetensors.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/train/callbacks.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/recovery.h"
#include "blobs.h"
#include "kill_after.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;
using train_test::blobs;
using train_test::Killed;
using train_test::KillAfter;

// 60 rows in batches of 16: 4 steps per epoch, the last one of 12 rows.
constexpr int64_t kStepsPerEpoch = 4;

std::unique_ptr<Model> make_model() {
  auto m = std::make_unique<Model>("net", 23);
  m->emplace<Dense>(16, "relu");
  m->emplace<Dense>(3, "linear");
  m->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("mixtrain_callback_state_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

struct Outcome {
  std::vector<Tensor> weights;
  History history;
  float learning_rate = 0;
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// One fit with `cb` (made fresh for each run by make_cb), saving every step to ckpt; resumed from ckpt when
// resume, killed after global step kill_at when > 0. Returns the outcome when the fit ended by itself.
template <typename MakeCallback>
std::optional<Outcome> run(MakeCallback make_cb, const std::string& ckpt, bool resume, int64_t kill_at,
                           int* stopped_epoch = nullptr) {
  auto [x, y] = blobs(60, 5);
  auto m = make_model();
  FitOptions o;
  o.epochs = 12;
  o.batch_size = 16;
  o.verbose = 0;
  if (resume) o.resume = load_checkpoint(ckpt, *m).fit_state;
  auto cb = make_cb();
  CheckpointCallback saver(ckpt, 1, "", 1);
  KillAfter killer(kill_at, kStepsPerEpoch);
  o.callbacks = {cb.get(), &saver, &killer};
  try {
    Outcome out;
    out.history = m->fit(x, y, o);
    for (const Var& w : m->weights()) out.weights.push_back(w.value().clone());
    out.learning_rate = m->optimizer().learning_rate();
    if constexpr (std::is_same_v<decltype(cb), std::unique_ptr<EarlyStopping>>) {
      if (stopped_epoch) *stopped_epoch = cb->stopped_epoch();
    }
    return out;
  } catch (const Killed&) {
    return std::nullopt;
  }
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_EQ(a.history.epoch, b.history.epoch) << what;
  ASSERT_EQ(a.weights.size(), b.weights.size()) << what;
  for (size_t i = 0; i < a.weights.size(); ++i) EXPECT_TRUE(same_bytes(a.weights[i], b.weights[i])) << what;
  EXPECT_EQ(a.learning_rate, b.learning_rate) << what;
  EXPECT_EQ(a.history.history, b.history.history) << what;
}

// min_delta so large that only the first epoch counts as an improvement: patience 2 stops training at the end of
// epoch 2 (the second epoch without improvement, as Keras counts) and puts back the weights of epoch 0.
TEST(CallbackState, EarlyStoppingResumesItsPatienceAndBestWeights) {
  const auto make = [] { return std::make_unique<EarlyStopping>("loss", 2, 1e9, /*restore_best_weights=*/true); };
  TempDir dir;
  int full_stop = -1;
  const std::optional<Outcome> full = run(make, dir.file("full.safetensors"), false, 0, &full_stop);
  ASSERT_TRUE(full.has_value());
  ASSERT_EQ(full_stop, 2);
  ASSERT_EQ(full->history.epoch, (std::vector<int>{0, 1, 2}));
  // Killed inside epoch 1, inside epoch 2, and after epoch 2's last step (only its end left).
  for (int64_t k : {6, 10, 12}) {
    const std::string ckpt = dir.file("k" + std::to_string(k) + ".safetensors");
    ASSERT_FALSE(run(make, ckpt, false, k).has_value());
    int stop = -1;
    const std::optional<Outcome> resumed = run(make, ckpt, true, 0, &stop);
    ASSERT_TRUE(resumed.has_value());
    EXPECT_EQ(stop, 2) << "killed after step " << k;
    expect_same(*full, *resumed, "EarlyStopping, killed after step " + std::to_string(k));
  }
  // The best weights travel as callback/ tensors beside the model's own.
  const SafetensorsFile f = load_safetensors(dir.file("k10.safetensors"));
  int best = 0;
  for (const auto& [name, t] : f.tensors) best += name.rfind("callback/EarlyStopping.0/", 0) == 0;
  EXPECT_EQ(best, 4) << "two Dense layers: four best weights";
}

// patience 2 and a cooldown of 1: the rate halves at the end of epochs 2, 4, 6, ...; a resume that forgot the
// counters would halve it at other epochs.
TEST(CallbackState, ReduceLROnPlateauResumesItsCounters) {
  const auto make = [] {
    ReduceLROnPlateauOptions o;
    o.monitor = "loss";
    o.factor = 0.5;
    o.patience = 2;
    o.cooldown = 1;
    o.min_delta = 1e9;
    return std::make_unique<ReduceLROnPlateau>(o);
  };
  TempDir dir;
  const std::optional<Outcome> full = run(make, dir.file("full.safetensors"), false, 0);
  ASSERT_TRUE(full.has_value());
  const std::vector<double>& lr = full->history.history.at("learning_rate");
  ASSERT_EQ(lr.size(), 12u);
  EXPECT_LT(lr.back(), lr.front() / 4) << "the rate was lowered several times";
  for (int64_t k : {3, 9, 14, 27}) {
    const std::string ckpt = dir.file("k" + std::to_string(k) + ".safetensors");
    ASSERT_FALSE(run(make, ckpt, false, k).has_value());
    const std::optional<Outcome> resumed = run(make, ckpt, true, 0);
    ASSERT_TRUE(resumed.has_value());
    expect_same(*full, *resumed, "ReduceLROnPlateau, killed after step " + std::to_string(k));
  }
}

// A saved state that is not what the callback wrote is refused naming the callback; nothing is half-restored.
TEST(CallbackState, MalformedStatesAreRefused) {
  auto m = make_model();
  m->build_for(Shape{8});
  EarlyStopping es("loss", 2, 0, true);
  es.set_model(m.get());
  es.on_train_begin(1, 1);
  for (const char* bad : {"[]", "{\"best\": 1, \"wait\": -1, \"stopped_epoch\": -1}",
                          "{\"best\": \"x\", \"wait\": 0, \"stopped_epoch\": -1}", "{\"wait\": 0}"}) {
    try {
      es.restore_state(CallbackState{bad, {}});
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("EarlyStopping"), std::string::npos) << e.what();
    }
  }
  CallbackState wrong_weight{"{\"best\": 1, \"wait\": 0, \"stopped_epoch\": -1}", {}};
  for (const Var& w : m->weights()) wrong_weight.tensors.emplace_back(w.name(), Tensor::zeros(Shape{1}, DType::kFloat32));
  EXPECT_THROW(es.restore_state(wrong_weight), Error);
  ReduceLROnPlateau r;
  try {
    r.restore_state(CallbackState{"{\"best\": 1, \"wait\": 0}", {}});
    ADD_FAILURE() << "accepted a state without cooldown_counter";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ReduceLROnPlateau state: 'cooldown_counter' is missing"), std::string::npos)
        << e.what();
  }
  try {
    r.restore_state(CallbackState{"{\"best\": 1, \"wait\": 2.5, \"cooldown_counter\": 0}", {}});
    ADD_FAILURE() << "accepted a fractional wait";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'wait' is 2.5, expected a whole number in [0, "), std::string::npos)
        << e.what();
  }
}

// The ladder's state reads back as written, and what it changed in the model is read from it.
TEST(CallbackState, RecoveryStateRoundTripsAndNamesTheModelChanges) {
  RecoveryGuard g;
  const std::string fresh = g.state_json();
  EXPECT_TRUE(recovery_model_changes(fresh).float32_layers.empty());
  EXPECT_FALSE(recovery_model_changes(fresh).enabled_loss_scaling);
  const std::string saved =
      R"({"rung":2,"gave_up":false,"consecutive_failures":3,"drifting_steps":0,"ema":0.5,"reference_ema":"nan",)"
      R"("has_ema":true,"has_reference_ema":false,"events":[)"
      R"({"step":4,"action":"enable_loss_scaling","reason":"r","layers":[],"resume_step":-1},)"
      R"({"step":9,"action":"layers_to_float32","reason":"r","layers":["dense","dense_1"],"resume_step":-1},)"
      R"({"step":9,"action":"rollback","reason":"r","layers":[],"resume_step":5}]})";
  g.restore_state(saved);
  EXPECT_EQ(g.events().size(), 3u);
  EXPECT_EQ(g.events()[1].layers, (std::vector<std::string>{"dense", "dense_1"}));
  EXPECT_EQ(g.events()[2].resume_step, 5);
  EXPECT_EQ(g.state_json(), saved) << "written back byte for byte";
  const RecoveryModelChanges c = recovery_model_changes(saved);
  EXPECT_EQ(c.float32_layers, (std::vector<std::string>{"dense", "dense_1"}));
  EXPECT_TRUE(c.enabled_loss_scaling);
  for (const char* bad : {"{}", R"({"rung":7})", "[1]"})
    EXPECT_THROW(RecoveryGuard().restore_state(bad), Error) << bad;
  std::string unknown = saved;
  unknown.replace(unknown.find("rollback"), 8, "teleport");
  EXPECT_THROW(g.restore_state(unknown), Error);
  EXPECT_EQ(g.state_json(), saved) << "a refused state leaves the guard as it was";
}

}  // namespace
}  // namespace mixtrain
