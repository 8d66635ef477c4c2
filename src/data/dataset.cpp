#include "mixtrain/data/dataset.h"

#include <algorithm>
#include <cmath>

#include "mixtrain/core/random.h"

namespace mixtrain {

namespace {
// A stream of its own, so the holdout split does not repeat the sequence that weight initialisation
// or shuffling draws from the same seed.
constexpr uint64_t kHoldoutStream = 0x686f6c646f7574ull;  // "holdout"

Dataset subset(const Dataset& data, const std::vector<int64_t>& rows) {
  Dataset out;
  out.x = data.x.gather_rows(rows);
  out.y = data.y.gather_rows(rows);
  out.num_classes = data.num_classes;
  out.sample_shape = data.sample_shape;
  out.source = data.source;
  return out;
}
}  // namespace

void validate_dataset(const Dataset& data) {
  const std::string& src = data.source;
  // Features (N, F) float32, or token windows (N, T) int32 whose labels are (N, T).
  const bool tokens = data.x.defined() && data.x.dtype() == DType::kInt32;
  MIXTRAIN_CHECK(data.x.defined() && data.x.rank() == 2 && (data.x.dtype() == DType::kFloat32 || tokens),
                 "dataset '" << src << "': features must be (N, features) float32 or (N, T) int32 ids, got "
                             << (data.x.defined() ? data.x.describe() : std::string("nothing")));
  MIXTRAIN_CHECK(data.y.defined() && data.y.rank() == (tokens ? 2 : 1) && data.y.dtype() == DType::kInt32,
                 "dataset '" << src << "': labels must be " << (tokens ? "(N, T)" : "(N,)") << " int32, got "
                             << (data.y.defined() ? data.y.describe() : std::string("nothing")));
  MIXTRAIN_CHECK(data.y.dim(0) == data.x.dim(0),
                 "dataset '" << src << "': " << data.x.dim(0) << " samples but " << data.y.dim(0) << " labels");
  MIXTRAIN_CHECK(!tokens || data.y.shape() == data.x.shape(),
                 "dataset '" << src << "': token windows " << data.x.describe() << " and their targets "
                             << data.y.describe() << " differ in shape");
  MIXTRAIN_CHECK(data.num_classes >= 1, "dataset '" << src << "': num_classes is " << data.num_classes);
  const int32_t* y = data.y.data<int32_t>();
  const int64_t per_sample = tokens ? data.y.dim(1) : 1;
  for (int64_t i = 0; i < data.y.numel(); ++i)
    MIXTRAIN_CHECK(y[i] >= 0 && y[i] < data.num_classes,
                   "dataset '" << src << "': sample " << i / per_sample << " has label " << y[i]
                               << (tokens ? " at position " + std::to_string(i % per_sample) : std::string())
                               << ", outside [0, " << data.num_classes << ")");
  if (tokens) {
    const int32_t* x = data.x.data<int32_t>();
    for (int64_t i = 0; i < data.x.numel(); ++i)
      MIXTRAIN_CHECK(x[i] >= 0 && x[i] < data.num_classes,
                     "dataset '" << src << "': token " << i << " is " << x[i] << ", outside [0, " << data.num_classes
                                 << ")");
  }
}

std::pair<Dataset, Dataset> split_holdout(const Dataset& data, double fraction, uint64_t seed) {
  if (!(fraction > 0.0 && fraction < 1.0))
    MIXTRAIN_FAIL(kInvalidInput, "holdout fraction " << fraction << " for '" << data.source << "' is not in (0, 1)",
                  "use a fraction such as 0.1 to hold out 10% of the samples as a test set");
  const int64_t n = data.size();
  if (n < 2)
    MIXTRAIN_FAIL(kInvalidInput,
                  "'" << data.source << "' has " << n << " sample(s); holding out a test set needs at least 2",
                  "add samples or provide a separate test file");
  const int64_t held = std::clamp<int64_t>(std::llround(fraction * static_cast<double>(n)), 1, n - 1);

  const std::vector<int64_t> perm = Rng::derive(seed, kHoldoutStream).permutation(n);
  std::vector<int64_t> test_rows(perm.begin(), perm.begin() + held);
  std::vector<int64_t> train_rows(perm.begin() + held, perm.end());
  std::sort(test_rows.begin(), test_rows.end());
  std::sort(train_rows.begin(), train_rows.end());
  return {subset(data, train_rows), subset(data, test_rows)};
}

std::vector<int64_t> class_counts(const Dataset& data) {
  std::vector<int64_t> counts(static_cast<size_t>(std::max<int64_t>(data.num_classes, 0)), 0);
  if (!data.y.defined()) return counts;
  const int32_t* y = data.y.data<int32_t>();
  for (int64_t i = 0; i < data.y.numel(); ++i)
    if (y[i] >= 0 && y[i] < data.num_classes) ++counts[static_cast<size_t>(y[i])];
  return counts;
}

}  // namespace mixtrain
