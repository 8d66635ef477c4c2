// ops::count_in_top_k against an independent definition: a label is in the top k when its score is at least the
// k-th largest score of its row (sorted in double), which is TensorFlow's in_top_k rule for ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "mixtrain/ops/losses.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::kOddSizes;
using testing::random_tensor;
using testing::to_doubles;

double reference_in_top_k(const Tensor& scores, const std::vector<int64_t>& labels, int64_t k) {
  const std::vector<double> s = to_doubles(scores);
  const int64_t cols = scores.dim(-1), rows = static_cast<int64_t>(labels.size());
  double in_top = 0;
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<double> row(s.begin() + i * cols, s.begin() + (i + 1) * cols);
    const double mine = row[static_cast<size_t>(labels[static_cast<size_t>(i)])];
    std::sort(row.begin(), row.end(), std::greater<>());
    const double kth = row[static_cast<size_t>(std::min(k, cols) - 1)];
    in_top += mine >= kth;
  }
  return in_top;
}

TEST(CountInTopK, MatchesTheSortedDefinitionOnOddShapes) {
  // Counts are exact integers: the op must equal the reference exactly in every dtype (the scores are compared in
  // their own dtype's values, which the reference reads back the same).
  for (DType dt : kFloatDTypes) {
    for (int64_t rows : kOddSizes) {
      for (int64_t cols : {1, 7, 17, 31}) {
        // Few distinct values (multiples of 1/4 in [-2, 2]) so ties straddle the k-th place often.
        Tensor scores = random_tensor({rows, cols}, 11 + rows * 31 + cols, DType::kFloat32, -2.0f, 2.0f);
        std::vector<float> v = scores.to_floats();
        for (float& x : v) x = std::round(x * 4.0f) / 4.0f;
        scores = Tensor::from_floats({rows, cols}, v, dt);
        std::vector<int64_t> l(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i) l[static_cast<size_t>(i)] = (i * 7 + 3) % cols;
        const Tensor labels = Tensor::from_int64s({rows}, l);
        for (int64_t k : {1, 2, 5, 40}) {
          EXPECT_EQ(count_in_top_k(scores, labels, k).item(), reference_in_top_k(scores, l, k))
              << dtype_name(dt) << " rows=" << rows << " cols=" << cols << " k=" << k;
        }
      }
    }
  }
}

TEST(CountInTopKByHand, TiesCountForTheLabelAndKOneIsArgMaxWithoutTies) {
  // Row 0: label 2's 0.5 ties class 1 for second place: in the top 2 (ties count), not the top 1.
  // Row 1: label 0 is the third largest: in the top 3 only. Row 2: NaN label score never counts.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor scores = Tensor::from_floats({3, 4}, {0.9f, 0.5f, 0.5f, 0.1f, 0.2f, 0.9f, 0.7f, 0.1f, nan, 1, 2, 3});
  const Tensor labels = Tensor::from_ints({3}, {2, 0, 0});
  EXPECT_EQ(count_in_top_k(scores, labels, 1).item(), 0.0);
  EXPECT_EQ(count_in_top_k(scores, labels, 2).item(), 1.0);
  EXPECT_EQ(count_in_top_k(scores, labels, 3).item(), 2.0);
  EXPECT_EQ(count_in_top_k(scores, labels, 4).item(), 2.0);
  // Without ties, k = 1 is the arg-max count.
  const Tensor distinct = Tensor::from_floats({2, 3}, {0.1f, 0.3f, 0.2f, 0.9f, 0.3f, 0.2f});
  const Tensor l2 = Tensor::from_ints({2}, {1, 1});
  EXPECT_EQ(count_in_top_k(distinct, l2, 1).item(), count_correct(distinct, l2).item());
}

TEST(CountInTopK, ViewsSequencesAndBadInput) {
  const Tensor wide = random_tensor({7, 12}, 5, DType::kFloat32);
  const Tensor view = wide.slice(1, 2, 9);  // (7, 7), strided
  std::vector<int64_t> l{0, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(count_in_top_k(view, Tensor::from_int64s({7}, l), 3).item(),
            reference_in_top_k(view.contiguous(), l, 3));
  // (B, T, C) scores with (B, T) labels count every position.
  const Tensor seq = random_tensor({2, 3, 5}, 6, DType::kFloat32);
  std::vector<int64_t> sl{0, 1, 2, 3, 4, 0};
  EXPECT_EQ(count_in_top_k(seq, Tensor::from_int64s({2, 3}, sl), 2).item(),
            reference_in_top_k(seq.reshape({6, 5}), sl, 2));
  EXPECT_THROW((void)count_in_top_k(seq, Tensor::from_int64s({2, 3}, sl), 0), Error);
  EXPECT_THROW((void)count_in_top_k(wide, Tensor::from_ints({7}, {0, 1, 2, 3, 4, 5, 12}), 5), Error);
}

}  // namespace
}  // namespace mixtrain::ops
