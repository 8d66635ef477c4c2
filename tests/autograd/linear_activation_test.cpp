// linear_activation: its value and its gradients for the input, the float32 kernel and the float32 bias equal those
// of activation(linear(...)) byte for byte in every compute dtype, and match central finite differences. A GELU
// output let go of and made again from its pre-activation (Var::value_for_backward) for the next product's
// backward gives the same bits and the same gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/autograd/gradcheck.h"
#include "mixtrain/ops/matmul.h"

namespace mixtrain {
namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = r.uniform(lo, hi);
  return Tensor::from_floats(shape, v);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.contiguous().raw(), b.contiguous().raw(), a.nbytes()) == 0;
}

struct Result {
  Tensor y, dx, dkernel, dbias;
};

// One forward and backward of a Dense-like product in `compute` dtype, the kernel and bias float32 variables as a
// layer holds them, through the fused function or through linear then activation.
Result run(bool fused, ops::Activation a, DType compute, const Tensor& x0, const Tensor& k0, const Tensor& b0,
           const Tensor& target) {
  Var x(x0.to(compute), true), kernel(k0.clone(), true), bias(b0.clone(), true);
  const Tensor kernel_compute = kernel.value().to(compute);
  clear_tape();
  Var y = fused ? linear_activation(x, kernel, kernel_compute, bias, a)
                : activation(linear(x, kernel, kernel_compute, bias), a);
  backward(mean_squared_error(y, target.to(compute)));
  return {y.value(), x.grad(), kernel.grad(), bias.grad()};
}

TEST(LinearActivation, GradientsEqualTheCompositionByteForByte) {
  Tensor x = random_tensor({37, 19}, 1, -2.0f, 2.0f);
  float* xp = x.data<float>();
  for (int64_t j = 0; j < 19; ++j) xp[5 * 19 + j] = 0.0f;  // row 5 is zero: with bias 0, pre-activations of 0
  const Tensor kernel = random_tensor({19, 23}, 2);
  Tensor bias = random_tensor({23}, 3);
  bias.data<float>()[4] = 0.0f;
  const Tensor target = random_tensor({37, 23}, 4);
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (ops::Activation a : {ops::Activation::kRelu, ops::Activation::kGelu}) {
      const Result u = run(false, a, d, x, kernel, bias, target);
      const Result f = run(true, a, d, x, kernel, bias, target);
      const std::string what = std::string(dtype_name(d)) + " " + ops::activation_name(a);
      EXPECT_TRUE(same_bytes(f.y, u.y)) << what;
      EXPECT_TRUE(same_bytes(f.dx, u.dx)) << what;
      EXPECT_TRUE(same_bytes(f.dkernel, u.dkernel)) << what;
      EXPECT_TRUE(same_bytes(f.dbias, u.dbias)) << what;
      EXPECT_EQ(f.dkernel.dtype(), DType::kFloat32) << what;
    }
  }
}

TEST(LinearActivation, InferenceKeepsNoPreActivationAndGivesTheSameValue) {
  const Tensor x = random_tensor({9, 4}, 5), kernel = random_tensor({4, 6}, 6), bias = random_tensor({6}, 7);
  NoGradGuard ng;
  for (ops::Activation a : {ops::Activation::kRelu, ops::Activation::kGelu, ops::Activation::kTanh}) {
    Var y = linear_activation(Var(x), Var(kernel), kernel, Var(bias), a);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(same_bytes(y.value(), ops::activation(ops::linear(x, kernel, bias), a))) << ops::activation_name(a);
  }
}

// Float32 central differences as in gradcheck_test.cpp (eps 1e-2, agreement within 5e-3). relu has no derivative
// at 0: the inputs are drawn until every pre-activation is at least 0.05 from it, beyond what a step of eps can
// move it (|x|, |kernel| <= 1).
TEST(LinearActivation, GradientsMatchFiniteDifferences) {
  for (ops::Activation a : {ops::Activation::kRelu, ops::Activation::kGelu}) {
    std::vector<Tensor> inputs;
    for (uint64_t seed = 10;; seed += 3) {
      inputs = {random_tensor({6, 7}, seed), random_tensor({7, 5}, seed + 1), random_tensor({5}, seed + 2)};
      const std::vector<float> pre = ops::linear(inputs[0], inputs[1], inputs[2]).to_floats();
      float nearest = 1.0f;
      for (float v : pre) nearest = std::min(nearest, std::fabs(v));
      if (nearest >= 0.05f) break;
    }
    const Tensor target = random_tensor({6, 5}, 99);
    const GradCheckResult r = check_gradients(
        [a, &target](const std::vector<Var>& v) {
          return mean_squared_error(linear_activation(v[0], v[1], v[1].value(), v[2], a), target);
        },
        inputs);
    EXPECT_LT(r.max_rel_error, 5e-3) << ops::activation_name(a) << ": " << r.worst;
  }
}

// Two products as a GELU MLP runs them, x -> gelu(x k1 + b1) -> (.) k2 + b2, in `compute` dtype; with `release`,
// the GELU output is let go of after the second product read it, so that product's backward reads it made again.
struct MlpResult {
  Tensor hidden, remade, dx, dk1, db1, dk2, db2;
};
MlpResult mlp_step(bool release, DType compute, const std::vector<Tensor>& w, const Tensor& x0, const Tensor& target) {
  Var x(x0.to(compute), true), k1(w[0].clone(), true), b1(w[1].clone(), true), k2(w[2].clone(), true),
      b2(w[3].clone(), true);
  clear_tape();
  Var h = linear_activation(x, k1, k1.value().to(compute), b1, ops::Activation::kGelu);
  Var out = linear(h, k2, k2.value().to(compute), b2);
  MlpResult r;
  r.hidden = h.value();
  if (release) h.release_value();
  r.remade = h.value_for_backward();
  backward(mean_squared_error(out, target.to(compute)));
  return {r.hidden, r.remade, x.grad(), k1.grad(), b1.grad(), k2.grad(), b2.grad()};
}

TEST(LinearActivation, GeluOutputMadeAgainGivesItsBitsAndTheSameGradients) {
  const Tensor x = random_tensor({37, 19}, 21, -2.0f, 2.0f), target = random_tensor({37, 11}, 22);
  const std::vector<Tensor> w{random_tensor({19, 23}, 23), random_tensor({23}, 24), random_tensor({23, 11}, 25),
                              random_tensor({11}, 26)};
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const MlpResult kept = mlp_step(false, d, w, x, target), released = mlp_step(true, d, w, x, target);
    const std::string what = dtype_name(d);
    EXPECT_TRUE(same_bytes(released.remade, kept.hidden)) << what;
    EXPECT_NE(released.remade.raw(), released.hidden.raw()) << what << ": not made again";
    EXPECT_TRUE(same_bytes(kept.remade, kept.hidden)) << what;
    EXPECT_TRUE(same_bytes(released.dx, kept.dx)) << what;
    EXPECT_TRUE(same_bytes(released.dk1, kept.dk1)) << what;
    EXPECT_TRUE(same_bytes(released.db1, kept.db1)) << what;
    EXPECT_TRUE(same_bytes(released.dk2, kept.dk2)) << what;
    EXPECT_TRUE(same_bytes(released.db2, kept.db2)) << what;
  }
}

TEST(LinearActivation, OnlyARecordedGeluOutputCanBeMadeAgain) {
  Var x(random_tensor({5, 4}, 31), true), kernel(random_tensor({4, 6}, 32), true), bias(random_tensor({6}, 33), true);
  clear_tape();
  EXPECT_TRUE(linear_activation(x, kernel, kernel.value(), bias, ops::Activation::kGelu).recomputable());
  // ReLU's derivative reads its output (no pre-activation is kept to make it from); a plain product has none.
  EXPECT_FALSE(linear_activation(x, kernel, kernel.value(), bias, ops::Activation::kRelu).recomputable());
  EXPECT_FALSE(linear(x, kernel, kernel.value(), bias).recomputable());
  clear_tape();
  NoGradGuard ng;
  EXPECT_FALSE(linear_activation(x, kernel, kernel.value(), bias, ops::Activation::kGelu).recomputable());
}

// The second product's gradients through a GELU output let go of and made again, against finite differences (as
// GradientsMatchFiniteDifferences).
TEST(LinearActivation, GradientsThroughAGeluOutputMadeAgainMatchFiniteDifferences) {
  const std::vector<Tensor> inputs{random_tensor({6, 7}, 41), random_tensor({7, 5}, 42), random_tensor({5}, 43),
                                   random_tensor({5, 3}, 44), random_tensor({3}, 45)};
  const Tensor target = random_tensor({6, 3}, 46);
  const GradCheckResult r = check_gradients(
      [&target](const std::vector<Var>& v) {
        Var h = linear_activation(v[0], v[1], v[1].value(), v[2], ops::Activation::kGelu);
        Var out = linear(h, v[3], v[3].value(), v[4]);
        if (grad_enabled()) h.release_value();
        return mean_squared_error(out, target);
      },
      inputs);
  EXPECT_LT(r.max_rel_error, 5e-3) << r.worst;
}

}  // namespace
}  // namespace mixtrain
