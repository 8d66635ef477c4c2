// RMSprop against a float64 reference of Keras' formula, its documented example, the arena path (bit-identical
// to apply()) and checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "mixtrain/optim/parameter_arena.h"
#include "mixtrain/optim/rmsprop.h"

namespace mixtrain {
namespace {

const double kW0[2] = {1.0, -2.0};
const double kGrads[4][2] = {{0.5, -1.0}, {0.25, 2.0}, {-0.75, 0.125}, {1e-3, -3.0}};

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.raw(), bc.raw(), ac.nbytes()) == 0;
}

Tensor grad_at(int step) {
  return Tensor::from_floats({2}, {static_cast<float>(kGrads[step][0]), static_cast<float>(kGrads[step][1])});
}

// Keras' RMSprop.update_step in float64.
void rmsprop_reference(double lr, const RMSpropOptions& o, int steps, double w[2]) {
  double v[2] = {0, 0}, m[2] = {0, 0}, a[2] = {0, 0};
  w[0] = kW0[0];
  w[1] = kW0[1];
  const double eps = o.epsilon;
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < 2; ++i) {
      const double g = kGrads[s][i];
      v[i] = o.rho * v[i] + (1 - o.rho) * g * g;
      double denominator = v[i] + eps;
      if (o.centered) {
        a[i] = o.rho * a[i] + (1 - o.rho) * g;
        denominator = v[i] - a[i] * a[i] + eps;
      }
      const double increment = lr * g / std::sqrt(denominator);
      if (o.momentum > 0) {
        m[i] = o.momentum * m[i] + increment;
        w[i] -= m[i];
      } else {
        w[i] -= increment;
      }
    }
  }
}

std::vector<RMSpropOptions> variants() {
  return {RMSpropOptions{}, RMSpropOptions{0.9, 0.8, 1e-7f, false}, RMSpropOptions{0.9, 0.0, 1e-7f, true},
          RMSpropOptions{0.8, 0.5, 1e-6f, true}};
}

std::string describe(const RMSpropOptions& o) {
  return "rho " + std::to_string(o.rho) + " momentum " + std::to_string(o.momentum) +
         (o.centered ? " centered" : "");
}

TEST(RMSprop, MatchesFloat64ReferenceOfKerasFormula) {
  for (const RMSpropOptions& o : variants()) {
    SCOPED_TRACE(describe(o));
    RMSprop opt(0.01f, o);
    Var w(Tensor::from_floats({2}, {static_cast<float>(kW0[0]), static_cast<float>(kW0[1])}), true, "w");
    for (int s = 0; s < 4; ++s) {
      opt.apply({grad_at(s)}, {w});
      double ref[2];
      rmsprop_reference(0.01, o, s + 1, ref);
      // Float32 per element: a handful of roundings per step on values near 1 (each <= 6e-8 relative), and the
      // increments (~0.03) carry the float32 lr and constants' rounding; 4 steps stay within 5e-7.
      for (int i = 0; i < 2; ++i) EXPECT_NEAR(w.value().at(i), ref[i], 5e-7 * std::max(1.0, std::fabs(ref[i])));
    }
    EXPECT_EQ(opt.iterations(), 4);
  }
}

TEST(RMSprop, KerasDocumentedExample) {
  // keras.optimizers.RMSprop(learning_rate=0.1); var1 = 10; loss = var1^2 / 2 (gradient var1): 9.683772.
  RMSprop opt(0.1f);
  Var v(Tensor::from_floats({1}, {10.0f}), true, "var1");
  opt.apply({Tensor::from_floats({1}, {10.0f})}, {v});
  EXPECT_NEAR(v.value().at(0), 9.683772f, 1e-6f);
}

TEST(RMSprop, DefaultsSlotsAndFactory) {
  RMSprop opt;
  EXPECT_EQ(opt.name(), "rmsprop");
  EXPECT_EQ(opt.learning_rate(), 0.001f);
  EXPECT_EQ(opt.options().rho, 0.9);
  EXPECT_EQ(opt.options().momentum, 0.0);
  EXPECT_EQ(opt.options().epsilon, 1e-7f);
  EXPECT_FALSE(opt.options().centered);
  auto made = make_optimizer("rmsprop", 0.02f);
  EXPECT_EQ(made->name(), "rmsprop");
  EXPECT_EQ(made->learning_rate(), 0.02f);

  // Keras' variables: velocity always, momentum and average_gradient only when used.
  for (const RMSpropOptions& o : variants()) {
    RMSprop r(0.01f, o);
    Var w(Tensor::from_floats({2}, {1.0f, 2.0f}), true, "d/kernel");
    r.apply({grad_at(0)}, {w});
    std::vector<std::string> keys;
    for (const auto& [k, t] : r.state()) keys.push_back(k);
    std::vector<std::string> want{"iterations", "learning_rate"};
    if (o.centered) want.push_back("d/kernel/average_gradient");
    if (o.momentum > 0) want.push_back("d/kernel/momentum");
    want.push_back("d/kernel/velocity");
    EXPECT_EQ(keys, want) << describe(o);
  }

  EXPECT_THROW(RMSprop(0.1f, RMSpropOptions{1.0}), Error);
  EXPECT_THROW(RMSprop(0.1f, RMSpropOptions{-0.1}), Error);
  EXPECT_THROW(RMSprop(0.1f, RMSpropOptions{0.9, 1.0}), Error);
  EXPECT_THROW(RMSprop(0.1f, RMSpropOptions{0.9, 0.0, 0.0f}), Error);
}

Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = dist(rng);
  return Tensor::from_floats(shape, v, dtype);
}

// Odd shapes, one above the arena's block and the threads' threshold; variable 3 never gets a gradient.
std::vector<Var> make_vars(DType dtype) {
  const std::vector<Shape> shapes = {{7, 3}, {17}, {31, 5}, {9}, {70001}};
  const std::vector<std::string> names = {"d0/kernel", "d0/bias", "d1/kernel", "d1/unused", "d2/kernel"};
  std::vector<Var> vars;
  for (size_t i = 0; i < shapes.size(); ++i)
    vars.emplace_back(random_tensor(shapes[i], dtype, 200 + static_cast<uint32_t>(i)), true, names[i]);
  return vars;
}

std::vector<Tensor> grads_at(const std::vector<Var>& vars, int step) {
  std::vector<Tensor> g(vars.size());
  for (size_t i = 0; i < vars.size(); ++i)
    if (i != 3) g[i] = random_tensor(vars[i].shape(), DType::kFloat32, 5000 + 100 * step + static_cast<uint32_t>(i));
  return g;
}

TEST(RMSprop, ArenaPassIsBitIdenticalToApply) {
  for (const RMSpropOptions& o : variants()) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (bool clip : {false, true}) {
        SCOPED_TRACE(describe(o) + " " + dtype_name(dtype) + (clip ? " clipnorm" : ""));
        std::vector<Var> ref = make_vars(dtype), flat = make_vars(dtype);
        RMSprop opt_ref(0.01f, o), opt_flat(0.01f, o);
        if (clip) {
          opt_ref.set_global_clipnorm(0.5f);
          opt_flat.set_global_clipnorm(0.5f);
        }
        ParameterArena arena(flat);
        for (int step = 0; step < 3; ++step) {
          const std::vector<Tensor> g = grads_at(ref, step);
          // Gradients are kept in the variable's dtype (as backward leaves them, and as the arena stores them);
          // apply() gets them widened to float32.
          std::vector<Tensor> widened(g.size());
          for (size_t i = 0; i < g.size(); ++i)
            if (g[i].defined()) widened[i] = g[i].to(dtype).to(DType::kFloat32);
          opt_ref.apply(widened, ref);
          arena.zero_grad();
          for (size_t i = 0; i < flat.size(); ++i)
            if (g[i].defined()) flat[i].accumulate_grad(g[i]);
          opt_flat.apply_arena(arena);
          for (size_t i = 0; i < ref.size(); ++i) EXPECT_TRUE(bit_equal(ref[i].value(), flat[i].value())) << i;
          const NamedTensors sa = opt_ref.state(), sb = opt_flat.state();
          ASSERT_EQ(sa.size(), sb.size());
          for (size_t k = 0; k < sa.size(); ++k) {
            EXPECT_EQ(sa[k].first, sb[k].first);
            EXPECT_TRUE(bit_equal(sa[k].second, sb[k].second)) << sa[k].first;
          }
        }
        EXPECT_EQ(ref[3].version(), 0u) << "a variable without a gradient is left alone";
      }
    }
  }
}

TEST(RMSprop, CheckpointRoundTripContinuesBitIdentically) {
  for (const RMSpropOptions& o : variants()) {
    SCOPED_TRACE(describe(o));
    std::vector<Var> straight = make_vars(DType::kFloat32), resumed = make_vars(DType::kFloat32);
    RMSprop a(0.01f, o);
    auto b = std::make_unique<RMSprop>(0.01f, o);
    ParameterArena arena(resumed);  // the resumed run continues on the flat path
    for (int step = 0; step < 6; ++step) {
      const std::vector<Tensor> g = grads_at(straight, step);
      a.apply(g, straight);
      if (step == 3) {
        const NamedTensors saved = b->state();
        b = std::make_unique<RMSprop>(0.01f, o);
        b->load_state(saved);
        EXPECT_EQ(b->iterations(), 3);
      }
      arena.zero_grad();
      for (size_t i = 0; i < resumed.size(); ++i)
        if (g[i].defined()) resumed[i].accumulate_grad(g[i]);
      b->apply_arena(arena);
    }
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_TRUE(bit_equal(straight[i].value(), resumed[i].value())) << i;
    const NamedTensors sa = a.state(), sb = b->state();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t k = 0; k < sa.size(); ++k) EXPECT_TRUE(bit_equal(sa[k].second, sb[k].second)) << sa[k].first;
    // A state from a differently configured optimizer (another slot set) is refused.
    RMSprop plain(0.01f);
    if (o.momentum > 0 || o.centered) {
      EXPECT_THROW(plain.load_state(sa), Error);
    }
  }
}

}  // namespace
}  // namespace mixtrain
