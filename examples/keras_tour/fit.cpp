// Keras tour 1: a Sequential model trained with fit() and evaluated (docs/KERAS.md shows the Keras program).
#include <cstdio>

#include "data.h"
#include "mixtrain/train/keras.h"

using namespace mixtrain;

int main() {
  auto [x, y] = make_blobs(1200, 1);
  Model model;
  model.emplace<Dense>(32, "relu", std::nullopt, true, "hidden");
  model.emplace<Dense>(3, "linear", std::nullopt, true, "logits");
  model.compile(make_optimizer("adam", 1e-2f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  History history = model.fit(x, y, {.epochs = 5, .batch_size = 32, .validation_split = 0.2});
  const double accuracy = model.evaluate(x, y).accuracy;
  std::printf("val_accuracy %.4f, accuracy %.4f\n", history.history["val_accuracy"].back(), accuracy);
  return accuracy > 0.95 ? 0 : 1;
}
