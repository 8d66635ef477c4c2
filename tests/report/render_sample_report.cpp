// Writes a comparison report built from fixed, synthetic data to an HTML file, and prints the
// policy names one per line, so a browser check knows which curves the page must draw. The report has
// float32's band over three seeds, a recovery action and --batch-size auto, so every chart is drawn.
//   render_sample_report OUT.html [OUT.json]
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <limits>

#include "mixtrain/core/error.h"
#include "mixtrain/report/comparison.h"

namespace {

using mixtrain::ComparisonReport;
using mixtrain::PolicyRun;

constexpr int kEpochs = 5;
constexpr int kStepsPerEpoch = 469;  // 60000 examples in batches of 128
constexpr int kSteps = kEpochs * kStepsPerEpoch;

// A fixed pseudo-random sequence in [0, 1), the same on every platform.
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed) {}
  double next() {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state_ >> 11) / 9007199254740992.0;
  }

 private:
  uint64_t state_;
};

// Per-step loss: a shared trend and batch noise (identical data and seed; another float32 seed draws other
// batches), a policy-specific offset and a little policy-specific noise from rounding.
std::vector<double> step_losses(double offset, double own_noise, uint64_t own_seed, uint64_t data_seed = 42) {
  Lcg batches(data_seed), own(own_seed);
  std::vector<double> loss(kSteps);
  for (int t = 0; t < kSteps; ++t) {
    const double trend = 0.06 + 2.24 * std::exp(-t / 180.0) + 0.25 * std::exp(-t / 900.0);
    const double batch = 1 + 0.35 * (batches.next() - 0.5);
    const double rounding = 1 + own_noise * (own.next() - 0.5);
    loss[t] = trend * batch * rounding * offset;
  }
  return loss;
}

void fill_epochs(PolicyRun& run) {
  for (int e = 0; e < kEpochs; ++e) {
    double sum = 0;
    for (int t = e * kStepsPerEpoch; t < (e + 1) * kStepsPerEpoch; ++t) sum += run.step_loss[t];
    const double mean = sum / kStepsPerEpoch;  // NaN once any step is NaN
    run.epoch_loss.push_back(mean);
    run.epoch_val_loss.push_back(mean * 1.08 + 0.01);
  }
}

ComparisonReport sample_report() {
  constexpr double kMiB = 1024.0 * 1024.0;
  ComparisonReport report;
  report.title = "mixtrain compare: mlp on MNIST";
  report.model = "mlp: Dense(256, relu) -> Dense(256, relu) -> Dense(10)";
  report.data = "MNIST (60000 train / 10000 test), batch 128";
  report.seed = 42;
  report.epochs = kEpochs;

  PolicyRun f32;
  f32.policy = "float32";
  f32.seed = 42;
  f32.batch_size = 5728;  // --batch-size auto under the memory budget
  f32.step_loss = step_losses(1.0, 0.0, 1);
  f32.test_accuracy = 0.9781;
  f32.steps_per_second = 812;
  f32.peak_memory_bytes = 42.3 * kMiB;
  f32.layer_dtypes = {{"dense", "float32"}, {"dense_1", "float32"}, {"dense_2", "float32"}};

  // float32 with two more seeds: other initial weights and batches, for the band.
  PolicyRun f32_b = f32, f32_c = f32;
  f32_b.seed = 43;
  f32_b.step_loss = step_losses(1.012, 0.0, 1, 7);
  f32_b.test_accuracy = 0.9769;
  f32_c.seed = 44;
  f32_c.step_loss = step_losses(0.991, 0.0, 1, 8);
  f32_c.test_accuracy = 0.9790;

  // Dynamic loss scaling: starts at 2^15, halves on an overflow (skipping that step), doubles after
  // 2000 finite steps in a row.
  PolicyRun f16 = f32;
  f16.policy = "mixed_float16";
  f16.batch_size = 10048;
  f16.layer_dtypes = {{"dense", "float16"}, {"dense_1", "float16"}, {"dense_2", "float32"}};
  f16.step_loss = step_losses(1.004, 0.02, 2);
  f16.test_accuracy = 0.9776;
  f16.steps_per_second = 1187;
  f16.peak_memory_bytes = 27.1 * kMiB;
  double scale = 32768;
  int finite_run = 0;
  for (int t = 0; t < kSteps; ++t) {
    f16.step_loss_scale.push_back(scale);
    const bool overflow = t < 2 || t == 2200;
    if (overflow) {
      scale /= 2;
      finite_run = 0;
      ++f16.skipped_steps;
    } else if (++finite_run == 2000) {
      scale *= 2;
      finite_run = 0;
    }
  }

  // mixed_bfloat16 left the band at step 1400 with --recover: its first layer moved to float32 and training
  // rolled back to step 1350.
  PolicyRun bf16 = f32;
  bf16.policy = "mixed_bfloat16";
  bf16.batch_size = 10048;
  bf16.layer_dtypes = {{"dense", "float32"}, {"dense_1", "bfloat16"}, {"dense_2", "float32"}};
  bf16.recovery = {{1400, "layers_to_float32", "left float32's band", {"dense"}, -1},
                   {1400, "rollback", "back to the last good snapshot", {}, 1350}};
  bf16.step_loss = step_losses(1.015, 0.03, 3);
  bf16.test_accuracy = 0.9769;
  bf16.steps_per_second = 768;
  bf16.peak_memory_bytes = 26.8 * kMiB;

  // Pure float16 without loss scaling: activations overflow and the loss blows up to NaN.
  PolicyRun pure = f32;
  pure.policy = "float16";
  pure.batch_size = 11264;
  pure.layer_dtypes = {{"dense", "float16"}, {"dense_1", "float16"}, {"dense_2", "float16"}};
  pure.step_loss = step_losses(1.01, 0.05, 4);
  for (int t = 700; t < kSteps; ++t) {
    pure.step_loss[t] *= std::exp((t - 700) / 12.0);
    if (t >= 760) pure.step_loss[t] = std::numeric_limits<double>::quiet_NaN();
  }
  pure.test_accuracy = 0.098;
  pure.steps_per_second = 1290;
  pure.peak_memory_bytes = 22.0 * kMiB;

  for (PolicyRun* run : {&f32, &f32_b, &f32_c, &f16, &bf16, &pure}) {
    fill_epochs(*run);
    run->test_loss = run->epoch_val_loss.back() * 1.01;  // NaN for the diverged run
  }
  report.band = mixtrain::make_float32_band({f32, f32_b, f32_c});
  report.extra_seeds = {f32_b, f32_c};
  report.batch_size_auto = true;
  for (PolicyRun* run : {&f32, &f16, &bf16, &pure}) mixtrain::fill_comparison(*run, f32, report.band);
  report.runs = {f32, f16, bf16, pure};
  report.notes = {
      "Sample data for the report layout; not a measured run.",
      "float16 without loss scaling: the loss became NaN at step 761 and training continued on NaN weights.",
      "mixed_bfloat16 ran slower than float32 on this CPU (no native bfloat16 matrix instructions).",
  };
  return report;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: " << argv[0] << " OUT.html [OUT.json]\n";
    return 2;
  }
  try {
    const ComparisonReport report = sample_report();
    std::ofstream html(argv[1], std::ios::binary);
    html << mixtrain::render_comparison_html(report);
    if (!html.flush()) {
      std::cerr << "cannot write " << argv[1] << "\n";
      return 1;
    }
    if (argc == 3) {
      std::ofstream json(argv[2], std::ios::binary);
      json << mixtrain::comparison_to_json(report).dump(2) << "\n";
    }
    std::cerr << mixtrain::format_comparison_table(report);
    for (const PolicyRun& run : report.runs) std::cout << run.policy << "\n";
  } catch (const mixtrain::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
