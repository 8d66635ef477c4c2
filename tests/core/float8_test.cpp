// The float8 formats (core/float8.h) against their definitions: every code decodes to the value of the format's
// formula, and float32 / bfloat16 inputs at and beside every rounding boundary, the overflow thresholds, subnormals,
// signed zeros, NaNs and infinities encode to the code the definition of round-to-nearest-even gives
// (float8_reference.h, which shares no code with the converter).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "float8_reference.h"
#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/float8.h"
#include "mixtrain/core/random.h"

namespace mixtrain {
namespace {

namespace ref = float8_reference;

float decode(const ref::Format& f, uint8_t b) { return f.ieee_specials ? e5m2_bits_to_float(b) : e4m3_bits_to_float(b); }
uint8_t encode(const ref::Format& f, float x, bool saturate) {
  const Float8Overflow o = saturate ? Float8Overflow::kSaturate : Float8Overflow::kNonSaturating;
  return f.ieee_specials ? float_to_e5m2_bits(x, o) : float_to_e4m3_bits(x, o);
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The codes' values (NaN codes skipped), their midpoints (with the one past the largest finite value) and one
// float32 ulp either side of each, both signs; zeros, infinities, NaNs with payloads, float32 subnormals and extremes.
std::vector<float> boundary_inputs(const ref::Format& f) {
  std::vector<double> points;
  const uint8_t top = ref::max_code(f);
  for (uint8_t c = 0; c <= top; ++c) {
    const double v = ref::value(f, c);
    const double next = c < top ? ref::value(f, c + 1) : v + std::ldexp(1.0, std::ilogb(v) - f.mant_bits);
    points.push_back(v);
    points.push_back((v + next) / 2);
    points.push_back(next);
  }
  points.push_back(ref::value(f, 1) / 4);  // a quarter of the smallest subnormal
  std::vector<float> out;
  for (double p : points) {
    const float x = static_cast<float>(p);  // every point is exact in float32
    for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, INFINITY)}) {
      out.push_back(y);
      out.push_back(-y);
    }
  }
  for (uint32_t bits : {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u,
                        0x7FA00000u, 0xFFE00001u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x00800000u})
    out.push_back(from_bits(bits));
  return out;
}

void expect_encodes_as_defined(const ref::Format& f, float x, uint8_t got, bool saturate) {
  const auto want = ref::encode(f, static_cast<double>(x), saturate);
  if (!want) {
    EXPECT_TRUE(std::isnan(decode(f, got))) << f.name << " " << x << " gave " << int{got};
    EXPECT_EQ(got & 0x80, std::signbit(x) ? 0x80 : 0) << f.name << ": a NaN keeps its sign";
    return;
  }
  EXPECT_EQ(int{got}, int{*want}) << f.name << (saturate ? " saturating" : " non-saturating") << " of "
                                  << std::hexfloat << x;
}

const ref::Format kFormats[] = {ref::kE4M3, ref::kE5M2};

TEST(Float8, EveryCodeDecodesToItsDefinedValue) {
  for (const auto& f : kFormats) {
    int nans = 0;
    for (int c = 0; c < 256; ++c) {
      const double want = ref::value(f, static_cast<uint8_t>(c));
      const float got = decode(f, static_cast<uint8_t>(c));
      if (std::isnan(want)) {
        ++nans;
        EXPECT_TRUE(std::isnan(got)) << f.name << " code " << c;
        continue;
      }
      EXPECT_EQ(static_cast<double>(got), want) << f.name << " code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << f.name << " code " << c << ": the sign, zeros included";
    }
    EXPECT_EQ(nans, f.ieee_specials ? 6 : 2) << f.name;
  }
  EXPECT_EQ(e4m3_bits_to_float(0x7E), kFloat8E4M3Max);
  EXPECT_EQ(e5m2_bits_to_float(0x7B), kFloat8E5M2Max);
}

// Every E4M3 and E5M2 value is exactly a bfloat16 value: the array decode to bfloat16 loses nothing.
TEST(Float8, EveryValueIsExactlyABFloat16) {
  for (const auto& f : kFormats) {
    std::vector<uint8_t> codes(256);
    for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
    std::vector<bfloat16> b(256);
    float8_to_bfloat16(codes.data(), b.data(), 256, f.ieee_specials);
    for (int c = 0; c < 256; ++c) {
      const double want = ref::value(f, static_cast<uint8_t>(c));
      const float widened = bf16_bits_to_float(b[c].bits);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(widened)) << f.name << " code " << c;
        continue;
      }
      EXPECT_EQ(static_cast<double>(widened), want) << f.name << " code " << c;
      EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(want))), static_cast<float>(want));
    }
  }
}

TEST(Float8, Float32BoundariesEncodeAsDefined) {
  for (const auto& f : kFormats)
    for (bool saturate : {true, false})
      for (float x : boundary_inputs(f)) expect_encodes_as_defined(f, x, encode(f, x, saturate), saturate);
}

TEST(Float8, RandomFloat32EncodeAsDefined) {
  Rng rng(8);
  for (const auto& f : kFormats)
    for (int i = 0; i < 40000; ++i) {
      // Exponents around the format's range (and past it) more often than uniform bits would give.
      const uint64_t r = rng.next_u64();
      const uint32_t exponent = 97u + static_cast<uint32_t>(rng.below(48));  // 2^-30 .. 2^17
      const float x = from_bits(static_cast<uint32_t>(r & 0x807FFFFFu) | exponent << 23);
      const bool saturate = (i & 1) != 0;
      expect_encodes_as_defined(f, x, encode(f, x, saturate), saturate);
    }
}

// All 65,536 bfloat16 patterns, through the array conversion: bfloat16 holds every midpoint of both formats, so
// this covers every tie, both overflow thresholds, the subnormals, zeros, infinities and NaNs.
TEST(Float8, EveryBFloat16EncodesAsDefined) {
  std::vector<bfloat16> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = bfloat16{static_cast<uint16_t>(i)};
  for (const auto& f : kFormats)
    for (bool saturate : {true, false}) {
      std::vector<uint8_t> got(all.size());
      float8_from_bfloat16(all.data(), got.data(), static_cast<int64_t>(all.size()), f.ieee_specials,
                           saturate ? Float8Overflow::kSaturate : Float8Overflow::kNonSaturating);
      for (size_t i = 0; i < all.size(); ++i)
        expect_encodes_as_defined(f, bf16_bits_to_float(all[i].bits), got[i], saturate);
    }
}

// The thresholds written out: what the definition gives at each, so a reader sees the rule.
TEST(Float8, OverflowThresholdsAndSpecials) {
  const auto nosat = Float8Overflow::kNonSaturating;
  EXPECT_EQ(float_to_e4m3_bits(464.0f, nosat), 0x7E);  // halfway to 480: ties to 448's even mantissa
  EXPECT_EQ(float_to_e4m3_bits(std::nextafter(464.0f, 1e9f), nosat), 0x7F);  // past it: NaN (no infinity)
  EXPECT_EQ(float_to_e4m3_bits(std::nextafter(464.0f, 1e9f)), 0x7E);         // saturating (the default): 448
  EXPECT_EQ(float_to_e4m3_bits(-INFINITY), 0xFE);
  EXPECT_EQ(float_to_e4m3_bits(INFINITY, nosat), 0x7F);
  EXPECT_EQ(float_to_e5m2_bits(61440.0f), 0x7C);  // halfway to 65536: ties to the even mantissa, infinity
  EXPECT_EQ(float_to_e5m2_bits(std::nextafter(61440.0f, 0.0f)), 0x7B);
  EXPECT_EQ(float_to_e5m2_bits(61440.0f, Float8Overflow::kSaturate), 0x7B);
  EXPECT_EQ(float_to_e5m2_bits(-INFINITY, Float8Overflow::kSaturate), 0xFB);
  EXPECT_EQ(float_to_e5m2_bits(-INFINITY), 0xFC);
  EXPECT_EQ(float_to_e4m3_bits(-0.0f), 0x80);
  EXPECT_EQ(float_to_e5m2_bits(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3_bits(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: ties to zero
  EXPECT_EQ(float_to_e4m3_bits(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(float_to_e4m3_bits(-NAN), 0xFF);
}

// E8M0: 2^(e - 127) for e in 0..254, 0xFF NaN; encoding picks the nearest power of two (halfway goes up).
TEST(Float8, E8M0ScaleCodes) {
  for (int c = 0; c < 255; ++c) {
    const double want = std::ldexp(1.0, c - 127);
    EXPECT_EQ(static_cast<double>(e8m0_bits_to_float(static_cast<uint8_t>(c))), want) << c;
    EXPECT_EQ(float_to_e8m0_bits(static_cast<float>(want)), c);
    if (c > 0 && c < 254) {
      const float halfway = static_cast<float>(1.5 * want);
      EXPECT_EQ(float_to_e8m0_bits(halfway), c + 1);
      EXPECT_EQ(float_to_e8m0_bits(std::nextafter(halfway, 0.0f)), c);
    }
  }
  EXPECT_TRUE(std::isnan(e8m0_bits_to_float(0xFF)));
  for (float bad : {-1.0f, NAN, INFINITY, -INFINITY}) EXPECT_EQ(float_to_e8m0_bits(bad), 0xFF) << bad;
  EXPECT_EQ(float_to_e8m0_bits(0.0f), 0x00);
  EXPECT_EQ(float_to_e8m0_bits(std::numeric_limits<float>::max()), 0xFE);
  EXPECT_EQ(float_to_e8m0_bits(std::numeric_limits<float>::denorm_min()), 0x00);
}

TEST(Float8, DTypeTraitsAndNames) {
  const struct {
    DType dtype;
    const char* name;
    const char* tag;
  } rows[] = {{DType::kFloat8E4M3FN, "float8_e4m3fn", "F8_E4M3"},
              {DType::kFloat8E5M2, "float8_e5m2", "F8_E5M2"},
              {DType::kFloat8E8M0FNU, "float8_e8m0fnu", "F8_E8M0"}};
  for (const auto& r : rows) {
    EXPECT_EQ(parse_dtype(r.name), r.dtype);
    EXPECT_EQ(parse_safetensors_dtype(r.tag), r.dtype);
    EXPECT_EQ(dtype_size(r.dtype), 1u);
    EXPECT_TRUE(is_float8(r.dtype));
    EXPECT_FALSE(is_float(r.dtype)) << "no op computes in " << r.name;
    EXPECT_FALSE(is_low_precision(r.dtype));
  }
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32, DType::kUInt8, DType::kInt64})
    EXPECT_FALSE(is_float8(d));
  EXPECT_THROW(dispatch_float(DType::kFloat8E4M3FN, "test", [](auto) {}), Error);
}

}  // namespace
}  // namespace mixtrain
