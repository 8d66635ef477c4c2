// Training with Adam's moments in bfloat16 (AdamOptions::optimizer_state): an MLP under mixed_bfloat16 with bfloat16
// state and stochastic rounding learns the blobs as float32 does, and checkpoints keep the bfloat16 moments: a run
// resumed from one gives the uninterrupted run's bits, and a checkpoint of the other state dtype is refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "blobs.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/optim/adam.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"
#include "quiet_policy_test.h"

namespace mixtrain {
namespace {

using train_test::blobs;
namespace fs = std::filesystem;

class BFloat16StateTraining : public QuietPolicyTest {};

AdamOptions state_options(bool bfloat16_state) {
  AdamOptions o;
  if (!bfloat16_state) return o;
  o.optimizer_state = DType::kBFloat16;
  o.stochastic_rounding = true;
  o.rounding_seed = 17;
  return o;
}

// Two hidden Dense layers under `policy`, float32 logits, Adam with the given state.
std::unique_ptr<Model> mlp(const char* policy, bool bfloat16_state) {
  auto m = std::make_unique<Model>("mlp", 5);
  m->emplace<Dense>(32, "relu", dtype_arg(policy));
  m->emplace<Dense>(16, "relu", dtype_arg(policy));
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  m->compile(std::make_unique<Adam>(3e-3f, state_options(bfloat16_state)),
             Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  m->build_for(Shape{8});
  return m;
}

FitOptions fit_options(int epochs, int initial_epoch = 0) {
  FitOptions o;
  o.epochs = epochs;
  o.initial_epoch = initial_epoch;
  o.batch_size = 64;
  o.verbose = 0;
  return o;
}

double trained_accuracy(const char* policy, bool bfloat16_state) {
  auto [x, y] = blobs(1536, 31);
  auto [xt, yt] = blobs(600, 32);
  auto m = mlp(policy, bfloat16_state);
  m->fit(x, y, fit_options(3));
  return m->evaluate(xt, yt).accuracy;
}

// The tolerance of the other tracking tests (fp8_training_test.cpp): within 2 points of the reference's accuracy on
// the blobs, which overlap a little, so a run that loses information shows.
TEST_F(BFloat16StateTraining, AnMlpUnderMixedBfloat16WithBfloat16StateTracksFloat32) {
  const double float32 = trained_accuracy("float32", false);
  ASSERT_GT(float32, 0.9);
  EXPECT_NEAR(trained_accuracy("mixed_bfloat16", true), float32, 0.02);
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("mixtrain_bf16_state_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Two epochs straight, and one epoch, a checkpoint, a new model loading it and the second epoch: the same bits in
// every weight and moment, the moments bfloat16 in the file.
TEST_F(BFloat16StateTraining, ACheckpointResumesBitIdentically) {
  TempDir dir;
  auto [x, y] = blobs(640, 7);
  auto whole = mlp("mixed_bfloat16", true);
  whole->fit(x, y, fit_options(2));

  auto first = mlp("mixed_bfloat16", true);
  first->fit(x, y, fit_options(1));
  CheckpointInfo info;
  info.epoch = 1;
  save_checkpoint(dir.file("half.safetensors"), *first, info);
  auto resumed = mlp("mixed_bfloat16", true);
  const CheckpointInfo loaded = load_checkpoint(dir.file("half.safetensors"), *resumed);
  resumed->fit(x, y, fit_options(2, loaded.epoch));

  for (size_t i = 0; i < whole->weights().size(); ++i)
    EXPECT_TRUE(same_bytes(whole->weights()[i].value(), resumed->weights()[i].value())) << whole->weights()[i].name();
  const NamedTensors a = whole->optimizer().state(), b = resumed->optimizer().state();
  ASSERT_EQ(a.size(), b.size());
  int moments = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(same_bytes(a[i].second, b[i].second)) << a[i].first;
    if (a[i].first.ends_with("/m") || a[i].first.ends_with("/v")) {
      EXPECT_EQ(a[i].second.dtype(), DType::kBFloat16) << a[i].first;
      ++moments;
    }
  }
  EXPECT_EQ(moments, 12);  // m and v of 3 kernels and 3 biases
}

// A float32-state checkpoint loaded by a bfloat16-state model (and the reverse) is refused with one line naming the
// entry, both dtypes and the flag, before anything changes.
TEST_F(BFloat16StateTraining, ACheckpointOfTheOtherStateDtypeIsRefused) {
  TempDir dir;
  auto [x, y] = blobs(128, 8);
  for (bool saved_bfloat16 : {false, true}) {
    auto saved = mlp("mixed_bfloat16", saved_bfloat16);
    saved->fit(x, y, fit_options(1));
    save_checkpoint(dir.file("c.safetensors"), *saved, CheckpointInfo{});
    auto other = mlp("mixed_bfloat16", !saved_bfloat16);
    const Tensor before = other->weights()[0].value().clone();
    try {
      load_checkpoint(dir.file("c.safetensors"), *other);
      ADD_FAILURE() << "loaded a checkpoint of the other optimizer state";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      const std::string what = e.what();
      EXPECT_NE(what.find("bfloat16"), std::string::npos) << what;
      EXPECT_NE(what.find("float32"), std::string::npos) << what;
      EXPECT_NE(what.find("--optimizer-state"), std::string::npos) << what;
    }
    EXPECT_TRUE(same_bytes(before, other->weights()[0].value()));
  }
}

}  // namespace
}  // namespace mixtrain
