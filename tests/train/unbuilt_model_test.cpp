// A model used before it is built: Keras raises "not built yet" where a C++ user would otherwise get an empty
// weight list and a custom loop that trains nothing. weights(), trainable_weights(), non_trainable_weights(),
// count_params() and summary() say so and how to build; an optimizer given no variables refuses the update.
#include <gtest/gtest.h>

#include <functional>
#include <sstream>
#include <string>

#include "blobs.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/optim/parameter_arena.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/weights_file.h"

namespace mixtrain {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::unique_ptr<Model> unbuilt_mlp() {
  auto m = std::make_unique<Model>("mlp", 1);
  m->emplace<Dense>(16, "relu");
  m->emplace<Dense>(3);
  return m;
}

FitOptions one_quiet_epoch() {
  FitOptions o;
  o.verbose = 0;
  return o;
}

// Runs `use` and expects the "not built yet" Error naming the model, what was asked and how to build it.
void expect_not_built(const std::function<void()>& use, const std::string& what) {
  SCOPED_TRACE(what);
  try {
    use();
    FAIL() << what << " answered on a model that is not built";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_TRUE(contains(e.message(), "model 'mlp'." + what)) << e.message();
    EXPECT_TRUE(contains(e.message(), "the model is not built yet")) << e.message();
    EXPECT_TRUE(contains(e.hint(), "build(input_shape)")) << e.hint();
    EXPECT_TRUE(contains(e.hint(), "build_for(sample_shape)")) << e.hint();
    EXPECT_TRUE(contains(e.hint(), "fit it first")) << e.hint();
  }
}

TEST(UnbuiltModel, WeightsCountAndSummaryExplainHowToBuild) {
  auto m = unbuilt_mlp();
  expect_not_built([&] { m->weights(); }, "weights()");
  expect_not_built([&] { m->trainable_weights(); }, "trainable_weights()");
  expect_not_built([&] { m->non_trainable_weights(); }, "non_trainable_weights()");
  expect_not_built([&] { m->count_params(); }, "count_params()");
  std::ostringstream out;
  expect_not_built([&] { m->summary(out); }, "summary()");
  EXPECT_EQ(out.str(), "") << "a half-written table";
}

TEST(UnbuiltModel, EachWayOfBuildingAnswers) {
  auto [x, y] = train_test::blobs(64, 1);
  auto by_build_for = unbuilt_mlp();
  by_build_for->build_for({8});
  EXPECT_EQ(by_build_for->count_params(), 8 * 16 + 16 + 16 * 3 + 3);
  EXPECT_EQ(by_build_for->trainable_weights().size(), 4u);

  auto by_predict = unbuilt_mlp();
  by_predict->predict(x);  // called on data
  EXPECT_EQ(by_predict->weights().size(), 4u);

  auto by_fit = unbuilt_mlp();
  by_fit->compile(make_optimizer("sgd", 0.1f), Loss("sparse_categorical_crossentropy", true));
  by_fit->fit(x, y, one_quiet_epoch());
  std::ostringstream out;
  by_fit->summary(out);
  EXPECT_TRUE(contains(out.str(), "Total params: 195")) << out.str();

  // A functional model knows its input shape from Input(): built on construction, as in Keras.
  SymbolicTensor in = Input({8});
  Model functional({in}, {(*make_layer<Dense>(3))(in)}, "functional", 1);
  EXPECT_EQ(functional.count_params(), 27);
}

TEST(UnbuiltModel, CheckpointsAndWeightFilesBuildTheModelTheyLoadInto) {
  auto [x, y] = train_test::blobs(64, 1);
  auto trained = unbuilt_mlp();
  trained->compile(make_optimizer("sgd", 0.1f), Loss("sparse_categorical_crossentropy", true));
  trained->fit(x, y, one_quiet_epoch());
  const std::string dir = ::testing::TempDir();
  save_weights(*trained, dir + "/unbuilt_model_test.weights.safetensors");
  save_checkpoint(dir + "/unbuilt_model_test.ckpt", *trained, CheckpointInfo{});

  auto fresh = unbuilt_mlp();
  load_weights(*fresh, dir + "/unbuilt_model_test.weights.safetensors");
  EXPECT_EQ(fresh->weights()[0].value().to_floats(), trained->weights()[0].value().to_floats());
  auto resumed = unbuilt_mlp();
  resumed->compile(make_optimizer("sgd", 0.1f), Loss("sparse_categorical_crossentropy", true));
  load_checkpoint(dir + "/unbuilt_model_test.ckpt", *resumed);
  EXPECT_EQ(resumed->weights()[2].value().to_floats(), trained->weights()[2].value().to_floats());

  // Saving needs weights: the save refuses with its own message, before any weights() call.
  auto never_built = unbuilt_mlp();
  try {
    save_weights(*never_built, dir + "/never.safetensors");
    FAIL() << "an unbuilt model was saved";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.message(), "is not built")) << e.message();
  }
}

// An update of no variables (a list gathered from layers before they were built) would train nothing: every
// optimizer, wrapped in a LossScaleOptimizer or not, refuses it through apply() and through an arena.
TEST(UnbuiltModel, AnOptimizerGivenNoVariablesRefusesTheUpdate) {
  for (const char* name : {"sgd", "adam", "rmsprop"}) {
    for (bool wrap : {false, true}) {
      SCOPED_TRACE(std::string(name) + (wrap ? " in a LossScaleOptimizer" : ""));
      std::unique_ptr<Optimizer> opt = make_optimizer(name, 0.1f);
      if (wrap) opt = std::make_unique<LossScaleOptimizer>(std::move(opt));
      for (bool arena : {false, true}) {
        try {
          if (arena) {
            ParameterArena empty(std::vector<Var>{});
            opt->apply_arena(empty);
          } else {
            opt->apply({}, {});
          }
          FAIL() << "an update of no variables was accepted" << (arena ? " (arena)" : "");
        } catch (const Error& e) {
          EXPECT_TRUE(contains(e.message(), "no variables to update")) << e.message();
          EXPECT_TRUE(contains(e.hint(), "build_for")) << e.hint();
        }
      }
      EXPECT_EQ(opt->iterations(), 0) << "a refused update counted as a step";
    }
  }
}

}  // namespace
}  // namespace mixtrain
