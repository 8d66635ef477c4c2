// Training bfloat16 master weights with Kahan compensation (AdamOptions::kahan_summation): checkpoints keep the
// compensation, so a run resumed from one gives the uninterrupted run's bits; a checkpoint saved without it (or with
// it, for an optimizer that keeps none) is refused in one line naming the flag, before anything changes.
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

class KahanTraining : public QuietPolicyTest {};

// A scratch directory per test, as the other checkpoint tests of this folder keep one.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("mixtrain_kahan_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Two hidden Dense layers with bfloat16 variables, float32 logits, Adam with or without Kahan compensation.
std::unique_ptr<Model> mlp(bool kahan) {
  AdamOptions o;
  o.kahan_summation = kahan;
  auto m = std::make_unique<Model>("mlp", 5);
  m->emplace<Dense>(32, "relu", dtype_arg("bfloat16"));
  m->emplace<Dense>(16, "relu", dtype_arg("bfloat16"));
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  m->compile(std::make_unique<Adam>(3e-3f, o), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
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

// Two epochs straight, and one epoch, a checkpoint, a new model loading it and the second epoch: the same bits in
// every weight, moment and compensation, the compensation bfloat16 in the file and not all zero.
TEST_F(KahanTraining, ACheckpointResumesBitIdentically) {
  TempDir dir;
  auto [x, y] = blobs(640, 7);
  auto whole = mlp(true);
  whole->fit(x, y, fit_options(2));

  auto first = mlp(true);
  first->fit(x, y, fit_options(1));
  CheckpointInfo info;
  info.epoch = 1;
  save_checkpoint(dir.file("half.safetensors"), *first, info);
  auto resumed = mlp(true);
  const CheckpointInfo loaded = load_checkpoint(dir.file("half.safetensors"), *resumed);
  resumed->fit(x, y, fit_options(2, loaded.epoch));

  for (size_t i = 0; i < whole->weights().size(); ++i)
    EXPECT_TRUE(same_bytes(whole->weights()[i].value(), resumed->weights()[i].value())) << whole->weights()[i].name();
  const NamedTensors a = whole->optimizer().state(), b = resumed->optimizer().state();
  ASSERT_EQ(a.size(), b.size());
  int compensations = 0;
  bool carries = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(same_bytes(a[i].second, b[i].second)) << a[i].first;
    if (!a[i].first.ends_with("/kahan")) continue;
    EXPECT_EQ(a[i].second.dtype(), DType::kBFloat16) << a[i].first;
    ++compensations;
    const Tensor c = a[i].second.to(DType::kFloat32);
    for (int64_t k = 0; k < c.numel(); ++k) carries = carries || c.data<float>()[k] != 0.0f;
  }
  EXPECT_EQ(compensations, 6);  // 3 kernels and 3 biases
  EXPECT_TRUE(carries);
}

// A checkpoint without compensation loaded by a model that keeps one (and the reverse) is refused with one line naming
// the entry and the flag, before anything changes.
TEST_F(KahanTraining, ACheckpointOfTheOtherRoundingIsRefused) {
  TempDir dir;
  auto [x, y] = blobs(128, 8);
  for (bool saved_kahan : {false, true}) {
    auto saved = mlp(saved_kahan);
    saved->fit(x, y, fit_options(1));
    save_checkpoint(dir.file("c.safetensors"), *saved, CheckpointInfo{});
    auto other = mlp(!saved_kahan);
    const Tensor before = other->weights()[0].value().clone();
    try {
      load_checkpoint(dir.file("c.safetensors"), *other);
      ADD_FAILURE() << "loaded a checkpoint of the other rounding";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      const std::string what = e.what();
      EXPECT_NE(what.find("Kahan compensation"), std::string::npos) << what;
      EXPECT_NE(what.find("/kahan"), std::string::npos) << what;
      EXPECT_NE(what.find("--master-rounding"), std::string::npos) << what;
    }
    EXPECT_TRUE(same_bytes(before, other->weights()[0].value()));
  }
}

}  // namespace
}  // namespace mixtrain
