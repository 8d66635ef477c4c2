#include "mixtrain/data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "test_files.h"

namespace mixtrain {
namespace {

using testing::contains;
using testing::error_of;

// n samples; sample i has features (i, 10 i) and label i % 3, so every row names its sample.
Dataset numbered(int64_t n) {
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int64_t i = 0; i < n; ++i) {
    x.push_back(static_cast<float>(i));
    x.push_back(static_cast<float>(10 * i));
    y.push_back(static_cast<int32_t>(i % 3));
  }
  Dataset d;
  d.x = Tensor::from_floats({n, 2}, x);
  d.y = Tensor::from_ints({n}, y);
  d.num_classes = 3;
  d.sample_shape = {2};
  d.source = "numbered.csv";
  return d;
}

std::vector<int64_t> ids(const Dataset& d) {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < d.size(); ++r) {
    const auto id = static_cast<int64_t>(d.x.at(2 * r));
    EXPECT_EQ(d.x.at(2 * r + 1), static_cast<float>(10 * id));
    EXPECT_EQ(d.y.at(r), static_cast<float>(id % 3)) << "label travelled with its sample";
    out.push_back(id);
  }
  return out;
}

TEST(Dataset, SizeFeaturesAndValidation) {
  const Dataset d = numbered(4);
  EXPECT_EQ(d.size(), 4);
  EXPECT_EQ(d.num_features(), 2);
  EXPECT_EQ(Dataset{}.size(), 0);
  validate_dataset(d);
  Dataset bad = numbered(4);
  bad.num_classes = 2;
  EXPECT_TRUE(contains(error_of([&] { validate_dataset(bad); }).what(),
                       "dataset 'numbered.csv': sample 2 has label 2, outside [0, 2)"));
  bad = numbered(4);
  bad.y = Tensor::from_ints({3}, {0, 1, 2});
  EXPECT_TRUE(contains(error_of([&] { validate_dataset(bad); }).what(), "4 samples but 3 labels"));
  bad = numbered(4);
  bad.x = bad.x.to(DType::kFloat16);
  EXPECT_TRUE(contains(error_of([&] { validate_dataset(bad); }).what(), "got float16 (4, 2)"));
}

TEST(Dataset, ClassCounts) {
  EXPECT_EQ(class_counts(numbered(10)), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(class_counts(Dataset{}), (std::vector<int64_t>{}));
}

TEST(Dataset, HoldoutIsDisjointDeterministicAndOrdered) {
  const Dataset d = numbered(20);
  const auto [train, test] = split_holdout(d, 0.25, 7);
  EXPECT_EQ(train.size(), 15);
  EXPECT_EQ(test.size(), 5);
  for (const Dataset* part : {&train, &test}) {
    EXPECT_EQ(part->num_classes, 3);
    EXPECT_EQ(part->sample_shape, (std::vector<int64_t>{2}));
    EXPECT_EQ(part->source, "numbered.csv");
    EXPECT_EQ(part->x.dtype(), DType::kFloat32);
    EXPECT_EQ(part->y.dtype(), DType::kInt32);
  }
  const std::vector<int64_t> train_ids = ids(train), test_ids = ids(test);
  EXPECT_TRUE(std::is_sorted(train_ids.begin(), train_ids.end()));
  EXPECT_TRUE(std::is_sorted(test_ids.begin(), test_ids.end()));
  std::vector<int64_t> all = train_ids;
  all.insert(all.end(), test_ids.begin(), test_ids.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(20);
  std::iota(expected.begin(), expected.end(), int64_t{0});
  EXPECT_EQ(all, expected) << "each sample lands in exactly one part";

  const auto [train2, test2] = split_holdout(d, 0.25, 7);
  EXPECT_EQ(ids(test2), test_ids);
  EXPECT_EQ(ids(train2), train_ids);
  const auto [train3, test3] = split_holdout(d, 0.25, 8);
  EXPECT_NE(ids(test3), test_ids) << "another seed chooses other samples";
  EXPECT_EQ(test3.size(), 5);
  // The split does not touch the source data.
  EXPECT_EQ(ids(d), expected);
}

TEST(Dataset, HoldoutSizeIsRoundedAndKeepsBothPartsNonEmpty) {
  const Dataset d = numbered(10);
  EXPECT_EQ(split_holdout(d, 0.01, 1).second.size(), 1);
  EXPECT_EQ(split_holdout(d, 0.99, 1).second.size(), 9);
  EXPECT_EQ(split_holdout(d, 0.15, 1).second.size(), 2);  // llround(1.5)
  EXPECT_EQ(split_holdout(d, 0.14, 1).second.size(), 1);
  EXPECT_EQ(split_holdout(numbered(2), 0.5, 1).first.size(), 1);
}

TEST(Dataset, HoldoutRejectsBadFractionsAndTinyData) {
  const Dataset d = numbered(10);
  for (double f : {0.0, 1.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    const Error e = error_of([&] { split_holdout(d, f, 0); });
    EXPECT_TRUE(contains(e.what(), "for 'numbered.csv' is not in (0, 1)")) << e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
  }
  const Error e = error_of([] { split_holdout(numbered(1), 0.5, 0); });
  EXPECT_TRUE(contains(e.what(), "'numbered.csv' has 1 sample(s); holding out a test set needs at least 2"))
      << e.what();
}


}  // namespace
}  // namespace mixtrain
