// ZeRO stage 1 on two ranks against plain data parallelism on the same two ranks: the optimizer's slots split
// across the ranks, the gradients reduce-scattered, each rank updating its share and the weights all-gathered,
// must give plain data parallelism's weights, loss scale and optimizer state (within 1e-6: the two paths sum the
// same two float32 shard gradients, and only global clipping's norm is summed in another order), with one skip
// decision for both ranks when only one of them holds a non-finite gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>

#include "../train/blobs.h"
#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/distributed/zero.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/optim/adam.h"
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

// The brief's bound: the same sums in the same float32 order, but for the clipping norm's.
constexpr double kZeroTolerance = 1e-6;

struct ZeroCase {
  int64_t accumulate = 1;
  std::optional<float> clipnorm;
  DType state = DType::kFloat32;
};

std::unique_ptr<Model> mlp(uint64_t seed, const ZeroCase& s) {
  auto m = std::make_unique<Model>("mlp", seed);
  m->emplace<Dense>(33, "relu");  // odd sizes: the shares split variables in the middle
  m->emplace<Dense>(17, "relu");
  m->emplace<Dense>(3);
  AdamOptions o;
  o.optimizer_state = s.state;
  m->compile(std::make_unique<Adam>(0.01f, o), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  m->optimizer().set_gradient_accumulation_steps(s.accumulate);
  if (s.clipnorm) m->optimizer().set_global_clipnorm(s.clipnorm);
  return m;
}

// Every optimizer entry's values, in state() order (gathered first on a sharded optimizer).
std::vector<float> optimizer_values(Model& m) {
  m.optimizer().inner_optimizer().gather_shards();
  std::vector<float> all;
  for (const auto& [key, t] : m.optimizer().state()) {
    const std::vector<float> f = t.to(DType::kFloat32).to_floats();
    all.insert(all.end(), f.begin(), f.end());
  }
  return all;
}

void expect_zero_equals_plain(const ZeroCase& setup, const char* what) {
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(480, 31);
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 32;
  o.verbose = 0;
  o.communicator = &comm;
  auto plain = mlp(7, setup);
  plain->fit(x, y, o);
  o.zero_stage = 1;
  auto zero = mlp(7, setup);
  zero->fit(x, y, o);
  EXPECT_TRUE(zero->optimizer().inner_optimizer().sharded());
  const std::vector<float> wz = flat_values(zero->weights());
  const double difference = max_relative_difference(wz, flat_values(plain->weights()));
  if (comm.rank() == 0) std::cout << what << ": largest relative weight difference " << difference << "\n";
  EXPECT_LT(difference, kZeroTolerance) << what;
  EXPECT_TRUE(same_bits_on_all_ranks(wz, comm)) << what;
  EXPECT_EQ(zero->optimizer().iterations(), plain->optimizer().iterations()) << what;
  EXPECT_LT(max_relative_difference(optimizer_values(*zero), optimizer_values(*plain)), kZeroTolerance) << what;
}

TEST(Zero1, TwoRanksEqualPlainDataParallel) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  expect_zero_equals_plain({}, "float32");
}

TEST(Zero1, GlobalClippingNormIsTheWholeGradients) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  ZeroCase clipped;
  clipped.clipnorm = 0.05f;  // small enough to clip most steps
  expect_zero_equals_plain(clipped, "clipnorm 0.05");
}

TEST(Zero1, AccumulationAndBfloat16StateShardToo) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  ZeroCase accumulating;
  accumulating.accumulate = 4;
  expect_zero_equals_plain(accumulating, "accumulate 4");
  ZeroCase bfloat16_state;
  bfloat16_state.state = DType::kBFloat16;
  expect_zero_equals_plain(bfloat16_state, "bfloat16 optimizer state");
}

class Zero1LossScale : public ::testing::Test {
 protected:
  void SetUp() override { set_precision_warning_sink([](const std::string&) {}); }
  void TearDown() override {
    set_global_policy("float32");
    set_precision_warning_sink(nullptr);
  }
};

// mixed_float16 steps with an infinite input on rank 1 at the third: the same skipped step, scale and weights as
// plain data parallelism.
TEST_F(Zero1LossScale, APlantedNonFiniteSkipsLikePlainDataParallel) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(64, 16);
  const ShardRange s = shard_range(64, comm.rank(), comm.size());
  const Tensor xs = x.slice_rows(s.begin, s.end).clone(), ys = y.slice_rows(s.begin, s.end);
  std::vector<float> weights[2], scales[2];
  for (int zero = 0; zero < 2; ++zero) {
    set_global_policy("mixed_float16");
    Model m("mlp", 3);
    m.emplace<Dense>(33, "relu");
    m.emplace<Dense>(3, "linear", dtype_arg("float32"));
    set_global_policy("float32");
    m.compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true));
    auto& scaler = dynamic_cast<LossScaleOptimizer&>(m.optimizer());
    m.build_for(Shape{8});
    broadcast_variables(m.weights(), comm);
    if (zero) scaler.inner_optimizer().set_shard_group(shard_group(comm));
    for (int step = 0; step < 6; ++step) {
      Tensor in = xs.clone();
      if (step == 2 && comm.rank() == 1) in.data<float>()[5] = std::numeric_limits<float>::infinity();
      m.train_step(in, ys, &comm);
      EXPECT_EQ(scaler.last_step_skipped(), step == 2) << "step " << step << " zero " << zero;
      scales[zero].push_back(scaler.loss_scale());
    }
    scales[zero].push_back(static_cast<float>(scaler.skipped_steps()));
    weights[zero] = flat_values(m.weights());
    EXPECT_TRUE(same_bits_on_all_ranks(weights[zero], comm));
  }
  EXPECT_EQ(scales[1], scales[0]);
  EXPECT_LT(max_relative_difference(weights[1], weights[0]), kZeroTolerance);
}

// The flag alone carries the decision: a non-finite gradient in rank 1's share of rank 1's buffer reaches no
// element that rank 0 checks, and rank 0 still skips, with the same scale.
TEST_F(Zero1LossScale, ANonFiniteOnlyInTheOtherRanksShareSkipsEveryRank) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  std::vector<Var> vars{Var(Tensor::full({40}, DType::kFloat32, 0.5f), true, "a/kernel"),
                        Var(Tensor::full({24}, DType::kFloat32, -0.25f), true, "b/kernel")};
  ParameterArena arena(vars);
  LossScaleOptimizer opt(make_optimizer("adam", 0.01f));
  opt.inner_optimizer().set_shard_group(shard_group(comm));
  const int64_t n = arena.capacity(DType::kFloat32);
  const BufferShare rank1 = buffer_share(n, 1, 2);
  for (int step = 0; step < 2; ++step) {
    arena.zero_grad();
    for (Var v : vars) v.set_grad(Tensor::full(v.shape(), DType::kFloat32, 1.0f));
    Tensor g = arena.gradient_buffer(DType::kFloat32);
    if (step == 1 && comm.rank() == 1) g.data<float>()[rank1.end - 1] = std::numeric_limits<float>::quiet_NaN();
    reduce_scatter_gradients(arena, comm, 0.5f);
    const std::vector<float> before = flat_values(vars);
    const float scale = opt.loss_scale();
    opt.apply_arena(arena);
    EXPECT_EQ(opt.last_step_skipped(), step == 1) << "rank " << comm.rank() << " step " << step;
    if (step == 1) {
      EXPECT_EQ(flat_values(vars), before) << "rank " << comm.rank();
      EXPECT_EQ(opt.loss_scale(), scale / 2) << "rank " << comm.rank();
    }
    EXPECT_TRUE(same_bits_on_all_ranks(flat_values(vars), comm));
  }
}

TEST(Zero1, StateNeedsAGatherAndStochasticRoundingIsRefused) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(64, 4);
  FitOptions o;
  o.epochs = 1;
  o.verbose = 0;
  o.communicator = &comm;
  o.zero_stage = 1;
  auto m = mlp(5, {});
  m->fit(x, y, o);
  EXPECT_THROW(m->optimizer().state(), Error);
  m->optimizer().inner_optimizer().gather_shards();
  EXPECT_NO_THROW(m->optimizer().state());
  AdamOptions rounding;
  rounding.stochastic_rounding = true;
  Adam adam(0.01f, rounding);
  EXPECT_THROW(adam.set_shard_group(shard_group(comm)), Error);
  o.zero_stage = 2;
  EXPECT_THROW(mlp(5, {})->fit(x, y, o), Error);
}

}  // namespace
}  // namespace mixtrain
