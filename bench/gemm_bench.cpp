// Square GEMM throughput per input dtype (C in the same dtype, as in a mixed-precision forward pass).
// Peer in the same run: float32, and the same float32 GEMM on one thread. bfloat16 runs three ways: the
// method gemm() picks, and each method forced ("widen" to float32, "dot" with vdpbf16ps, "amx" with tiles).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// The test hook that forces a bfloat16 method (not part of the installed API).
#include "../src/kernels/gemm_internal.h"

#include "mixtrain/core/half.h"
#include "mixtrain/kernels/gemm.h"

namespace {

using mixtrain::DType;

// n*n random values in [-1, 1], rounded into dtype, as raw bytes.
std::vector<unsigned char> random_matrix(DType dtype, int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<unsigned char> bytes(static_cast<size_t>(n * n) * mixtrain::dtype_size(dtype));
  for (int64_t i = 0; i < n * n; ++i) {
    const float v = dist(rng);
    if (dtype == DType::kFloat32) {
      reinterpret_cast<float*>(bytes.data())[i] = v;
    } else {
      reinterpret_cast<uint16_t*>(bytes.data())[i] =
          dtype == DType::kFloat16 ? mixtrain::float_to_half_bits(v) : mixtrain::float_to_bf16_bits(v);
    }
  }
  return bytes;
}

// bf16_method: nullptr for gemm()'s own choice, else "dot" or "widen" forced for this benchmark.
void run_gemm(benchmark::State& state, DType dtype, int threads, const char* bf16_method = nullptr) {
  if (bf16_method != nullptr &&
      std::strcmp(mixtrain::kernels::set_gemm_bf16_method_for_testing(bf16_method), bf16_method) != 0) {
    mixtrain::kernels::set_gemm_bf16_method_for_testing(nullptr);
    state.SkipWithError("this CPU has no such bfloat16 method");
    return;
  }
  const int64_t n = state.range(0);
  const auto a = random_matrix(dtype, n, 1), b = random_matrix(dtype, n, 2);
  std::vector<unsigned char> c(static_cast<size_t>(n * n) * mixtrain::dtype_size(dtype));  // (n, n)
  const int saved = omp_get_max_threads();
  if (threads > 0) omp_set_num_threads(threads);
  for (auto _ : state) {
    mixtrain::kernels::gemm(false, false, n, n, n, dtype, a.data(), n, b.data(), n, dtype, c.data(), n, false, nullptr);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  omp_set_num_threads(saved);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2e-9 * static_cast<double>(n * n * n) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  std::string label = mixtrain::kernels::gemm_isa();
  if (dtype == DType::kBFloat16) label += std::string("/") + mixtrain::kernels::gemm_bf16_method();
  state.SetLabel(label);
  mixtrain::kernels::set_gemm_bf16_method_for_testing(nullptr);
}

void BM_gemm_f32(benchmark::State& state) { run_gemm(state, DType::kFloat32, 0); }
void BM_gemm_f16(benchmark::State& state) { run_gemm(state, DType::kFloat16, 0); }
void BM_gemm_bf16(benchmark::State& state) { run_gemm(state, DType::kBFloat16, 0); }
void BM_gemm_bf16_widen(benchmark::State& state) { run_gemm(state, DType::kBFloat16, 0, "widen"); }
void BM_gemm_bf16_dot(benchmark::State& state) { run_gemm(state, DType::kBFloat16, 0, "dot"); }
void BM_gemm_bf16_amx(benchmark::State& state) { run_gemm(state, DType::kBFloat16, 0, "amx"); }
void BM_gemm_f32_1thread(benchmark::State& state) { run_gemm(state, DType::kFloat32, 1); }

// Real time: the work runs on OpenMP threads, which the main thread's CPU time does not see.
BENCHMARK(BM_gemm_f32)->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gemm_f16)->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gemm_bf16)->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gemm_bf16_widen)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gemm_bf16_dot)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gemm_bf16_amx)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gemm_f32_1thread)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
