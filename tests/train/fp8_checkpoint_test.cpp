// Checkpoints under the float8 policies: every FP8 layer's amax histories and scales travel with the weights, so a
// mixed_float8 fit killed and resumed from its --save-every checkpoint ends with the same bytes as an uninterrupted
// one, histories included; a checkpoint without them (an older version's) still loads, and a state that does not fit
// the model is refused naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>

#include "blobs.h"
#include "kill_after.h"
#include "mixtrain/io/safetensors.h"
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/precision/fp8_gemm_scales.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/model_file.h"
#include "quiet_policy_test.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;
using train_test::blobs;
using train_test::Killed;
using train_test::KillAfter;

// 120 rows, batches of 16: 8 steps per epoch (the last of 8 rows), 3 epochs.
constexpr int kEpochs = 3;
constexpr int64_t kStepsPerEpoch = 8;

class Fp8Checkpoint : public QuietPolicyTest {
 protected:
  void SetUp() override {
    QuietPolicyTest::SetUp();
    set_fp8_recipe(Fp8Recipe::kDelayed);
    dir_ = fs::temp_directory_path() / ("mixtrain_fp8_ckpt_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::remove_all(dir_);
    set_fp8_recipe(Fp8Recipe::kDelayed);
    QuietPolicyTest::TearDown();
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// Two FP8 Dense layers (the recipe in force now), float32 logits, Adam.
std::unique_ptr<Model> make_model(const char* policy = "mixed_float8") {
  auto m = std::make_unique<Model>("fp8", 11);
  m->emplace<Dense>(32, "relu", dtype_arg(policy));
  m->emplace<Dense>(16, "relu", dtype_arg(policy));
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  m->compile(make_optimizer("adam", 3e-3f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

FitOptions fit_options() {
  FitOptions o;
  o.epochs = kEpochs;
  o.batch_size = 16;
  o.verbose = 0;
  return o;
}

// Weights, optimizer state and every layer's state besides its variables, by name.
NamedTensors state_of(const Model& m) {
  NamedTensors out;
  for (const Var& w : m.weights()) out.emplace_back(w.name(), w.value().clone());
  for (auto& [k, t] : const_cast<Model&>(m).optimizer().state()) out.emplace_back("optimizer/" + k, t.clone());
  for (const auto& l : m.layers())
    for (const auto& [k, t] : l->extra_state()) out.emplace_back(l->name() + "/" + k, t.clone());
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Names of the entries whose bytes differ (all of them when the lists differ in names).
std::vector<std::string> differing(const NamedTensors& a, const NamedTensors& b) {
  std::vector<std::string> out;
  if (a.size() != b.size()) return {"(" + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " entries)"};
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || !same_bytes(a[i].second, b[i].second)) out.push_back(a[i].first);
  return out;
}

// Fits (resuming from ckpt when asked), saving every save_every steps, until killed after global step kill_at
// (0: to the end); the final state when the fit ended by itself.
std::optional<NamedTensors> run_until(const std::string& ckpt, int64_t save_every, int64_t kill_at, bool resume) {
  auto [x, y] = blobs(120, 7);
  auto m = make_model();
  FitOptions o = fit_options();
  if (resume) o.resume = load_checkpoint(ckpt, *m).fit_state;
  CheckpointCallback saver(ckpt, 1, "", save_every);
  KillAfter killer(kill_at, kStepsPerEpoch);
  o.callbacks = {&saver, &killer};
  try {
    m->fit(x, y, o);
    return state_of(*m);
  } catch (const Killed&) {
    return std::nullopt;
  }
}

NamedTensors uninterrupted() {
  auto [x, y] = blobs(120, 7);
  auto m = make_model();
  m->fit(x, y, fit_options());
  return state_of(*m);
}

TEST_F(Fp8Checkpoint, KilledAndResumedMixedFloat8FitIsBitIdenticalHistoriesIncluded) {
  const NamedTensors full = uninterrupted();
  // 2 FP8 layers x 3 tensors x (history, scale), beside the weights and optimizer slots.
  int fp8_entries = 0;
  for (const auto& [name, t] : full) fp8_entries += name.find("/fp8/") != std::string::npos;
  ASSERT_EQ(fp8_entries, 12);
  // Mid-epoch (3, 13) and at an epoch's last step (8).
  for (int64_t k : {3, 8, 13}) {
    const std::string ckpt = file("k" + std::to_string(k) + ".safetensors");
    ASSERT_FALSE(run_until(ckpt, k, k, false).has_value());
    const SafetensorsFile f = load_safetensors(ckpt);
    ASSERT_TRUE(f.contains("layer_state/dense/fp8/grad/amax_history"));
    const Tensor& h = f.get("layer_state/dense_1/fp8/input/amax_history");
    EXPECT_EQ(h.shape(), Shape{1024});
    int filled = 0;
    for (int64_t i = 0; i < h.numel(); ++i) filled += h.data<float>()[i] > 0.0f;
    EXPECT_EQ(filled, k) << "one slot per update so far, the current one empty";
    const std::optional<NamedTensors> resumed = run_until(ckpt, k, 0, true);
    ASSERT_TRUE(resumed.has_value());
    EXPECT_EQ(differing(full, *resumed), std::vector<std::string>{}) << "killed after step " << k;
  }
}

// The block recipe keeps nothing between steps (each block's scale comes from the block itself): no layer state is
// saved, a fit killed and resumed ends with the uninterrupted fit's bytes, and a delayed-recipe checkpoint's
// histories are refused for layers built under the block recipe.
TEST_F(Fp8Checkpoint, BlockRecipeSavesNoStateAndResumesBitIdentically) {
  set_fp8_recipe(Fp8Recipe::kBlock);
  const NamedTensors full = uninterrupted();
  for (const auto& [name, t] : full) EXPECT_EQ(name.find("/fp8/"), std::string::npos) << name;
  for (int64_t k : {3, 8}) {
    const std::string ckpt = file("block" + std::to_string(k) + ".safetensors");
    ASSERT_FALSE(run_until(ckpt, k, k, false).has_value());
    for (const auto& [key, t] : load_safetensors(ckpt).tensors) EXPECT_NE(key.rfind("layer_state/", 0), 0u) << key;
    const std::optional<NamedTensors> resumed = run_until(ckpt, k, 0, true);
    ASSERT_TRUE(resumed.has_value());
    EXPECT_EQ(differing(full, *resumed), std::vector<std::string>{}) << "killed after step " << k;
  }
  set_fp8_recipe(Fp8Recipe::kDelayed);
  const std::string delayed = file("delayed.safetensors");
  ASSERT_FALSE(run_until(delayed, 4, 4, false).has_value());
  set_fp8_recipe(Fp8Recipe::kBlock);
  auto block = make_model();
  try {
    load_checkpoint(delayed, *block);
    ADD_FAILURE() << "histories for a block-recipe layer must be refused";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("block FP8 recipe"), std::string::npos) << e.what();
  }
}

// A checkpoint without layer_state/ entries (as versions before them wrote) loads as before: the layers keep fresh
// scales, so the resumed run departs from the uninterrupted one; this is what the entries prevent.
TEST_F(Fp8Checkpoint, CheckpointWithoutHistoriesLoadsAndResumesWithFreshScales) {
  const NamedTensors full = uninterrupted();
  const std::string ckpt = file("ckpt.safetensors");
  ASSERT_FALSE(run_until(ckpt, 5, 5, false).has_value());
  SafetensorsFile f = load_safetensors(ckpt);
  NamedTensors older;
  for (const auto& [key, t] : f.tensors)
    if (key.rfind("layer_state/", 0) != 0) older.emplace_back(key, t);
  std::map<std::string, std::string> meta;
  for (const auto& [key, value] : f.metadata)
    if (key.rfind("checksum/", 0) != 0) meta[key] = value;
  ASSERT_LT(older.size(), f.tensors.size());
  save_safetensors(ckpt, older, meta);
  auto probe = make_model();
  EXPECT_NO_THROW(load_checkpoint(ckpt, *probe));
  const std::optional<NamedTensors> resumed = run_until(ckpt, 5, 0, true);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_FALSE(differing(full, *resumed).empty()) << "fresh scales after the resume must change the run";
}

// Histories given to a layer that cannot take them are refused by name, leaving the model as it was.
TEST_F(Fp8Checkpoint, StateThatDoesNotFitIsRefused) {
  const std::string ckpt = file("ckpt.safetensors");
  ASSERT_FALSE(run_until(ckpt, 4, 4, false).has_value());
  const auto expect_refused = [&](Model& m, const std::string& path, const std::string& needle) {
    try {
      load_checkpoint(path, m);
      ADD_FAILURE() << "load should refuse: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.what();
    }
  };
  set_fp8_recipe(Fp8Recipe::kCurrent);
  auto current = make_model();
  expect_refused(*current, ckpt, "current FP8 recipe");
  set_fp8_recipe(Fp8Recipe::kDelayed);

  // A history of another length, a negative amax, an entry for no layer: damaged files with valid checksums.
  const SafetensorsFile f = load_safetensors(ckpt);
  const auto rewritten = [&](const std::string& name, const std::string& key, const Tensor& replacement) {
    NamedTensors tensors;
    for (const auto& [k, t] : f.tensors)
      if (k != key) tensors.emplace_back(k, t);
    tensors.emplace_back(key, replacement);
    std::map<std::string, std::string> meta;
    for (const auto& [k, v] : f.metadata)
      if (k.rfind("checksum/", 0) != 0) meta[k] = v;
    save_safetensors(file(name), tensors, meta);
    return file(name);
  };
  const std::string history = "layer_state/dense/fp8/weight/amax_history";
  auto m = make_model();
  expect_refused(*m, rewritten("short.safetensors", history, Tensor::zeros(Shape{16}, DType::kFloat32)),
                 "expected float32 (1024)");
  Tensor negative = f.get(history).clone();
  negative.data<float>()[3] = -1.0f;
  expect_refused(*m, rewritten("negative.safetensors", history, negative), "not a finite magnitude");
  expect_refused(*m, rewritten("stray.safetensors", "layer_state/nowhere/fp8/x", negative), "belongs to no layer");
  EXPECT_EQ(m->layers()[0]->extra_state().size(), 0u) << "a refused load changes nothing";
}

// The whole-model file and a Conv2D layer carry the same state: load_model gives back every history and scale.
TEST_F(Fp8Checkpoint, ModelFileAndConv2DKeepTheirHistories) {
  auto m = std::make_unique<Model>("conv", 3);
  m->emplace<Conv2D>(4, 3, 1, "same", "relu", true, dtype_arg("mixed_float8"));
  m->emplace<Flatten>();
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  m->compile(make_optimizer("adam", 1e-3f), Loss("sparse_categorical_crossentropy", true), {});
  Rng r(4);
  std::vector<float> pixels(32 * 6 * 6 * 2);
  for (float& p : pixels) p = r.normal();
  std::vector<int32_t> labels(32);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(i % 3);
  FitOptions o;
  o.epochs = 1;
  o.batch_size = 8;
  o.verbose = 0;
  m->fit(Tensor::from_floats({32, 6, 6, 2}, pixels), Tensor::from_ints({32}, labels), o);
  const Layer::LayerState saved = m->layers()[0]->extra_state();
  ASSERT_EQ(saved.size(), 6u);
  save_model(*m, file("conv.model.safetensors"));
  const std::unique_ptr<Model> loaded = load_model(file("conv.model.safetensors"));
  const Layer::LayerState back = loaded->layers()[0]->extra_state();
  ASSERT_EQ(back.size(), saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(back[i].first, saved[i].first);
    EXPECT_TRUE(same_bytes(back[i].second, saved[i].second)) << saved[i].first;
  }
}

}  // namespace
}  // namespace mixtrain
