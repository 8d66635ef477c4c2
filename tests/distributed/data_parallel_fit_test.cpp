// Data-parallel training on two ranks against one process at the same global batch: the same final weights
// (within float32 reduction-order tolerance), the same accuracy, identical weights on both ranks, and one
// loss-scale decision for both ranks when only one of them sees a non-finite gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <tuple>

#include "../train/blobs.h"
#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/nn/layers.h"
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

std::unique_ptr<Model> mlp(uint64_t seed, float dropout = 0.0f) {
  auto m = std::make_unique<Model>("mlp", seed);
  m->emplace<Dense>(32, "relu");
  if (dropout > 0) m->emplace<Dropout>(dropout);
  m->emplace<Dense>(3);
  m->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

// float32 reduction-order tolerance after a few dozen Adam steps: each step's gradient differs from the
// single-process one by a few float32 ulps (the shard means are added instead of one mean over the batch), and
// Adam's normalised update carries such differences at about their own relative size.
constexpr double kWeightTolerance = 1e-5;

TEST(DataParallelFit, TwoRanksTrainTheMlpToTheSingleProcessWeights) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(600, 11);
  auto [tx, ty] = blobs(300, 12);
  FitOptions o;
  o.epochs = 3;
  o.batch_size = 32;
  o.validation_split = 0.2;
  auto single = mlp(5);
  History hs = single->fit(x, y, o);  // every rank trains the reference alone
  o.communicator = &comm;
  auto parallel = mlp(5);
  History hp = parallel->fit(x, y, o);

  const std::vector<float> ws = flat_values(single->weights()), wp = flat_values(parallel->weights());
  const double difference = max_relative_difference(wp, ws);
  if (comm.rank() == 0) std::cout << "MLP: largest relative weight difference to one process " << difference << "\n";
  EXPECT_LT(difference, kWeightTolerance);
  EXPECT_TRUE(same_bits_on_all_ranks(wp, comm)) << "the ranks' weights diverged";
  EXPECT_EQ(hp.steps, hs.steps);
  EXPECT_EQ(hp.samples, hs.samples);  // the global batch's rows, not this rank's
  ASSERT_EQ(hp.step_loss.size(), hs.step_loss.size());
  for (size_t i = 0; i < hs.step_loss.size(); ++i) EXPECT_NEAR(hp.step_loss[i], hs.step_loss[i], 1e-4) << "step " << i;
  EXPECT_NEAR(hp.history["val_loss"].back(), hs.history["val_loss"].back(), 1e-4);
  const EvaluateResult es = single->evaluate(tx, ty), ep = parallel->evaluate(tx, ty, 256, &comm);
  EXPECT_NEAR(ep.accuracy, es.accuracy, 0.001);
  EXPECT_GT(ep.accuracy, 0.9);
}

TEST(DataParallelFit, BucketsStartedDuringBackwardGiveTheSameBitsAsOneBucket) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  Tensor x, y;  // captured below: not a structured binding (clang 14 cannot capture those)
  std::tie(x, y) = blobs(256, 18);
  auto run = [&](int64_t bucket_bytes) {
    auto m = std::make_unique<Model>("mlp", 4);
    m->emplace<Dense>(64, "relu");
    m->emplace<Dense>(64, "relu");
    m->emplace<Dense>(3);
    m->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true));
    m->set_gradient_bucket_bytes(bucket_bytes);
    FitOptions o;
    o.epochs = 1;
    o.batch_size = 32;
    o.communicator = &comm;
    m->fit(x, y, o);
    return flat_values(m->weights());
  };
  const int64_t calls_before = comm.stats().calls;
  const std::vector<float> one_bucket = run(int64_t{1} << 30);
  const int64_t calls_one = comm.stats().calls - calls_before;
  // 1 KiB buckets: the last two layers' gradients (17 KiB, one bucket) leave while the first layer's backward
  // runs, the first layer's after it; the sums are elementwise, so bucketing changes no bit.
  const std::vector<float> small_buckets = run(1024);
  const int64_t calls_small = comm.stats().calls - calls_before - calls_one;
  EXPECT_GT(calls_small, calls_one) << "the small buckets were not used";
  EXPECT_EQ(small_buckets, one_bucket);
  EXPECT_TRUE(same_bits_on_all_ranks(small_buckets, comm));
}

TEST(DataParallelFit, AnEmptyShardOfASmallLastBatchStillTakesPart) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(97, 13);  // batches of 32: the last one has 1 row, rank 1's shard of it is empty
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 32;
  o.shuffle = true;
  auto single = mlp(6);
  single->fit(x, y, o);
  o.communicator = &comm;
  auto parallel = mlp(6);
  History h = parallel->fit(x, y, o);
  EXPECT_EQ(h.steps, 8);
  const std::vector<float> wp = flat_values(parallel->weights());
  EXPECT_LT(max_relative_difference(wp, flat_values(single->weights())), kWeightTolerance);
  EXPECT_TRUE(same_bits_on_all_ranks(wp, comm));
}

TEST(DataParallelFit, StartsFromRankZeroAndDrawsDropoutPerRank) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(128, 14);
  // Different seeds per rank: fit must still start every rank from rank 0's weights and batch order.
  auto m = mlp(100 + static_cast<uint64_t>(comm.rank()), 0.3f);
  FitOptions o;
  o.epochs = 1;
  o.batch_size = 16;
  o.communicator = &comm;
  m->fit(x, y, o);
  EXPECT_TRUE(same_bits_on_all_ranks(flat_values(m->weights()), comm));
  // The model's dropout stream is the same on every rank (so a checkpoint of it resumes every rank) ...
  auto low_bits = [](const std::vector<uint64_t>& words) {
    std::vector<float> out;
    for (uint64_t w : words) out.push_back(static_cast<float>(w & 0xffff));
    return out;
  };
  EXPECT_TRUE(same_bits_on_all_ranks(low_bits(m->dropout_rng().state()), comm));
  // ... and the streams a step draws its masks from differ by rank.
  Rng shared = m->dropout_rng();
  Rng step = rank_step_rng(shared, comm.rank(), 3);
  EXPECT_FALSE(same_bits_on_all_ranks(low_bits({step.next_u64(), step.next_u64(), step.next_u64()}), comm))
      << "both ranks drew the same dropout masks";
  EXPECT_TRUE(same_bits_on_all_ranks(low_bits(shared.state()), comm));
}

TEST(DataParallelFit, RefusesAGlobalBatchThatDoesNotDivideByTheRanks) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  auto [x, y] = blobs(64, 15);
  auto m = mlp(1);
  FitOptions o;
  o.batch_size = 15;
  o.communicator = &world_communicator();
  try {
    m->fit(x, y, o);
    FAIL() << "fit accepted a global batch of 15 on 2 ranks";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("does not divide by the 2 ranks"), std::string::npos) << e.message();
  }
}

// A user's optimizer with only the per-variable update rule (no flat-buffer support): train_step takes the
// per-tensor path, whose gradients are all-reduced one tensor at a time.
class PlainSgd : public Optimizer {
 public:
  explicit PlainSgd(float lr) : Optimizer(lr) {}
  std::string name() const override { return "plain_sgd"; }

 protected:
  void update(float* value, const float* grad, int64_t n, const std::string&) override {
    for (int64_t i = 0; i < n; ++i) value[i] -= learning_rate() * grad[i];
  }
  std::vector<std::string> slot_names() const override { return {}; }
};

TEST(DataParallelFit, AnOptimizerWithoutFlatBuffersTrainsToTheSingleProcessWeights) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(200, 17);
  auto make = [] {
    auto m = std::make_unique<Model>("mlp", 8);
    m->emplace<Dense>(16, "relu");
    m->emplace<Dense>(3);
    m->compile(std::make_unique<PlainSgd>(0.1f), Loss("sparse_categorical_crossentropy", true));
    return m;
  };
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 40;
  auto single = make();
  ASSERT_FALSE(single->optimizer().supports_arena());
  single->fit(x, y, o);
  o.communicator = &comm;
  auto parallel = make();
  parallel->fit(x, y, o);
  const std::vector<float> wp = flat_values(parallel->weights());
  EXPECT_LT(max_relative_difference(wp, flat_values(single->weights())), kWeightTolerance);
  EXPECT_TRUE(same_bits_on_all_ranks(wp, comm));
}

class DataParallelLossScale : public ::testing::Test {
 protected:
  void SetUp() override { set_precision_warning_sink([](const std::string&) {}); }
  void TearDown() override {
    set_global_policy("float32");
    set_precision_warning_sink(nullptr);
  }
};

TEST_F(DataParallelLossScale, ANonFiniteGradientOnRankOneOnlySkipsTheStepOnBothRanks) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  set_global_policy("mixed_float16");
  Model m("mlp", 3);
  m.emplace<Dense>(16, "relu");
  m.emplace<Dense>(3, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  m.compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true));
  ASSERT_TRUE(m.optimizer().scales_loss());
  auto& scaler = dynamic_cast<LossScaleOptimizer&>(m.optimizer());
  m.build_for(Shape{8});
  broadcast_variables(m.weights(), comm);
  auto [x, y] = blobs(64, 16);
  const ShardRange s = shard_range(64, comm.rank(), comm.size());
  Tensor xs = x.slice_rows(s.begin, s.end).clone(), ys = y.slice_rows(s.begin, s.end);
  m.train_step(xs, ys, &comm);  // one finite step first
  ASSERT_FALSE(scaler.last_step_skipped());
  const float scale = scaler.loss_scale();
  const std::vector<float> before = flat_values(m.weights());
  const NamedTensors state_before = scaler.state();

  // Rank 1's shard holds an infinite input: its gradients are non-finite, rank 0's are not.
  Tensor bad = xs.clone();
  if (comm.rank() == 1) bad.data<float>()[5] = std::numeric_limits<float>::infinity();
  m.train_step(bad, ys, &comm);
  EXPECT_TRUE(scaler.last_step_skipped()) << "rank " << comm.rank() << " applied the step";
  EXPECT_EQ(scaler.loss_scale(), scale / 2) << "rank " << comm.rank();
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(flat_values(m.weights()), before) << "a skipped step changed weights on rank " << comm.rank();
  std::vector<float> scales{scaler.loss_scale(), static_cast<float>(scaler.skipped_steps())};
  EXPECT_TRUE(same_bits_on_all_ranks(scales, comm));

  m.train_step(xs, ys, &comm);  // and training goes on in step
  EXPECT_FALSE(scaler.last_step_skipped());
  EXPECT_NE(flat_values(m.weights()), before);
  EXPECT_TRUE(same_bits_on_all_ranks(flat_values(m.weights()), comm));
}

}  // namespace
}  // namespace mixtrain
