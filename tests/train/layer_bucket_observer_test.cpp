// A stack model's layers as the segments of the overlapped gradient all-reduce (src/train/layer_bucket_observer.h):
// buckets begin at layer boundaries of the arena's layout, and only stacks with one float32 group qualify.
#include <gtest/gtest.h>

#include <memory>

#include "layer_bucket_observer.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/train/model.h"

namespace mixtrain {
namespace {

TEST(LayerBucketObserver, BucketsBeginWhereALayersWeightsBegin) {
  Model m("stack", 1);
  m.emplace<Dense>(8, "relu");
  m.emplace<Activation>("relu");  // no weights: its segment is empty and never makes a bucket
  m.emplace<Dense>(5);
  m.emplace<Dense>(3);
  m.build_for(Shape{4});
  ParameterArena arena;
  arena.bind(m.trainable_weights());
  // The first offset of each layer with weights, from the arena's layout (kernel then bias, in layer order).
  std::vector<int64_t> starts;
  size_t var = 0;
  for (const auto& l : m.layers()) {
    if (l->trainable_weights().empty()) continue;
    starts.push_back(arena.entry(var).offset);
    var += l->trainable_weights().size();
  }
  ASSERT_EQ(starts.size(), 3u);
  const int64_t capacity = arena.capacity(DType::kFloat32);

  LayerBucketObserver small;
  ASSERT_TRUE(small.prepare(m, arena, 4));  // every layer its own bucket, last first
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(small.reduce().bucket_ranges(),
            (Ranges{{starts[2], capacity}, {starts[1], starts[2]}, {0, starts[1]}}));
  LayerBucketObserver large;
  ASSERT_TRUE(large.prepare(m, arena, capacity * 4));  // one bucket, started when backward ends
  EXPECT_EQ(large.reduce().bucket_ranges(), (Ranges{{0, capacity}}));
}

TEST(LayerBucketObserver, AFunctionalModelDoesNotQualify) {
  SymbolicTensor x = Input({4});
  SymbolicTensor out = (*make_layer<Dense>(3))(x);
  Model m({x}, {out}, "functional", 1);
  ParameterArena arena;
  arena.bind(m.trainable_weights());
  LayerBucketObserver o;
  EXPECT_FALSE(o.prepare(m, arena, 4));
}

}  // namespace
}  // namespace mixtrain
