#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "mixtrain/optim/optimizer.h"

namespace mixtrain {
namespace {

TEST(GlobalNorm, AccumulatesAcrossTensorsAndDTypes) {
  std::vector<Tensor> g = {Tensor::from_floats({2}, {3.0f, 0.0f}),
                           Tensor::from_floats({1, 1}, {4.0f}, DType::kFloat16),
                           Tensor::from_floats({2}, {12.0f, 0.0f}, DType::kBFloat16), Tensor()};
  EXPECT_FLOAT_EQ(global_norm(g), 13.0f);
  EXPECT_EQ(global_norm({}), 0.0f);
  g[0] = Tensor::from_floats({1}, {std::numeric_limits<float>::infinity()});
  EXPECT_TRUE(std::isinf(global_norm(g)));
}

TEST(GlobalNorm, LargeTensorIsExactAndIndependentOfChunking) {
  // 200000 ones: crosses several reduction chunks; the double sum is exact.
  Tensor big = Tensor::full({200000}, DType::kFloat32, 1.0f);
  EXPECT_FLOAT_EQ(global_norm({big}), std::sqrt(200000.0f));
  // float16 elements whose squares overflow float16 still give a finite norm.
  Tensor h = Tensor::full({4}, DType::kFloat16, 60000.0f);
  EXPECT_FLOAT_EQ(global_norm({h}), 120000.0f);
}

TEST(ClipByGlobalNorm, ScalesOnlyAboveTheLimitAndNeverWritesTheInput) {
  Tensor a = Tensor::from_floats({2}, {3.0f, 4.0f});
  std::vector<Tensor> g = {a};
  clip_by_global_norm(g, 10.0f);
  EXPECT_EQ(g[0].raw(), a.raw()) << "under the limit nothing is copied";
  clip_by_global_norm(g, 1.0f);
  EXPECT_NE(g[0].raw(), a.raw());
  EXPECT_FLOAT_EQ(g[0].at(0), 0.6f);
  EXPECT_FLOAT_EQ(g[0].at(1), 0.8f);
  EXPECT_EQ(a.at(0), 3.0f);
  EXPECT_NEAR(global_norm(g), 1.0f, 1e-6f);

  std::vector<Tensor> h = {Tensor::from_floats({2}, {300.0f, 400.0f}, DType::kFloat16)};
  clip_by_global_norm(h, 5.0f);
  EXPECT_EQ(h[0].dtype(), DType::kFloat32);
  EXPECT_FLOAT_EQ(h[0].at(0), 3.0f);

  std::vector<Tensor> bad = {Tensor::from_floats({2}, {std::nanf(""), 1.0f})};
  clip_by_global_norm(bad, 1.0f);
  EXPECT_TRUE(std::isnan(bad[0].at(1))) << "a non-finite norm poisons every gradient, as in Keras";
  EXPECT_THROW(clip_by_global_norm(g, -1.0f), Error);
}

}  // namespace
}  // namespace mixtrain
