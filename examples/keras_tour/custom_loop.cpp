// Keras tour 2: a custom training loop under mixed_float16 with GradientTape and loss scaling.
#include <cstdio>

#include "data.h"
#include "mixtrain/train/keras.h"

using namespace mixtrain;

int main() {
  set_global_policy("mixed_float16");
  auto [x, y] = make_blobs(1280, 2);
  Model model;
  model.emplace<Dense>(32, "relu");
  model.emplace<Dense>(3, "linear", dtype_arg("float32"));  // float32 logits, as Keras advises
  model.build_for({8});
  LossScaleOptimizer optimizer(make_optimizer("adam", 1e-2f));
  const Loss loss_fn("sparse_categorical_crossentropy", /*from_logits=*/true);
  const std::vector<Var> vars = model.trainable_weights();
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int64_t i = 0; i < 1280; i += 32) {
      GradientTape tape;
      Var logits = model.call(Var(x.slice(0, i, i + 32)), {.training = true});
      Var loss = loss_fn(logits, y.slice(0, i, i + 32));
      std::vector<Tensor> grads = tape.gradient(optimizer.scale_loss(loss), vars);
      optimizer.apply(grads, vars);  // unscales; skips the step if a gradient overflowed
    }
  }
  model.compile(make_optimizer("adam", 1e-3f), loss_fn, {"accuracy"});
  const double accuracy = model.evaluate(x, y).accuracy;
  std::printf("accuracy %.4f\n", accuracy);
  return accuracy > 0.95 ? 0 : 1;
}
