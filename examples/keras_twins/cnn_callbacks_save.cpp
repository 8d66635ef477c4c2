// A newcomer's first program: a functional CNN on Fashion-MNIST under mixed_bfloat16 with callbacks, saved as one
// file, the session cleared, and the model loaded back without the code that built it.
// Its Keras 3 twin, line for line (scripts/keras_twin_lines.py counts both):
// keras-twin:
//   import keras
//   from keras import layers
//   keras.mixed_precision.set_global_policy("mixed_bfloat16")
//   (x, y), (x_test, y_test) = keras.datasets.fashion_mnist.load_data()
//   x, y, x_test = x[:6000, ..., None] / 255.0, y[:6000], x_test[..., None] / 255.0
//   inputs = keras.Input((28, 28, 1))
//   h = layers.Conv2D(16, 3, activation="relu")(inputs)
//   h = layers.MaxPooling2D()(h)
//   h = layers.Conv2D(32, 3, activation="relu")(h)
//   h = layers.GlobalAveragePooling2D()(h)
//   outputs = layers.Dense(10, activation="softmax", dtype="float32")(h)
//   model = keras.Model(inputs, outputs)
//   model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
//   early = keras.callbacks.EarlyStopping(patience=2, restore_best_weights=True)
//   best = keras.callbacks.ModelCheckpoint("best.weights.h5", save_best_only=True, save_weights_only=True)
//   model.fit(x, y, epochs=3, batch_size=64, validation_split=0.1, callbacks=[early, best])
//   model.save("cnn.keras")
//   keras.utils.clear_session()
//   restored = keras.models.load_model("cnn.keras")
//   print("test accuracy", restored.evaluate(x_test, y_test)[1])
// end-keras-twin
#include "mixtrain/train/keras.h"
using namespace mixtrain;

int main() {
  set_global_policy("mixed_bfloat16");
  DataSplits data = load_fashion_mnist();
  Tensor x = data.train.x.slice(0, 0, 6000), y = data.train.y.slice(0, 0, 6000);
  SymbolicTensor inputs = Input({784});
  SymbolicTensor h = (*make_layer<Reshape>(std::vector<int64_t>{28, 28, 1}))(inputs);
  h = (*make_layer<Conv2D>(16, 3, "relu"))(h);
  h = (*make_layer<MaxPooling2D>())(h);
  h = (*make_layer<Conv2D>(32, 3, "relu"))(h);
  h = (*make_layer<GlobalAveragePooling2D>())(h);
  SymbolicTensor outputs = (*make_layer<Dense>(10, "softmax", dtype_arg("float32")))(h);
  Model model({inputs}, {outputs});
  model.compile(make_optimizer("adam", 1e-3f), Loss("sparse_categorical_crossentropy"), {"accuracy"});
  EarlyStopping early({.patience = 2, .restore_best_weights = true});
  CheckpointCallback best("best.safetensors", {.save_best_only = true});
  model.fit(x, y, {.epochs = 3, .batch_size = 64, .validation_split = 0.1, .callbacks = {&early, &best}});
  model.save("cnn.safetensors");
  clear_session();
  std::unique_ptr<Model> restored = load_model("cnn.safetensors");
  std::cout << "test accuracy " << restored->evaluate(data.test.x, data.test.y).accuracy << "\n";
}
