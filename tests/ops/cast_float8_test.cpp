// ops::cast and ops::cast_into with the float8 formats on the CPU: core's conversions (each format's default
// overflow: E4M3 saturates, E5M2 keeps infinity), from and to every floating dtype; and the ops that compute refuse
// float8 tensors by their dtype check rather than reading them as another dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "mixtrain/core/error.h"
#include "mixtrain/core/float8.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/transfer.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;

uint8_t expected_code(DType format, float x) {
  return format == DType::kFloat8E4M3FN ? float_to_e4m3_bits(x, Float8Overflow::kSaturate)
                                        : float_to_e5m2_bits(x, Float8Overflow::kNonSaturating);
}

TEST(CastFloat8, EveryFloatingDtypeToAndFromBothFormats) {
  // Past both formats' largest values, so saturation and infinity both show, and small enough for subnormals.
  const Tensor base = random_tensor({7, 31}, 5, DType::kFloat32, -70000.0f, 70000.0f);
  const Tensor small = random_tensor({7, 31}, 6, DType::kFloat32, -0.01f, 0.01f);
  for (const Tensor& values : {base, small})
    for (DType from : kFloatDTypes) {
      const Tensor x = values.to(from);
      const std::vector<float> xs = x.to_floats();  // exact widenings of x's elements
      for (DType format : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
        const std::string what = std::string(dtype_name(from)) + " -> " + dtype_name(format);
        const Tensor q = cast(x, format);
        ASSERT_EQ(q.dtype(), format);
        const auto* codes = static_cast<const uint8_t*>(q.raw());
        for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(codes[i], expected_code(format, xs[i])) << what << " at " << i;
        Tensor back = Tensor::empty(q.shape(), from);
        cast_into(q, back);
        const std::vector<float> bs = back.to_floats();
        for (size_t i = 0; i < xs.size(); ++i) {
          const float decoded =
              format == DType::kFloat8E4M3FN ? e4m3_bits_to_float(codes[i]) : e5m2_bits_to_float(codes[i]);
          // float32, float16 (subnormals down to 2^-24, largest 65504) and bfloat16 hold every float8 value, so the
          // way back is exact in all three.
          ASSERT_TRUE(bs[i] == decoded || (std::isnan(bs[i]) && std::isnan(decoded))) << what << " back at " << i;
        }
      }
    }
}

TEST(CastFloat8, OpsThatComputeRefuseFloat8Tensors) {
  const Tensor a = cast(random_tensor({4, 4}, 7, DType::kFloat32, -1.0f, 1.0f), DType::kFloat8E4M3FN);
  EXPECT_THROW(matmul(a, a), Error);
  EXPECT_THROW(add(a, a), Error);
}

}  // namespace
}  // namespace mixtrain::ops
