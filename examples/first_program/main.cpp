// The README's first program: Fashion-MNIST under mixed_bfloat16, as a Keras user would write it.
#include <cstdio>

#include "mixtrain/train/keras.h"

using namespace mixtrain;

int main() {
  set_global_policy("mixed_bfloat16");  // bfloat16 compute, float32 weights; before the model is built
  DataSplits data = load_fashion_mnist();  // Debian's dataset-fashion-mnist: 60000 + 10000 images of 28x28
  Model model;
  model.emplace<Dense>(256, "relu");
  model.emplace<Dense>(10, "softmax", dtype_arg("float32"));  // the output layer stays float32
  model.compile(make_optimizer("adam", 1e-3f), Loss("sparse_categorical_crossentropy"), {"accuracy"});
  model.fit(data.train.x, data.train.y, {.epochs = 2, .batch_size = 128, .validation_split = 0.1});
  model.summary();  // each layer's compute and variable dtype
  const EvaluateResult test = model.evaluate(data.test.x, data.test.y);
  std::printf("test accuracy %.4f\n", test.accuracy);
  model.save("fashion_mlp.safetensors");  // architecture, optimizer and weights: load_model() reads it back
  return test.accuracy > 0.8 ? 0 : 1;
}
