#include "mixtrain/data/normalize.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_files.h"

namespace mixtrain {
namespace {

using testing::contains;
using testing::error_of;

TEST(Normalize, ParsesNames) {
  EXPECT_EQ(parse_normalization("standard"), Normalization::kStandard);
  EXPECT_EQ(parse_normalization("minmax"), Normalization::kMinMax);
  EXPECT_EQ(parse_normalization("none"), Normalization::kNone);
  for (Normalization m : {Normalization::kStandard, Normalization::kMinMax, Normalization::kNone})
    EXPECT_EQ(parse_normalization(normalization_name(m)), m);
  const Error e = error_of([] { parse_normalization("zscore"); });
  EXPECT_TRUE(contains(e.what(), "unknown normalization 'zscore'; valid names: standard, minmax, none")) << e.what();
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
}

TEST(Normalize, StandardUsesTrainingStatisticsOnly) {
  // Column means 4, 10, 8; population variances 5, 0, 5.
  const Tensor train = Tensor::from_floats({4, 3}, {1, 10, 5, 3, 10, 7, 5, 10, 9, 7, 10, 11});
  const Normalizer norm = Normalizer::fit(train, Normalization::kStandard);
  EXPECT_EQ(norm.mode(), Normalization::kStandard);
  EXPECT_EQ(norm.num_features(), 3);
  EXPECT_EQ(norm.offset(), (std::vector<double>{4.0, 10.0, 8.0}));
  EXPECT_EQ(norm.scale(), (std::vector<double>{std::sqrt(5.0), 1.0, std::sqrt(5.0)}));  // constant column -> 1

  // A test matrix far from the training data: its own statistics must not matter.
  Tensor test = Tensor::from_floats({2, 3}, {4, 12, 3, 9, 10, 108});
  norm.apply(test);
  const float r5 = static_cast<float>(1.0 / std::sqrt(5.0));
  const std::vector<float> got = test.to_floats();
  const std::vector<float> want = {0.0f,
                                   2.0f,
                                   static_cast<float>(-5.0 / std::sqrt(5.0)),
                                   static_cast<float>(5.0 / std::sqrt(5.0)),
                                   0.0f,
                                   static_cast<float>(100.0 / std::sqrt(5.0))};
  EXPECT_EQ(got, want);
  EXPECT_FLOAT_EQ(got[3], 5.0f * r5);
  EXPECT_FLOAT_EQ(got[5], 44.72135955f);

  // Applied to the training split, every non-constant column gets mean 0 and std 1.
  Tensor train_copy = train.clone();
  norm.apply(train_copy);
  EXPECT_EQ(train_copy.to_floats(),
            (std::vector<float>{static_cast<float>(-3 / std::sqrt(5.0)), 0, static_cast<float>(-3 / std::sqrt(5.0)),
                                static_cast<float>(-1 / std::sqrt(5.0)), 0, static_cast<float>(-1 / std::sqrt(5.0)),
                                static_cast<float>(1 / std::sqrt(5.0)), 0, static_cast<float>(1 / std::sqrt(5.0)),
                                static_cast<float>(3 / std::sqrt(5.0)), 0, static_cast<float>(3 / std::sqrt(5.0))}));
  EXPECT_EQ(train.at(0), 1.0f) << "fit must not modify its input";
}

TEST(Normalize, MinMaxMapsTrainingRangeToUnitInterval) {
  const Tensor train = Tensor::from_floats({3, 2}, {0, 2, 4, 2, 2, 2});
  const Normalizer norm = Normalizer::fit(train, Normalization::kMinMax);
  EXPECT_EQ(norm.offset(), (std::vector<double>{0.0, 2.0}));
  EXPECT_EQ(norm.scale(), (std::vector<double>{4.0, 1.0}));  // zero range -> 1
  Tensor test = Tensor::from_floats({2, 2}, {6, 5, -2, 2});
  norm.apply(test);
  EXPECT_EQ(test.to_floats(), (std::vector<float>{1.5f, 3.0f, -0.5f, 0.0f}));
  Tensor t2 = train.clone();
  norm.apply(t2);
  EXPECT_EQ(t2.to_floats(), (std::vector<float>{0.0f, 0.0f, 1.0f, 0.0f, 0.5f, 0.0f}));
}

TEST(Normalize, StandardIsAccurateForLargeOffsets) {
  // float32 data around 1e4 with spread 1: E[x^2] - E[x]^2 in float would lose most digits.
  std::vector<float> v;
  for (int i = 0; i < 1000; ++i) v.push_back(10000.0f + (i % 2 ? 1.0f : -1.0f));
  const Normalizer norm = Normalizer::fit(Tensor::from_floats({1000, 1}, v), Normalization::kStandard);
  EXPECT_EQ(norm.offset()[0], 10000.0);
  EXPECT_EQ(norm.scale()[0], 1.0);
}

TEST(Normalize, NoneLeavesDataUnchanged) {
  const Tensor train = Tensor::from_floats({2, 2}, {1, 2, 3, 4});
  const Normalizer norm = Normalizer::fit(train, Normalization::kNone);
  EXPECT_EQ(norm.offset(), (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(norm.scale(), (std::vector<double>{1.0, 1.0}));
  Tensor x = Tensor::from_floats({1, 2}, {-3.5f, 7.25f});
  norm.apply(x);
  EXPECT_EQ(x.to_floats(), (std::vector<float>{-3.5f, 7.25f}));
  Normalizer unfitted;
  unfitted.apply(x);
  EXPECT_EQ(x.to_floats(), (std::vector<float>{-3.5f, 7.25f}));
}

TEST(Normalize, RejectsWrongShapesAndDTypes) {
  const Normalizer norm = Normalizer::fit(Tensor::from_floats({2, 3}, {1, 2, 3, 4, 5, 6}), Normalization::kStandard);
  Tensor narrow = Tensor::from_floats({2, 2}, {1, 2, 3, 4});
  const Error e = error_of([&] { norm.apply(narrow); });
  EXPECT_TRUE(contains(e.what(), "fitted on 3 features, got float32 (2, 2)")) << e.what();
  Tensor half = Tensor::from_floats({1, 3}, {1, 2, 3}, DType::kFloat16);
  EXPECT_TRUE(contains(error_of([&] { norm.apply(half); }).what(), "expected features (N, F) float32"));
  EXPECT_TRUE(contains(error_of([] {
                         Normalizer::fit(Tensor::zeros({0, 3}, DType::kFloat32), Normalization::kMinMax);
                       }).what(),
                       "no training samples"));
  EXPECT_THROW(Normalizer::fit(Tensor::zeros({4}, DType::kFloat32), Normalization::kStandard), Error);
}

}  // namespace
}  // namespace mixtrain
