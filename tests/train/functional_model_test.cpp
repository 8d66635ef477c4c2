// A functional (residual) Model trains, saves and reloads by weight path into a second model built in the
// same process.
#include <gtest/gtest.h>

#include <filesystem>

#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"

#include "blobs.h"

namespace mixtrain {
namespace {

using train_test::blobs;

std::unique_ptr<Model> residual_model(uint64_t seed, const std::string& policy) {
  set_global_policy(policy);
  SymbolicTensor x = Input({8});
  SymbolicTensor h = (*make_layer<Dense>(8, "relu"))(x);
  SymbolicTensor r = (*make_layer<Add>())({x, h});
  SymbolicTensor out = (*make_layer<Dense>(3, "linear", dtype_arg("float32")))(r);
  auto m = std::make_unique<Model>(std::vector<SymbolicTensor>{x}, std::vector<SymbolicTensor>{out}, "resmlp", seed);
  set_global_policy("float32");
  m->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

TEST(FunctionalModel, TrainsUnderEveryPolicy) {
  auto [x, y] = blobs(600, 1);
  for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16"}) {
    auto m = residual_model(3, policy);
    FitOptions o;
    o.epochs = 4;
    o.batch_size = 32;
    History h = m->fit(x, y, o);
    EXPECT_LT(h.history["loss"].back(), h.history["loss"].front()) << policy;
    EXPECT_GT(m->evaluate(x, y).accuracy, 0.95) << policy;
  }
}

TEST(FunctionalModel, CheckpointLoadsIntoASecondModelOfTheSameProcess) {
  auto [x, y] = blobs(300, 2);
  auto first = residual_model(5, "float32");
  FitOptions o;
  o.epochs = 1;
  o.batch_size = 32;
  first->fit(x, y, o);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("functional_ckpt_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  save_checkpoint(path, *first, CheckpointInfo{});
  auto second = residual_model(6, "float32");  // other initial weights, built later in the process
  load_checkpoint(path, *second);
  std::filesystem::remove(path);
  EXPECT_EQ(first->predict(x).to_floats(), second->predict(x).to_floats());
}

TEST(FunctionalModel, IntegerInputsStayIntegersUntilALayerCastsThem) {
  // Labels as features: an int32 batch reaches Dense, which casts it to its compute dtype.
  std::vector<int32_t> ids = {0, 1, 2, 1, 0, 2, 1, 1};
  Tensor xi = Tensor::from_ints({1, 8}, ids);
  auto m = residual_model(1, "float32");
  m->build_for({8});
  Tensor pi = m->predict(xi);
  Tensor pf = m->predict(xi.to(DType::kFloat32));
  EXPECT_EQ(pi.to_floats(), pf.to_floats());
}

}  // namespace
}  // namespace mixtrain
