// float16 / bfloat16 conversions, checked on all 65,536 bit patterns in both directions.
#include <gtest/gtest.h>

#include <cmath>

#include "mixtrain/core/half.h"
#include "mixtrain/core/random.h"
#include "mixtrain/core/tensor.h"

namespace mixtrain {
namespace {

// Exact value of a float16 bit pattern, computed independently in double.
double half_value_reference(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  if (exp == 0x1F) return mant ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

TEST(Float16, EveryBitPatternDecodesExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double want = half_value_reference(static_cast<uint16_t>(h));
    const float got = half_bits_to_float(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "pattern " << h;
      EXPECT_EQ(std::signbit(got), (h >> 15) != 0) << h;
    }
  }
}

TEST(Float16, EveryBitPatternRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = float_to_half_bits(half_bits_to_float(static_cast<uint16_t>(h)));
    if (((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF)) {
      EXPECT_EQ(back & 0x7C00, 0x7C00) << h;  // still NaN
      EXPECT_NE(back & 0x3FF, 0) << h;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << h;
    } else {
      EXPECT_EQ(back, h) << "pattern " << h;
    }
  }
}

// Between each pair of neighbouring finite halves: the midpoint rounds to the even one, and just
// above / below the midpoint round away from / toward the lower neighbour.
TEST(Float16, RoundsToNearestEvenAtEveryMidpoint) {
  for (uint32_t h = 0; h < 0x7BFF; ++h) {  // positive finite, excluding the largest
    for (uint32_t sign : {0u, 0x8000u}) {
      const uint16_t lo = static_cast<uint16_t>(h | sign), hi = static_cast<uint16_t>((h + 1) | sign);
      const double mid = (half_value_reference(lo) + half_value_reference(hi)) / 2;
      const float midf = static_cast<float>(mid);  // exact: the midpoint needs only 12 significant bits
      ASSERT_EQ(static_cast<double>(midf), mid);
      const uint16_t even = (h & 1) ? hi : lo;
      EXPECT_EQ(float_to_half_bits(midf), even) << "midpoint above pattern " << h;
      EXPECT_EQ(float_to_half_bits(std::nextafter(midf, 0.0f)), lo) << h;
      EXPECT_EQ(float_to_half_bits(std::nextafter(midf, sign ? -INFINITY : INFINITY)), hi) << h;
    }
  }
}

TEST(Float16, OverflowUnderflowAndSpecials) {
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half_bits(65519.99f), 0x7BFF);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7C00);  // the tie rounds to even: infinity
  EXPECT_EQ(float_to_half_bits(1e10f), 0x7C00);
  EXPECT_EQ(float_to_half_bits(-1e10f), 0xFC00);
  EXPECT_EQ(float_to_half_bits(INFINITY), 0x7C00);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_half_bits(1e-10f), 0x0000);
  EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(NAN))));
}

// The array conversion (F16C where the CPU has it) must agree bit for bit with the scalar code: on every
// half pattern, on every midpoint and its neighbours, and on random floats across the whole range.
TEST(Float16, ArrayConversionMatchesScalarBitForBit) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> decoded(65536);
  convert_elements(all.data(), DType::kFloat16, decoded.data(), DType::kFloat32, 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = half_bits_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(float_bits(decoded[h]), float_bits(want)) << h;
  }
  std::vector<float> probes;
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const float lo = half_bits_to_float(static_cast<uint16_t>(h)), hi = half_bits_to_float(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), lo}) {
      probes.push_back(f);
      probes.push_back(-f);
    }
  }
  Rng r(9);
  for (int i = 0; i < 200000; ++i) probes.push_back(bits_float(static_cast<uint32_t>(r.next_u64())));
  probes.push_back(NAN);
  probes.push_back(INFINITY);
  std::vector<uint16_t> encoded(probes.size());
  convert_elements(probes.data(), DType::kFloat32, encoded.data(), DType::kFloat16, static_cast<int64_t>(probes.size()));
  for (size_t i = 0; i < probes.size(); ++i) ASSERT_EQ(encoded[i], float_to_half_bits(probes[i])) << probes[i];
}

TEST(BFloat16, EveryBitPatternDecodesAndRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_bits_to_float(static_cast<uint16_t>(b));
    uint32_t u;
    std::memcpy(&u, &f, 4);
    EXPECT_EQ(u, b << 16);
    const uint16_t back = float_to_bf16_bits(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_bits_to_float(back))) << b;
    } else {
      EXPECT_EQ(back, b) << b;
    }
  }
}

// The array conversion (AVX-512 where the CPU has it) agrees bit for bit with the scalar code.
TEST(BFloat16, ArrayConversionMatchesScalarBitForBit) {
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  std::vector<float> decoded(65536);
  convert_elements(all.data(), DType::kBFloat16, decoded.data(), DType::kFloat32, 65536);
  for (uint32_t b = 0; b < 65536; ++b) ASSERT_EQ(float_bits(decoded[b]), b << 16) << b;
  std::vector<float> probes;
  for (uint32_t b = 0; b < 0x7F80; ++b) {
    const uint32_t mid = (b << 16) | 0x8000u;
    for (uint32_t u : {mid, mid - 1, mid + 1, b << 16}) {
      probes.push_back(bits_float(u));
      probes.push_back(bits_float(u | 0x80000000u));
    }
  }
  Rng r(11);
  for (int i = 0; i < 200000; ++i) probes.push_back(bits_float(static_cast<uint32_t>(r.next_u64())));
  probes.push_back(NAN);
  probes.push_back(-INFINITY);
  probes.push_back(bits_float(0x7F800001u));  // signalling NaN: quieted
  std::vector<uint16_t> encoded(probes.size());
  convert_elements(probes.data(), DType::kFloat32, encoded.data(), DType::kBFloat16,
                   static_cast<int64_t>(probes.size()));
  for (size_t i = 0; i < probes.size(); ++i)
    ASSERT_EQ(encoded[i], float_to_bf16_bits(probes[i])) << std::hex << float_bits(probes[i]);
}

TEST(BFloat16, RoundsToNearestEvenAtEveryMidpoint) {
  for (uint32_t b = 0; b < 0x7F7F; ++b) {  // positive finite, excluding the largest
    const uint32_t mid = (b << 16) | 0x8000u;
    const uint16_t even = (b & 1) ? static_cast<uint16_t>(b + 1) : static_cast<uint16_t>(b);
    EXPECT_EQ(float_to_bf16_bits(bits_float(mid)), even) << b;
    EXPECT_EQ(float_to_bf16_bits(bits_float(mid - 1)), b) << b;
    EXPECT_EQ(float_to_bf16_bits(bits_float(mid + 1)), b + 1) << b;
  }
  EXPECT_EQ(float_to_bf16_bits(3.4e38f), 0x7F80);  // rounds past the largest bfloat16: infinity
}

}  // namespace
}  // namespace mixtrain
