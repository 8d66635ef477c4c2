// Keras tour 3: a custom layer whose float32 variables are read in the compute dtype (autocast).
#include <cstdio>

#include "data.h"
#include "mixtrain/train/keras.h"

using namespace mixtrain;

// y = relu(x W + b), the Keras guide's Linear layer. Inside call() its float32 variables are read in the
// compute dtype, bfloat16 under mixed_bfloat16, as Keras reads them, with their gradients reaching the float32
// variables.
class Linear : public Layer {
 public:
  explicit Linear(int64_t units) : Layer("linear"), units(units) {}
  Shape compute_output_shape(const Shape&) const override { return Shape{units}; }
  void build_impl(const Shape& input_shape, Rng& rng) override {
    w = add_weight("w", {input_shape[-1], units}, Initializer::kGlorotUniform, rng);
    b = add_weight("b", {units}, Initializer::kZeros, rng);
  }
  Var call(const Var& x, const CallContext&) override {
    return activation(bias_add(matmul(x, w), b), ops::Activation::kRelu);
  }
  int64_t units;
  Var w, b;
};

int main() {
  set_global_policy("mixed_bfloat16");
  auto [x, y] = make_blobs(1200, 3);
  Model model;
  model.emplace<Linear>(32);
  model.emplace<Dense>(3, "linear", dtype_arg("float32"));
  model.compile(make_optimizer("adam", 1e-2f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  model.fit(x, y, {.epochs = 5, .batch_size = 32});
  const double accuracy = model.evaluate(x, y).accuracy;
  std::printf("accuracy %.4f\n", accuracy);
  return accuracy > 0.95 ? 0 : 1;
}
