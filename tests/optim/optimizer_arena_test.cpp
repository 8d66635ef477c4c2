// Optimizer::apply_arena against the per-variable apply(): the same bits, state and checkpoint keys.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/autograd/transformer_functions.h"
#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/parameter_arena.h"
#include "mixtrain/optim/sgd.h"

namespace mixtrain {
namespace {

Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = dist(rng);
  return Tensor::from_floats(shape, v, dtype);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.raw(), bc.raw(), ac.nbytes()) == 0;
}

// Odd shapes; one variable above a block and above the threads' threshold; names that AdamW excludes.
// Variable 5 never receives a gradient, variable 2 skips step 1.
std::vector<Var> make_vars(const std::vector<DType>& dtypes) {
  const std::vector<Shape> shapes = {{7, 3}, {17}, {1}, {31, 5}, {129}, {9}, {70001}};
  const std::vector<std::string> names = {"d0/kernel", "d0/bias", "d1/kernel", "d1/bias",
                                          "d2/kernel", "d2/unused", "d3/kernel"};
  std::vector<Var> vars;
  for (size_t i = 0; i < shapes.size(); ++i) {
    vars.emplace_back(random_tensor(shapes[i], dtypes[i % dtypes.size()], 100 + static_cast<uint32_t>(i)), true,
                      names[i]);
  }
  return vars;
}

bool gets_grad(size_t var, int step) { return var != 5 && !(var == 2 && step == 1); }

// Accumulates step `step`'s gradients (two float16/float32 parts, as backward does) into vars.
void backward(std::vector<Var>& vars, int step, float grad_scale) {
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!gets_grad(i, step)) continue;
    const uint32_t seed = 1000 * static_cast<uint32_t>(step) + static_cast<uint32_t>(i);
    vars[i].accumulate_grad(random_tensor(vars[i].shape(), DType::kFloat16, seed, grad_scale));
    vars[i].accumulate_grad_owned(random_tensor(vars[i].shape(), DType::kFloat32, seed + 500, grad_scale));
  }
}

// What Model::train_step does today.
void per_variable_step(Optimizer& opt, std::vector<Var>& vars, int step, float grad_scale) {
  backward(vars, step, grad_scale);
  std::vector<Tensor> grads;
  for (const Var& v : vars) grads.push_back(v.has_grad() ? v.grad().to(DType::kFloat32) : Tensor());
  opt.apply(grads, vars);
  for (Var& v : vars) v.zero_grad();
}

void arena_step(Optimizer& opt, ParameterArena& arena, std::vector<Var>& vars, int step, float grad_scale) {
  arena.zero_grad();
  backward(vars, step, grad_scale);
  opt.apply_arena(arena);
}

void expect_same_state(const Optimizer& a, const Optimizer& b) {
  const NamedTensors sa = a.state(), sb = b.state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_TRUE(bit_equal(sa[i].second, sb[i].second)) << sa[i].first;
  }
}

void expect_same_values(const std::vector<Var>& a, const std::vector<Var>& b) {
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_equal(a[i].value(), b[i].value())) << a[i].name();
}

using Factory = std::function<std::unique_ptr<Optimizer>()>;

struct Case {
  std::string name;
  Factory make;
};

std::vector<Case> cases() {
  return {
      {"sgd", [] { return std::make_unique<Sgd>(0.1f); }},
      {"sgd_momentum", [] { return std::make_unique<Sgd>(0.05f, 0.9f, false); }},
      {"sgd_nesterov", [] { return std::make_unique<Sgd>(0.05f, 0.9f, true); }},
      {"adam", [] { return std::make_unique<Adam>(1e-2f); }},
      {"adamw", [] { return std::make_unique<AdamW>(1e-2f, 0.05f, AdamOptions{}, std::vector<std::string>{"bias"}); }},
  };
}

const std::vector<std::vector<DType>> kDtypeSets = {
    {DType::kFloat32}, {DType::kFloat16}, {DType::kBFloat16}, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}};

// An embedding table in an arena gets its gradient row by row (only the rows a batch uses are written, and the rows
// the previous batch used are cleared), yet Adam and AdamW, which move every row, zero gradient or not, give the bits
// of the per-variable path with the dense gradient; with other weights in the arena, and ids that leave some rows of
// each step unused in the next.
TEST(OptimizerArena, EmbeddingRowGradientsGiveTheDenseGradientsBits) {
  constexpr int64_t kRows = 37, kWidth = 11;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    auto make = [&] {
      return std::vector<Var>{Var(random_tensor({kRows, kWidth}, DType::kFloat32, 7), true, "embedding/embeddings"),
                              Var(random_tensor({kWidth}, DType::kFloat32, 8), true, "d/bias")};
    };
    std::vector<Var> ref = make(), flat = make();
    auto opt_ref = c.make(), opt_flat = c.make();
    ParameterArena arena(flat);
    for (int step = 0; step < 4; ++step) {
      std::vector<int32_t> ids(12);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((7 * step + 3 * i * i) % (kRows - 5 * step));
      const Tensor idt = Tensor::from_ints({3, 4}, ids);
      const Tensor w = random_tensor({12, kWidth}, DType::kFloat32, 50 + static_cast<uint32_t>(step));
      auto loss = [&](std::vector<Var>& v) {
        const Var rows = reshape(embedding(idt, v[0], DType::kFloat32), {12, kWidth});
        return sum(multiply(bias_add(rows, v[1]), Var(w)));
      };
      backward(loss(ref));  // plain variables: the dense gradient
      std::vector<Tensor> grads;
      for (const Var& v : ref) grads.push_back(v.grad());
      opt_ref->apply(grads, ref);
      for (Var& v : ref) v.zero_grad();

      arena.zero_grad();
      backward(loss(flat));
      ASSERT_NE(flat[0].gradient_buffer_rows(), nullptr) << "step " << step << ": the dense path ran";
      EXPECT_EQ(0, std::memcmp(flat[0].grad().raw(), grads[0].raw(), grads[0].nbytes())) << "step " << step;
      opt_flat->apply_arena(arena);
      expect_same_values(ref, flat);
    }
    expect_same_state(*opt_ref, *opt_flat);
  }
}

TEST(OptimizerArena, BitIdenticalToPerVariableApply) {
  for (const Case& c : cases()) {
    for (const auto& dtypes : kDtypeSets) {
      for (bool clip : {false, true}) {
        SCOPED_TRACE(c.name + " dtypes " + std::to_string(dtypes.size()) + " first " + dtype_name(dtypes[0]) +
                     (clip ? " clipnorm" : ""));
        std::vector<Var> ref = make_vars(dtypes), flat = make_vars(dtypes);
        auto opt_ref = c.make(), opt_flat = c.make();
        if (clip) {
          // Below the gradients' norm, so every step is clipped.
          opt_ref->set_global_clipnorm(0.5f);
          opt_flat->set_global_clipnorm(0.5f);
        }
        ParameterArena arena(flat);
        arena.enable_compute_copy(DType::kFloat16);
        for (int step = 0; step < 3; ++step) {
          const std::vector<uint64_t> before = [&] {
            std::vector<uint64_t> v;
            for (const Var& x : flat) v.push_back(x.version());
            return v;
          }();
          per_variable_step(*opt_ref, ref, step, 1.0f);
          arena_step(*opt_flat, arena, flat, step, 1.0f);
          expect_same_values(ref, flat);
          expect_same_state(*opt_ref, *opt_flat);
          EXPECT_EQ(opt_flat->iterations(), step + 1);
          for (size_t i = 0; i < flat.size(); ++i) {
            EXPECT_EQ(flat[i].version() > before[i], gets_grad(i, step)) << "variable " << i;
            if (flat[i].dtype() != DType::kFloat32) continue;
            const Tensor copy = flat[i].compute_copy(DType::kFloat16);
            ASSERT_TRUE(copy.defined()) << "variable " << i;
            EXPECT_TRUE(bit_equal(copy, flat[i].value().to(DType::kFloat16))) << "variable " << i;
          }
        }
        EXPECT_TRUE(arena.bound_to(flat));
      }
    }
  }
}

TEST(OptimizerArena, NonFiniteGradientsUnderClipnormGiveNaNAsApplyDoes) {
  std::vector<Var> ref = make_vars({DType::kFloat32}), flat = make_vars({DType::kFloat32});
  Adam opt_ref(1e-3f), opt_flat(1e-3f);
  opt_ref.set_global_clipnorm(1.0f);
  opt_flat.set_global_clipnorm(1.0f);
  ParameterArena arena(flat);
  per_variable_step(opt_ref, ref, 0, 1e5f);  // float16 parts overflow to inf
  arena_step(opt_flat, arena, flat, 0, 1e5f);
  // Which NaN payload survives may differ between vector and scalar code, so compare NaN-ness.
  for (size_t i = 0; i < ref.size(); ++i) {
    const std::vector<float> a = ref[i].value().to_floats(), b = flat[i].value().to_floats();
    for (size_t j = 0; j < a.size(); ++j) ASSERT_EQ(std::isnan(a[j]), std::isnan(b[j])) << i << " " << j;
    EXPECT_EQ(std::isnan(a[0]), gets_grad(i, 0)) << i;
  }
}

TEST(OptimizerArena, StateRoundTripsBetweenBothPaths) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    // Two per-variable steps, then the checkpoint goes to an optimizer that continues with apply_arena.
    std::vector<Var> ref = make_vars({DType::kFloat32, DType::kBFloat16});
    std::vector<Var> flat = make_vars({DType::kFloat32, DType::kBFloat16});
    auto opt_ref = c.make(), opt_a = c.make();
    per_variable_step(*opt_ref, ref, 0, 1.0f);
    per_variable_step(*opt_ref, ref, 1, 1.0f);
    for (size_t i = 0; i < ref.size(); ++i) flat[i].set_value(ref[i].value());
    ParameterArena arena(flat);
    opt_a->load_state(opt_ref->state());
    per_variable_step(*opt_ref, ref, 2, 1.0f);
    arena_step(*opt_a, arena, flat, 2, 1.0f);
    expect_same_values(ref, flat);
    expect_same_state(*opt_ref, *opt_a);

    // And back: the arena optimizer's checkpoint loads into a per-variable one, and into itself mid-run.
    auto opt_b = c.make();
    opt_b->load_state(opt_a->state());
    expect_same_state(*opt_b, *opt_a);
    opt_a->load_state(opt_a->state());
    per_variable_step(*opt_ref, ref, 3, 1.0f);
    arena_step(*opt_a, arena, flat, 3, 1.0f);
    expect_same_values(ref, flat);
    expect_same_state(*opt_ref, *opt_a);
    EXPECT_EQ(opt_b->iterations(), 3);
  }
}

TEST(OptimizerArena, MixesWithPerVariableApplyOnBoundVariables) {
  std::vector<Var> ref = make_vars({DType::kFloat32}), flat = make_vars({DType::kFloat32});
  Adam opt_ref(1e-2f), opt_flat(1e-2f);
  ParameterArena arena(flat);
  arena_step(opt_flat, arena, flat, 0, 1.0f);
  arena.zero_grad();
  per_variable_step(opt_flat, flat, 1, 1.0f);  // the views are updated in place; compute copies go stale
  arena_step(opt_flat, arena, flat, 2, 1.0f);
  for (int step = 0; step < 3; ++step) per_variable_step(opt_ref, ref, step, 1.0f);
  expect_same_values(ref, flat);
  expect_same_state(opt_ref, opt_flat);
  EXPECT_TRUE(arena.bound_to(flat));
}

TEST(OptimizerArena, RefusesAStaleArena) {
  std::vector<Var> vars = make_vars({DType::kFloat32});
  Sgd opt(0.1f);
  ParameterArena arena(vars);
  vars[0].mutable_value() = vars[0].value().to(DType::kFloat16);
  vars[0].bump_version();
  backward(vars, 0, 1.0f);
  const Tensor before = vars[1].value().clone();
  EXPECT_THROW(opt.apply_arena(arena), Error);
  EXPECT_TRUE(bit_equal(vars[1].value(), before));
  EXPECT_EQ(opt.iterations(), 0);
  arena.bind(vars);
  arena.zero_grad();
  backward(vars, 0, 1.0f);
  opt.apply_arena(arena);
  EXPECT_EQ(opt.iterations(), 1);
}

TEST(OptimizerArena, RefusesNonTrainableVariablesWithGradients) {
  std::vector<Var> vars = make_vars({DType::kFloat32});
  vars[3].set_trainable(false);
  Adam opt(1e-3f);
  ParameterArena arena(vars);
  backward(vars, 0, 1.0f);
  EXPECT_THROW(opt.apply_arena(arena), Error);
  EXPECT_EQ(opt.iterations(), 0);
  EXPECT_EQ(opt.state().size(), 2u) << "no slots were created";
}

}  // namespace
}  // namespace mixtrain
