#include "mixtrain/data/normalize.h"

#include <algorithm>
#include <cmath>

namespace mixtrain {

namespace {
void check_matrix(const Tensor& x, const char* op) {
  MIXTRAIN_CHECK(x.defined() && x.rank() == 2 && x.dtype() == DType::kFloat32,
                 op << ": expected features (N, F) float32, got "
                    << (x.defined() ? x.describe() : std::string("an undefined tensor")));
}
}  // namespace

Normalization parse_normalization(std::string_view name) {
  if (name == "standard") return Normalization::kStandard;
  if (name == "minmax") return Normalization::kMinMax;
  if (name == "none") return Normalization::kNone;
  MIXTRAIN_FAIL(kInvalidInput, "unknown normalization '" << name << "'; valid names: standard, minmax, none",
                "standard suits most inputs; minmax keeps values in [0, 1]");
}

const char* normalization_name(Normalization mode) {
  switch (mode) {
    case Normalization::kStandard:
      return "standard";
    case Normalization::kMinMax:
      return "minmax";
    case Normalization::kNone:
      return "none";
  }
  return "unknown";
}

Normalizer Normalizer::fit(const Tensor& x_train, Normalization mode) {
  check_matrix(x_train, "Normalizer::fit");
  const int64_t n = x_train.dim(0);
  const int64_t f = x_train.dim(1);
  MIXTRAIN_CHECK(n >= 1, "Normalizer::fit: no training samples in " << x_train.describe());
  const float* x = x_train.data<float>();

  Normalizer norm;
  norm.mode_ = mode;
  norm.offset_.assign(static_cast<size_t>(f), 0.0);
  norm.scale_.assign(static_cast<size_t>(f), 1.0);
  if (mode == Normalization::kStandard) {
    // Two passes: the mean first, then squared deviations from it, which stays accurate where
    // E[x^2] - E[x]^2 would cancel.
    std::vector<double> sum(static_cast<size_t>(f), 0.0), sq(static_cast<size_t>(f), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < f; ++j) sum[j] += x[i * f + j];
    for (int64_t j = 0; j < f; ++j) norm.offset_[j] = sum[j] / static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < f; ++j) {
        const double d = x[i * f + j] - norm.offset_[j];
        sq[j] += d * d;
      }
    for (int64_t j = 0; j < f; ++j) {
      const double sd = std::sqrt(sq[j] / static_cast<double>(n));  // population std, as scikit-learn
      norm.scale_[j] = sd > 0.0 ? sd : 1.0;
    }
  } else if (mode == Normalization::kMinMax) {
    std::vector<double> lo(x, x + f), hi(x, x + f);
    for (int64_t i = 1; i < n; ++i)
      for (int64_t j = 0; j < f; ++j) {
        lo[j] = std::min<double>(lo[j], x[i * f + j]);
        hi[j] = std::max<double>(hi[j], x[i * f + j]);
      }
    for (int64_t j = 0; j < f; ++j) {
      norm.offset_[j] = lo[j];
      norm.scale_[j] = hi[j] > lo[j] ? hi[j] - lo[j] : 1.0;
    }
  }
  return norm;
}

void Normalizer::apply(Tensor& x) const {
  if (mode_ == Normalization::kNone && offset_.empty()) return;  // default-constructed: nothing to check against
  check_matrix(x, "Normalizer::apply");
  const int64_t f = num_features();
  MIXTRAIN_CHECK(x.dim(1) == f, "Normalizer::apply: fitted on " << f << " features, got " << x.describe());
  if (mode_ == Normalization::kNone) return;
  float* p = x.data<float>();
  const int64_t n = x.dim(0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < f; ++j) p[i * f + j] = static_cast<float>((p[i * f + j] - offset_[j]) / scale_[j]);
}

}  // namespace mixtrain
