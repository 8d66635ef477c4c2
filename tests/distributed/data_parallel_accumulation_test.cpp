// Gradient accumulation on two ranks: each rank's shard of the global batch as micro-batches, the gradients
// all-reduced once per update (the collectives of a step do not grow with the micro-batches), and the weights of
// one process training the same global batches without accumulation.
#include <gtest/gtest.h>

#include <iostream>

#include "../train/blobs.h"
#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/train/model.h"
#include "two_ranks.h"

namespace mixtrain {
namespace {

using distributed_test::flat_values;
using distributed_test::max_relative_difference;
using distributed_test::same_bits_on_all_ranks;
using train_test::blobs;

std::unique_ptr<Model> accumulating_mlp(uint64_t seed, int64_t accumulate) {
  auto m = std::make_unique<Model>("mlp", seed);
  m->emplace<Dense>(32, "relu");
  m->emplace<Dense>(32, "relu");
  m->emplace<Dense>(3);
  m->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  m->optimizer().set_gradient_accumulation_steps(accumulate);
  return m;
}

// As data_parallel_fit_test.cpp: float32 reduction order, a few dozen Adam updates.
constexpr double kWeightTolerance = 1e-5;

TEST(DataParallelAccumulation, TwoRanksAccumulatingEqualOneProcessAtTheGlobalBatch) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(600, 31);
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 32;  // 16 rows per rank in 4 micro-batches of 4
  o.validation_split = 0.2;
  o.verbose = 0;
  auto single = accumulating_mlp(7, 1);
  const History hs = single->fit(x, y, o);
  o.communicator = &comm;
  auto parallel = accumulating_mlp(7, 4);
  const History hp = parallel->fit(x, y, o);
  const std::vector<float> wp = flat_values(parallel->weights());
  const double difference = max_relative_difference(wp, flat_values(single->weights()));
  if (comm.rank() == 0) std::cout << "accumulating ranks: largest relative weight difference " << difference << "\n";
  EXPECT_LT(difference, kWeightTolerance);
  EXPECT_TRUE(same_bits_on_all_ranks(wp, comm));
  EXPECT_EQ(parallel->optimizer().iterations(), single->optimizer().iterations());
  ASSERT_EQ(hp.step_loss.size(), hs.step_loss.size());
  for (size_t i = 0; i < hs.step_loss.size(); ++i) EXPECT_NEAR(hp.step_loss[i], hs.step_loss[i], 1e-4) << "step " << i;
}

// The collectives of one update: the small one (gradient flags and logs) and the gradients' buckets, as many with
// 4 micro-batches as with 1 and the same bytes, both with one bucket and with buckets started during the (last)
// backward pass.
TEST(DataParallelAccumulation, OneAllReducePerUpdate) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(64, 32);
  const Tensor xs = x.slice_rows(comm.rank() * 32, comm.rank() * 32 + 32);
  const Tensor ys = y.slice_rows(comm.rank() * 32, comm.rank() * 32 + 32);
  for (const int64_t bucket_bytes : {int64_t{1} << 30, int64_t{1024}}) {
    CommStats per_update[2];
    std::vector<float> weights[2];
    for (int k = 0; k < 2; ++k) {
      auto m = accumulating_mlp(8, k == 0 ? 1 : 4);
      m->set_gradient_bucket_bytes(bucket_bytes);
      m->build_for(Shape{8});
      broadcast_variables(m->weights(), comm);
      m->train_step(xs, ys, &comm, 64);  // first step: slots, buffers
      comm.reset_stats();
      m->train_step(xs, ys, &comm, 64);
      per_update[k] = comm.stats();
      weights[k] = flat_values(m->weights());
    }
    if (bucket_bytes > 1024) {
      EXPECT_EQ(per_update[0].calls, 2) << "flags and logs, then one gradient all-reduce";
    }
    EXPECT_EQ(per_update[1].calls, per_update[0].calls) << "bucket bytes " << bucket_bytes;
    EXPECT_EQ(per_update[1].bytes, per_update[0].bytes) << "bucket bytes " << bucket_bytes;
    EXPECT_LT(max_relative_difference(weights[1], weights[0]), kWeightTolerance);
    EXPECT_TRUE(same_bits_on_all_ranks(weights[1], comm));
  }
}

}  // namespace
}  // namespace mixtrain
