// Mixed precision end to end through Model: why loss scaling exists, what a skipped step leaves behind,
// and automatic wrapping by compile().
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/core/allocator.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/model.h"
#include "quiet_policy_test.h"

namespace mixtrain {
namespace {

using MixedPrecisionTest = QuietPolicyTest;

// XOR of the signs of two inputs: a linear read-out of the untrained hidden layer cannot separate it,
// so the task is learned only when the hidden layer learns.
std::pair<Tensor, Tensor> sign_xor(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x(static_cast<size_t>(n * 2));
  std::vector<int32_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    x[i * 2] = r.uniform(-1, 1);
    x[i * 2 + 1] = r.uniform(-1, 1);
    y[i] = (x[i * 2] > 0) != (x[i * 2 + 1] > 0);
  }
  return {Tensor::from_floats({n, 2}, x), Tensor::from_ints({n}, y)};
}

struct XorRun {
  double accuracy;
  bool hidden_moved;
};

// A custom training loop whose loss is multiplied by 1e-7 (as a loss summed and normalised over ten
// million targets would be): the gradients reaching the float16 hidden activations are ~1e-9, below
// the smallest float16 subnormal (6e-8), so they round to zero unless the loss is scaled first.
// SGD's learning rate is raised by the same 1e7, so in float32 the run is an ordinary one.
XorRun train_xor(const char* policy, bool loss_scaling) {
  constexpr float kLossWeight = 1e-7f;
  auto [x, y] = sign_xor(512, 1);
  set_global_policy(policy);
  Model m("xor", 3);
  Dense* hidden = m.emplace<Dense>(16, "tanh");
  m.emplace<Dense>(2, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  m.build_for(Shape{2});
  std::unique_ptr<Optimizer> opt = make_optimizer("sgd", 0.5f / kLossWeight);
  LossScaleOptimizer scaler(make_optimizer("sgd", 0.5f / kLossWeight));
  const Loss loss_fn("sparse_categorical_crossentropy", true);
  const std::vector<float> initial = hidden->kernel().value().to_floats();
  const std::vector<Var> vars = m.trainable_weights();
  for (int epoch = 0; epoch < 150; ++epoch)
    for (int64_t b = 0; b < 512; b += 64) {
      Tensor xb = x.slice_rows(b, b + 64), yb = y.slice_rows(b, b + 64);
      Var loss = scale(loss_fn(m.call(Var(xb)), yb), kLossWeight);
      backward(loss, loss_scaling ? scaler.loss_scale() : 1.0f);
      std::vector<Tensor> grads;
      for (Var v : vars) {
        grads.push_back(v.has_grad() ? v.grad() : Tensor::zeros(v.shape(), DType::kFloat32));
        v.zero_grad();
      }
      NoGradGuard ng;
      if (loss_scaling)
        scaler.apply(grads, vars);
      else
        opt->apply(grads, vars);
    }
  m.compile(make_optimizer("sgd", 0.1f), loss_fn, {"accuracy"});
  return {m.evaluate(x, y).accuracy, hidden->kernel().value().to_floats() != initial};
}

TEST_F(MixedPrecisionTest, Float16GradientsUnderflowWithoutLossScalingAndLearnWithIt) {
  const XorRun f32 = train_xor("float32", false);
  const XorRun unscaled = train_xor("mixed_float16", false);
  const XorRun scaled = train_xor("mixed_float16", true);
  std::printf("xor accuracy: float32 %.3f, mixed_float16 unscaled %.3f, mixed_float16 dynamic scaling %.3f\n",
              f32.accuracy, unscaled.accuracy, scaled.accuracy);
  // Without scaling every float16 gradient of the hidden layer is zero: its weights never move and only
  // the float32 read-out learns, which cannot solve XOR.
  EXPECT_TRUE(f32.hidden_moved);
  EXPECT_GT(f32.accuracy, 0.9);
  EXPECT_FALSE(unscaled.hidden_moved);
  EXPECT_LT(unscaled.accuracy, 0.75);
  // With dynamic scaling the float16 run learns like the float32 one.
  EXPECT_TRUE(scaled.hidden_moved);
  EXPECT_GT(scaled.accuracy, f32.accuracy - 0.03);
}

TEST_F(MixedPrecisionTest, CompileWrapsOnlyFloat16ComputeAndNeverTwice) {
  auto build = [](const char* policy) {
    set_global_policy(policy);
    auto m = std::make_unique<Model>("m", 1);
    m->emplace<Dense>(4, "relu");
    m->emplace<Dense>(2, "linear", dtype_arg("float32"));
    set_global_policy("float32");
    return m;
  };
  auto is_scaled = [](Model& m) { return dynamic_cast<LossScaleOptimizer*>(&m.optimizer()) != nullptr; };
  auto m16 = build("mixed_float16");
  m16->compile(make_optimizer("sgd", 0.1f), Loss("mse"));
  EXPECT_TRUE(is_scaled(*m16));
  EXPECT_EQ(dynamic_cast<LossScaleOptimizer&>(m16->optimizer()).inner().name(), "sgd");
  auto mbf = build("mixed_bfloat16");
  mbf->compile(make_optimizer("sgd", 0.1f), Loss("mse"));
  EXPECT_FALSE(is_scaled(*mbf));
  auto m32 = build("float32");
  m32->compile(make_optimizer("sgd", 0.1f), Loss("mse"));
  EXPECT_FALSE(is_scaled(*m32));
  auto pre = build("mixed_float16");
  pre->compile(std::make_unique<LossScaleOptimizer>(make_optimizer("sgd", 0.1f)), Loss("mse"));
  EXPECT_EQ(dynamic_cast<LossScaleOptimizer&>(pre->optimizer()).inner().name(), "sgd");  // not wrapped twice
}

TEST_F(MixedPrecisionTest, InjectedOverflowSkipsTheStepLeavingStateBitIdentical) {
  set_global_policy("mixed_float16");
  Model m("m", 5);
  m.emplace<Dense>(8, "relu");
  m.emplace<Dense>(3, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  m.compile(make_optimizer("adam", 1e-2f), Loss("sparse_categorical_crossentropy", true));
  auto& scaler = dynamic_cast<LossScaleOptimizer&>(m.optimizer());
  Rng r(2);
  std::vector<float> xv(16 * 5);
  for (float& v : xv) v = r.uniform(-1, 1);
  Tensor x = Tensor::from_floats({16, 5}, xv);
  Tensor y = Tensor::from_ints({16}, std::vector<int32_t>(16, 1));
  m.train_step(x, y);  // creates the optimizer slots
  ASSERT_FALSE(scaler.last_step_skipped());

  auto snapshot = [&] {
    std::vector<std::vector<float>> s;
    for (const Var& w : m.weights()) s.push_back(w.value().to_floats());
    for (auto& [k, t] : m.optimizer().state())
      if (k.rfind("loss_scale/", 0) != 0) s.push_back(t.to_floats());
    return s;
  };
  const auto before = snapshot();
  const float scale_before = scaler.loss_scale();
  Tensor poisoned = x.clone();
  poisoned.data<float>()[0] = 1e6f;  // beyond float16's 65504: infinity after the input cast
  m.train_step(poisoned, y);
  EXPECT_TRUE(scaler.last_step_skipped());
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(scaler.loss_scale(), scale_before / 2);
  EXPECT_EQ(snapshot(), before);  // weights and optimizer slots bit for bit
  m.train_step(x, y);
  EXPECT_FALSE(scaler.last_step_skipped());
  EXPECT_NE(snapshot(), before);
}

// One training step of the Fashion-MNIST-shaped MLP (784-256-128-10, Adam) at batch 4096: its peak
// memory (the allocator's count above what was live before fit, i.e. the data set) must drop to at most
// 0.65x float32's under mixed_float16: 16-bit batches, activations and activation gradients.
int64_t step_peak_bytes(const char* policy) {
  Tensor x = Tensor::full({4096, 784}, DType::kFloat32, 0.5f);
  Tensor y = Tensor::from_ints({4096}, std::vector<int32_t>(4096, 3));
  set_global_policy(policy);
  Model m("mlp", 1);
  m.emplace<Dense>(256, "relu");
  m.emplace<Dense>(128, "relu");
  m.emplace<Dense>(10, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  m.compile(make_optimizer("adam", 1e-3f), Loss("sparse_categorical_crossentropy", true));
  m.build_for(Shape{784});
  FitOptions o;
  o.epochs = 1;
  o.batch_size = 4096;
  const int64_t live = memory_stats().live_bytes;
  reset_peak_memory();
  m.fit(x, y, o);
  return memory_stats().peak_bytes - live;
}

TEST_F(MixedPrecisionTest, Batch4096StepPeakMemoryDropsBelow065OfFloat32) {
  const int64_t f32 = step_peak_bytes("float32");
  const int64_t f16 = step_peak_bytes("mixed_float16");
  const int64_t bf16 = step_peak_bytes("mixed_bfloat16");
  std::printf("batch-4096 step peak: float32 %.1f MB, mixed_float16 %.1f MB (%.2fx), mixed_bfloat16 %.1f MB (%.2fx)\n",
              f32 / 1e6, f16 / 1e6, static_cast<double>(f16) / f32, bf16 / 1e6, static_cast<double>(bf16) / f32);
  EXPECT_LE(static_cast<double>(f16), 0.65 * static_cast<double>(f32));
  EXPECT_LE(static_cast<double>(bf16), 0.65 * static_cast<double>(f32));
}

}  // namespace
}  // namespace mixtrain
