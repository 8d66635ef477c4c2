// mixtrain bench: speed of mixtrain's own kernels and training step on this machine.
//   bench gemm [--sizes 512,1024,2048] [--seconds S] [--json FILE] [--device cpu|cuda|cuda:N] [--float8]
//   bench step --model mlp --hidden 4096,4096 --batch-size 256 --policy P [--steps N] [--json FILE] [--device D]
//              [--accumulate N] [--optimizer-state float32|bfloat16] [--master-rounding nearest|stochastic|kahan]
//   mpirun -np N mixtrain bench step ...: the same global batch on N ranks, with communication's share
//   bench step --model transformer [--context T --width D --layers L --heads H --vocabulary V
//              --attention tiled|full] --batch-size B --policy P [--steps N] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>

#include "commands.h"
#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/distributed/zero.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "mixtrain/ops/gemm_timing.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/core/allocator.h"
#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/train/batch_size.h"
#include "mixtrain/train/memory_plan.h"

namespace mixtrain::cli {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Best GFLOP/s of n x n x n GEMMs in dtype over about `seconds`, on the CPU (ops::time_cpu_matmul).
double gemm_gflops(DType dtype, int64_t n, double seconds) {
  Rng r(1);
  Tensor a = Tensor::empty({n, n}, DType::kFloat32), b = Tensor::empty({n, n}, DType::kFloat32);
  for (int64_t i = 0; i < n * n; ++i) {
    a.data<float>()[i] = r.uniform(-1, 1);
    b.data<float>()[i] = r.uniform(-1, 1);
  }
  Tensor a16 = a.to(dtype), b16 = b.to(dtype);
  Tensor c = Tensor::empty({n, n}, dtype);
  return ops::time_cpu_matmul(a16, b16, c, seconds).gflops;
}

// Best GFLOP/s of the FP8 GEMM as the float8 policies run it on the CPU: A and B quantized once to `format` with
// their current scales (ops::fp8_quantize: the codes widened exactly to bfloat16), then ops::scaled_matmul timed
// (the bfloat16 GEMM, float32 accumulation, the inverse scales in the epilogue, bfloat16 out), best of repeated runs
// over about `seconds` (at least two). The quantization is left out, as the other rows leave out their casts.
double fp8_gemm_gflops(DType format, int64_t n, double seconds) {
  Rng r(1);
  Tensor a = Tensor::empty({n, n}, DType::kFloat32), b = Tensor::empty({n, n}, DType::kFloat32);
  for (int64_t i = 0; i < n * n; ++i) {
    a.data<float>()[i] = r.uniform(-1, 1);
    b.data<float>()[i] = r.uniform(-1, 1);
  }
  const float max = format == DType::kFloat8E5M2 ? kFloat8E5M2Max : kFloat8E4M3Max;
  const float sa = max / ops::fp8_amax(a), sb = max / ops::fp8_amax(b);
  const Tensor qa = ops::fp8_quantize(a, format, sa, Float8Overflow::kSaturate).values;
  const Tensor qb = ops::fp8_quantize(b, format, sb, Float8Overflow::kSaturate).values;
  Tensor c = Tensor::empty({n, n}, DType::kBFloat16);
  double best = 1e30, spent = 0;
  for (int run = 0; run < 1000 && (run < 2 || spent < seconds); ++run) {
    const Clock::time_point t = Clock::now();
    ops::scaled_matmul(qa, qb, false, false, 1.0f / (sa * sb), Tensor(), DType::kBFloat16, c);
    const double s = since(t);
    best = std::min(best, s);
    spent += s;
  }
  return 2.0 * static_cast<double>(n) * n * n / best / 1e9;
}

// Each size's matrices (A and B in float32 and the timed dtype, and C: five n x n float32 at most) must fit in
// the memory available, checked for every size before the first is timed.
void check_gemm_sizes_fit(const std::vector<int64_t>& sizes) {
  const int64_t available = default_memory_budget();
  for (int64_t n : sizes) {
    const double need = 5.0 * static_cast<double>(n) * static_cast<double>(n) * 4;
    if (need > static_cast<double>(available))
      MIXTRAIN_FAIL(kInvalidInput,
                    "bench gemm --sizes " << n << ": its matrices need " << format_bytes(need) << ", more than the "
                                          << format_bytes(static_cast<double>(available))
                                          << " available (80% of the memory free now)",
                    "give smaller --sizes");
  }
}

// bench gemm on a GPU: the same table, each product through ops::matmul (the CUDA backend's cuBLASLt kernel),
// timed between device synchronizations (ops::time_matmul).
int bench_gemm_gpu(const Args& a, const Device& device) {
  // Large enough that a GPU's launch cost is small beside the product; 512 takes microseconds on a recent one.
  const std::vector<int64_t> sizes = a.int_list("sizes", {1024, 4096, 8192});
  const double seconds = a.number("seconds", 1.0);
  MIXTRAIN_CHECK(seconds > 0, "--seconds must be positive");
  const std::string problem = ops::gemm_device_problem(device);
  if (!problem.empty())
    MIXTRAIN_FAIL(kInvalidInput, "bench gemm --device " << device.str() << ": no GPU GEMM here: " << problem,
                  "--device cpu (the default) runs on the CPU; --device cuda needs a build with the CUDA backend "
                  "(-DMIXTRAIN_CUDA=ON where nvcc is found) and an NVIDIA GPU with its driver");
  const ops::CudaBackendStatus status = ops::load_cuda_backend();
  const std::string gpu = status.devices.at(static_cast<size_t>(device.index));
  std::printf("GEMM (n x n x n) on %s, %s, best of repeated runs over %.1f s per case\n", device.str().c_str(),
              gpu.c_str(), seconds);
  std::printf("methods: ops::matmul on the CUDA backend, cuBLASLt, float32 accumulation (float32 inputs %s); "
              "batches of back-to-back products between device synchronizations\n",
              ops::gemm_method(device, DType::kFloat32) == "cublaslt tf32" ? "on TF32 tensor cores"
                                                                          : "in float32, TF32 off");
  std::printf("%6s  %-9s %10s %11s  %s\n", "n", "dtype", "GFLOP/s", "vs float32", "method");
  Json rows = Json::array();
  // Whether cuBLASLt served every product: a declined plan costs a float32 scratch pass, a fallback product the
  // backend's own slow kernel instead of the tensor cores (scripts/gpu-check.sh fails on any at these shapes).
  const ops::CudaGemmCounts all_before = ops::cuda_gemm_counts();
  for (int64_t n : sizes) {
    double f32 = 0;
    for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      ops::GemmTiming t;
      const ops::CudaGemmCounts before = ops::cuda_gemm_counts();
      try {
        t = ops::time_matmul(device, d, n, seconds);
      } catch (const Error& e) {
        // A GPU without a dtype's tensor cores (bfloat16 before compute capability 8.0): a row that says so.
        if (d == DType::kFloat32) throw;
        const std::string why = "unavailable: " + e.message();
        std::printf("%6lld  %-9s %10s %11s  %s\n", static_cast<long long>(n), dtype_name(d), "-", "-", why.c_str());
        rows.push_back(Json::object({{"n", n}, {"dtype", dtype_name(d)}, {"gflops", Json()},
                                     {"ratio_vs_float32", Json()}, {"method", why}}));
        continue;
      }
      if (d == DType::kFloat32) f32 = t.gflops;
      const ops::CudaGemmCounts after = ops::cuda_gemm_counts();
      const int64_t fallback = after.fallback_products - before.fallback_products;
      std::printf("%6lld  %-9s %10.1f %10.2fx  %s%s\n", static_cast<long long>(n), dtype_name(d), t.gflops,
                  t.gflops / f32, t.method.c_str(), fallback > 0 ? " (FALLBACK KERNEL)" : "");
      rows.push_back(Json::object({{"n", n},
                                   {"dtype", dtype_name(d)},
                                   {"gflops", t.gflops},
                                   {"ratio_vs_float32", t.gflops / f32},
                                   {"method", t.method},
                                   {"batches", t.batches},
                                   {"per_batch", t.per_batch},
                                   {"gemm_declined_plans", after.declined_plans - before.declined_plans},
                                   {"gemm_fallback_products", fallback}}));
    }
  }
  const ops::CudaGemmCounts all_after = ops::cuda_gemm_counts();
  const int64_t declined = all_after.declined_plans - all_before.declined_plans;
  const int64_t fallback = all_after.fallback_products - all_before.fallback_products;
  std::printf("GPU GEMM: %lld plans declined by cuBLASLt, %lld products on the fallback kernel\n",
              static_cast<long long>(declined), static_cast<long long>(fallback));
  const std::string json_path = a.path("json");
  if (!json_path.empty()) {
    write_file_atomically(json_path, Json::object({{"device", device.str()},
                                                   {"gpu", gpu},
                                                   {"cuda_backend", status.detail},
                                                   {"gemm_declined_plans", declined},
                                                   {"gemm_fallback_products", fallback},
                                                   {"gemm", rows}})
                                         .dump(2) +
                                         "\n");
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}

int bench_gemm(const std::vector<std::string>& argv) {
  Args a(argv, {"sizes", "seconds", "json", "device"}, {"float8"});
  const Device device = device_flag(a);
  MIXTRAIN_CHECK(!a.has("float8") || device.is_cpu(),
                 "bench gemm --float8 times the CPU's FP8 GEMM; the float8 policies do not run on " << device.str());
  if (!device.is_cpu()) return bench_gemm_gpu(a, device);
  const bool float8 = a.has("float8");
  const std::vector<int64_t> sizes = a.int_list("sizes", {512, 1024, 2048});
  const double seconds = a.number("seconds", 1.0);
  MIXTRAIN_CHECK(seconds > 0, "--seconds must be positive");
  check_gemm_sizes_fit(sizes);
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
    // --float8: the FP8 operands, widened to bfloat16 and multiplied on the bfloat16 GEMM with scales.
    for (DType d : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      if (!float8) break;
      const double g = fp8_gemm_gflops(d, n, seconds);
      const std::string method = std::string(kernels::gemm_bf16_method()) + " scaled";
      std::printf("%6lld  %-9s %10.1f %10.2fx  %s\n", static_cast<long long>(n), dtype_name(d), g, g / f32,
                  method.c_str());
      rows.push_back(Json::object(
          {{"n", n}, {"dtype", dtype_name(d)}, {"gflops", g}, {"ratio_vs_float32", g / f32}, {"method", method}}));
    }
  }
  const std::string json_path = a.path("json");
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

// The batch one bench step trains on, and how the report names the model.
struct StepBatch {
  Tensor x, y;
  std::string description;  // e.g. "mlp 784-4096-4096-10"
  int64_t tokens = 0;       // tokens per step (sequence models; 0 otherwise)
};

// Random 28x28 images in [0, 1) as Fashion-MNIST's, and one label of 10 per image.
StepBatch image_batch(const RunConfig& cfg, const Model& model, int64_t inputs, int64_t classes) {
  Rng r(cfg.seed);
  Tensor x = Tensor::empty({cfg.batch_size, inputs}, DType::kFloat32);  // (B, 784)
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = r.uniform();
  std::vector<int32_t> labels(static_cast<size_t>(cfg.batch_size));
  for (auto& l : labels) l = static_cast<int32_t>(r.below(static_cast<uint64_t>(classes)));
  StepBatch b;
  // The batch as fit() feeds it: already in the first layer's compute dtype.
  b.x = x.to(model.layers().front()->compute_dtype());
  b.y = Tensor::from_ints({cfg.batch_size}, labels);  // (B,)
  return b;
}

// B windows of T ids cut from one random stream of ids in [0, V), each labelled with the id that follows every
// position, as fit() draws windows from a text. Random ids cost the same as text: nothing in a step depends on
// the values.
StepBatch token_batch(const RunConfig& cfg, int64_t vocabulary) {
  const int64_t B = cfg.batch_size, T = cfg.context_length;
  Rng r(cfg.seed);
  std::vector<int32_t> stream(static_cast<size_t>(B * T + 1));
  for (auto& id : stream) id = static_cast<int32_t>(r.below(static_cast<uint64_t>(vocabulary)));
  StepBatch b;
  b.x = Tensor::from_ints({B, T}, std::vector<int32_t>(stream.begin(), stream.end() - 1));  // (B, T)
  b.y = Tensor::from_ints({B, T}, std::vector<int32_t>(stream.begin() + 1, stream.end()));  // (B, T)
  b.tokens = B * T;
  return b;
}

// bench step's flags, parsed once: the run it times, with the peer comparison's shapes where the flags give none.
struct StepOptions {
  RunConfig run;
  bool transformer = false;
  int64_t steps = 10;       // --steps: the timed steps
  int64_t vocabulary = 0;   // --vocabulary: the transformer's (0 for the other models)
  std::string json_path;    // --json
  bool memory_plan = false; // --memory-plan: the plan before the steps, the measurement beside it after
  std::optional<int64_t> memory_budget;  // --memory-budget (with --memory-plan): a plan over it is refused
};
constexpr int64_t kWarmupSteps = 2;  // untimed: optimizer slots, caches

StepOptions step_options_from(const std::vector<std::string>& argv) {
  Args a(argv, {"model", "hidden", "batch-size", "policy", "steps", "json", "optimizer", "seed", "context", "width",
                "layers", "heads", "vocabulary", "device", "accumulate", "master-rounding", "fp8-recipe",
                "optimizer-state", "attention", "fused-loss", "zero", "remat", "grad-comm", "memory-budget"},
         {"memory-plan"});
  StepOptions o;
  RunConfig& cfg = o.run;
  cfg.device = usable_device_flag(a, "bench step");
  cfg.model = a.str("model", "mlp");
  o.transformer = cfg.model == "transformer";
  if (o.transformer) {
    MIXTRAIN_CHECK(!a.has("hidden"), "--hidden does not apply to --model transformer (its MLP is 4 x --width)");
  } else {
    for (const char* f : {"context", "width", "layers", "heads", "vocabulary", "attention", "fused-loss"})
      MIXTRAIN_CHECK(!a.has(f), "--" << f << " applies to --model transformer only");
  }
  // The wide MLP of the peer comparison; a convolutional model's dense head stays small.
  cfg.hidden = a.int_list("hidden", cfg.model == "mlp" ? std::vector<int64_t>{4096, 4096} : std::vector<int64_t>{128});
  cfg.policy = a.str("policy", "float32");
  cfg.fp8_recipe = a.str("fp8-recipe", cfg.fp8_recipe);
  cfg.seed = static_cast<uint64_t>(a.integer("seed", 1));
  o.steps = a.integer("steps", 10);
  MIXTRAIN_CHECK(o.steps > 0, "--steps must be a positive integer, got " << o.steps);
  if (o.transformer) {
    // `mixtrain train --model transformer`'s recipe (tools/cli/run_options.cpp): AdamW at 2e-3 with weight
    // decay 0.01, clipping at global norm 1, a cosine schedule after a warm-up of a tenth of the steps (at
    // most 100), batches of 32 windows; the shapes of its defaults on Moby Dick (83 characters).
    cfg.optimizer = a.str("optimizer", "adamw");
    cfg.batch_size = a.integer("batch-size", 32);
    cfg.learning_rate = 2e-3f;
    cfg.weight_decay = 0.01f;
    cfg.clipnorm = 1.0f;
    cfg.lr_schedule = "cosine";
    cfg.warmup_steps = std::min<int64_t>(100, (o.steps + kWarmupSteps) / 10);
    // Written out rather than taken from RunConfig's defaults, so the benchmark's shapes stay put.
    cfg.context_length = a.integer("context", 64);
    cfg.width = a.integer("width", 128);
    cfg.num_layers = a.integer("layers", 2);
    cfg.num_heads = a.integer("heads", 4);
    o.vocabulary = a.integer("vocabulary", 83, 2, 1 << 24);
    cfg.attention = a.str("attention", "tiled");
    cfg.fused_loss = a.on_off("fused-loss", true);
  } else {
    cfg.optimizer = a.str("optimizer", "adam");
    cfg.batch_size = a.integer("batch-size", 256);
  }
  cfg.remat = a.str("remat", "none");
  // --accumulate N: each timed step is one update of the batch as N micro-batches.
  cfg.gradient_accumulation_steps = a.integer("accumulate", 1);
  cfg.master_rounding = a.str("master-rounding", "nearest");
  cfg.optimizer_state = a.str("optimizer-state", "float32");
  cfg.zero_stage = static_cast<int>(a.integer("zero", 0));  // under mpirun: the optimizer state split over the ranks
  cfg.grad_comm = a.str("grad-comm", "float32");             // under mpirun: the gradients' dtype between the ranks
  validate_run_config(cfg);
  o.json_path = a.path("json");
  o.memory_plan = a.has("memory-plan");
  if (a.has("memory-budget")) {
    MIXTRAIN_CHECK(o.memory_plan, "--memory-budget needs --memory-plan (bench step refuses a run whose plan exceeds it)");
    o.memory_budget = parse_memory_size(a.str("memory-budget", ""), "--memory-budget");
  }
  return o;
}

constexpr int64_t kInputs = 784, kClasses = 10;  // the Fashion-MNIST shapes

// The model bench step times, compiled with the optimizer training builds (weight decay, clipping, schedule over
// every step this command runs).
std::unique_ptr<Model> build_step_model(const StepOptions& o) {
  const RunConfig& cfg = o.run;
  set_precision_warning_sink([](const std::string&) {});
  auto model = o.transformer ? build_model(cfg, cfg.context_length, o.vocabulary, {cfg.context_length})
                             : build_model(cfg, kInputs, kClasses);
  set_precision_warning_sink(nullptr);
  model->compile(make_run_optimizer(cfg, o.steps + kWarmupSteps), Loss("sparse_categorical_crossentropy", true));
  return model;
}

// The batch, and the model's name in the report (e.g. "mlp 784-4096-4096-10").
StepBatch step_batch(const StepOptions& o, const Model& model, int64_t weights) {
  const RunConfig& cfg = o.run;
  StepBatch batch = o.transformer ? token_batch(cfg, o.vocabulary) : image_batch(cfg, model, kInputs, kClasses);
  if (o.transformer) {
    batch.description = "transformer (V " + std::to_string(o.vocabulary) + ", T " + std::to_string(cfg.context_length) +
                        ", D " + std::to_string(cfg.width) + ", L " + std::to_string(cfg.num_layers) + ", heads " +
                        std::to_string(cfg.num_heads) + ", " + std::to_string(weights) + " weights)";
  } else if (cfg.model == "mlp") {
    batch.description = "mlp 784-";
    for (int64_t h : cfg.hidden) batch.description += std::to_string(h) + "-";
    batch.description += "10";
  } else {
    batch.description = cfg.model + " (28x28x1 images, " + std::to_string(weights) + " weights)";
  }
  return batch;
}

// What the timed steps measured.
struct StepTiming {
  double median = 0;             // seconds per step
  int64_t step_peak_bytes = 0;   // beyond what the model, its optimizer state and the batch hold between steps
  int64_t held_bytes = 0;        // what they hold between steps (allocator's live bytes after the warm-up)
  int64_t declined_plans = 0;    // GPU: cuBLASLt plans declined (warm-up and timed steps)
  int64_t fallback_products = 0; // GPU: products on the fallback kernel
  double comm_share = 0;         // data-parallel: time inside collectives over the timed steps' time
  int64_t comm_bytes = 0;        // data-parallel: bytes all-reduced per step per rank
};

// Data-parallel (job not null): --batch-size is the global batch, each rank steps on its shard of it and
// all-reduces the gradients.
StepTiming time_steps(const StepOptions& o, Model& model, const StepBatch& batch, Communicator* job) {
  const RunConfig& cfg = o.run;
  const ShardRange shard = job ? shard_range(cfg.batch_size, job->rank(), job->size()) : ShardRange{0, cfg.batch_size};
  // On a GPU the batch is copied there once, as a data loader that prefetches would have it: the steps time the
  // GPU's work. Each step reads its logs back, so its time covers that work.
  model.to(cfg.device);
  const Tensor xs = ops::to_device(batch.x.slice_rows(shard.begin, shard.end), cfg.device),
               ys = ops::to_device(batch.y.slice_rows(shard.begin, shard.end), cfg.device);
  // --zero 1: the optimizer's slots split over the ranks, the gradients reduce-scattered (distributed/zero.h).
  if (job && cfg.zero_stage == 1) model.optimizer().inner_optimizer().set_shard_group(shard_group(*job));
  if (job) model.set_gradient_comm_dtype(cfg.grad_comm == "bfloat16" ? DType::kBFloat16 : DType::kFloat32);
  const ops::CudaGemmCounts gemm_before = ops::cuda_gemm_counts();  // the warm-up makes the GEMM plans
  for (int64_t i = 0; i < kWarmupSteps; ++i) model.train_step(xs, ys, job, cfg.batch_size);
  const int64_t live_before = memory_stats(cfg.device).live_bytes;
  reset_peak_memory(cfg.device);
  if (job) {
    job->barrier();
    job->reset_stats();  // count the timed steps' communication only
  }
  std::vector<double> times;
  for (int64_t s = 0; s < o.steps; ++s) {
    const auto t = Clock::now();
    model.train_step(xs, ys, job, cfg.batch_size);
    times.push_back(since(t));
  }
  StepTiming r;
  r.step_peak_bytes = memory_stats(cfg.device).peak_bytes - live_before;
  r.held_bytes = live_before;
  const ops::CudaGemmCounts gemm_after = ops::cuda_gemm_counts();
  r.declined_plans = gemm_after.declined_plans - gemm_before.declined_plans;
  r.fallback_products = gemm_after.fallback_products - gemm_before.fallback_products;
  double total = 0;
  for (double t : times) total += t;
  // The transfer, and waiting for the slowest rank.
  r.comm_share = job && total > 0 ? job->stats().seconds / total : 0.0;
  r.comm_bytes = job ? job->stats().bytes / o.steps : 0;
  std::sort(times.begin(), times.end());
  r.median = times[times.size() / 2];
  return r;
}

// MLP: forward 2 flops per weight per row, backward 4 (input and weight gradients). A convolution reuses its
// weights across positions and attention has products without weights, so no such count is given for the other
// models (0).
double step_gflops(const RunConfig& cfg, int64_t weights, double median) {
  if (cfg.model != "mlp") return 0.0;
  return 6.0 * static_cast<double>(cfg.batch_size) * static_cast<double>(weights) / median / 1e9;
}

void print_step(const StepOptions& o, const StepBatch& batch, int64_t weights, const StepTiming& t,
                const Communicator* job) {
  const RunConfig& cfg = o.run;
  const std::string where = cfg.device.is_cpu() ? std::string("isa ") + kernels::gemm_isa() : cfg.device.str();
  const std::string micro = cfg.gradient_accumulation_steps > 1
                                ? " in " + std::to_string(cfg.gradient_accumulation_steps) + " micro-batches"
                                : std::string();
  std::printf("bench step: %s, batch %lld%s, %s, %s, %s: %.2f ms/step (median of %lld), %.1f steps/s",
              batch.description.c_str(), static_cast<long long>(cfg.batch_size), micro.c_str(), cfg.policy.c_str(),
              cfg.optimizer.c_str(), where.c_str(), t.median * 1e3, static_cast<long long>(o.steps), 1.0 / t.median);
  if (cfg.model == "mlp") std::printf(", %.1f GFLOP/s", step_gflops(cfg, weights, t.median));
  if (o.transformer) std::printf(", %.0f tokens/s", static_cast<double>(batch.tokens) / t.median);
  std::printf(", %.0f samples/s\n", static_cast<double>(cfg.batch_size) / t.median);
  // Whether cuBLASLt served every product in place: a declined plan costs a scratch pass (or ReLU as a kernel of its
  // own after the product), a fallback product much more (the backend's own kernel instead of the tensor cores).
  if (cfg.device.type == DeviceType::kCuda)
    std::printf("GPU GEMM: %lld plans declined by cuBLASLt, %lld products on the fallback kernel (warm-up and timed "
                "steps)\n",
                static_cast<long long>(t.declined_plans), static_cast<long long>(t.fallback_products));
  // A device communicator's collectives are queued on the GPU: the host's share is their queueing only, and their
  // time on the GPU is inside the step's.
  const bool queued_on_device = job && job->moves_memory_of(cfg.device);
  std::printf("memory%s: %.1f MiB held between steps (model, gradients, optimizer state, batch), %.1f MiB more at "
              "the peak of a step\n",
              job ? " (rank 0)" : "", static_cast<double>(t.held_bytes) / (1 << 20),
              static_cast<double>(t.step_peak_bytes) / (1 << 20));
  if (job)
    std::printf("data-parallel: %d ranks (%s)%s%s, %.1f%% of step time %s (rank 0), %.2f MiB all-reduced per step "
                "per rank\n",
                job->size(), job->backend().c_str(), cfg.zero_stage == 1 ? ", ZeRO-1" : "",
                cfg.grad_comm == "bfloat16" ? ", bfloat16 gradients" : "", 100.0 * t.comm_share,
                queued_on_device ? "queueing collectives on the GPU" : "in communication",
                static_cast<double>(t.comm_bytes) / (1 << 20));
}

Json step_json(const StepOptions& o, const StepBatch& batch, int64_t weights, const StepTiming& t,
               const Communicator* job) {
  const RunConfig& cfg = o.run;
  Json j = Json::object({{"ms_per_step", t.median * 1e3},
                         {"steps_per_second", 1.0 / t.median},
                         {"gflops", step_gflops(cfg, weights, t.median)},
                         {"policy", cfg.policy},
                         {"model", cfg.model},
                         {"optimizer", cfg.optimizer},
                         {"batch_size", cfg.batch_size},
                         {"gradient_accumulation_steps", cfg.gradient_accumulation_steps},
                         {"steps", o.steps},
                         {"weights", weights},
                         {"isa", kernels::gemm_isa()},
                         {"device", cfg.device.str()},
                         {"step_peak_memory_bytes", static_cast<double>(t.step_peak_bytes)},
                         {"held_memory_bytes", static_cast<double>(t.held_bytes)},
                         {"zero_stage", cfg.zero_stage},
                         {"grad_comm", cfg.grad_comm},
                         {"samples_per_second", static_cast<double>(cfg.batch_size) / t.median},
                         {"ranks", job ? job->size() : 1},
                         {"communicator", job ? job->backend() : std::string("none")},
                         {"communication_share", t.comm_share},
                         {"communication_bytes_per_step_per_rank", static_cast<double>(t.comm_bytes)}});
  if (cfg.device.type == DeviceType::kCuda) {
    j["gemm_declined_plans"] = t.declined_plans;
    j["gemm_fallback_products"] = t.fallback_products;
  }
  if (o.transformer) {
    j["tokens_per_second"] = static_cast<double>(batch.tokens) / t.median;
    j["vocabulary"] = o.vocabulary;
    j["fused_loss"] = cfg.fused_loss;
    j["context"] = cfg.context_length;
    j["width"] = cfg.width;
    j["layers"] = cfg.num_layers;
    j["heads"] = cfg.num_heads;
    j["attention"] = cfg.attention;
  }
  if (o.transformer || cfg.model == "resnet") {
    j["remat"] = cfg.remat;
  }
  return j;
}

// The plan for the steps bench step times: this rank's rows, no validation.
MemoryPlan step_memory_plan(const StepOptions& o, const Communicator* job) {
  const RunConfig& cfg = o.run;
  const int64_t rows = job ? cfg.batch_size / job->size() : cfg.batch_size;
  const int ranks = job ? job->size() : 1;
  return o.transformer ? plan_training_memory(cfg, cfg.context_length, o.vocabulary, rows,
                                              StepSamples{{cfg.context_length}, true}, 0, ranks)
                       : plan_training_memory(cfg, kInputs, kClasses, rows, {}, 0, ranks);
}

int bench_step(const std::vector<std::string>& argv) {
  const StepOptions o = step_options_from(argv);
  const int64_t live_at_start = memory_stats(o.run.device).live_bytes;
  std::optional<MemoryPlan> plan;
  if (o.memory_plan) {
    plan = step_memory_plan(o, data_parallel_job_on(o.run.device));
    if (writes_outputs()) std::printf("%s", memory_plan_text(*plan).c_str());
    if (o.memory_budget) check_plan_within_budget(*plan, *o.memory_budget, "--memory-budget");
  }
  std::unique_ptr<Model> model = build_step_model(o);
  int64_t weights = 0;
  for (const Var& w : model->trainable_weights()) weights += w.value().numel();
  const StepBatch batch = step_batch(o, *model, weights);
  // Data-parallel (mpirun -np N): every rank starts from rank 0's weights.
  Communicator* job = data_parallel_job_on(o.run.device);
  check_global_batch(o.run, job);
  if (job) broadcast_variables(model->weights(), *job);
  const StepTiming t = time_steps(o, *model, batch, job);
  print_step(o, batch, weights, t, job);
  // Measured as the plan counts: what the model, its state and the batch hold between steps, and a step's peak.
  const int64_t measured = t.held_bytes - live_at_start + t.step_peak_bytes;
  if (plan && writes_outputs()) std::printf("%s", memory_measured_text(*plan, measured).c_str());
  if (!o.json_path.empty()) {
    Json report = step_json(o, batch, weights, t, job);
    if (plan) report["memory_plan"] = memory_plan_json(*plan, measured);
    if (writes_outputs()) write_file_atomically(o.json_path, report.dump(2) + "\n");
    std::printf("wrote %s\n", o.json_path.c_str());
  }
  return 0;
}
}  // namespace

int bench_command(const std::vector<std::string>& argv) {
  const std::string what = argv.empty() ? "" : argv[0];
  const std::vector<std::string> rest(argv.begin() + (argv.empty() ? 0 : 1), argv.end());
  if (is_help(what)) throw HelpRequested{};
  if (what == "gemm") return bench_gemm(rest);
  if (what == "step") return bench_step(rest);
  MIXTRAIN_FAIL(kInvalidInput, "bench needs a target, got '" << what << "'", "use `mixtrain bench gemm` or `mixtrain bench step`");
}

}  // namespace mixtrain::cli
