// A custom training loop under mixed_float16, the way Keras' guide writes one: scale the loss, run
// backward, unscale the gradients, clip them by global norm (after unscaling, so the threshold means
// what it says), and apply — the loss-scale optimizer skips the update when any gradient overflowed.
//
// Data: two interleaved spirals (a classic non-linear toy problem), generated with a fixed seed.
#include <cmath>
#include <cstdio>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/model.h"

using namespace mixtrain;

int main() {
  // (N, 2) points on two spirals, labels 0 / 1.
  const int64_t n = 1024;
  Rng rng(7);
  std::vector<float> xs;
  std::vector<int32_t> ys;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t label = static_cast<int32_t>(i % 2);
    const float t = 0.5f + 3.0f * rng.uniform();
    const float angle = t * 1.6f + (label ? 3.14159265f : 0.0f);
    xs.push_back(t * std::cos(angle) / 3.5f + 0.02f * rng.normal());
    xs.push_back(t * std::sin(angle) / 3.5f + 0.02f * rng.normal());
    ys.push_back(label);
  }
  const Tensor x = Tensor::from_floats({n, 2}, xs), y = Tensor::from_ints({n}, ys);

  set_global_policy("mixed_float16");
  Model model("spirals", /*seed=*/1);
  model.emplace<Dense>(64, "tanh");
  model.emplace<Dense>(64, "tanh");
  model.emplace<Dense>(2, "linear", dtype_arg("float32"));  // logits in float32
  set_global_policy("float32");
  model.build_for(Shape{2});

  LossScaleOptimizer optimizer(make_optimizer("adam", 1e-2f));
  const Loss loss_fn("sparse_categorical_crossentropy", /*from_logits=*/true);
  const std::vector<Var> vars = model.trainable_weights();
  Rng dropout_rng(3);
  const int64_t batch = 64;
  for (int epoch = 0; epoch < 100; ++epoch) {
    double epoch_loss = 0;
    const std::vector<int64_t> order = rng.permutation(n);
    for (int64_t b = 0; b < n; b += batch) {
      const std::vector<int64_t> idx(order.begin() + b, order.begin() + b + batch);
      Var loss = loss_fn(model.call(Var(x.gather_rows(idx)), CallContext{true, &dropout_rng}), y.gather_rows(idx));
      epoch_loss += loss.value().item();
      backward(loss, optimizer.loss_scale());  // the scaled loss's gradients
      std::vector<Tensor> scaled;
      for (Var v : vars) {
        scaled.push_back(v.grad());
        v.zero_grad();
      }
      bool finite = true;
      std::vector<Tensor> grads = optimizer.get_unscaled_gradients(scaled, &finite);
      if (finite) clip_by_global_norm(grads, 1.0f);
      NoGradGuard no_grad;
      optimizer.apply_unscaled(grads, vars, finite);
    }
    if (epoch % 25 == 24)
      std::printf("epoch %d: loss %.4f, loss scale %g, skipped steps %lld\n", epoch + 1,
                  epoch_loss / static_cast<double>(n / batch), optimizer.loss_scale(),
                  static_cast<long long>(optimizer.skipped_steps()));
  }
  model.compile(make_optimizer("adam", 1e-3f), loss_fn, {"accuracy"});
  const double accuracy = model.evaluate(x, y).accuracy;
  std::printf("spirals accuracy %.4f\n", accuracy);
  return accuracy > 0.95 ? 0 : 1;
}
