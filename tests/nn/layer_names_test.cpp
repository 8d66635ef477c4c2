// Layer names given at construction (Keras' name=), unique per model, and clear_session().
#include <gtest/gtest.h>

#include <memory>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/nn/sequential.h"
#include "mixtrain/nn/session.h"
#include "mixtrain/nn/transformer_layers.h"
#include "mixtrain/precision/hardware_check.h"

namespace mixtrain {
namespace {

TEST(LayerNames, EveryBuiltInLayerTakesANameAtConstruction) {
  const std::vector<std::shared_ptr<Layer>> layers = {
      std::make_shared<Dense>(4, "relu", std::nullopt, true, "l_dense"),
      std::make_shared<Activation>("relu", std::nullopt, "l_activation"),
      std::make_shared<Dropout>(0.5f, std::nullopt, "l_dropout"),
      std::make_shared<Softmax>(std::nullopt, "l_softmax"),
      std::make_shared<Flatten>(std::nullopt, "l_flatten"),
      std::make_shared<Conv2D>(2, 3, 1, "valid", "linear", true, std::nullopt, "l_conv"),
      std::make_shared<MaxPooling2D>(2, std::nullopt, "valid", std::nullopt, "l_max"),
      std::make_shared<AveragePooling2D>(2, std::nullopt, "valid", std::nullopt, "l_avg"),
      std::make_shared<GlobalAveragePooling2D>(std::nullopt, "l_gap"),
      std::make_shared<Add>(std::nullopt, "l_add"),
      std::make_shared<Concatenate>(-1, std::nullopt, "l_concat"),
      std::make_shared<Reshape>(std::vector<int64_t>{2, 2}, std::nullopt, "l_reshape"),
      std::make_shared<Embedding>(10, 4, std::nullopt, "l_embedding"),
      std::make_shared<PositionEmbedding>(8, std::nullopt, "l_position"),
      std::make_shared<LayerNormalization>(1e-3f, std::nullopt, "l_layernorm"),
      std::make_shared<BatchNormalization>(0.99f, 1e-3f, std::nullopt, "l_batchnorm"),
      std::make_shared<MultiHeadAttention>(MultiHeadAttentionOptions{.num_heads = 2, .key_dim = 2, .name = "l_mha"}),
  };
  for (const auto& l : layers) {
    EXPECT_EQ(l->name().substr(0, 2), "l_") << l->class_name();
    EXPECT_TRUE(l->has_explicit_name()) << l->class_name();
  }
  // Unnamed layers keep their kind until a model names them.
  EXPECT_EQ(Dense(4).name(), "dense");
  EXPECT_FALSE(Dense(4).has_explicit_name());
  EXPECT_THROW(Dense(4, "linear", std::nullopt, true, "a//b"), Error);
}

TEST(LayerNames, AGivenNameIsTheWeightPathAndSurvivesTheModel) {
  Sequential m;
  m.emplace<Dense>(8, "relu", std::nullopt, true, "hidden");
  m.emplace<Dense>(3);
  m.emplace<Dense>(3, "linear", std::nullopt, true, "head/logits");
  Rng rng(1);
  m.build({5}, rng);
  std::vector<std::string> names;
  for (const Var& w : m.weights()) names.push_back(w.name());
  EXPECT_EQ(names, (std::vector<std::string>{"hidden/kernel", "hidden/bias", "dense/kernel", "dense/bias",
                                             "head/logits/kernel", "head/logits/bias"}));
}

TEST(LayerNames, NamesAreUniquePerModelNotPerProcess) {
  auto build = [] {
    auto m = std::make_unique<Sequential>();
    m->emplace<Dense>(4);
    m->emplace<Dense>(4, "linear", std::nullopt, true, "out");
    m->emplace<Dense>(4);
    return m;
  };
  auto first = build();
  auto second = build();  // built later in the same process: the same names, so the same weight paths
  for (size_t i = 0; i < first->layers().size(); ++i) EXPECT_EQ(first->layers()[i]->name(), second->layers()[i]->name());
  EXPECT_EQ(second->layers()[2]->name(), "dense_1");
  // Two layers given one name in one model: refused, naming the model and the name.
  Sequential twice;
  twice.emplace<Dense>(4, "linear", std::nullopt, true, "same");
  try {
    twice.emplace<Dense>(4, "linear", std::nullopt, true, "same");
    FAIL() << "a repeated name was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'same'"), std::string::npos) << e.what();
  }
  // An unnamed layer never takes a given name: the automatic name moves on.
  Sequential mixed;
  mixed.emplace<Dense>(4, "linear", std::nullopt, true, "dense");
  mixed.emplace<Dense>(4);
  EXPECT_EQ(mixed.layers()[1]->name(), "dense_1");
}

TEST(ClearSession, ResetsTheGlobalPolicyAndTheTape) {
  set_precision_warning_sink([](const std::string&) {});
  set_global_policy("mixed_bfloat16");
  Var w(Tensor::from_floats({2}, {1, 2}), /*requires_grad=*/true);
  Var y = scale(w, 3.0f);  // recorded, never differentiated
  ASSERT_GT(tape_size(), 0u);
  Dense before(4);
  clear_session();
  EXPECT_EQ(global_policy().name(), "float32");
  EXPECT_EQ(tape_size(), 0u);
  EXPECT_EQ(Dense(4).compute_dtype(), DType::kFloat32);
  EXPECT_EQ(before.compute_dtype(), DType::kBFloat16);  // built layers keep their policy
  set_precision_warning_sink(nullptr);
}

}  // namespace
}  // namespace mixtrain
