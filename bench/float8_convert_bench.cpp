// float8 array conversions (core/float8.h) at each instruction-set level, beside the bfloat16 conversion of the same
// array measured in the same run (the peer: the narrowing every mixed_bfloat16 step does). 1 << 20 standard normal
// values, one thread. BM_*/0 runs the scalar level, /2 the avx512 level (where the CPU has it). Report ratios.
#include <benchmark/benchmark.h>

#include <vector>

#include "mixtrain/core/float8.h"
#include "mixtrain/core/isa_level.h"
#include "mixtrain/core/random.h"
#include "mixtrain/core/tensor.h"

namespace mixtrain {
namespace {

constexpr int64_t kN = int64_t{1} << 20;

std::vector<float> normals() {
  Rng r(1);
  std::vector<float> x(kN);
  for (float& v : x) v = r.normal() * 100.0f;
  return x;
}

// Forces the level for one benchmark and puts the default back.
struct Level {
  explicit Level(int64_t level) { set_isa_level_for_testing(static_cast<IsaLevel>(level)); }
  ~Level() { set_isa_level_for_testing(std::nullopt); }
};

void BM_float8_encode_e4m3(benchmark::State& state) {
  const Level level(state.range(0));
  const std::vector<float> x = normals();
  std::vector<uint8_t> q(kN);
  for (auto _ : state) {
    float8_from_float(x.data(), q.data(), kN, false, Float8Overflow::kSaturate);
    benchmark::DoNotOptimize(q.data());
  }
  state.SetLabel(isa_level_name(isa_level()));
  state.SetItemsProcessed(state.iterations() * kN);
}

void BM_float8_decode_e4m3(benchmark::State& state) {
  const Level level(state.range(0));
  const std::vector<float> x = normals();
  std::vector<uint8_t> q(kN);
  float8_from_float(x.data(), q.data(), kN, false, Float8Overflow::kSaturate);
  std::vector<float> y(kN);
  for (auto _ : state) {
    float8_to_float(q.data(), y.data(), kN, false);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(isa_level_name(isa_level()));
  state.SetItemsProcessed(state.iterations() * kN);
}

void BM_bfloat16_encode_peer(benchmark::State& state) {
  const Level level(state.range(0));
  const std::vector<float> x = normals();
  std::vector<uint16_t> h(kN);
  for (auto _ : state) {
    convert_elements(x.data(), DType::kFloat32, h.data(), DType::kBFloat16, kN);
    benchmark::DoNotOptimize(h.data());
  }
  state.SetLabel(isa_level_name(isa_level()));
  state.SetItemsProcessed(state.iterations() * kN);
}

BENCHMARK(BM_float8_encode_e4m3)->Arg(0)->Arg(2);
BENCHMARK(BM_float8_decode_e4m3)->Arg(0)->Arg(2);
BENCHMARK(BM_bfloat16_encode_peer)->Arg(0)->Arg(2);

}  // namespace
}  // namespace mixtrain

BENCHMARK_MAIN();
