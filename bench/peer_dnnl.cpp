// peer_dnnl: oneDNN matmul GFLOP/s at the sizes `mixtrain bench gemm` measures, for a side-by-side ratio.
//
// C (n, n) = A (n, n) x B (n, n), row-major, A, B and C all in the dtype under test (as mixtrain's GEMM is
// timed); oneDNN accumulates in float32 for the 16-bit types. Best of repeated runs over about `seconds`
// per case, after one untimed run. Threads: oneDNN's OpenMP runtime, so OMP_NUM_THREADS sets them.
// A dtype this oneDNN build cannot run on this CPU prints "supported": false with oneDNN's reason.
//
// Built standalone: g++ -std=c++20 -O2 peer_dnnl.cpp -ldnnl
// Output: one JSON object per line.
//   peer_dnnl [--sizes 512,1024,2048] [--seconds S]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

const char* dtype_name(dt d) {
  switch (d) {
    case dt::f32: return "float32";
    case dt::bf16: return "bfloat16";
    case dt::f16: return "float16";
    default: return "other";
  }
}

const char* isa_name(dnnl::cpu_isa isa) {
  static const std::unordered_map<int, const char*> names = {
      {static_cast<int>(dnnl::cpu_isa::sse41), "sse41"},
      {static_cast<int>(dnnl::cpu_isa::avx), "avx"},
      {static_cast<int>(dnnl::cpu_isa::avx2), "avx2"},
      {static_cast<int>(dnnl::cpu_isa::avx2_vnni), "avx2_vnni"},
      {static_cast<int>(dnnl::cpu_isa::avx512_core), "avx512_core"},
      {static_cast<int>(dnnl::cpu_isa::avx512_core_vnni), "avx512_core_vnni"},
      {static_cast<int>(dnnl::cpu_isa::avx512_core_bf16), "avx512_core_bf16"},
      {static_cast<int>(dnnl::cpu_isa::avx512_core_amx), "avx512_core_amx"},
  };
  const auto it = names.find(static_cast<int>(isa));
  return it == names.end() ? "other" : it->second;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

// Fills a memory object in any dtype by writing float32 values through a reorder.
void fill_random(dnnl::engine& eng, dnnl::stream& strm, dnnl::memory& dst, int64_t n, unsigned seed) {
  std::vector<float> values(static_cast<size_t>(n * n));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (float& v : values) v = u(rng);
  dnnl::memory src({{n, n}, dt::f32, tag::ab}, eng, values.data());
  dnnl::reorder(src, dst).execute(strm, src, dst);
  strm.wait();
}

void run_case(dnnl::engine& eng, dnnl::stream& strm, dt d, int64_t n, double seconds) {
  const dnnl::memory::desc md({n, n}, d, tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(md, md, md), eng);
  } catch (const dnnl::error& e) {
    std::printf("{\"what\": \"peer_dnnl\", \"n\": %lld, \"dtype\": \"%s\", \"supported\": false, \"reason\": \"%s\"}\n",
                static_cast<long long>(n), dtype_name(d), json_escape(e.what()).c_str());
    std::fflush(stdout);
    return;
  }
  dnnl::memory a(md, eng), b(md, eng), c(md, eng);
  fill_random(eng, strm, a, n, 1);
  fill_random(eng, strm, b, n, 2);
  dnnl::matmul mm(pd);
  const std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  mm.execute(strm, args);  // untimed: first-touch pages, JIT caches
  strm.wait();
  double best = 1e30;
  int runs = 0;
  const auto start = Clock::now();
  while (runs < 2 || (since(start) < seconds && runs < 1000)) {
    const auto t = Clock::now();
    mm.execute(strm, args);
    strm.wait();
    best = std::min(best, since(t));
    ++runs;
  }
  const double gflops = 2.0 * static_cast<double>(n) * n * n / best / 1e9;
  std::printf("{\"what\": \"peer_dnnl\", \"n\": %lld, \"dtype\": \"%s\", \"supported\": true, \"gflops\": %.2f, "
              "\"runs\": %d, \"impl\": \"%s\"}\n",
              static_cast<long long>(n), dtype_name(d), gflops, runs, json_escape(pd.impl_info_str()).c_str());
  std::fflush(stdout);
}

std::vector<int64_t> parse_sizes(const std::string& list) {
  std::vector<int64_t> sizes;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || v <= 0) return {};
    sizes.push_back(v);
  }
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {512, 1024, 2048};
  double seconds = 1.0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--sizes" && i + 1 < argc) {
      sizes = parse_sizes(argv[++i]);
    } else if (arg == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: peer_dnnl [--sizes 512,1024,2048] [--seconds S]\n");
      return 2;
    }
  }
  if (sizes.empty() || !(seconds > 0)) {
    std::fprintf(stderr, "peer_dnnl: --sizes needs positive integers separated by commas, --seconds > 0\n");
    return 2;
  }
  const dnnl_version_t* v = dnnl_version();
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::printf("{\"what\": \"peer_dnnl_info\", \"version\": \"%d.%d.%d\", \"isa\": \"%s\", \"omp_num_threads\": \"%s\"}\n",
              v->major, v->minor, v->patch, isa_name(dnnl::get_effective_cpu_isa()), omp ? omp : "unset");
  std::fflush(stdout);
  try {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    for (int64_t n : sizes)
      for (dt d : {dt::f32, dt::bf16, dt::f16}) run_case(eng, strm, d, n, seconds);
  } catch (const dnnl::error& e) {
    std::fprintf(stderr, "peer_dnnl: oneDNN error: %s (status %d)\n", e.what(), static_cast<int>(e.status));
    return 1;
  }
  return 0;
}
