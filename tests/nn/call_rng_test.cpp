// A training call without a random generator (`model.call(x, {.training = true})`, Keras' `model(x, training=True)`)
// draws its dropout masks from the network's own stream (a Model's: its dropout stream, the one fit() uses), so a
// custom loop with Dropout needs no generator of its own; a Dropout layer called alone still asks for one, and
// says how to pass it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/sequential.h"

namespace mixtrain {
namespace {

Tensor ones(int64_t rows, int64_t cols) {
  return Tensor::from_floats({rows, cols}, std::vector<float>(static_cast<size_t>(rows * cols), 1.0f));
}

int zeros_in(const Tensor& t) {
  int n = 0;
  for (float v : t.to_floats()) n += v == 0.0f;
  return n;
}

TEST(TrainingCallRng, ANetworkSuppliesMasksToATrainingCall) {
  Sequential net;
  net.emplace<Dropout>(0.5f);
  Rng rng(1);
  net.build({64}, rng);
  const Tensor a = net.call(Var(ones(4, 64)), {.training = true}).value();
  const Tensor b = net.call(Var(ones(4, 64)), {.training = true}).value();
  // Half the 256 units dropped, give or take: masks were drawn, and kept units are scaled by 1 / (1 - 0.5).
  EXPECT_GT(zeros_in(a), 64);
  EXPECT_LT(zeros_in(a), 192);
  for (float v : a.to_floats()) EXPECT_TRUE(v == 0.0f || v == 2.0f) << v;
  // The stream moves on: the second call's mask is another one.
  EXPECT_NE(a.to_floats(), b.to_floats());
  // Inference calls are untouched.
  EXPECT_EQ(zeros_in(net.call(Var(ones(4, 64))).value()), 0);
}

TEST(TrainingCallRng, ADropoutLayerAloneSaysHowToPassAGenerator) {
  Dropout d(0.5f);
  try {
    d(Var(ones(2, 8)), {.training = true});
    FAIL() << "a training call without a generator was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".rng = &rng"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mixtrain
