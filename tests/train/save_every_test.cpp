// Checkpoints saved every N steps (CheckpointCallback's every_steps) and FitOptions::resume: a fit interrupted
// after any step and resumed from its last checkpoint ends with the same bytes as an uninterrupted fit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>

#include "mixtrain/io/safetensors.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"
#include "blobs.h"
#include "kill_after.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;
using train_test::blobs;
using train_test::Killed;
using train_test::KillAfter;

// 100 rows, 20 held out for validation, batches of 16: 5 steps per epoch, the last one of 16 rows too.
constexpr int kEpochs = 3;
constexpr int64_t kStepsPerEpoch = 5;
constexpr int64_t kTotalSteps = kEpochs * kStepsPerEpoch;

// "float32": Adam in float32. "mixed": mixed_float16 under a loss scale that doubles after 2 finite steps, so it
// rises into overflows, skips steps and halves during the run: its state must be restored exactly. Both with
// BatchNormalization (moving statistics) and Dropout (a random stream), the layers whose state is not weights.
std::unique_ptr<Model> make_model(const std::string& scenario) {
  const DTypeArg hidden = dtype_arg(scenario == "mixed" ? "mixed_float16" : "float32");
  auto m = std::make_unique<Model>("net", 17);
  m->emplace<Dense>(32, "relu", hidden);
  m->emplace<BatchNormalization>(0.9f, 1e-3f, hidden);
  m->emplace<Dropout>(0.3f, hidden);
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  std::unique_ptr<Optimizer> opt = make_optimizer("adam", 0.01f);
  if (scenario == "mixed") {
    LossScaleOptions o;
    o.dynamic_growth_steps = 2;
    o.initial_scale = 65536.0f * 64.0f;  // starts too high: the first steps overflow and are skipped
    opt = std::make_unique<LossScaleOptimizer>(std::move(opt), o);
  }
  m->compile(std::move(opt), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

FitOptions fit_options() {
  FitOptions o;
  o.epochs = kEpochs;
  o.batch_size = 16;
  o.validation_split = 0.2;
  o.verbose = 0;
  return o;
}

struct Result {
  NamedTensors state;  // weights (moving statistics included), optimizer slots and counters, loss scale, Rngs
  History history;
};

Result result_of(Model& m, const History& h) {
  Result r;
  for (const Var& w : m.weights()) r.state.emplace_back(w.name(), w.value().clone());
  for (auto& [k, t] : m.optimizer().state()) r.state.emplace_back("optimizer/" + k, t.clone());
  for (const Rng* rng : {&m.init_rng(), &m.shuffle_rng(), &m.dropout_rng()}) {
    const std::vector<uint64_t> words = rng->state();
    Tensor t = Tensor::zeros(Shape{32}, DType::kUInt8);  // the 4 words' bytes, only compared
    std::memcpy(t.raw(), words.data(), 32);
    r.state.emplace_back("rng", t);
  }
  r.history = h;
  return r;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Doubles compared by their bits, so a NaN loss equals the same NaN.
bool same_doubles(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

void expect_identical(const Result& full, const Result& resumed, const std::string& what) {
  ASSERT_EQ(full.state.size(), resumed.state.size()) << what;
  for (size_t i = 0; i < full.state.size(); ++i) {
    EXPECT_EQ(full.state[i].first, resumed.state[i].first) << what;
    EXPECT_TRUE(same_bytes(full.state[i].second, resumed.state[i].second))
        << what << ": '" << full.state[i].first << "' differs";
  }
  const History &f = full.history, &r = resumed.history;
  EXPECT_EQ(f.epoch, r.epoch) << what;
  EXPECT_TRUE(same_doubles(f.step_loss, r.step_loss)) << what << ": step losses differ";
  EXPECT_TRUE(same_doubles(f.step_loss_scale, r.step_loss_scale)) << what << ": step loss scales differ";
  ASSERT_EQ(f.history.size(), r.history.size()) << what;
  for (const auto& [k, v] : f.history) {
    ASSERT_TRUE(r.history.count(k)) << what << ": no '" << k << "'";
    EXPECT_TRUE(same_doubles(v, r.history.at(k))) << what << ": history '" << k << "' differs";
  }
  EXPECT_EQ(f.samples, r.samples) << what;
  EXPECT_EQ(f.epoch_seconds.size(), r.epoch_seconds.size()) << what;
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("mixtrain_save_every_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

Result uninterrupted(const std::string& scenario) {
  auto [x, y] = blobs(100, 3);
  auto m = make_model(scenario);
  const History h = m->fit(x, y, fit_options());
  return result_of(*m, h);
}

// Trains from the checkpoint at ckpt (fresh when empty) until killed after global step kill_at (0: to the end),
// saving every save_every steps; returns the result when the fit ended by itself.
std::optional<Result> run_until(const std::string& scenario, const std::string& ckpt, int64_t save_every,
                                int64_t kill_at, bool resume) {
  auto [x, y] = blobs(100, 3);
  auto m = make_model(scenario);
  FitOptions o = fit_options();
  if (resume) {
    CheckpointInfo info = load_checkpoint(ckpt, *m);
    EXPECT_TRUE(info.fit_state.has_value()) << "a checkpoint saved by a callback holds the fit's position";
    o.resume = info.fit_state;
  }
  CheckpointCallback saver(ckpt, 1, "", save_every);
  KillAfter killer(kill_at, kStepsPerEpoch);
  o.callbacks = {&saver, &killer};  // the save of step kill_at happens before the kill, as with a real kill
  try {
    const History h = m->fit(x, y, o);
    EXPECT_FALSE(m->fit_state().has_value()) << "fit_state() is empty once fit() returned";
    return result_of(*m, h);
  } catch (const Killed&) {
    EXPECT_FALSE(m->fit_state().has_value()) << "fit_state() is empty once fit() ended by an exception";
    return std::nullopt;
  }
}

void check_kill_and_resume(const std::string& scenario) {
  const Result full = uninterrupted(scenario);
  ASSERT_EQ(full.history.step_loss.size(), static_cast<size_t>(kTotalSteps));
  if (scenario == "mixed") {
    // The scale moved both ways: overflows were skipped and growth happened, so its counters matter.
    const auto& s = full.history.step_loss_scale;
    ASSERT_EQ(s.size(), static_cast<size_t>(kTotalSteps));
    bool fell = false, rose = false;
    for (size_t i = 1; i < s.size(); ++i) {
      fell = fell || s[i] < s[i - 1];
      rose = rose || s[i] > s[i - 1];
    }
    EXPECT_TRUE(fell && rose) << "the loss scale must both halve and grow during the run";
  }
  // Kill points: the first step, mid-epoch (3, 7, 12), the last step of an epoch (5, 10; its end not yet run),
  // and the run's last step (15: only the last epoch's end is left).
  for (int64_t k : {1, 3, 5, 7, 10, 12, 15}) {
    TempDir dir;
    const std::string ckpt = dir.file("ckpt.safetensors");
    ASSERT_FALSE(run_until(scenario, ckpt, k, k, false).has_value());
    const SafetensorsFile f = load_safetensors(ckpt);
    const int64_t step_in_epoch = (k - 1) % kStepsPerEpoch + 1;
    EXPECT_EQ(f.metadata.at("step"), std::to_string(step_in_epoch)) << "k=" << k;
    EXPECT_EQ(f.metadata.at("epoch"), std::to_string((k - 1) / kStepsPerEpoch)) << "k=" << k;
    EXPECT_EQ(f.metadata.at("format"), kCheckpointFormatMidEpoch);
    const std::optional<Result> resumed = run_until(scenario, ckpt, k, 0, true);
    ASSERT_TRUE(resumed.has_value());
    expect_identical(full, *resumed, scenario + ", killed after step " + std::to_string(k));
  }
  // Killed several times in a row, each run resuming from the last checkpoint of the one before (saved every 2
  // steps, so each kill also loses the steps since that save).
  TempDir dir;
  const std::string ckpt = dir.file("ckpt.safetensors");
  ASSERT_FALSE(run_until(scenario, ckpt, 2, 3, false).has_value());   // saved at 2
  ASSERT_FALSE(run_until(scenario, ckpt, 2, 9, true).has_value());    // from 2; saved at 4, 5 (epoch end), 6, 8
  ASSERT_FALSE(run_until(scenario, ckpt, 2, 10, true).has_value());   // from 8; saved at 10 before the kill
  const std::optional<Result> resumed = run_until(scenario, ckpt, 2, 0, true);
  ASSERT_TRUE(resumed.has_value());
  expect_identical(full, *resumed, scenario + ", killed three times");
}

TEST(SaveEvery, KilledAndResumedFitIsBitIdenticalFloat32) { check_kill_and_resume("float32"); }
TEST(SaveEvery, KilledAndResumedFitIsBitIdenticalMixedFloat16) { check_kill_and_resume("mixed"); }

// The epoch-end saves of the same callback carry the fit state at the epoch boundary (format 1, which older
// versions read as before); a checkpoint saved outside fit() has none and resumes by initial_epoch.
TEST(SaveEvery, EpochBoundaryAndOutsideFitFilesStayFormatOne) {
  TempDir dir;
  auto [x, y] = blobs(100, 3);
  auto m = make_model("float32");
  CheckpointCallback saver(dir.file("e{epoch}.safetensors"), 1);
  FitOptions o = fit_options();
  o.callbacks = {&saver};
  m->fit(x, y, o);
  const SafetensorsFile e2 = load_safetensors(dir.file("e2.safetensors"));
  EXPECT_EQ(e2.metadata.at("format"), kCheckpointFormat);
  EXPECT_EQ(e2.metadata.at("step"), "0");
  auto m2 = make_model("float32");
  const CheckpointInfo info = load_checkpoint(dir.file("e2.safetensors"), *m2);
  ASSERT_TRUE(info.fit_state.has_value());
  EXPECT_EQ(info.fit_state->epoch, 2);
  EXPECT_EQ(info.fit_state->step, 0);
  EXPECT_EQ(info.fit_state->history.epoch, (std::vector<int>{0, 1}));

  CheckpointInfo plain;
  plain.epoch = 3;
  save_checkpoint(dir.file("after.safetensors"), *m, plain);
  const SafetensorsFile after = load_safetensors(dir.file("after.safetensors"));
  EXPECT_EQ(after.metadata.at("format"), kCheckpointFormat);
  EXPECT_EQ(after.metadata.count("step"), 0u);
  EXPECT_EQ(after.metadata.count("fit_state"), 0u);
  auto m3 = make_model("float32");
  EXPECT_FALSE(load_checkpoint(dir.file("after.safetensors"), *m3).fit_state.has_value());
}

// A resume with another data stream is refused naming the difference, before any step; so is a damaged state.
TEST(SaveEvery, ResumeWithOtherDataOrDamagedStateIsRefused) {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt.safetensors");
  ASSERT_FALSE(run_until("float32", ckpt, 3, 3, false).has_value());
  auto [x, y] = blobs(100, 3);
  const auto expect_fit_refused = [&](FitOptions o, const Tensor& xs, const Tensor& ys, const std::string& needle) {
    auto m = make_model("float32");
    o.resume = load_checkpoint(ckpt, *m).fit_state;
    try {
      m->fit(xs, ys, o);
      ADD_FAILURE() << "fit should refuse: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.what();
    }
  };
  FitOptions other_batch = fit_options();
  other_batch.batch_size = 15;
  expect_fit_refused(other_batch, x, y, "batch_size 16, this fit has 15");
  auto [x2, y2] = blobs(110, 3);
  expect_fit_refused(fit_options(), x2, y2, "training rows 80, this fit has 88");
  FitOptions unshuffled = fit_options();
  unshuffled.shuffle = false;
  expect_fit_refused(unshuffled, x, y, "shuffle true, this fit has false");

  // The shuffle stream set elsewhere after loading: the epoch's order can no longer be trusted.
  {
    auto m = make_model("float32");
    FitOptions o = fit_options();
    o.resume = load_checkpoint(ckpt, *m).fit_state;
    m->shuffle_rng() = Rng(5);
    EXPECT_THROW(m->fit(x, y, o), Error);
  }

  // Damaged metadata, rewritten with valid checksums (as an editing tool would): refused naming the entry.
  const auto edited = [&](const std::string& name, const std::function<void(std::map<std::string, std::string>&)>& edit) {
    SafetensorsFile f = load_safetensors(ckpt);
    edit(f.metadata);
    save_safetensors(dir.file(name), f.tensors, f.metadata);
    return dir.file(name);
  };
  const auto expect_load_refused = [&](const std::string& path, const std::string& needle) {
    auto m = make_model("float32");
    try {
      load_checkpoint(path, *m);
      ADD_FAILURE() << "loading " << path << " should fail with '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(e.message().find(path), std::string::npos) << e.what();
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.what();
    }
  };
  expect_load_refused(edited("a.safetensors", [](auto& m) { m["step"] = "4"; }), "differs from the fit state's step 3");
  expect_load_refused(edited("b.safetensors", [](auto& m) { m.erase("step"); }), "'fit_state' metadata without 'step'");
  expect_load_refused(edited("c.safetensors", [](auto& m) { m["format"] = kCheckpointFormat; }),
                      "does not match its position (inside an epoch)");
  expect_load_refused(edited("d.safetensors", [](auto& m) { m["fit_state"] = "{\"epoch\": 0"; }),
                      "'fit_state' metadata is not JSON");
  expect_load_refused(edited("e.safetensors",
                             [](auto& m) {
                               const std::string key = "\"step\":3";
                               const size_t at = m["fit_state"].find(key);
                               ASSERT_NE(at, std::string::npos) << m["fit_state"];
                               m["fit_state"].replace(at, key.size(), "\"step\":9");
                               m["step"] = "9";
                             }),
                      "'step' 9 is past the epoch's 5 steps");
}

}  // namespace
}  // namespace mixtrain

namespace mixtrain {
namespace {

// Requests a stop (as the CLI's signal handler does) when global step `at` ends, then counts the hooks fit()
// calls after it.
class StopAfter : public Callback {
 public:
  StopAfter(StopRequest& stop, int64_t at) : stop_(stop), at_(at) {}
  void on_epoch_begin(int epoch) override { epoch_ = epoch; }
  void on_train_batch_end(int64_t step, const Logs&) override {
    ++batches_after_;
    if (epoch_ * kStepsPerEpoch + step == at_) {
      stop_.request(15);
      batches_after_ = 0;
    }
  }
  void on_epoch_end(int, const Logs&) override { ++epoch_ends_; }
  void on_train_interrupted(int epoch, int64_t steps_done) override {
    interrupted_at_ = epoch * kStepsPerEpoch + steps_done;
  }
  void on_train_end(const Logs&) override { ended_ = true; }

  int64_t batches_after_ = 0, interrupted_at_ = 0;
  int epoch_ends_ = 0;
  bool ended_ = false;

 private:
  StopRequest& stop_;
  int64_t at_;
  int64_t epoch_ = 0;
};

// A fit stopped by a StopRequest after step k saves its position through CheckpointCallback (even without
// every_steps) and returns; resumed from that file it ends bit-identical to an uninterrupted fit.
void check_stop_and_resume(const std::string& scenario) {
  const Result full = uninterrupted(scenario);
  for (int64_t k : {1, 3, 5, 7, 10, 15}) {
    const std::string what = scenario + ", stopped after step " + std::to_string(k);
    TempDir dir;
    const std::string ckpt = dir.file("ckpt.safetensors");
    {
      auto [x, y] = blobs(100, 3);
      auto m = make_model(scenario);
      StopRequest stop;
      StopAfter stopper(stop, k);
      CheckpointCallback saver(ckpt, 1, "", /*every_steps=*/0);
      FitOptions o = fit_options();
      o.stop_request = &stop;
      o.callbacks = {&stopper, &saver};
      const int epoch_ends_before = static_cast<int>((k - 1) / kStepsPerEpoch);
      const History h = m->fit(x, y, o);
      EXPECT_TRUE(h.interrupted) << what;
      EXPECT_EQ(h.step_loss.size(), static_cast<size_t>(k)) << what << ": fit() stops after the step in progress";
      EXPECT_EQ(stopper.batches_after_, 0) << what;
      EXPECT_EQ(stopper.interrupted_at_, k) << what;
      EXPECT_EQ(stopper.epoch_ends_, epoch_ends_before) << what << ": the epoch in progress is not ended";
      EXPECT_FALSE(stopper.ended_) << what << ": on_train_end is left to the resumed fit";
      EXPECT_EQ(stop.reason(), 15);
      const SafetensorsFile f = load_safetensors(ckpt);
      EXPECT_EQ(f.metadata.at("step"), std::to_string((k - 1) % kStepsPerEpoch + 1)) << what;
    }
    const std::optional<Result> resumed = run_until(scenario, ckpt, 0, 0, true);
    ASSERT_TRUE(resumed.has_value());
    EXPECT_FALSE(resumed->history.interrupted);
    expect_identical(full, *resumed, what);
  }
}

TEST(StopRequest, FitStopsAfterTheStepSavesAndResumesBitIdenticalFloat32) { check_stop_and_resume("float32"); }
TEST(StopRequest, FitStopsAfterTheStepSavesAndResumesBitIdenticalMixedFloat16) { check_stop_and_resume("mixed"); }

TEST(StopRequest, KeepsTheFirstReasonUntilCleared) {
  StopRequest stop;
  EXPECT_FALSE(stop.requested());
  EXPECT_EQ(stop.reason(), 0);
  stop.request();
  EXPECT_TRUE(stop.requested());
  EXPECT_EQ(stop.reason(), StopRequest::kRequested);
  stop.request(2);  // a second request keeps the first's reason
  EXPECT_EQ(stop.reason(), StopRequest::kRequested);
  stop.clear();
  EXPECT_FALSE(stop.requested());
  stop.request(15);
  EXPECT_EQ(stop.reason(), 15);
}

// A request made before fit() starts stops it after its first step (fit polls only after completed steps), and
// a model that was stopped trains on when fit() is called again with the request cleared.
TEST(StopRequest, ARequestBeforeFitStopsAfterTheFirstStep) {
  auto [x, y] = blobs(100, 3);
  auto m = make_model("float32");
  StopRequest stop;
  stop.request();
  FitOptions o = fit_options();
  o.stop_request = &stop;
  const History h = m->fit(x, y, o);
  EXPECT_TRUE(h.interrupted);
  EXPECT_EQ(h.step_loss.size(), 1u);
  EXPECT_TRUE(h.epoch.empty());
  stop.clear();
  const History again = m->fit(x, y, o);
  EXPECT_FALSE(again.interrupted);
  EXPECT_EQ(again.step_loss.size(), static_cast<size_t>(kTotalSteps));
}

}  // namespace
}  // namespace mixtrain
