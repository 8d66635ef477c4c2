#include "mixtrain/optim/parameter_arena.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/autograd/gradient_tape.h"
#include "mixtrain/autograd/tape.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/matmul.h"

namespace mixtrain {
namespace {

Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = dist(rng);
  return Tensor::from_floats(shape, v, dtype);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.raw(), bc.raw(), ac.nbytes()) == 0;
}

bool all_zero(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.raw());
  for (size_t i = 0; i < c.nbytes(); ++i)
    if (p[i] != 0) return false;
  return true;
}

// Odd sizes, two dtypes interleaved.
std::vector<Var> make_vars() {
  return {Var(random_tensor({3, 5}, DType::kFloat32, 1), true, "a/kernel"),
          Var(random_tensor({7}, DType::kFloat16, 2), true, "b/kernel"),
          Var(random_tensor({1}, DType::kFloat32, 3), true, "a/bias"),
          Var(random_tensor({17, 3}, DType::kFloat16, 4), true, "b/bias"),
          Var(random_tensor({129}, DType::kFloat32, 5), true, "c/kernel")};
}

TEST(ParameterArena, ValuesAreAlignedViewsOfOneBufferPerDtype) {
  std::vector<Var> vars = make_vars();
  std::vector<Tensor> before;
  std::vector<uint64_t> versions;
  for (const Var& v : vars) {
    before.push_back(v.value().clone());
    versions.push_back(v.version());
  }
  ParameterArena arena(vars);
  ASSERT_EQ(arena.dtypes(), (std::vector<DType>{DType::kFloat32, DType::kFloat16}));
  EXPECT_EQ(arena.value_buffer(DType::kFloat32).shape(), Shape({arena.capacity(DType::kFloat32)}));
  EXPECT_FALSE(arena.value_buffer(DType::kBFloat16).defined());
  for (size_t i = 0; i < vars.size(); ++i) {
    const Var& v = vars[i];
    const ParameterArena::Entry& e = arena.entry(i);
    EXPECT_EQ(e.dtype, v.dtype());
    EXPECT_EQ(e.numel, v.value().numel());
    EXPECT_EQ(e.offset * static_cast<int64_t>(dtype_size(e.dtype)) % 64, 0) << "variable " << i;
    EXPECT_TRUE(v.value().shares_storage(arena.value_buffer(v.dtype())));
    EXPECT_TRUE(v.grad_buffer().shares_storage(arena.gradient_buffer(v.dtype())));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.value().raw()) % 64, 0u);
    EXPECT_TRUE(bit_equal(v.value(), before[i])) << "bind copies the values in";
    EXPECT_EQ(v.version(), versions[i]) << "bind keeps the version";
    EXPECT_TRUE(v.value_rebound());
    EXPECT_FALSE(v.has_grad());
  }
  // Writing the flat buffer writes the variable.
  float* flat = arena.value_buffer(DType::kFloat32).data<float>();
  flat[arena.entry(2).offset] = 42.0f;
  EXPECT_EQ(vars[2].value().item(), 42.0f);
  // set_value writes in place: the variable stays a view.
  vars[0].set_value(Tensor::full({3, 5}, DType::kFloat32, 0.5f));
  EXPECT_TRUE(arena.bound_to(vars));
  EXPECT_EQ(flat[arena.entry(0).offset + 14], 0.5f);
}

TEST(ParameterArena, GradientsAccumulateIntoTheViews) {
  std::vector<Var> vars = make_vars();
  ParameterArena arena(vars);
  Var& w = vars[0];  // float32
  const Tensor g1 = random_tensor({3, 5}, DType::kFloat16, 10);
  const Tensor g2 = random_tensor({3, 5}, DType::kFloat32, 11);
  w.accumulate_grad(g1);  // converted into the view
  ASSERT_TRUE(w.has_grad());
  EXPECT_TRUE(w.grad().shares_storage(arena.gradient_buffer(DType::kFloat32)));
  EXPECT_EQ(w.grad().raw(), arena.gradient_view(0).raw());
  EXPECT_TRUE(bit_equal(w.grad(), g1.to(DType::kFloat32)));
  w.accumulate_grad_owned(g2.clone());  // added in place, not adopted
  EXPECT_EQ(w.grad().raw(), arena.gradient_view(0).raw());
  const std::vector<float> a = g1.to_floats(), b = g2.to_floats(), sum = w.grad().to_floats();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(sum[i], a[i] + b[i]);

  // A float16 variable keeps its gradient in the float16 buffer.
  Var& h = vars[1];
  const Tensor gh = random_tensor({7}, DType::kFloat32, 12);
  h.accumulate_grad_owned(gh);
  EXPECT_TRUE(h.grad().shares_storage(arena.gradient_buffer(DType::kFloat16)));
  EXPECT_TRUE(bit_equal(h.grad(), gh.to(DType::kFloat16)));

  // Per-variable zero_grad forgets without filling: the next gradient overwrites the stale one.
  w.zero_grad();
  EXPECT_FALSE(w.has_grad());
  w.accumulate_grad(g2);
  EXPECT_TRUE(bit_equal(w.grad(), g2));
  // set_grad copies into the buffer.
  vars[4].set_grad(Tensor::full({129}, DType::kFloat32, 2.0f));
  EXPECT_EQ(vars[4].grad().raw(), arena.gradient_view(4).raw());
  EXPECT_EQ(arena.gradient_view(4).at(128), 2.0f);
}

TEST(ParameterArena, BuffersReadAsZerosAfterZeroGrad) {
  std::vector<Var> vars = make_vars();
  ParameterArena arena(vars);
  for (size_t i = 0; i < vars.size(); ++i) {
    vars[i].accumulate_grad(random_tensor(vars[i].shape(), DType::kFloat32, 20 + static_cast<uint32_t>(i)));
  }
  const void* f32 = arena.gradient_buffer(DType::kFloat32).raw();
  EXPECT_FALSE(all_zero(arena.gradient_buffer(DType::kFloat32)));
  arena.zero_grad();
  for (DType dt : arena.dtypes()) EXPECT_TRUE(all_zero(arena.gradient_buffer(dt)));
  EXPECT_EQ(arena.gradient_buffer(DType::kFloat32).raw(), f32) << "zeroing keeps the buffer";
  for (const Var& v : vars) {
    EXPECT_FALSE(v.has_grad());
    EXPECT_FALSE(v.grad().defined());
  }
}

// zero_grad() fills nothing: a view written afterwards holds exactly its new gradient (not a sum with the
// stale one), and the views of variables still without a gradient read as zeros.
TEST(ParameterArena, ZeroGradDefersTheFillToTheNextRead) {
  std::vector<Var> vars = make_vars();
  ParameterArena arena(vars);
  for (size_t i = 0; i < vars.size(); ++i)
    vars[i].accumulate_grad(random_tensor(vars[i].shape(), DType::kFloat32, 40 + static_cast<uint32_t>(i)));
  arena.zero_grad();
  const Tensor g0 = random_tensor(vars[0].shape(), DType::kFloat32, 50);
  const Tensor g3 = random_tensor(vars[3].shape(), DType::kFloat16, 51);
  vars[0].accumulate_grad(g0);
  vars[3].accumulate_grad(g3);
  EXPECT_TRUE(bit_equal(arena.gradient_view(0), g0));
  EXPECT_TRUE(bit_equal(arena.gradient_view(3), g3));
  for (size_t i : {1, 2, 4}) EXPECT_TRUE(all_zero(arena.gradient_view(i))) << "variable " << i;
  // The whole buffers agree with the views, padding included.
  Tensor expect32 = Tensor::zeros({arena.capacity(DType::kFloat32)}, DType::kFloat32);
  expect32.slice(0, arena.entry(0).offset, arena.entry(0).offset + 15).copy_from(g0.reshape({15}));
  EXPECT_TRUE(bit_equal(arena.gradient_buffer(DType::kFloat32), expect32));
  // A gradient written after the buffers were read is still its own value.
  const Tensor g4 = random_tensor(vars[4].shape(), DType::kFloat32, 52);
  vars[4].accumulate_grad(g4);
  EXPECT_TRUE(bit_equal(arena.gradient_view(4), g4));
}

// Dense's backward writes the kernel's first gradient straight into the kernel's view (no copy), with the bits
// of the product computed on its own; a later contribution adds to it; a GradientTape still collects it apart.
TEST(ParameterArena, LinearBackwardWritesTheKernelGradientInPlace) {
  Var kernel(random_tensor({6, 4}, DType::kFloat32, 60), true, "d/kernel");
  Var bias(random_tensor({4}, DType::kFloat32, 61), true, "d/bias");
  ParameterArena arena(std::vector<Var>{kernel, bias});
  const Tensor x = random_tensor({5, 6}, DType::kFloat32, 62);
  // d(sum of y) / dy: ones.
  const Tensor ones = Tensor::full({5, 4}, DType::kFloat32, 1.0f);
  const Tensor expect_dw = ops::linear_backward(ones, x, kernel.value(), false, true).dw;

  arena.zero_grad();
  EXPECT_EQ(kernel.fresh_gradient_destination(DType::kFloat32).raw(), arena.gradient_view(0).raw());
  EXPECT_FALSE(kernel.fresh_gradient_destination(DType::kFloat16).defined()) << "only in the buffer's dtype";
  backward(sum(linear(Var(x), kernel, kernel.value(), bias)));
  ASSERT_TRUE(kernel.has_grad());
  EXPECT_EQ(kernel.grad().raw(), arena.gradient_view(0).raw());
  EXPECT_TRUE(bit_equal(kernel.grad(), expect_dw));
  EXPECT_FALSE(kernel.fresh_gradient_destination(DType::kFloat32).defined()) << "a gradient is written";

  // Second use without zero_grad: accumulates (2 x dw, exact in float32).
  backward(sum(linear(Var(x), kernel, kernel.value(), bias)));
  EXPECT_TRUE(bit_equal(arena.gradient_view(0), ops::add(expect_dw, expect_dw)));

  // Under a tape, the buffer is left alone and the tape gets the gradient.
  arena.zero_grad();
  GradientTape tape;
  Var y = linear(Var(x), kernel, kernel.value(), bias);
  const std::vector<Tensor> grads = tape.gradient(y, {kernel});  // d(sum of y)
  ASSERT_EQ(grads.size(), 1u);
  EXPECT_TRUE(bit_equal(grads[0], expect_dw));
  EXPECT_FALSE(kernel.has_grad());
  EXPECT_TRUE(all_zero(arena.gradient_view(0)));
}

TEST(ParameterArena, RebindIsIdempotentAndDetectsDtypeChanges) {
  std::vector<Var> vars = make_vars();
  ParameterArena arena;
  EXPECT_FALSE(arena.bound_to(vars));
  arena.bind(vars);
  const uint64_t layout = arena.layout_id();
  vars[0].accumulate_grad(Tensor::full({3, 5}, DType::kFloat32, 1.0f));
  arena.bind(vars);
  EXPECT_EQ(arena.layout_id(), layout);
  EXPECT_TRUE(vars[0].has_grad()) << "an idempotent bind touches nothing";
  EXPECT_FALSE(arena.bound_to({vars[0], vars[1]}));
  EXPECT_FALSE(arena.bound_to({vars[1], vars[0], vars[2], vars[3], vars[4]}));

  // What Layer::set_dtype_policy does: replace the value with another dtype.
  const Tensor expect = vars[0].value().to(DType::kBFloat16);
  vars[0].mutable_value() = vars[0].value().to(DType::kBFloat16);
  vars[0].zero_grad();
  vars[0].bump_version();
  EXPECT_FALSE(arena.bound_to(vars));
  // Until rebound, gradients fall back to fresh tensors (the old buffer has the wrong dtype).
  vars[0].accumulate_grad(Tensor::full({3, 5}, DType::kFloat32, 1.0f));
  EXPECT_EQ(vars[0].grad().dtype(), DType::kBFloat16);
  arena.bind(vars);
  EXPECT_NE(arena.layout_id(), layout);
  EXPECT_TRUE(arena.bound_to(vars));
  EXPECT_EQ(arena.dtypes(), (std::vector<DType>{DType::kBFloat16, DType::kFloat16, DType::kFloat32}));
  EXPECT_TRUE(bit_equal(vars[0].value(), expect));
  EXPECT_TRUE(vars[0].value().shares_storage(arena.value_buffer(DType::kBFloat16)));
  // The current gradient is carried into the new buffer.
  ASSERT_TRUE(vars[0].has_grad());
  EXPECT_EQ(vars[0].grad().raw(), arena.gradient_view(0).raw());
  EXPECT_EQ(vars[0].grad().at(3), 1.0f);

  // Variables that leave the binding are detached from the gradient buffer.
  Var gone = vars[4];
  arena.bind({vars[0], vars[1]});
  EXPECT_FALSE(gone.grad_buffer().defined());
  gone.accumulate_grad(Tensor::full({129}, DType::kFloat32, 3.0f));
  EXPECT_FALSE(gone.grad().shares_storage(arena.gradient_buffer(DType::kFloat32)));
}

TEST(ParameterArena, RejectsBadVariables) {
  Var a(Tensor::zeros({2}, DType::kFloat32), true, "a");
  Var ids(Tensor::from_ints({2}, {1, 2}), false, "ids");
  ParameterArena arena;
  EXPECT_THROW(arena.bind({a, a}), Error);
  EXPECT_THROW(arena.bind({a, ids}), Error);
  EXPECT_THROW(arena.bind({a, Var()}), Error);
  EXPECT_TRUE(arena.empty());
  EXPECT_FALSE(a.value_rebound()) << "a failed bind changes nothing";
  EXPECT_THROW(arena.enable_compute_copy(DType::kFloat32), Error);
}

TEST(ParameterArena, ComputeCopiesEqualTheConvertedValues) {
  std::vector<Var> vars = make_vars();
  ParameterArena arena(vars);
  arena.enable_compute_copy(DType::kFloat16);
  arena.enable_compute_copy(DType::kBFloat16);
  arena.enable_compute_copy(DType::kFloat16);  // idempotent
  ASSERT_EQ(arena.compute_copy_dtypes().size(), 2u);
  for (const Var& v : vars) {
    if (v.dtype() != DType::kFloat32) {
      EXPECT_FALSE(v.compute_copy(DType::kBFloat16).defined()) << "16-bit variables need no copy";
      continue;
    }
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      const Tensor c = v.compute_copy(dt);
      ASSERT_TRUE(c.defined());
      EXPECT_TRUE(c.shares_storage(arena.compute_copy_buffer(dt)));
      EXPECT_TRUE(bit_equal(c, v.value().to(dt)));
    }
  }
  // A value written another way makes the copy stale until refreshed.
  vars[0].set_value(random_tensor({3, 5}, DType::kFloat32, 30));
  EXPECT_FALSE(vars[0].compute_copy(DType::kFloat16).defined());
  EXPECT_TRUE(vars[2].compute_copy(DType::kFloat16).defined());
  arena.refresh_compute_copies();
  ASSERT_TRUE(vars[0].compute_copy(DType::kFloat16).defined());
  EXPECT_TRUE(bit_equal(vars[0].compute_copy(DType::kFloat16), vars[0].value().to(DType::kFloat16)));
  // Copies enabled before bind are built by bind.
  std::vector<Var> more = make_vars();
  ParameterArena early;
  early.enable_compute_copy(DType::kBFloat16);
  early.bind(more);
  EXPECT_TRUE(bit_equal(more[4].compute_copy(DType::kBFloat16), more[4].value().to(DType::kBFloat16)));
}

}  // namespace
}  // namespace mixtrain
