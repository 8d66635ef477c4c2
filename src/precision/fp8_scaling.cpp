#include "mixtrain/precision/fp8_scaling.h"

#include <cmath>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/core/float8.h"

namespace mixtrain {

namespace {
bool is_e5m2(DType format) {
  MIXTRAIN_CHECK(format == DType::kFloat8E4M3FN || format == DType::kFloat8E5M2,
                 "FP8 scaling: the format must be float8_e4m3fn or float8_e5m2, got " << dtype_name(format));
  return format == DType::kFloat8E5M2;
}

Float8Overflow default_overflow(bool e5m2) { return e5m2 ? Float8Overflow::kNonSaturating : Float8Overflow::kSaturate; }

// The larger magnitude, NaN winning (std::max would keep whichever came first).
float max_magnitude(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return NAN;
  return std::fmax(std::fabs(a), std::fabs(b));
}
}  // namespace

float float8_format_max(DType format) { return is_e5m2(format) ? kFloat8E5M2Max : kFloat8E4M3Max; }

float amax_of(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = max_magnitude(m, x[i]);
  return m;
}

float scale_from_amax(float amax, float format_max, int margin, float previous) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous;
  const float s = std::ldexp(format_max / amax, -margin);
  return std::isfinite(s) && s > 0.0f ? s : previous;
}

float current_scale(const float* x, int64_t n, DType format, int margin) {
  return scale_from_amax(amax_of(x, n), float8_format_max(format), margin, 1.0f);
}

void quantize_scaled(const float* x, int64_t n, float scale, DType format, uint8_t* out) {
  const bool e5m2 = is_e5m2(format);
  std::vector<float> scaled(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) scaled[static_cast<size_t>(i)] = x[i] * scale;
  float8_from_float(scaled.data(), out, n, e5m2, default_overflow(e5m2));
}

void dequantize_scaled(const uint8_t* codes, int64_t n, float scale, DType format, float* out) {
  float8_to_float(codes, out, n, is_e5m2(format));
  for (int64_t i = 0; i < n; ++i) out[i] = out[i] / scale;
}

void Fp8CastStats::merge(const Fp8CastStats& other) {
  amax = max_magnitude(amax, other.amax);
  count += other.count;
  saturated += other.saturated;
  flushed += other.flushed;
}

// The definitions read through the converter's non-saturating cast: past the range is what turns non-finite, and
// rounding to zero is a zero code (0x00 or 0x80 in both formats).
Fp8CastStats fp8_cast_stats(const float* x, int64_t n, DType format, float scale) {
  const bool e5m2 = is_e5m2(format);
  std::vector<float> scaled(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) scaled[static_cast<size_t>(i)] = x[i] * scale;
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  float8_from_float(scaled.data(), codes.data(), n, e5m2, Float8Overflow::kNonSaturating);
  std::vector<float> back(static_cast<size_t>(n));
  float8_to_float(codes.data(), back.data(), n, e5m2);
  Fp8CastStats s;
  s.amax = amax_of(x, n);
  s.count = n;
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    if (!std::isfinite(x[i])) continue;
    s.saturated += !std::isfinite(back[i]);
    s.flushed += x[i] != 0.0f && (codes[i] & 0x7f) == 0;
  }
  return s;
}

DelayedScaling::DelayedScaling(DType format, DelayedScalingOptions options)
    : format_max_(float8_format_max(format)), options_(options) {
  MIXTRAIN_CHECK(options.history_length >= 1,
                 "DelayedScaling: the amax history length must be at least 1, got " << options.history_length);
  MIXTRAIN_CHECK(options.margin >= 0, "DelayedScaling: the margin must be at least 0, got " << options.margin);
  ring_.assign(static_cast<size_t>(options.history_length), 0.0f);
}

void DelayedScaling::record(float amax) {
  float& slot = ring_[static_cast<size_t>(current_)];
  slot = max_magnitude(slot, amax);
}

void DelayedScaling::update() {
  const float amax = options_.reduction == AmaxReduction::kMostRecent
                         ? ring_[static_cast<size_t>(current_)]
                         : amax_of(ring_.data(), static_cast<int64_t>(ring_.size()));
  scale_ = scale_from_amax(amax, format_max_, options_.margin, scale_);
  current_ = (current_ + 1) % static_cast<int64_t>(ring_.size());
  ring_[static_cast<size_t>(current_)] = 0.0f;
}

std::vector<float> DelayedScaling::history() const {
  std::vector<float> h;
  const int64_t n = static_cast<int64_t>(ring_.size());
  for (int64_t i = 1; i <= n; ++i) h.push_back(ring_[static_cast<size_t>((current_ + i) % n)]);
  return h;
}

void DelayedScaling::restore(const std::vector<float>& history, float scale) {
  MIXTRAIN_CHECK(history.size() == ring_.size(),
                 "the amax history holds " << history.size() << " values, this tensor's holds " << ring_.size());
  for (size_t i = 0; i < history.size(); ++i)
    MIXTRAIN_CHECK(history[i] >= 0.0f && std::isfinite(history[i]),
                   "amax history entry " << i << " is " << history[i] << ", not a finite magnitude");
  MIXTRAIN_CHECK(scale > 0.0f && std::isfinite(scale), "the scale is " << scale << ", not positive and finite");
  // history() lists the ring from the oldest slot to the current one; stored in that order, the current slot is
  // the last and the oldest the first, the one the next update() drops.
  ring_ = history;
  current_ = static_cast<int64_t>(ring_.size()) - 1;
  scale_ = scale;
}

}  // namespace mixtrain
