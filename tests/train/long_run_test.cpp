// Tens of thousands of small training steps, as a run left going for days makes: nothing a step allocates
// outlives it. After a warm-up, the tensor allocator's live bytes are the same after every step, and the
// process's resident memory stays flat, including through skipped (non-finite) steps and evaluations.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "mixtrain/core/allocator.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/model.h"

#include "blobs.h"

// Under AddressSanitizer freed memory waits in a quarantine (256 MiB by default) before it is reused, so the
// resident memory of 20,000 steps grows by the quarantine, not by a leak: this binary (the long run alone) turns
// the quarantine off so the resident-memory check measures the program again (278 KB growth measured so).
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __asan_default_options() { return "quarantine_size_mb=0"; }
#endif

namespace mixtrain {
namespace {

using train_test::blobs;

int64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long total = 0, resident = 0;
  const int read = std::fscanf(f, "%ld %ld", &total, &resident);
  std::fclose(f);
  return read == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : -1;
}

TEST(LongRun, LiveBytesAndResidentMemoryStayFlatOverTwentyThousandSteps) {
  set_global_policy("mixed_float16");  // casts, 16-bit weight caches and the loss-scale path in every step
  auto m = std::make_unique<Model>("long_run", 3);
  m->emplace<Dense>(16, "relu");
  m->emplace<BatchNormalization>();
  m->emplace<Dropout>(0.1f);
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  m->compile(make_optimizer("adam", 0.003f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});

  auto [x, y] = blobs(512, 1);
  auto [tx, ty] = blobs(64, 2);
  // A batch with an infinity: its step is skipped and the scale halves, a path a long run takes now and then.
  Tensor bad = x.slice_rows(0, 16).contiguous().to(DType::kFloat32);
  bad.data<float>()[5] = std::numeric_limits<float>::infinity();
  const Tensor bad_labels = y.slice_rows(0, 16);

  constexpr int64_t kSteps = 20000, kWarmup = 1000, kEvery = 1000;
  std::vector<int64_t> live, resident;
  int64_t skipped = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    if (step % 997 == 500) {
      m->train_step(bad, bad_labels);
      skipped += dynamic_cast<const LossScaleOptimizer&>(m->optimizer()).last_step_skipped() ? 1 : 0;
    } else {
      const int64_t b = (step * 16) % 512;
      m->train_step(x.slice_rows(b, b + 16), y.slice_rows(b, b + 16));
    }
    if (step % 2000 == 1999) m->evaluate(tx, ty);
    if (step >= kWarmup && step % kEvery == 0) {
      live.push_back(memory_stats().live_bytes);
      resident.push_back(resident_bytes());
    }
  }
  set_global_policy("float32");
  ASSERT_GE(live.size(), 19u);
  EXPECT_EQ(skipped, kSteps / 997);  // every injected step was skipped
  for (size_t i = 1; i < live.size(); ++i)
    EXPECT_EQ(live[i], live[0]) << "the allocator's live bytes changed between samples 0 and " << i;
  ASSERT_GT(resident.front(), 0) << "/proc/self/statm is unreadable";
  // A leak of 64 bytes a step would add 1.2 MB over the 19,000 sampled steps; allow half of that for the
  // allocator's and the C library's own bookkeeping.
  const int64_t growth = *std::max_element(resident.begin(), resident.end()) - resident.front();
  std::printf("live tensor bytes %lld at every sample; resident memory %lld bytes, grew by %lld after warm-up\n",
              static_cast<long long>(live.front()), static_cast<long long>(resident.front()),
              static_cast<long long>(growth));
  EXPECT_LT(growth, 600 * 1024) << "resident memory grew by " << growth << " bytes";
  const EvaluateResult r = m->evaluate(tx, ty);
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_GT(r.accuracy, 0.9);  // and it still learns
}

}  // namespace
}  // namespace mixtrain
