// The optimizer updates' spans (src/ops/cpu/update_spans.cpp, ops::update_span) at every instruction-set level the
// CPU can run (core/isa_level.h): the same bits as the portable baseline, on arrays above and below the size where
// the pass goes multithreaded, and with a length that no vector width divides; through an optimizer's update
// variable by variable and through the fused update's CPU kernel (an arena's update); with Adam's bfloat16 moments and
// bfloat16 master weights rounded to nearest or stochastically (the vectorised rounding pass,
// src/ops/cpu/stochastic_round_span.cpp, against the scalar float_to_bfloat16_sr as well) or with Kahan compensation
// (src/ops/cpu/kahan_round_span.cpp, against the scalar kahan_widen and kahan_split as well).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "mixtrain/core/half.h"
#include "mixtrain/core/isa_level.h"
#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/parameter_arena.h"
#include "mixtrain/optim/rmsprop.h"
#include "mixtrain/optim/sgd.h"
#include "ops/cpu/kahan_round_span.h"
#include "ops/cpu/stochastic_round_span.h"
#include "ops/shared/kahan_round.h"
#include "ops/shared/stochastic_round.h"

namespace mixtrain {
namespace {

struct ResetIsa {
  ~ResetIsa() { set_isa_level_for_testing(std::nullopt); }
};

Tensor random_tensor(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  v[0] = 0.0f;        // a zero gradient: v stays 0, the division meets epsilon alone
  v[1] = 1e-30f;      // squares to a subnormal
  return Tensor::from_floats({n}, v);
}

// Three steps of a fresh optimizer on one variable of n elements of `dtype`, by apply() or through an arena (the
// fused update's CPU kernel); the final weights and slots, as bytes.
std::vector<uint8_t> train(const std::function<std::unique_ptr<Optimizer>()>& make, int64_t n, bool arena,
                           DType dtype = DType::kFloat32) {
  auto opt = make();
  Var w(random_tensor(n, 1, 1.0f).to(dtype), true, "w");
  ParameterArena flat;
  if (arena) flat.bind({w});
  for (uint32_t step = 0; step < 3; ++step) {
    if (!arena) {
      opt->apply({random_tensor(n, 10 + step, 0.1f)}, {w});
      continue;
    }
    flat.zero_grad();
    w.accumulate_grad(random_tensor(n, 10 + step, 0.1f));
    opt->apply_arena(flat);
  }
  std::vector<uint8_t> bytes(static_cast<const uint8_t*>(w.value().raw()),
                             static_cast<const uint8_t*>(w.value().raw()) + w.value().nbytes());
  for (const auto& [name, t] : opt->state()) {
    const Tensor c = t.contiguous();
    bytes.insert(bytes.end(), static_cast<const uint8_t*>(c.raw()), static_cast<const uint8_t*>(c.raw()) + c.nbytes());
  }
  return bytes;
}

// arena_only: a rule apply() refuses (16-bit state, stochastic rounding of bfloat16 weights).
void expect_same_bits_at_every_level(const char* what, const std::function<std::unique_ptr<Optimizer>()>& make,
                                     bool arena_only = false, DType dtype = DType::kFloat32) {
  ResetIsa reset;
  for (int64_t n : {int64_t{37}, int64_t{70001}})  // below and above the multithreading threshold (65,536)
    for (bool arena : {false, true}) {
      if (arena_only && !arena) continue;
      set_isa_level_for_testing(IsaLevel::kScalar);
      const std::vector<uint8_t> scalar = train(make, n, arena, dtype);
      for (IsaLevel l : {IsaLevel::kAvx2, IsaLevel::kAvx512}) {
        if (set_isa_level_for_testing(l) != l) {
          std::printf("[ note ] %s: %s not supported here, not compared\n", what, isa_level_name(l));
          continue;
        }
        const std::vector<uint8_t> got = train(make, n, arena, dtype);
        ASSERT_EQ(got.size(), scalar.size());
        size_t first = 0;
        while (first < got.size() && got[first] == scalar[first]) ++first;
        EXPECT_EQ(first, got.size()) << what << " at " << isa_level_name(l) << ", n = " << n
                                     << (arena ? " (arena)" : "") << ": the bytes differ first at float " << first / 4
                                     << " of " << got.size() / 4;
      }
    }
}

TEST(OptimizerIsaVariants, AdamGivesTheSameBitsAtEveryLevel) {
  expect_same_bits_at_every_level("adam", [] { return std::make_unique<Adam>(0.01f); });
}

TEST(OptimizerIsaVariants, RmspropGivesTheSameBitsAtEveryLevelInEveryCase) {
  for (double momentum : {0.0, 0.9})
    for (bool centered : {false, true}) {
      const std::string what = "rmsprop momentum " + std::to_string(momentum) + (centered ? " centered" : "");
      expect_same_bits_at_every_level(what.c_str(), [=] {
        return std::make_unique<RMSprop>(0.01f, RMSpropOptions{.momentum = momentum, .centered = centered});
      });
    }
}

TEST(OptimizerIsaVariants, SgdAndAdamwGiveTheSameBitsAtEveryLevel) {
  expect_same_bits_at_every_level("sgd", [] { return std::make_unique<Sgd>(0.1f); });
  expect_same_bits_at_every_level("sgd nesterov", [] { return std::make_unique<Sgd>(0.1f, 0.9f, true); });
  expect_same_bits_at_every_level("adamw", [] { return std::make_unique<AdamW>(0.01f, 0.05f); });
}

// Adam's bfloat16 moments, rounded to nearest and stochastically, under float32 and bfloat16 weights; AdamW's decay
// with them.
TEST(OptimizerIsaVariants, AdamWithBfloat16StateGivesTheSameBitsAtEveryLevel) {
  for (bool stochastic : {false, true})
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      AdamOptions o;
      o.optimizer_state = DType::kBFloat16;
      o.stochastic_rounding = stochastic;
      o.rounding_seed = 11;
      const std::string what = std::string("adam bfloat16 state, ") + dtype_name(dtype) + " weights" +
                               (stochastic ? ", stochastic" : ", nearest");
      expect_same_bits_at_every_level(what.c_str(), [o] { return std::make_unique<Adam>(0.01f, o); }, true, dtype);
      expect_same_bits_at_every_level(what.c_str(), [o] { return std::make_unique<AdamW>(0.01f, 0.05f, o); }, true,
                                      dtype);
    }
}

// bfloat16 master weights with float32 moments under stochastic rounding: the vectorised pass alone.
TEST(OptimizerIsaVariants, StochasticRoundingOfBfloat16WeightsGivesTheSameBitsAtEveryLevel) {
  AdamOptions o;
  o.stochastic_rounding = true;
  o.rounding_seed = 3;
  expect_same_bits_at_every_level("adam stochastic bfloat16 weights", [o] { return std::make_unique<Adam>(0.01f, o); },
                                  true, DType::kBFloat16);
}

// The rounding pass against the scalar float_to_bfloat16_sr element by element, on the values whose rounding the
// pass selects rather than computes (infinities, NaNs, the finite values that would round up past the largest
// bfloat16), zeros, subnormals and random values, at a length no vector width divides and an offset index.
TEST(OptimizerIsaVariants, StochasticRoundingPassEqualsTheScalarFunctionAtEveryLevel) {
  std::vector<float> x = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, bits_float(0x7F800001u), bits_float(0xFFC12345u),
                          3.4028235e38f, -3.4028235e38f, bits_float(0x7F7F8000u), bits_float(0x7F7FFFFFu),
                          1e-40f, -1e-45f, 1.0f, 1.00123f};
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0.0f, 10.0f);
  while (x.size() < 1037) x.push_back(dist(rng));
  const uint64_t seed = 77, step = 5, first = 123456;
  std::vector<uint16_t> expected(x.size());
  for (size_t j = 0; j < x.size(); ++j) expected[j] = ops::shared::float_to_bfloat16_sr(x[j], seed, step, first + j);
  ResetIsa reset;
  for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (set_isa_level_for_testing(l) != l) {
      std::printf("[ note ] stochastic rounding pass: %s not supported here, not compared\n", isa_level_name(l));
      continue;
    }
    std::vector<uint16_t> got(x.size());
    ops::cpu::round_bfloat16_stochastic(x.data(), got.data(), static_cast<int64_t>(x.size()), seed, step, first);
    for (size_t j = 0; j < x.size(); ++j)
      ASSERT_EQ(got[j], expected[j]) << isa_level_name(l) << ": element " << j << " (" << x[j] << ")";
  }
}

// bfloat16 master weights with Kahan compensation, float32 and bfloat16 moments, Adam and AdamW: the widening and
// splitting passes (the compensation slot is among the state bytes compared).
TEST(OptimizerIsaVariants, KahanCompensationOfBfloat16WeightsGivesTheSameBitsAtEveryLevel) {
  for (DType state : {DType::kFloat32, DType::kBFloat16}) {
    AdamOptions o;
    o.kahan_summation = true;
    o.optimizer_state = state;
    const std::string what = std::string("adam kahan, ") + dtype_name(state) + " moments";
    expect_same_bits_at_every_level(what.c_str(), [o] { return std::make_unique<Adam>(0.01f, o); }, true,
                                    DType::kBFloat16);
    expect_same_bits_at_every_level(what.c_str(), [o] { return std::make_unique<AdamW>(0.01f, 0.05f, o); }, true,
                                    DType::kBFloat16);
  }
}

// The Kahan passes against the scalar kahan_split and kahan_widen element by element: the split on the values whose
// compensation the pass selects rather than computes (infinities, NaNs, the finite values that round past the
// largest bfloat16), ties, zeros, subnormals and random values; the widening on random bit pairs and specials.
TEST(OptimizerIsaVariants, KahanPassesEqualTheScalarFunctionsAtEveryLevel) {
  std::vector<float> x = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, bits_float(0x7F800001u), bits_float(0xFFC12345u),
                          3.4028235e38f, -3.4028235e38f, bits_float(0x7F7F8000u), bits_float(0x7F7FFFFFu),
                          bits_float(0x3F808000u), bits_float(0x3F818000u), 1e-40f, -1e-45f, 1.0f, 1.00123f};
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 10.0f);
  while (x.size() < 1037) x.push_back(dist(rng));
  std::vector<uint16_t> w_bits(x.size()), c_bits(x.size());
  std::uniform_int_distribution<uint32_t> bits16(0, 0xFFFF);
  for (size_t j = 0; j < x.size(); ++j) {
    w_bits[j] = static_cast<uint16_t>(bits16(rng));
    c_bits[j] = static_cast<uint16_t>(j < 8 ? 0x7F80u + j : bits16(rng));  // infinity and NaNs among them
  }
  std::vector<uint16_t> want_w(x.size()), want_c(x.size());
  std::vector<float> want_wide(x.size());
  for (size_t j = 0; j < x.size(); ++j) {
    ops::shared::kahan_split(x[j], &want_w[j], &want_c[j]);
    want_wide[j] = ops::shared::kahan_widen(w_bits[j], c_bits[j]);
  }
  ResetIsa reset;
  const int64_t n = static_cast<int64_t>(x.size());
  for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (set_isa_level_for_testing(l) != l) {
      std::printf("[ note ] kahan passes: %s not supported here, not compared\n", isa_level_name(l));
      continue;
    }
    std::vector<uint16_t> w(x.size()), c(x.size());
    std::vector<float> wide(x.size());
    ops::cpu::round_bfloat16_kahan(x.data(), w.data(), c.data(), n);
    ops::cpu::widen_bfloat16_kahan(w_bits.data(), c_bits.data(), wide.data(), n);
    for (size_t j = 0; j < x.size(); ++j) {
      ASSERT_EQ(w[j], want_w[j]) << isa_level_name(l) << ": weight " << j << " (" << x[j] << ")";
      ASSERT_EQ(c[j], want_c[j]) << isa_level_name(l) << ": compensation " << j << " (" << x[j] << ")";
      ASSERT_EQ(float_bits(wide[j]), float_bits(want_wide[j])) << isa_level_name(l) << ": widened " << j;
    }
  }
}

}  // namespace
}  // namespace mixtrain
