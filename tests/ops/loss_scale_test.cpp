// ops::unscale_and_count_nonfinite against a float64 reference on odd sizes and every floating dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/loss_scale.h"

namespace mixtrain::ops {
namespace {

TEST(UnscaleAndCountNonfinite, MatchesReferenceOnOddSizes) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t n : {1, 7, 17, 129, 2049, 70001}) {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 101 - 50) * 3.0f;
      if (n > 7) {
        v[3] = std::numeric_limits<float>::infinity();
        v[static_cast<size_t>(n - 1)] = std::nanf("");
      }
      const Tensor scaled = Tensor::from_floats({n}, v, dt);
      const std::vector<float> rounded = scaled.to_floats();
      const float inv = static_cast<float>(1.0 / 3.0);
      Tensor out = Tensor::empty({n}, DType::kFloat32);
      const int64_t bad = unscale_and_count_nonfinite(scaled, inv, out);
      EXPECT_EQ(bad, n > 7 ? 2 : 0);
      EXPECT_EQ(bad, count_nonfinite(out));
      const std::vector<float> got = out.to_floats();
      for (int64_t i = 0; i < n; ++i) {
        const float want = rounded[static_cast<size_t>(i)] * inv;  // one float32 product, no rounding after
        if (std::isnan(want))
          EXPECT_TRUE(std::isnan(got[static_cast<size_t>(i)]));
        else
          ASSERT_EQ(got[static_cast<size_t>(i)], want) << dtype_name(dt) << " n=" << n << " i=" << i;
      }
      if (dt == DType::kFloat32) {
        Tensor in_place = scaled.clone();
        EXPECT_EQ(unscale_and_count_nonfinite(in_place, inv), bad);
        EXPECT_EQ(std::memcmp(in_place.raw(), out.raw(), out.nbytes()), 0);
      }
    }
  }
}

// A finite scaled value that overflows once unscaled by a scale below 1 counts as non-finite.
TEST(UnscaleAndCountNonfinite, OverflowOnUnscaleCounts) {
  Tensor g = Tensor::from_floats({2}, {3e38f, 1.0f});
  EXPECT_EQ(unscale_and_count_nonfinite(g, 4.0f), 1);
}

TEST(UnscaleAndCountNonfinite, RejectsBadOutputs) {
  const Tensor g16 = Tensor::from_floats({4}, {1, 2, 3, 4}, DType::kFloat16);
  Tensor wrong_dtype = Tensor::empty({4}, DType::kFloat16);
  Tensor wrong_size = Tensor::empty({3}, DType::kFloat32);
  EXPECT_THROW(unscale_and_count_nonfinite(g16, 0.5f, wrong_dtype), Error);
  EXPECT_THROW(unscale_and_count_nonfinite(g16, 0.5f, wrong_size), Error);
  Tensor g16_copy = g16.clone();
  EXPECT_THROW(unscale_and_count_nonfinite(g16_copy, 0.5f), Error);  // in place needs float32
  EXPECT_TRUE(kernel::unscale_table().supports(DeviceType::kCpu));
}

}  // namespace
}  // namespace mixtrain::ops
