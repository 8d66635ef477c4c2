// Per-tensor FP8 scales (precision/fp8_scaling.h) against a float64 reference: the scale formula, current scaling,
// the quantize / dequantize round trip within the format's half unit in the last place, and delayed scaling's amax
// history (ring length, max / most-recent reduction, zero and non-finite amaxes, one roll per update) against a
// plain list of every step's amax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/core/float8.h"
#include "mixtrain/core/random.h"
#include "mixtrain/precision/fp8_scaling.h"

namespace mixtrain {
namespace {

const DType kFormats[] = {DType::kFloat8E4M3FN, DType::kFloat8E5M2};

// (max / amax) / 2^margin in float64, rounded once to float32 (a float32 quotient is correctly rounded, so the two
// agree exactly), or previous under the rules' exceptions.
float reference_scale(double amax, double max, int margin, float previous) {
  if (!(amax > 0) || !std::isfinite(amax)) return previous;
  const double s = max / amax / std::ldexp(1.0, margin);
  const float f = static_cast<float>(s);
  return std::isfinite(f) && f > 0 ? f : previous;
}

TEST(Fp8Scaling, FormatMaxima) {
  EXPECT_EQ(float8_format_max(DType::kFloat8E4M3FN), 448.0f);
  EXPECT_EQ(float8_format_max(DType::kFloat8E5M2), 57344.0f);
  EXPECT_THROW(float8_format_max(DType::kFloat16), Error);
  EXPECT_THROW(float8_format_max(DType::kFloat8E8M0FNU), Error);
}

TEST(Fp8Scaling, ScaleFormulaMatchesFloat64) {
  Rng rng(3);
  for (DType f : kFormats)
    for (int i = 0; i < 20000; ++i) {
      const float amax = std::ldexp(rng.uniform() + 0.5f, static_cast<int>(rng.below(60)) - 30);
      const int margin = static_cast<int>(rng.below(4));
      EXPECT_EQ(scale_from_amax(amax, float8_format_max(f), margin, 7.0f),
                reference_scale(amax, float8_format_max(f), margin, 7.0f))
          << amax << " margin " << margin;
    }
  for (float bad : {0.0f, -0.0f, NAN, INFINITY, -1.0f}) EXPECT_EQ(scale_from_amax(bad, 448.0f, 0, 7.0f), 7.0f) << bad;
  EXPECT_EQ(scale_from_amax(1e-45f, 448.0f, 0, 7.0f), 7.0f);  // 448 / 1e-45 is past float32: keep the previous
  EXPECT_EQ(scale_from_amax(448.0f, 448.0f, 2, 7.0f), 0.25f);
}

TEST(Fp8Scaling, CurrentScaleUsesTheTensorsOwnAmax) {
  Rng rng(4);
  std::vector<float> x(1000);
  for (float& v : x) v = rng.normal() * 30.0f;
  double amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(static_cast<double>(v)));
  EXPECT_EQ(amax_of(x.data(), 1000), static_cast<float>(amax));
  for (DType f : kFormats)
    EXPECT_EQ(current_scale(x.data(), 1000, f, 1), reference_scale(amax, float8_format_max(f), 1, 1.0f));
  x[17] = NAN;
  EXPECT_TRUE(std::isnan(amax_of(x.data(), 1000)));
  EXPECT_EQ(current_scale(x.data(), 1000, DType::kFloat8E4M3FN), 1.0f);
  EXPECT_EQ(amax_of(x.data(), 0), 0.0f);
}

// Dequantize(quantize(x)) is x within half a unit in the last place of the format at x * scale (relative 2^-4 for
// E4M3's 3 mantissa bits, 2^-3 for E5M2's 2) plus half the smallest subnormal, over the scale.
TEST(Fp8Scaling, QuantizeRoundTripsWithinHalfAnUlp) {
  Rng rng(5);
  std::vector<float> x(4099);
  for (float& v : x) v = rng.normal() * std::ldexp(1.0f, static_cast<int>(rng.below(12)) - 6);
  for (DType f : kFormats) {
    const float scale = current_scale(x.data(), static_cast<int64_t>(x.size()), f);
    std::vector<uint8_t> codes(x.size());
    std::vector<float> back(x.size());
    quantize_scaled(x.data(), static_cast<int64_t>(x.size()), scale, f, codes.data());
    dequantize_scaled(codes.data(), static_cast<int64_t>(x.size()), scale, f, back.data());
    const double rel = f == DType::kFloat8E4M3FN ? 0.0625 : 0.125;
    const double sub = f == DType::kFloat8E4M3FN ? std::ldexp(1.0, -10) : std::ldexp(1.0, -17);
    for (size_t i = 0; i < x.size(); ++i) {
      const double err = std::fabs(static_cast<double>(back[i]) - x[i]);
      // 2^-20 relative on top: the float32 roundings of x * scale and of the division back.
      ASSERT_LE(err, (rel + 0x1p-20) * std::fabs(x[i]) + sub / scale) << dtype_name(f) << " " << x[i];
    }
  }
}

// The reference: every step's amax in a list; the scale after update t reduces the last `length` entries.
struct HistoryModel {
  std::vector<float> steps{0.0f};
  float scale = 1.0f;
  void record(float a) {
    float& s = steps.back();
    s = std::isnan(a) || std::isnan(s) ? NAN : std::max(s, std::fabs(a));
  }
  void update(const DelayedScalingOptions& o, double max) {
    double amax = steps.back();
    if (o.reduction == AmaxReduction::kMax) {
      const size_t from = steps.size() > static_cast<size_t>(o.history_length) ? steps.size() - o.history_length : 0;
      amax = 0;
      for (size_t i = from; i < steps.size(); ++i) amax = std::isnan(steps[i]) ? NAN : std::max<double>(amax, steps[i]);
    }
    scale = reference_scale(amax, max, o.margin, scale);
    steps.push_back(0.0f);
  }
};

TEST(Fp8Scaling, DelayedScalingFollowsItsHistory) {
  Rng rng(6);
  for (AmaxReduction reduction : {AmaxReduction::kMax, AmaxReduction::kMostRecent})
    for (int length : {1, 4, 16}) {
      const DelayedScalingOptions o{length, reduction, 1};
      DelayedScaling d(DType::kFloat8E4M3FN, o);
      HistoryModel m;
      for (int step = 0; step < 60; ++step) {
        const int draws = static_cast<int>(rng.below(3));  // 0 draws: a step with amax 0
        for (int k = 0; k < draws; ++k) {
          const float u = rng.uniform();
          const float amax = u < 0.03f ? NAN : u < 0.06f ? INFINITY : std::ldexp(u, static_cast<int>(rng.below(20)) - 5);
          d.record(amax);
          m.record(amax);
        }
        d.update();
        m.update(o, 448.0);
        ASSERT_EQ(d.scale(), m.scale) << "length " << length << " step " << step;
        ASSERT_EQ(d.scale_inverse(), 1.0f / m.scale);
        const std::vector<float> h = d.history();
        ASSERT_EQ(static_cast<int>(h.size()), length);
        EXPECT_EQ(h.back(), 0.0f) << "the new step's slot starts at zero";
      }
    }
}

TEST(Fp8Scaling, DelayedScalingDefaultsAndChecks) {
  DelayedScaling d(DType::kFloat8E5M2);
  EXPECT_EQ(d.options().history_length, 1024);
  EXPECT_EQ(d.options().reduction, AmaxReduction::kMax);
  EXPECT_EQ(d.scale(), 1.0f);
  d.record(2.0f);
  d.record(-8.0f);  // a magnitude
  d.update();
  EXPECT_EQ(d.scale(), 57344.0f / 8.0f);
  d.update();  // 8 is still in the window
  EXPECT_EQ(d.scale(), 57344.0f / 8.0f);
  EXPECT_EQ(d.history()[1021], 8.0f);
  EXPECT_THROW(DelayedScaling(DType::kFloat8E4M3FN, {0, AmaxReduction::kMax, 0}), Error);
  EXPECT_THROW(DelayedScaling(DType::kFloat8E4M3FN, {8, AmaxReduction::kMax, -1}), Error);
}

}  // namespace
}  // namespace mixtrain

namespace mixtrain {
namespace {

// Saturation and flushing by the formats' definitions, in float64: E4M3's largest finite value 448 = 1.75 * 2^8 has
// the next step 480 (a NaN code), so the rounding midpoint 464 rounds to even (448) and only magnitudes above it
// saturate; E5M2's 57344 = 1.75 * 2^15 is followed by infinity at 2^16, so the midpoint 61440 ties to even (2^16,
// infinity) and saturates. The smallest subnormals are 2^-9 (E4M3) and 2^-16 (E5M2): a magnitude at or below half
// of it (the midpoint ties to even, zero) flushes to zero.
bool saturates(double v, DType f) {
  return f == DType::kFloat8E4M3FN ? std::fabs(v) > 464.0 : std::fabs(v) >= 61440.0;
}
bool flushes(double v, DType f) {
  return v != 0 && std::fabs(v) <= std::ldexp(1.0, f == DType::kFloat8E4M3FN ? -10 : -17);
}

TEST(Fp8CastStats, CountsSaturatedAndFlushedValuesAsTheDefinitionsSay) {
  Rng rng(9);
  for (DType f : kFormats)
    for (float scale : {1.0f, 0.375f, 8.0f}) {
      // Values at and beside both boundaries (one float32 step either side), zeros, random magnitudes over the
      // whole range, and a NaN and an infinity, which count in neither share.
      std::vector<float> x = {0.0f, -0.0f, NAN, INFINITY};
      const double bounds[] = {f == DType::kFloat8E4M3FN ? 464.0 : 61440.0,
                               std::ldexp(1.0, f == DType::kFloat8E4M3FN ? -10 : -17)};
      for (double b : bounds)
        for (float sign : {1.0f, -1.0f}) {
          const float at = static_cast<float>(b / scale);
          for (float v : {at, std::nextafter(at, 0.0f), std::nextafter(at, INFINITY)}) x.push_back(sign * v);
        }
      for (int i = 0; i < 3000; ++i) {
        const int exponent = static_cast<int>(rng.uniform() * 43.0f) - 24;  // 2^-24 to 2^18
        x.push_back((rng.uniform() < 0.5f ? -1.0f : 1.0f) * std::ldexp(rng.uniform(), exponent));
      }
      const Fp8CastStats s = fp8_cast_stats(x.data(), static_cast<int64_t>(x.size()), f, scale);
      int64_t saturated = 0, flushed = 0;
      for (float v : x) {
        if (!std::isfinite(v)) continue;
        const double scaled = static_cast<double>(static_cast<float>(v * scale));  // the float32 product, as cast
        saturated += saturates(scaled, f);
        flushed += flushes(scaled, f);
      }
      EXPECT_EQ(s.count, static_cast<int64_t>(x.size()));
      EXPECT_EQ(s.saturated, saturated) << dtype_name(f) << " scale " << scale;
      EXPECT_EQ(s.flushed, flushed) << dtype_name(f) << " scale " << scale;
      EXPECT_GT(saturated, 0);
      EXPECT_GT(flushed, 0);
      EXPECT_TRUE(std::isnan(s.amax)) << "a NaN makes the amax NaN, as amax_of";
      Fp8CastStats merged = s;
      merged.merge(s);
      EXPECT_EQ(merged.count, 2 * s.count);
      EXPECT_DOUBLE_EQ(merged.saturated_fraction(), s.saturated_fraction());
    }
}

}  // namespace
}  // namespace mixtrain
