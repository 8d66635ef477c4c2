// mixtrain bench: speed of mixtrain's own kernels and training step on this machine.
//   bench gemm [--sizes 512,1024,2048] [--seconds S] [--json FILE]
//   bench step --model mlp --hidden 4096,4096 --batch-size 256 --policy P [--steps N] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/precision/hardware_check.h"

namespace mixtrain::cli {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Best GFLOP/s of n x n x n GEMMs in dtype over about `seconds`.
double gemm_gflops(DType dtype, int64_t n, double seconds) {
  Rng r(1);
  Tensor a = Tensor::empty({n, n}, DType::kFloat32), b = Tensor::empty({n, n}, DType::kFloat32);
  for (int64_t i = 0; i < n * n; ++i) {
    a.data<float>()[i] = r.uniform(-1, 1);
    b.data<float>()[i] = r.uniform(-1, 1);
  }
  Tensor a16 = a.to(dtype), b16 = b.to(dtype);
  Tensor c = Tensor::empty({n, n}, dtype);
  double best = 1e30;
  const auto start = Clock::now();
  int runs = 0;
  while (runs < 2 || (since(start) < seconds && runs < 1000)) {
    const auto t = Clock::now();
    kernels::gemm(false, false, n, n, n, dtype, a16.raw(), n, b16.raw(), n, dtype, c.raw(), n, false, nullptr);
    best = std::min(best, since(t));
    ++runs;
  }
  return 2.0 * n * n * n / best / 1e9;
}

int bench_gemm(const std::vector<std::string>& argv) {
  Args a(argv, {"sizes", "seconds", "json"});
  const std::vector<int64_t> sizes = a.int_list("sizes", {512, 1024, 2048});
  const double seconds = a.number("seconds", 1.0);
  MIXTRAIN_CHECK(seconds > 0, "--seconds must be positive");
  std::printf("GEMM (n x n x n), isa %s, best of repeated runs over %.1f s per case\n", kernels::gemm_isa(), seconds);
  // The methods the one-time calibration (or MIXTRAIN_BF16_GEMM / MIXTRAIN_F16_GEMM) chose on this CPU.
  std::printf("methods: bfloat16 %s, float16 %s (float32 every %d k on fp16); AMX tile state %s\n",
              kernels::gemm_bf16_method(), kernels::gemm_f16_method(), kernels::gemm_f16_promote_interval(),
              kernels::gemm_amx_status());
  std::printf("%6s  %-9s %10s %11s  %s\n", "n", "dtype", "GFLOP/s", "vs float32", "method");
  Json rows = Json::array();
  for (int64_t n : sizes) {
    double f32 = 0;
    for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      const double g = gemm_gflops(d, n, seconds);
      if (d == DType::kFloat32) f32 = g;
      const char* method = d == DType::kBFloat16 ? kernels::gemm_bf16_method()
                           : d == DType::kFloat16 ? kernels::gemm_f16_method()
                                                  : kernels::gemm_isa();
      std::printf("%6lld  %-9s %10.1f %10.2fx  %s\n", static_cast<long long>(n), dtype_name(d), g, g / f32, method);
      rows.push_back(Json::object(
          {{"n", n}, {"dtype", dtype_name(d)}, {"gflops", g}, {"ratio_vs_float32", g / f32}, {"method", method}}));
    }
  }
  const std::string json_path = a.str("json", "");
  if (!json_path.empty()) {
    write_file_atomically(json_path, Json::object({{"isa", kernels::gemm_isa()},
                                                   {"bf16_method", kernels::gemm_bf16_method()},
                                                   {"f16_method", kernels::gemm_f16_method()},
                                                   {"amx_status", kernels::gemm_amx_status()},
                                                   {"gemm", rows}})
                                         .dump(2) +
                                         "\n");
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}

int bench_step(const std::vector<std::string>& argv) {
  Args a(argv, {"model", "hidden", "batch-size", "policy", "steps", "json", "optimizer", "seed"});
  RunConfig cfg;
  cfg.model = a.str("model", "mlp");
  // The wide MLP of the peer comparison; a convolutional model's dense head stays small.
  cfg.hidden = a.int_list("hidden", cfg.model == "mlp" ? std::vector<int64_t>{4096, 4096} : std::vector<int64_t>{128});
  cfg.batch_size = a.integer("batch-size", 256);
  cfg.policy = a.str("policy", "float32");
  cfg.optimizer = a.str("optimizer", "adam");
  cfg.seed = static_cast<uint64_t>(a.integer("seed", 1));
  validate_run_config(cfg);
  const int64_t steps = a.integer("steps", 10);
  MIXTRAIN_CHECK(steps > 0, "--steps must be a positive integer, got " << steps);
  constexpr int64_t kInputs = 784, kClasses = 10;  // the Fashion-MNIST shapes
  set_precision_warning_sink([](const std::string&) {});
  auto model = build_model(cfg, kInputs, kClasses);
  set_precision_warning_sink(nullptr);
  model->compile(make_optimizer(cfg.optimizer, cfg.learning_rate), Loss("sparse_categorical_crossentropy", true));
  Rng r(cfg.seed);
  Tensor x = Tensor::empty({cfg.batch_size, kInputs}, DType::kFloat32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = r.uniform();
  std::vector<int32_t> labels(static_cast<size_t>(cfg.batch_size));
  for (auto& l : labels) l = static_cast<int32_t>(r.below(kClasses));
  Tensor y = Tensor::from_ints({cfg.batch_size}, labels);
  // The batch as fit() feeds it: already in the first layer's compute dtype.
  Tensor xb = x.to(model->layers().front()->compute_dtype());
  for (int i = 0; i < 2; ++i) model->train_step(xb, y);  // warm-up: optimizer slots, caches
  std::vector<double> times;
  for (int64_t s = 0; s < steps; ++s) {
    const auto t = Clock::now();
    model->train_step(xb, y);
    times.push_back(since(t));
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  int64_t weights = 0;
  for (const Var& w : model->trainable_weights()) weights += w.value().numel();
  // MLP: forward 2 flops per weight per row, backward 4 (input and weight gradients). A convolution reuses
  // its weights across positions, so no such count is printed for the other models.
  const bool mlp = cfg.model == "mlp";
  const double gflops =
      mlp ? 6.0 * static_cast<double>(cfg.batch_size) * static_cast<double>(weights) / median / 1e9 : 0.0;
  if (mlp) {
    std::printf("bench step: mlp 784-");
    for (int64_t h : cfg.hidden) std::printf("%lld-", static_cast<long long>(h));
    std::printf("10");
  } else {
    std::printf("bench step: %s (28x28x1 images, %lld weights)", cfg.model.c_str(), static_cast<long long>(weights));
  }
  std::printf(", batch %lld, %s, %s, isa %s: %.2f ms/step (median of %lld), %.1f steps/s", static_cast<long long>(cfg.batch_size),
              cfg.policy.c_str(), cfg.optimizer.c_str(), kernels::gemm_isa(), median * 1e3, static_cast<long long>(steps),
              1.0 / median);
  if (mlp) std::printf(", %.1f GFLOP/s", gflops);
  std::printf("\n");
  const std::string json_path = a.str("json", "");
  if (!json_path.empty()) {
    write_file_atomically(json_path, Json::object({{"ms_per_step", median * 1e3},
                                                   {"steps_per_second", 1.0 / median},
                                                   {"gflops", gflops},
                                                   {"policy", cfg.policy},
                                                   {"model", cfg.model},
                                                   {"isa", kernels::gemm_isa()}})
                                             .dump(2) +
                                         "\n");
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
}  // namespace

int bench_command(const std::vector<std::string>& argv) {
  const std::string what = argv.empty() ? "" : argv[0];
  const std::vector<std::string> rest(argv.begin() + (argv.empty() ? 0 : 1), argv.end());
  if (what == "gemm") return bench_gemm(rest);
  if (what == "step") return bench_step(rest);
  MIXTRAIN_FAIL(kInvalidInput, "bench needs a target, got '" << what << "'", "use `mixtrain bench gemm` or `mixtrain bench step`");
}

}  // namespace mixtrain::cli
