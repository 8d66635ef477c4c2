// save_weights / load_weights: weights by path, into a model built afresh in the same process.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "blobs.h"
#include "mixtrain/io/safetensors.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/weights_file.h"

namespace mixtrain {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("mixtrain_weights_" + name)).string();
}

std::unique_ptr<Model> mlp(uint64_t seed, int64_t hidden = 16) {
  auto m = std::make_unique<Model>("mlp", seed);
  m->emplace<Dense>(hidden, "relu");
  m->emplace<Dense>(3);
  return m;
}

bool same_values(const Model& a, const Model& b) {
  const auto wa = a.weights(), wb = b.weights();
  if (wa.size() != wb.size()) return false;
  for (size_t i = 0; i < wa.size(); ++i) {
    const Tensor x = wa[i].value().to(DType::kFloat32), y = wb[i].value().to(DType::kFloat32);
    if (x.shape() != y.shape()) return false;
    for (int64_t j = 0; j < x.numel(); ++j)
      if (x.data<float>()[j] != y.data<float>()[j]) return false;
  }
  return true;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Weights, AFreshModelInTheSameProcessLoadsTrainedWeights) {
  auto [x, y] = train_test::blobs(300, 3);
  auto trained = mlp(1);
  trained->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  trained->fit(x, y, {.epochs = 3, .batch_size = 32});
  const std::string path = temp_path("fresh.safetensors");
  save_weights(*trained, path);

  auto fresh = mlp(2);  // other initial weights, built after the first model: same layer names
  const LoadWeightsReport r = load_weights(*fresh, path);  // unbuilt: built for the stored input shape
  EXPECT_EQ(r.loaded, (std::vector<std::string>{"dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"}));
  EXPECT_TRUE(r.skipped.empty());
  EXPECT_TRUE(same_values(*trained, *fresh));
  const Tensor pa = trained->predict(x), pb = fresh->predict(x);
  for (int64_t i = 0; i < pa.numel(); ++i) ASSERT_EQ(pa.data<float>()[i], pb.data<float>()[i]);
  fresh->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  EXPECT_GT(fresh->evaluate(x, y).accuracy, 0.9);
  std::remove(path.c_str());
}

TEST(Weights, ByOrderIgnoresNamesByNameMatchesPaths) {
  auto source = mlp(1);
  source->build_for({8});
  const std::string path = temp_path("order.safetensors");
  save_weights(*source, path);

  // Other layer names, same structure: by order loads, by name finds nothing and leaves every weight.
  Model renamed("renamed", 5);
  renamed.emplace<Dense>(16, "relu", std::nullopt, true, "hidden");
  renamed.emplace<Dense>(3, "linear", std::nullopt, true, "logits");
  renamed.build_for({8});
  const LoadWeightsReport by_name = load_weights(renamed, path, /*by_name=*/true);
  EXPECT_TRUE(by_name.loaded.empty());
  EXPECT_EQ(by_name.skipped.size(), 4u);
  EXPECT_FALSE(same_values(*source, renamed));
  load_weights(renamed, path);
  EXPECT_TRUE(same_values(*source, renamed));

  // by_name: a model sharing one layer's path takes that layer only.
  Model partial("partial", 6);
  partial.emplace<Dense>(16, "relu");                                  // "dense": in the file
  partial.emplace<Dense>(3, "linear", std::nullopt, true, "new_head");  // not in the file
  partial.build_for({8});
  const Tensor head_before = partial.layers()[1]->weights()[0].value().clone();
  const LoadWeightsReport r = load_weights(partial, path, /*by_name=*/true);
  EXPECT_EQ(r.loaded, (std::vector<std::string>{"dense/kernel", "dense/bias"}));
  EXPECT_EQ(r.skipped.size(), 2u);
  EXPECT_EQ(partial.layers()[1]->weights()[0].value().at(0), head_before.at(0));
  EXPECT_EQ(partial.layers()[0]->weights()[0].value().at(3), source->layers()[0]->weights()[0].value().at(3));
  std::remove(path.c_str());
}

TEST(Weights, MismatchesNameTheFileAndTheWeightAndChangeNothing) {
  auto source = mlp(1);
  source->build_for({8});
  const std::string path = temp_path("mismatch.safetensors");
  save_weights(*source, path);

  auto wider = mlp(3, /*hidden=*/12);
  wider->build_for({8});
  const Tensor before = wider->weights()[0].value().clone();
  const std::string msg = error_of([&] { load_weights(*wider, path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("'dense/kernel'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
  EXPECT_EQ(wider->weights()[0].value().at(0), before.at(0));  // the load validated before writing

  // skip_mismatch: the shapes that differ are skipped, the others load.
  const LoadWeightsReport r = load_weights(*wider, path, /*by_name=*/true, /*skip_mismatch=*/true);
  EXPECT_EQ(r.loaded, (std::vector<std::string>{"dense_1/bias"}));
  EXPECT_EQ(r.skipped.size(), 3u);

  Model deeper("deeper", 1);
  deeper.emplace<Dense>(16, "relu");
  deeper.emplace<Dense>(16, "relu");
  deeper.emplace<Dense>(3);
  deeper.build_for({8});
  const std::string count = error_of([&] { load_weights(deeper, path); });
  EXPECT_NE(count.find("holds 4 weights"), std::string::npos) << count;

  const std::string missing = error_of([&] { load_weights(deeper, temp_path("no_such_file")); });
  EXPECT_NE(missing.find("no_such_file"), std::string::npos) << missing;
  Model unbuilt("unbuilt", 1);
  unbuilt.emplace<Dense>(3);
  EXPECT_NE(error_of([&] { save_weights(unbuilt, path); }).find("not built"), std::string::npos);
  std::remove(path.c_str());
}

TEST(Weights, ACheckpointsWeightsLoad) {
  auto [x, y] = train_test::blobs(90, 4);
  auto trained = mlp(1);
  trained->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  trained->fit(x, y, {.epochs = 1, .batch_size = 30});
  const std::string path = temp_path("ckpt.safetensors");
  save_checkpoint(path, *trained, {});
  auto fresh = mlp(9);
  load_weights(*fresh, path);  // the optimizer and Rng entries are not weights
  EXPECT_TRUE(same_values(*trained, *fresh));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace mixtrain
