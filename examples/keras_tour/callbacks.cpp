// Keras tour 4: fit() with callbacks: early stopping, a plateau schedule and a checkpoint; one line per epoch.
#include <iostream>

#include "data.h"
#include "mixtrain/train/keras.h"

using namespace mixtrain;

int main() {
  auto [x, y] = make_blobs(1200, 4);
  Model model;
  model.emplace<Dense>(32, "relu");
  model.emplace<Dense>(3);
  model.compile(make_optimizer("adam", 1e-2f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  EarlyStopping early_stopping(EarlyStoppingOptions().with_patience(2).with_restore_best_weights(true));
  ReduceLROnPlateau reduce_lr({.monitor = "val_loss", .factor = 0.5, .patience = 1});
  CheckpointCallback checkpoint("tour-{epoch}.safetensors");
  History history = model.fit(x, y, {.epochs = 20, .batch_size = 32, .validation_split = 0.2,
                                     .callbacks = {&early_stopping, &reduce_lr, &checkpoint}, .verbose = 2});
  std::cout << "epochs run " << history.history["loss"].size() << ", last learning rate "
            << history.history["learning_rate"].back() << "\n";
  return model.evaluate(x, y).accuracy > 0.95 ? 0 : 1;
}
