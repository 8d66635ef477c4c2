// fma_peak: this machine's multiply-add ceiling per dtype, measured, so a GEMM can be stated as a share of it.
//
// Each case is one instruction in a tight loop over 16 independent zmm accumulators (enough to cover the
// latency of every x86 FMA unit we know of), run on 1 and on T threads (default 2), best of several runs:
//   float32   vfmadd231ps zmm   16 lanes x 2 flops = 32 flops per instruction      (AVX512F)
//   bfloat16  vdpbf16ps zmm     32 bf16 products + 32 adds = 64 flops, fp32 accumulate (AVX512_BF16)
//   float16   vfmadd231ph zmm   32 lanes x 2 flops = 64 flops, fp16 accumulate     (AVX512_FP16)
// A case whose instruction set this CPU lacks prints "available": false and is not run.
//
// Built standalone: g++ -std=c++20 -O2 -pthread fma_peak.cpp. The ISA-specific loops carry their own target
// attributes and run only after a CPUID check, so the rest of the program runs on any x86-64.
// Output: one JSON object per line.
//   fma_peak [--threads T] [--seconds S]
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Each loop returns a value derived from every accumulator so none of the work can be dropped.
// Each is acc += a * b (the 231 form), with values that keep every accumulator normal and finite: once acc is
// large enough the product is lost to rounding, which costs nothing.

__attribute__((target("avx512f"))) float loop_f32(int64_t iters) {
  const __m512 a = _mm512_set1_ps(0.5f), b = _mm512_set1_ps(1.0f);
  // Distinct starting values: identical accumulators would let the compiler merge them into one.
  __m512 c0 = _mm512_set1_ps(0.f), c1 = _mm512_set1_ps(1.f), c2 = _mm512_set1_ps(2.f), c3 = _mm512_set1_ps(3.f);
  __m512 c4 = _mm512_set1_ps(4.f), c5 = _mm512_set1_ps(5.f), c6 = _mm512_set1_ps(6.f), c7 = _mm512_set1_ps(7.f);
  __m512 c8 = _mm512_set1_ps(8.f), c9 = _mm512_set1_ps(9.f), c10 = _mm512_set1_ps(10.f), c11 = _mm512_set1_ps(11.f);
  __m512 c12 = _mm512_set1_ps(12.f), c13 = _mm512_set1_ps(13.f), c14 = _mm512_set1_ps(14.f), c15 = _mm512_set1_ps(15.f);
  for (int64_t i = 0; i < iters; ++i) {
    c0 = _mm512_fmadd_ps(a, b, c0);
    c1 = _mm512_fmadd_ps(a, b, c1);
    c2 = _mm512_fmadd_ps(a, b, c2);
    c3 = _mm512_fmadd_ps(a, b, c3);
    c4 = _mm512_fmadd_ps(a, b, c4);
    c5 = _mm512_fmadd_ps(a, b, c5);
    c6 = _mm512_fmadd_ps(a, b, c6);
    c7 = _mm512_fmadd_ps(a, b, c7);
    c8 = _mm512_fmadd_ps(a, b, c8);
    c9 = _mm512_fmadd_ps(a, b, c9);
    c10 = _mm512_fmadd_ps(a, b, c10);
    c11 = _mm512_fmadd_ps(a, b, c11);
    c12 = _mm512_fmadd_ps(a, b, c12);
    c13 = _mm512_fmadd_ps(a, b, c13);
    c14 = _mm512_fmadd_ps(a, b, c14);
    c15 = _mm512_fmadd_ps(a, b, c15);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                           _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)),
                                     _mm512_add_ps(_mm512_add_ps(c12, c13), _mm512_add_ps(c14, c15))));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float sum = 0.f;
  for (float v : lanes) sum += v;
  return sum;
}

// acc += sum of pairs of bf16 products; with tiny products the fp32 accumulators grow slowly and stay normal.
__attribute__((target("avx512f,avx512bf16"))) float loop_bf16(int64_t iters) {
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.001f), _mm512_set1_ps(0.001f));
  const __m512bh b = a;
  __m512 c0 = _mm512_set1_ps(0.f), c1 = _mm512_set1_ps(1.f), c2 = _mm512_set1_ps(2.f), c3 = _mm512_set1_ps(3.f);
  __m512 c4 = _mm512_set1_ps(4.f), c5 = _mm512_set1_ps(5.f), c6 = _mm512_set1_ps(6.f), c7 = _mm512_set1_ps(7.f);
  __m512 c8 = _mm512_set1_ps(8.f), c9 = _mm512_set1_ps(9.f), c10 = _mm512_set1_ps(10.f), c11 = _mm512_set1_ps(11.f);
  __m512 c12 = _mm512_set1_ps(12.f), c13 = _mm512_set1_ps(13.f), c14 = _mm512_set1_ps(14.f), c15 = _mm512_set1_ps(15.f);
  for (int64_t i = 0; i < iters; ++i) {
    c0 = _mm512_dpbf16_ps(c0, a, b);
    c1 = _mm512_dpbf16_ps(c1, a, b);
    c2 = _mm512_dpbf16_ps(c2, a, b);
    c3 = _mm512_dpbf16_ps(c3, a, b);
    c4 = _mm512_dpbf16_ps(c4, a, b);
    c5 = _mm512_dpbf16_ps(c5, a, b);
    c6 = _mm512_dpbf16_ps(c6, a, b);
    c7 = _mm512_dpbf16_ps(c7, a, b);
    c8 = _mm512_dpbf16_ps(c8, a, b);
    c9 = _mm512_dpbf16_ps(c9, a, b);
    c10 = _mm512_dpbf16_ps(c10, a, b);
    c11 = _mm512_dpbf16_ps(c11, a, b);
    c12 = _mm512_dpbf16_ps(c12, a, b);
    c13 = _mm512_dpbf16_ps(c13, a, b);
    c14 = _mm512_dpbf16_ps(c14, a, b);
    c15 = _mm512_dpbf16_ps(c15, a, b);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                           _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)),
                                     _mm512_add_ps(_mm512_add_ps(c12, c13), _mm512_add_ps(c14, c15))));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float sum = 0.f;
  for (float v : lanes) sum += v;
  return sum;
}

// vfmadd231ph through inline assembly: the assembler takes it whatever the compiler's target, and the
// instruction is exactly the one named. acc += 0.5 * 1 in float16.
__attribute__((target("avx512f"))) float loop_f16(int64_t iters) {
  const uint16_t half = 0x3800, one = 0x3C00;  // 0.5 and 1.0 in IEEE binary16
  const uint32_t half2 = half | (uint32_t{half} << 16), one2 = one | (uint32_t{one} << 16);
  alignas(64) uint32_t av[16], bv[16], out[16];
  for (int i = 0; i < 16; ++i) av[i] = half2, bv[i] = one2;
  asm volatile(
      "vmovdqu32 (%[a]), %%zmm16\n\t"
      "vmovdqu32 (%[b]), %%zmm17\n\t"
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
      "vmovdqa64 %%zmm0, %%zmm1\n\t vmovdqa64 %%zmm0, %%zmm2\n\t vmovdqa64 %%zmm0, %%zmm3\n\t"
      "vmovdqa64 %%zmm0, %%zmm4\n\t vmovdqa64 %%zmm0, %%zmm5\n\t vmovdqa64 %%zmm0, %%zmm6\n\t"
      "vmovdqa64 %%zmm0, %%zmm7\n\t vmovdqa64 %%zmm0, %%zmm8\n\t vmovdqa64 %%zmm0, %%zmm9\n\t"
      "vmovdqa64 %%zmm0, %%zmm10\n\t vmovdqa64 %%zmm0, %%zmm11\n\t vmovdqa64 %%zmm0, %%zmm12\n\t"
      "vmovdqa64 %%zmm0, %%zmm13\n\t vmovdqa64 %%zmm0, %%zmm14\n\t vmovdqa64 %%zmm0, %%zmm15\n\t"
      "test %[n], %[n]\n\t"
      "jle 2f\n\t"
      "1:\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm0\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm1\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm2\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm3\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm4\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm5\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm6\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm7\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm8\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm9\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm10\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm11\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm12\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm13\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm14\n\t"
      "vfmadd231ph %%zmm17, %%zmm16, %%zmm15\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      "vaddph %%zmm1, %%zmm0, %%zmm0\n\t vaddph %%zmm3, %%zmm2, %%zmm2\n\t vaddph %%zmm5, %%zmm4, %%zmm4\n\t"
      "vaddph %%zmm7, %%zmm6, %%zmm6\n\t vaddph %%zmm9, %%zmm8, %%zmm8\n\t vaddph %%zmm11, %%zmm10, %%zmm10\n\t"
      "vaddph %%zmm13, %%zmm12, %%zmm12\n\t vaddph %%zmm15, %%zmm14, %%zmm14\n\t"
      "vaddph %%zmm2, %%zmm0, %%zmm0\n\t vaddph %%zmm6, %%zmm4, %%zmm4\n\t vaddph %%zmm10, %%zmm8, %%zmm8\n\t"
      "vaddph %%zmm14, %%zmm12, %%zmm12\n\t vaddph %%zmm4, %%zmm0, %%zmm0\n\t vaddph %%zmm12, %%zmm8, %%zmm8\n\t"
      "vaddph %%zmm8, %%zmm0, %%zmm0\n\t"
      "vmovdqu32 %%zmm0, (%[o])\n\t"
      "vzeroupper\n\t"
      : [n] "+r"(iters)
      : [a] "r"(av), [b] "r"(bv), [o] "r"(out)
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17");
  return static_cast<float>(out[0] & 0xFFFF);
}

struct Case {
  const char* dtype;
  const char* instruction;
  const char* needs;      // the CPUID feature(s), as /proc/cpuinfo names them
  double flops_per_iter;  // 16 instructions per loop iteration
  bool available;
  float (*loop)(int64_t);
};

std::atomic<float> g_sink{0.f};

// Seconds for `threads` threads each running `iters` iterations, started together.
double run_once(float (*loop)(int64_t), int64_t iters, int threads) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      g_sink.store(g_sink.load(std::memory_order_relaxed) + loop(iters), std::memory_order_relaxed);
    });
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = Clock::now();
  go.store(true);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Best GFLOP/s over about `seconds`, iterations sized so one run takes ~50 ms.
double measure(const Case& c, int threads, double seconds) {
  int64_t iters = 1 << 16;
  while (run_once(c.loop, iters, 1) < 0.05) iters *= 2;
  double best = 1e30;
  const auto start = Clock::now();
  int runs = 0;
  while (runs < 3 || std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    best = std::min(best, run_once(c.loop, iters, threads));
    ++runs;
  }
  return c.flops_per_iter * static_cast<double>(iters) * threads / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  double seconds = 1.0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: fma_peak [--threads T] [--seconds S]\n");
      return 2;
    }
  }
  if (threads < 1 || !(seconds > 0)) {
    std::fprintf(stderr, "fma_peak: --threads must be >= 1 and --seconds > 0\n");
    return 2;
  }
  __builtin_cpu_init();
  const bool avx512f = __builtin_cpu_supports("avx512f");
  const Case cases[] = {
      {"float32", "vfmadd231ps zmm", "avx512f", 16 * 32.0, avx512f, loop_f32},
      {"bfloat16", "vdpbf16ps zmm", "avx512_bf16", 16 * 64.0, avx512f && __builtin_cpu_supports("avx512bf16"),
       loop_bf16},
      {"float16", "vfmadd231ph zmm", "avx512_fp16", 16 * 64.0, avx512f && __builtin_cpu_supports("avx512fp16"),
       loop_f16},
  };
  for (const Case& c : cases) {
    if (!c.available) {
      std::printf("{\"what\": \"fma_peak\", \"dtype\": \"%s\", \"instruction\": \"%s\", \"available\": false, "
                  "\"reason\": \"this CPU has no %s\"}\n",
                  c.dtype, c.instruction, c.needs);
      std::fflush(stdout);
      continue;
    }
    const double one = measure(c, 1, seconds / 2);
    const double all = measure(c, threads, seconds);
    std::printf("{\"what\": \"fma_peak\", \"dtype\": \"%s\", \"instruction\": \"%s\", \"available\": true, "
                "\"gflops_1_thread\": %.1f, \"threads\": %d, \"gflops\": %.1f}\n",
                c.dtype, c.instruction, one, threads, all);
    std::fflush(stdout);
  }
  return g_sink.load() == 12345.f ? 1 : 0;  // never true; keeps the results observed
}
