// The bfloat16 gradient exchange (distributed/bfloat16_exchange.h, FitOptions::grad_comm) on two ranks: each rank's
// values rounded once to bfloat16, summed in float32 in rank order, the sum rounded once; checked bit for bit against
// an independent definition of bfloat16's rounding (float64 arithmetic, ties to even) and against the exact sum
// within the bound that rounding gives, with no non-finite value hidden and every rank holding the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>

#include "../train/blobs.h"
#include "mixtrain/distributed/bfloat16_exchange.h"
#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/distributed/zero.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/optim/sgd.h"
#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/model.h"
#include "two_ranks.h"

namespace mixtrain {
namespace {

using distributed_test::flat_values;
using distributed_test::max_relative_difference;
using distributed_test::same_bits_on_all_ranks;
using train_test::blobs;

// bfloat16 keeps 8 significant bits: rounding to nearest moves a value in its normal range by at most 2^-8 of it
// (the unit roundoff); the smallest subnormal step is 2^-133.
constexpr double kUnitRoundoff = 0x1p-8;
constexpr double kSubnormalStep = 0x1p-133;

// Round to nearest, ties to even, at 8 significant bits, in float64: the definition, written without the library's
// bit manipulation. Past bfloat16's largest finite value (0x1.FEp127) a value rounds to infinity.
double round_to_bfloat16(double x) {
  if (x == 0 || !std::isfinite(x)) return x;
  const int e = std::max(std::ilogb(x), -126);  // below 2^-126 the quantum stays 2^-133 (subnormals)
  const double quantum = std::ldexp(1.0, e - 7);
  const double r = std::nearbyint(x / quantum) * quantum;  // the default rounding mode: ties to even
  return std::abs(r) > 0x1.FEp127 ? std::copysign(std::numeric_limits<double>::infinity(), r) : r;
}

// Rank-dependent values over many magnitudes, with odd length so the two blocks differ in size.
std::vector<float> values_of(int rank, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng rng(100 + static_cast<uint64_t>(rank));
  for (int64_t i = 0; i < n; ++i) {
    const double mantissa = 2.0 * rng.uniform() - 1.0;
    const int exponent = static_cast<int>(rng.uniform() * 60.0) - 30 - (i % 97 == 0 ? 110 : 0);  // some subnormal
    v[static_cast<size_t>(i)] = static_cast<float>(std::ldexp(mantissa, exponent));
  }
  return v;
}

TEST(BFloat16Exchange, AllReduceIsTheRoundedSumOfRoundedValuesOnEveryRank) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  const int64_t n = 1031;
  const std::vector<float> mine = values_of(comm.rank(), n), v0 = values_of(0, n), v1 = values_of(1, n);
  std::vector<float> data = mine;
  comm.reset_stats();
  const int64_t handed = all_reduce_bfloat16(data.data(), n, comm);
  const int64_t bf16_bytes = comm.stats().bytes;
  std::vector<float> f32 = mine;
  comm.reset_stats();
  comm.all_reduce(f32.data(), n, ReduceOp::kSum);
  EXPECT_EQ(handed, 2 * n);
  EXPECT_EQ(bf16_bytes * 2, comm.stats().bytes) << "half the float32 all-reduce's bytes";
  int worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = v0[static_cast<size_t>(i)], b = v1[static_cast<size_t>(i)];
    // float32 adds two bfloat16 values of 8 significant bits: its one rounding is below bfloat16's next one.
    const double expected = round_to_bfloat16(static_cast<float>(round_to_bfloat16(a) + round_to_bfloat16(b)));
    ASSERT_EQ(static_cast<double>(data[static_cast<size_t>(i)]), expected) << "element " << i;
    // Against the exact sum: two roundings of the terms and one of the sum, plus float32's and subnormal steps.
    const double bound = kUnitRoundoff * (std::abs(a) + std::abs(b) + std::abs(a + b)) +
                         0x1p-24 * std::abs(a + b) + 3 * kSubnormalStep;
    if (std::abs(data[static_cast<size_t>(i)] - (a + b)) > bound) ++worst;
  }
  EXPECT_EQ(worst, 0) << "elements outside bfloat16's rounding bound";
  EXPECT_TRUE(same_bits_on_all_ranks(data, comm));
}

TEST(BFloat16Exchange, ReduceScatterLeavesEachRankTheFloat32SumOfItsShare) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  const int64_t n = 517;
  const std::vector<int64_t> counts{buffer_share(n, 0, 2).size(), buffer_share(n, 1, 2).size()};
  std::vector<float> data = values_of(comm.rank(), n);
  const std::vector<float> v0 = values_of(0, n), v1 = values_of(1, n);
  EXPECT_EQ(reduce_scatter_bfloat16(data.data(), counts, comm), 2 * n);
  const BufferShare share = buffer_share(n, comm.rank(), 2);
  for (int64_t i = share.begin; i < share.end; ++i) {
    const auto k = static_cast<size_t>(i);
    const float expected = static_cast<float>(round_to_bfloat16(v0[k])) + static_cast<float>(round_to_bfloat16(v1[k]));
    ASSERT_EQ(data[k], expected) << "element " << i << " (not rounded again: it stays on this rank)";
  }
}

TEST(BFloat16Exchange, NoNonFiniteValueIsHidden) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max();
  // Per element: rank 0's value, rank 1's value. The last: two finite float32 values whose rounding reaches inf.
  const std::vector<std::pair<float, float>> cases{{1.0f, inf}, {-inf, 2.0f}, {nan, 1.0f},  {3.0f, nan},
                                                   {inf, -inf}, {big, big},   {0.5f, 0.25f}, {big, 0.0f}};
  std::vector<float> data;
  for (const auto& [a, b] : cases) data.push_back(comm.rank() == 0 ? a : b);
  all_reduce_bfloat16(data.data(), static_cast<int64_t>(data.size()), comm);
  for (size_t i = 0; i + 2 < cases.size(); ++i) EXPECT_FALSE(std::isfinite(data[i])) << "case " << i;
  EXPECT_EQ(data[6], 0.75f);
  EXPECT_EQ(data[7], inf) << "float32's largest is past bfloat16's: it rounds to inf (a skip, never a hidden one)";
}

// One SGD step at learning rate 1 moves each weight by its exchanged gradient, so the two exchanges' weights differ
// by the exchanges' difference: bounded by bfloat16's rounding of each rank's weighted shard gradient (each rank's
// own, from a step on its shard alone) and of their sum, plus float32's rounding of w - g.
TEST(GradComm, OneStepIsTheFloat32ExchangeWithinBfloat16Rounding) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(64, 8);
  const ShardRange s = shard_range(64, comm.rank(), comm.size());
  const Tensor xs = x.slice_rows(s.begin, s.end).clone(), ys = y.slice_rows(s.begin, s.end).clone();
  const auto stepped = [&](Communicator* c, DType wire) {
    Model m("mlp", 9);
    m.emplace<Dense>(33, "relu");
    m.emplace<Dense>(3);
    m.compile(std::make_unique<Sgd>(1.0f), Loss("sparse_categorical_crossentropy", true));
    m.build_for(Shape{8});
    m.set_gradient_comm_dtype(wire);
    m.train_step(xs, ys, c, c ? 64 : 0);
    return flat_values(m.weights());
  };
  Model start("mlp", 9);
  start.emplace<Dense>(33, "relu");
  start.emplace<Dense>(3);
  start.build_for(Shape{8});
  const std::vector<float> w0 = flat_values(start.weights());
  const std::vector<float> f32 = stepped(&comm, DType::kFloat32), bf16 = stepped(&comm, DType::kBFloat16);
  // Sum over the ranks of |weight_r g_r|, weight_r = rows_r / 64 = 1/2, from each rank's own step.
  const std::vector<float> alone = stepped(nullptr, DType::kFloat32);
  std::vector<double> magnitude(w0.size());
  for (size_t i = 0; i < w0.size(); ++i) magnitude[i] = 0.5 * std::abs(static_cast<double>(w0[i]) - alone[i]);
  comm.all_reduce(magnitude.data(), static_cast<int64_t>(magnitude.size()), ReduceOp::kSum);
  int outside = 0;
  double largest = 0;
  for (size_t i = 0; i < w0.size(); ++i) {
    const double g = std::abs(static_cast<double>(w0[i]) - f32[i]);
    const double bound = 2 * kUnitRoundoff * (magnitude[i] + g) + 0x1p-22 * (std::abs(w0[i]) + magnitude[i] + g);
    const double d = std::abs(static_cast<double>(bf16[i]) - f32[i]);
    largest = std::max(largest, d / (bound + 1e-30));
    if (d > bound) ++outside;
  }
  if (comm.rank() == 0) std::cout << "one step: largest difference / bound " << largest << "\n";
  EXPECT_EQ(outside, 0);
  EXPECT_NE(bf16, f32) << "the exchange did not round";
  EXPECT_TRUE(same_bits_on_all_ranks(bf16, comm));
}

std::unique_ptr<Model> adam_mlp(uint64_t seed, int64_t accumulate) {
  auto m = std::make_unique<Model>("mlp", seed);
  m->emplace<Dense>(33, "relu");
  m->emplace<Dense>(17, "relu");
  m->emplace<Dense>(3);
  m->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  m->optimizer().set_gradient_accumulation_steps(accumulate);
  return m;
}

// fit() with bfloat16 gradients, plain, with 4 micro-batches (one exchange per update: the same bytes per update as
// without them) and under ZeRO-1: the ranks' weights stay bit-identical and the runs train as the float32 exchange's.
TEST(GradComm, FitKeepsRanksBitIdenticalWithAccumulationAndZero1) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(480, 31);
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 32;
  o.verbose = 0;
  o.communicator = &comm;
  auto reference = adam_mlp(7, 1);
  const History h32 = reference->fit(x, y, o);
  o.grad_comm = DType::kBFloat16;
  const int64_t updates = 2 * 15;
  int64_t unaccumulated_bytes = 0;
  for (int64_t accumulate : {1, 4}) {
    for (int zero = 0; zero < 2; ++zero) {
      o.zero_stage = zero;
      auto m = adam_mlp(7, accumulate);
      comm.reset_stats();
      const History h = m->fit(x, y, o);
      const int64_t bytes = comm.stats().bytes;
      const std::vector<float> w = flat_values(m->weights());
      EXPECT_TRUE(same_bits_on_all_ranks(w, comm)) << "accumulate " << accumulate << " zero " << zero;
      EXPECT_NE(w, flat_values(reference->weights()));
      EXPECT_NEAR(h.history.at("loss").back(), h32.history.at("loss").back(), 0.02)
          << "accumulate " << accumulate << " zero " << zero;
      if (zero == 0 && comm.rank() == 0)
        std::cout << "accumulate " << accumulate << ": " << bytes / updates << " bytes exchanged per update\n";
      if (zero == 0 && accumulate == 1) unaccumulated_bytes = bytes;
      if (zero == 0 && accumulate == 4) {
        EXPECT_EQ(bytes, unaccumulated_bytes) << "one exchange per update";
      }
    }
  }
}

class GradCommLossScale : public ::testing::Test {
 protected:
  void SetUp() override { set_precision_warning_sink([](const std::string&) {}); }
  void TearDown() override {
    set_global_policy("float32");
    set_precision_warning_sink(nullptr);
  }
};

// mixed_float16 with an infinite input on rank 1 at the third step: both ranks skip that step and halve the scale,
// as under the float32 exchange, plain and under ZeRO-1.
TEST_F(GradCommLossScale, APlantedNonFiniteSkipsOnEveryRank) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(64, 16);
  const ShardRange s = shard_range(64, comm.rank(), comm.size());
  const Tensor xs = x.slice_rows(s.begin, s.end).clone(), ys = y.slice_rows(s.begin, s.end);
  std::vector<float> scales[3];
  for (int run = 0; run < 3; ++run) {  // float32, bfloat16, bfloat16 with ZeRO-1
    set_global_policy("mixed_float16");
    Model m("mlp", 3);
    m.emplace<Dense>(33, "relu");
    m.emplace<Dense>(3, "linear", dtype_arg("float32"));
    set_global_policy("float32");
    m.compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true));
    auto& scaler = dynamic_cast<LossScaleOptimizer&>(m.optimizer());
    m.build_for(Shape{8});
    broadcast_variables(m.weights(), comm);
    m.set_gradient_comm_dtype(run == 0 ? DType::kFloat32 : DType::kBFloat16);
    if (run == 2) scaler.inner_optimizer().set_shard_group(shard_group(comm));
    for (int step = 0; step < 6; ++step) {
      Tensor in = xs.clone();
      if (step == 2 && comm.rank() == 1) in.data<float>()[5] = std::numeric_limits<float>::infinity();
      const std::vector<float> before = flat_values(m.weights());
      m.train_step(in, ys, &comm);
      EXPECT_EQ(scaler.last_step_skipped(), step == 2) << "step " << step << " run " << run;
      if (step == 2) {
        EXPECT_EQ(flat_values(m.weights()), before) << "run " << run;
      }
      scales[run].push_back(scaler.loss_scale());
    }
    EXPECT_TRUE(same_bits_on_all_ranks(flat_values(m.weights()), comm)) << "run " << run;
  }
  EXPECT_EQ(scales[1], scales[0]);
  EXPECT_EQ(scales[2], scales[0]);
}

TEST(GradComm, OtherDtypesAreRefused) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  auto m = adam_mlp(5, 1);
  EXPECT_THROW(m->set_gradient_comm_dtype(DType::kFloat16), Error);
  std::vector<Tensor> grads{Tensor::full({4}, DType::kFloat32, 1.0f)};
  EXPECT_THROW(all_reduce_gradients(grads, world_communicator(), 0.5f, DType::kFloat16), Error);
}

}  // namespace
}  // namespace mixtrain
