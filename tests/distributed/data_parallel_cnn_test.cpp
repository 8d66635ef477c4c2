// The CNN on two ranks: with synchronized BatchNormalization it trains to the single-process weights and moving
// statistics (within float32 reduction order); with the default per-rank statistics the ranks still hold
// identical weights (the moving statistics are averaged before each evaluation), but the result differs from
// one process, as it does in PyTorch DDP without SyncBatchNorm.
#include <gtest/gtest.h>

#include <iostream>

#include "../train/blobs.h"
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/train/model.h"
#include "two_ranks.h"

namespace mixtrain {
namespace {

using distributed_test::flat_values;
using distributed_test::max_relative_difference;
using distributed_test::same_bits_on_all_ranks;
using train_test::blobs;

// Rows of 8 features as 2 x 4 single-channel images: convolution, batch normalization, ReLU, dense read-out.
std::unique_ptr<Model> cnn(uint64_t seed, bool synchronized) {
  auto m = std::make_unique<Model>("cnn", seed);
  m->emplace<Reshape>(std::vector<int64_t>{2, 4, 1});
  // No bias before batch normalization: its gradient is exactly zero in exact arithmetic and rounding noise in
  // float32, which Adam's normalised update would turn into steps of the full learning rate in random directions.
  m->emplace<Conv2D>(8, 3, 1, "same", "linear", /*use_bias=*/false);
  m->emplace<BatchNormalization>(0.9f)->set_synchronized(synchronized);
  m->emplace<Activation>("relu");
  m->emplace<Flatten>();
  m->emplace<Dense>(3);
  m->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

struct CnnRuns {
  std::vector<float> single, parallel;
  EvaluateResult single_test, parallel_test;
};

CnnRuns train_both(bool synchronized) {
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(512, 21);
  auto [tx, ty] = blobs(256, 22);
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 32;
  o.validation_split = 0.25;
  CnnRuns r;
  auto single = cnn(9, synchronized);
  single->fit(x, y, o);
  o.communicator = &comm;
  auto parallel = cnn(9, synchronized);
  parallel->fit(x, y, o);
  r.single = flat_values(single->weights());  // trainable weights and moving statistics
  r.parallel = flat_values(parallel->weights());
  r.single_test = single->evaluate(tx, ty);
  r.parallel_test = parallel->evaluate(tx, ty, 256, &comm);
  return r;
}

TEST(DataParallelCnn, SynchronizedBatchNormTrainsToTheSingleProcessWeights) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  const CnnRuns r = train_both(/*synchronized=*/true);
  const double difference = max_relative_difference(r.parallel, r.single);
  if (comm.rank() == 0) std::cout << "CNN (synchronized): largest relative weight difference " << difference << "\n";
  EXPECT_LT(difference, 1e-5);
  EXPECT_TRUE(same_bits_on_all_ranks(r.parallel, comm));
  EXPECT_NEAR(r.parallel_test.accuracy, r.single_test.accuracy, 0.001);
  EXPECT_GT(r.parallel_test.accuracy, 0.9);
}

// A small last batch leaves rank 1 without a sample: its synchronized layer still takes part in every exchange
// (with zero sums and no rows), so rank 0 is not left waiting and both train as one process on the global batch.
TEST(DataParallelCnn, SynchronizedBatchNormWithAnEmptyShardTrainsToTheSingleProcessWeights) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  auto [x, y] = blobs(97, 23);  // batches of 32: the last one has 1 sample, rank 1's shard of it is empty
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 32;
  o.verbose = 0;
  auto single = cnn(4, /*synchronized=*/true);
  single->fit(x, y, o);
  o.communicator = &comm;
  auto parallel = cnn(4, /*synchronized=*/true);
  // Small buckets: the read-out's gradients would start their all-reduce before the layer's backward exchange,
  // which the rank without samples never reaches (such steps wait for the end of the backward pass).
  parallel->set_gradient_bucket_bytes(64);
  const History h = parallel->fit(x, y, o);
  EXPECT_EQ(h.steps, 8);
  const std::vector<float> wp = flat_values(parallel->weights());
  EXPECT_LT(max_relative_difference(wp, flat_values(single->weights())), 1e-5);
  EXPECT_TRUE(same_bits_on_all_ranks(wp, comm));
}

TEST(DataParallelCnn, PerRankBatchNormKeepsTheRanksIdentical) {
  MIXTRAIN_REQUIRE_TWO_RANKS();
  Communicator& comm = world_communicator();
  const CnnRuns r = train_both(/*synchronized=*/false);
  const double difference = max_relative_difference(r.parallel, r.single);
  if (comm.rank() == 0) std::cout << "CNN (per-rank statistics): largest relative weight difference " << difference << "\n";
  EXPECT_TRUE(same_bits_on_all_ranks(r.parallel, comm));
  // Normalizing by 16-row shards instead of 32-row batches is a different model: no longer within reduction order.
  EXPECT_GT(difference, 1e-4);
  EXPECT_GT(r.parallel_test.accuracy, 0.9);
}

}  // namespace
}  // namespace mixtrain
