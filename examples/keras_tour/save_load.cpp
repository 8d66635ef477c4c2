// Keras tour 5: save_weights, then load_weights into a model built afresh in the same process.
#include <cstdio>

#include "data.h"
#include "mixtrain/train/keras.h"

using namespace mixtrain;

std::unique_ptr<Model> build_model() {
  auto model = std::make_unique<Model>();
  model->emplace<Dense>(32, "relu", std::nullopt, true, "hidden");
  model->emplace<Dense>(3, "linear", std::nullopt, true, "logits");
  model->compile(make_optimizer("adam", 1e-2f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return model;
}

int main() {
  auto [x, y] = make_blobs(1200, 5);
  auto model = build_model();
  model->fit(x, y, {.epochs = 3, .batch_size = 32});
  save_weights(*model, "tour.weights.safetensors");
  auto restored = build_model();
  load_weights(*restored, "tour.weights.safetensors");
  const double before = model->evaluate(x, y).accuracy, after = restored->evaluate(x, y).accuracy;
  std::printf("accuracy %.4f, restored %.4f\n", before, after);
  return before == after && after > 0.95 ? 0 : 1;
}
