// A newcomer's second program: a custom layer trained in a GradientTape loop under mixed_float16, the loss scaled
// and the gradients unscaled by a LossScaleOptimizer (which skips a step whose gradients overflowed).
// Its Keras 3 twin, line for line (scripts/keras_twin_lines.py counts both):
// keras-twin:
//   import keras, tensorflow as tf
//   keras.mixed_precision.set_global_policy("mixed_float16")
//   class Linear(keras.layers.Layer):
//       def __init__(self, units):
//           super().__init__()
//           self.units = units
//       def build(self, input_shape):
//           self.w = self.add_weight(shape=(input_shape[-1], self.units), initializer="glorot_uniform")
//           self.b = self.add_weight(shape=(self.units,), initializer="zeros")
//       def call(self, x):
//           return tf.nn.relu(tf.matmul(x, self.w) + self.b)
//   (x, y), _ = keras.datasets.fashion_mnist.load_data()
//   x, y = x[:4096].reshape(-1, 784) / 255.0, y[:4096]
//   model = keras.Sequential([keras.Input((784,)), Linear(128), keras.layers.Dense(10, dtype="float32")])
//   optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
//   loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
//   for epoch in range(2):
//       for i in range(0, 4096, 64):
//           with tf.GradientTape() as tape:
//               loss = optimizer.scale_loss(loss_fn(y[i:i + 64], model(x[i:i + 64], training=True)))
//           optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
//   print("loss scale", float(optimizer.dynamic_scale))
// end-keras-twin
#include "mixtrain/train/keras.h"
using namespace mixtrain;

struct Linear : Layer {
  explicit Linear(int64_t units) : Layer("linear"), units(units) {}
  void build_impl(const Shape& input_shape, Rng& rng) override {
    w = add_weight("w", {input_shape[-1], units}, Initializer::kGlorotUniform, rng);
    b = add_weight("b", {units}, Initializer::kZeros, rng);
  }
  Var call(const Var& x, const CallContext&) override { return relu(bias_add(matmul(x, w), b)); }
  int64_t units; Var w, b;
};

int main() {
  set_global_policy("mixed_float16");
  DataSplits data = load_fashion_mnist();
  Tensor x = data.train.x.slice(0, 0, 4096), y = data.train.y.slice(0, 0, 4096);
  Model model({make_layer<Linear>(128), make_layer<Dense>(10, "linear", dtype_arg("float32"))}, {784});
  LossScaleOptimizer optimizer(make_optimizer("adam", 1e-3f));
  const Loss loss_fn("sparse_categorical_crossentropy", /*from_logits=*/true);
  for (int epoch = 0; epoch < 2; ++epoch)
    for (int64_t i = 0; i < 4096; i += 64) {
      GradientTape tape;
      Var loss = optimizer.scale_loss(loss_fn(model.call(Var(x.slice(0, i, i + 64)), {.training = true}), y.slice(0, i, i + 64)));
      optimizer.apply(tape.gradient(loss, model.trainable_weights()), model.trainable_weights());
    }
  std::cout << "loss scale " << optimizer.loss_scale() << "\n";
}
