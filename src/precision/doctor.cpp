#include "mixtrain/precision/doctor.h"

#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/core/half.h"
#include "mixtrain/kernels/cpu_features.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/gemm_timing.h"

namespace mixtrain {
namespace {

using Clock = std::chrono::steady_clock;

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
constexpr int kNumMeasuredDTypes = 3;
static_assert(sizeof(kDTypes) / sizeof(kDTypes[0]) == kNumMeasuredDTypes);
// Large enough to run at the GEMM's full speed, small enough that both fit in a one-second budget
// on a two-core machine.
constexpr int64_t kSizes[] = {512, 1024};
// Each size but the last gets this share of the time still left; the last gets the rest.
constexpr double kSizeShare = 0.35;
constexpr double kMaxSeconds = 3600;
constexpr size_t kTextWidth = 110;  // of the human report's wrapped lines

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A, B and C of one n x n GEMM in one dtype, filled with values in [-1, 1) (no subnormals, no overflow).
struct Operands {
  Tensor a, b, c;  // (n, n) each, row-major, in host memory

  Operands(int64_t n, DType dtype, uint64_t seed)
      : a(Tensor::empty({n, n}, dtype)),
        b(Tensor::empty({n, n}, dtype)),
        c(Tensor::zeros({n, n}, dtype)) {  // zeroed, so its pages are mapped before timing starts
    const size_t count = static_cast<size_t>(n * n);
    fill(static_cast<unsigned char*>(a.raw()), count, dtype, seed);
    fill(static_cast<unsigned char*>(b.raw()), count, dtype, seed + 1);
  }

  static void fill(unsigned char* out, size_t count, DType dtype, uint64_t state) {
    for (size_t i = 0; i < count; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;  // 64-bit LCG (Knuth's MMIX)
      const float v = static_cast<float>(state >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
      if (dtype == DType::kFloat32) {
        reinterpret_cast<float*>(out)[i] = v;
      } else {
        const uint16_t bits = dtype == DType::kFloat16 ? float_to_half_bits(v) : float_to_bf16_bits(v);
        reinterpret_cast<uint16_t*>(out)[i] = bits;
      }
    }
  }
};

// CPU time of all threads of this process.
double process_cpu_seconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Wall and process CPU time of the GEMMs timed so far.
struct TimeUse {
  double wall = 0, cpu = 0;
};

// One product through the GEMM timer of ops (the CPU GEMM on the operands' buffers), with the process's CPU time.
double time_gemm(Operands& operands, TimeUse* use) {
  const double cpu0 = process_cpu_seconds();
  const double wall = ops::time_cpu_matmul_once(operands.a, operands.b, operands.c);
  use->wall += wall;
  use->cpu += process_cpu_seconds() - cpu0;
  return wall;
}

// Times every size that fits in the budget; see run_doctor().
std::vector<GemmMeasurement> measure_gemm(double seconds, double* spent, TimeUse* use) {
  std::vector<GemmMeasurement> out;
  const auto start = Clock::now();
  const size_t num_sizes = sizeof(kSizes) / sizeof(kSizes[0]);
  bool last = false;
  for (size_t si = 0; si < num_sizes && !last; ++si) {
    const int64_t n = kSizes[si];
    last = si + 1 == num_sizes;
    const double elapsed = seconds_since(start);
    double size_end = last ? seconds : elapsed + (seconds - elapsed) * kSizeShare;

    std::vector<Operands> ops;
    for (int d = 0; d < kNumMeasuredDTypes; ++d) ops.emplace_back(n, kDTypes[d], 17 + 2 * static_cast<uint64_t>(d));
    double best[kNumMeasuredDTypes];
    for (double& b : best) b = std::numeric_limits<double>::infinity();
    double best_round = std::numeric_limits<double>::infinity();  // all dtypes once
    int rounds = 0;
    // Interleaved, so a change in machine load hits every dtype alike; the first round also warms the
    // threads and the packing buffers, and the best of the rounds counts.
    for (;;) {
      double round = 0;
      for (int d = 0; d < kNumMeasuredDTypes; ++d) {
        const double t = time_gemm(ops[d], use);
        best[d] = std::min(best[d], t);
        round += t;
      }
      best_round = std::min(best_round, round);
      ++rounds;
      const double now = seconds_since(start);
      if (rounds < 2 || now < size_end) continue;
      if (!last) {
        // GEMM time grows as n^3, and two rounds are the least that gives a warm measurement. When the
        // next size does not fit, this one gets the rest of the budget instead.
        const double scale = static_cast<double>(kSizes[si + 1]) / static_cast<double>(n);
        if (2 * best_round * scale * scale * scale > seconds - now) {
          last = true;
          size_end = seconds;
          if (now < size_end) continue;
        }
      }
      break;
    }

    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    const double f32_gflops = flops / best[0] / 1e9;
    for (int d = 0; d < kNumMeasuredDTypes; ++d) {
      GemmMeasurement m;
      m.dtype = kDTypes[d];
      m.size = n;
      m.repetitions = rounds;
      m.best_seconds = best[d];
      m.gflops = flops / best[d] / 1e9;
      m.ratio = d == 0 ? 1.0 : m.gflops / f32_gflops;
      out.push_back(m);
    }
  }
  *spent = seconds_since(start);
  return out;
}

CpuReport inspect_cpu() {
  const kernels::CpuFeatures& f = kernels::cpu_features();
  CpuReport r;
  r.model_name = f.model_name.empty() ? "unknown CPU" : f.model_name;
  r.vendor = f.vendor;
  r.logical_cores = f.logical_cores;
  r.gemm_threads = omp_get_max_threads();
  r.gemm_isa = kernels::gemm_isa();
  r.bf16_method = kernels::gemm_bf16_method();
  r.f16_method = kernels::gemm_f16_method();
  r.f16_interval = kernels::gemm_f16_promote_interval();
  r.amx_granted = kernels::gemm_amx_granted();
  r.amx_status = kernels::gemm_amx_status();
  r.features = {{"AVX2", "avx2", f.avx2},
                {"FMA", "fma", f.fma},
                {"F16C", "f16c", f.f16c},
                {"AVX-512F", "avx512f", f.avx512f},
                {"AVX512-FP16", "avx512_fp16", f.avx512_fp16},
                {"AVX512-BF16", "avx512_bf16", f.avx512_bf16},
                {"AMX-BF16", "amx_bf16", f.amx_bf16},
                {"AMX-FP16", "amx_fp16", f.amx_fp16}};
  return r;
}

const char* policy_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "mixed_float16";
    case DType::kBFloat16:
      return "mixed_bfloat16";
    default:
      return "float32";
  }
}

// How mixtrain's GEMM computes a 16-bit dtype on this machine (the method the calibration chose).
std::string method_clause(const CpuReport& cpu, DType dtype) {
  if (dtype == DType::kFloat16) {
    if (cpu.f16_method == "fp16")
      return "float16 FMAs (AVX512-FP16), partial sums promoted to float32 every " +
             std::to_string(cpu.f16_interval) + " k values";
    if (cpu.f16_method == "amx")
      return "each input split into two bfloat16 pieces, three AMX tile products (tdpbf16ps), float32 accumulation";
    return "inputs widened to float32, float32 FMAs";
  }
  if (cpu.bf16_method == "amx") return "AMX tiles (tdpbf16ps), float32 accumulation";
  if (cpu.bf16_method == "dot") return "bfloat16 dot products (vdpbf16ps), float32 accumulation";
  return "inputs widened to float32, float32 FMAs";
}

// What the CPU itself offers for 16-bit arithmetic, whatever the kernels make of it.
std::string hardware_clause(DType dtype) {
  const kernels::CpuFeatures& f = kernels::cpu_features();
  if (dtype == DType::kFloat16) {
    if (f.avx512_fp16) return "this CPU has float16 arithmetic (AVX512-FP16)";
    if (f.amx_fp16) return "this CPU has float16 tile arithmetic (AMX-FP16)";
    return std::string("this CPU has no float16 arithmetic (neither AVX512-FP16 nor AMX-FP16)") +
           (f.f16c ? ", only conversions to and from float32 (F16C)" : "");
  }
  if (f.amx_bf16 && f.avx512_bf16) return "this CPU has bfloat16 tile arithmetic (AMX-BF16) and dot products (AVX512-BF16)";
  if (f.amx_bf16) return "this CPU has bfloat16 tile arithmetic (AMX-BF16)";
  if (f.avx512_bf16) return "this CPU has bfloat16 dot products (AVX512-BF16)";
  return "this CPU has no bfloat16 arithmetic (neither AVX512-BF16 nor AMX-BF16)";
}

std::string sizes_text(const DoctorReport& r) {
  std::string s;
  int fewest = 0, most = 0;
  for (const GemmMeasurement& m : r.measurements) {
    if (m.dtype != DType::kFloat32) continue;
    s += (s.empty() ? "" : ", ") + std::to_string(m.size);
    fewest = fewest == 0 ? m.repetitions : std::min(fewest, m.repetitions);
    most = std::max(most, m.repetitions);
  }
  return "n = " + s + ", best of " + std::to_string(fewest) + (most == fewest ? "" : " to " + std::to_string(most)) +
         " runs";
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string gib(int64_t bytes) { return fixed(static_cast<double>(bytes) / (1024.0 * 1024 * 1024), 1) + " GiB"; }

std::string cc_text(const kernels::GpuInfo& g) { return std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor); }

std::string busy_text(const DoctorReport& r) {
  return "measured on a busy machine (the GEMM threads got " + fixed(100 * r.cpu_share, 0) +
         "% of their time; other programs had the rest), so the ratios are noisy";
}

void add_cpu_verdicts(DoctorReport* r) {
  double f32_gflops = 0;
  int64_t f32_size = 0;
  for (const GemmMeasurement& m : r->measurements)
    if (m.dtype == DType::kFloat32) f32_gflops = m.gflops, f32_size = m.size;
  const std::string path = r->cpu.gemm_isa + " path, " + std::to_string(r->cpu.gemm_threads) +
                           (r->cpu.gemm_threads == 1 ? " thread" : " threads");
  for (DType dtype : kDTypes) {
    PolicyVerdict v;
    v.device = "cpu";
    v.policy = policy_of(dtype);
    v.speedup = measured_speedup(*r, dtype);
    v.verdict = cpu_verdict(dtype, v.speedup, r->busy(),
                            cpu_gemm_has_16bit_arithmetic(dtype, r->cpu.f16_method, r->cpu.bf16_method));
    if (dtype == DType::kFloat32) {
      v.reason = "float32 GEMM ran at " + fixed(f32_gflops, 1) + " GFLOP/s at n = " + std::to_string(f32_size) + " (" +
                 path + "); the mixed policies are measured against it";
    } else {
      const bool recommended = v.verdict.rfind("recommended", 0) == 0;
      v.reason = hardware_clause(dtype) + "; mixtrain's GEMM (" + path + ", " + method_clause(r->cpu, dtype) +
                 ") with " + dtype_name(dtype) + " inputs ran " + format_speedup(v.speedup) + "x float32 (" +
                 sizes_text(*r) + ")";
      if (dtype == DType::kBFloat16 && kernels::cpu_features().amx_bf16 && !r->cpu.amx_granted)
        v.reason += "; AMX tiles unused: " + r->cpu.amx_status;
      v.reason += recommended ? "; 16-bit activations also halve the traffic of memory-bound layers"
                              : "; 16-bit activations would still halve the traffic of memory-bound layers and "
                                "activation memory, which helps only a model limited by memory, not arithmetic";
      if (recommended && dtype == DType::kFloat16) v.reason += "; train with loss scaling against float16 underflow";
      if (r->busy()) v.reason += "; " + busy_text(*r);
    }
    r->verdicts.push_back(std::move(v));
  }
}

// Words of `text` in lines of at most `width` characters (longer words get a line of their own), each line
// indented by `indent` spaces and ended by a newline.
std::string wrap(const std::string& text, size_t indent, size_t width) {
  std::string out, line;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    start = end + 1;
    if (word.empty()) continue;
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      out += std::string(indent, ' ') + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += std::string(indent, ' ') + line + "\n";
  return out;
}

std::string pad(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string pad_left(const std::string& s, size_t width) {
  return s.size() < width ? std::string(width - s.size(), ' ') + s : s;
}

}  // namespace

std::vector<GpuGemmReport> measure_gpu_gemm(const kernels::GpuProbe& probe, const ops::CudaBackendStatus& backend) {
  std::vector<GpuGemmReport> out;
  for (size_t i = 0; i < probe.gpus.size(); ++i) {
    const kernels::GpuInfo& g = probe.gpus[i];
    GpuGemmReport rep;
    rep.device = "gpu" + std::to_string(i);
    const Device device = Device::cuda(static_cast<int>(i));
    // The probe asks the driver, the backend the runtime; both number the same GPUs the same way, unless they
    // disagree on how many there are.
    std::string problem;
    if (!backend.loaded)
      problem = backend.detail;
    else if (static_cast<int>(probe.gpus.size()) != backend.device_count)
      problem = "the driver lists " + std::to_string(probe.gpus.size()) + " GPU(s) and the CUDA runtime " +
                std::to_string(backend.device_count) + ", so they cannot be matched";
    else
      problem = ops::gemm_device_problem(device);
    if (!problem.empty()) {
      rep.not_measured = problem;
      out.push_back(std::move(rep));
      continue;
    }
    rep.method = ops::gemm_method(device, DType::kFloat32);
    double f32_gflops = 0;
    for (DType dtype : kDTypes) {
      if ((dtype == DType::kFloat16 && !kernels::gpu_has_fast_float16(g)) ||
          (dtype == DType::kBFloat16 && !kernels::gpu_has_bfloat16(g)))
        continue;  // "unsupported" from the compute capability
      std::string failure;
      try {
        const ops::GemmTiming t = ops::time_matmul(device, dtype, kGpuGemmSize, kGpuGemmSeconds);
        if (dtype == DType::kFloat32) f32_gflops = t.gflops;
        GemmMeasurement m;
        m.dtype = dtype;
        m.size = t.n;
        m.repetitions = t.batches;
        m.per_run = t.per_batch;
        m.best_seconds = t.best_seconds;
        m.gflops = t.gflops;
        m.ratio = dtype == DType::kFloat32 ? 1.0 : t.gflops / f32_gflops;
        rep.measurements.push_back(m);
      } catch (const Error& e) {
        failure = e.message();
      } catch (const std::exception& e) {
        failure = e.what();
      }
      if (failure.empty()) continue;
      rep.not_measured += (rep.not_measured.empty() ? "" : "; ") + std::string(dtype_name(dtype)) +
                          " GEMM failed: " + failure;
      if (dtype == DType::kFloat32) break;  // nothing to measure the others against
    }
    out.push_back(std::move(rep));
  }
  return out;
}

std::vector<PolicyVerdict> gpu_verdicts(const kernels::GpuProbe& probe, const std::vector<GpuGemmReport>& gemm) {
  std::vector<PolicyVerdict> out;
  const std::string f16_cores = "compute capability 7.0 and above has float16 tensor cores";
  const std::string bf16_cores = "compute capability 8.0 and above has bfloat16 arithmetic and tensor cores";
  for (size_t i = 0; i < probe.gpus.size(); ++i) {
    const kernels::GpuInfo& g = probe.gpus[i];
    const std::string device = "gpu" + std::to_string(i), cc = cc_text(g);
    const std::string about = g.name + ", " + gib(g.memory_bytes) + ", compute capability " + cc;
    const GpuGemmReport* rep = i < gemm.size() ? &gemm[i] : nullptr;
    const std::string not_measured =
        "; not measured" + (rep && !rep->not_measured.empty() ? ": " + rep->not_measured : std::string());
    const GemmMeasurement* f32 = nullptr;
    if (rep)
      for (const GemmMeasurement& m : rep->measurements)
        if (m.dtype == DType::kFloat32) f32 = &m;
    if (f32 == nullptr) {
      // From the compute capability alone.
      out.push_back({device, "float32", "baseline", about + not_measured, 0});
      if (kernels::gpu_has_fast_float16(g))
        out.push_back({device, "mixed_float16", "recommended (float16 tensor cores, compute capability " + cc + ")",
                       f16_cores + not_measured, 0});
      else
        out.push_back({device, "mixed_float16", "unsupported",
                       "compute capability " + cc + " has no float16 tensor cores (they need 7.0)", 0});
      if (kernels::gpu_has_bfloat16(g))
        out.push_back({device, "mixed_bfloat16", "recommended (bfloat16 tensor cores, compute capability " + cc + ")",
                       bf16_cores + not_measured, 0});
      else
        out.push_back({device, "mixed_bfloat16", "unsupported",
                       "compute capability " + cc + " has no bfloat16 arithmetic (it needs 8.0)", 0});
      continue;
    }
    // Measured: the CPU's rule on this GPU's ratios.
    const std::string how = rep->method == "cublaslt tf32"
                                ? "cuBLASLt through ops::matmul, TF32 tensor cores (MIXTRAIN_CUDA_TF32=1)"
                                : "cuBLASLt through ops::matmul, float32 arithmetic, TF32 off";
    out.push_back({device, "float32", "baseline",
                   about + "; float32 GEMM ran at " + fixed(f32->gflops, 1) + " GFLOP/s at n = " +
                       std::to_string(f32->size) + " (" + how + "); the mixed policies are measured against it",
                   1.0});
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const bool f16 = dtype == DType::kFloat16;
      const char* policy = policy_of(dtype);
      if (f16 ? !kernels::gpu_has_fast_float16(g) : !kernels::gpu_has_bfloat16(g)) {
        out.push_back({device, policy, "unsupported",
                       f16 ? "compute capability " + cc + " has no float16 tensor cores (they need 7.0)"
                           : "compute capability " + cc + " has no bfloat16 arithmetic (it needs 8.0)",
                       0});
        continue;
      }
      const GemmMeasurement* m = nullptr;
      for (const GemmMeasurement& x : rep->measurements)
        if (x.dtype == dtype) m = &x;
      const std::string cores = f16 ? f16_cores : bf16_cores;
      if (m == nullptr) {  // its measurement failed
        out.push_back({device, policy,
                       std::string("recommended (") + dtype_name(dtype) + " tensor cores, compute capability " + cc +
                           ")",
                       cores + not_measured, 0});
        continue;
      }
      PolicyVerdict v;
      v.device = device;
      v.policy = policy;
      v.speedup = measured_speedup(rep->measurements, dtype);
      v.verdict = measured_verdict(dtype, v.speedup);
      v.reason = cores + "; cuBLASLt with " + dtype_name(dtype) + " inputs and float32 accumulation ran " +
                 format_speedup(v.speedup) + "x float32 (n = " + std::to_string(m->size) + ", best of " +
                 std::to_string(m->repetitions) + " runs of " + std::to_string(m->per_run) + " products)";
      if (f16 && v.verdict.rfind("recommended", 0) == 0) v.reason += "; train with loss scaling against float16 underflow";
      out.push_back(std::move(v));
    }
  }
  return out;
}

bool DoctorReport::busy() const { return cpu_share < kBusyCpuShare; }

std::string format_speedup(double speedup) {
  std::string s = fixed(speedup, 2);
  if (s.size() >= 2 && s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
  return s;
}

std::string measured_verdict(DType dtype, double speedup) {
  if (dtype == DType::kFloat32) return "baseline";
  const std::string shown = format_speedup(speedup);
  const std::string measured = std::string("(") + dtype_name(dtype) + " GEMM measured " + shown + "x float32)";
  // Decided on the value as shown, so a verdict never contradicts its own number.
  if (std::stod(shown) >= kRecommendSpeedup - 1e-9) return "recommended " + measured;
  return "no benefit on this hardware: stay in float32 " + measured;
}

bool cpu_gemm_has_16bit_arithmetic(DType dtype, const std::string& f16_method, const std::string& bf16_method) {
  if (dtype == DType::kFloat16) return f16_method == "fp16" || f16_method == "amx";
  if (dtype == DType::kBFloat16) return bf16_method == "dot" || bf16_method == "amx";
  return false;
}

std::string cpu_verdict(DType dtype, double speedup, bool busy, bool sixteen_bit_arithmetic) {
  std::string verdict = measured_verdict(dtype, speedup);
  if (!busy || sixteen_bit_arithmetic || verdict.rfind("recommended ", 0) != 0) return verdict;
  return "inconclusive on a busy machine: stay in float32 until measured on an idle one " +
         verdict.substr(std::string("recommended ").size());
}

double measured_speedup(const DoctorReport& report, DType dtype) { return measured_speedup(report.measurements, dtype); }

double measured_speedup(const std::vector<GemmMeasurement>& measurements, DType dtype) {
  if (dtype == DType::kFloat32) return 1.0;
  double log_sum = 0;
  int count = 0;
  for (const GemmMeasurement& m : measurements) {
    if (m.dtype != dtype || !(m.ratio > 0)) continue;
    log_sum += std::log(m.ratio);
    ++count;
  }
  return count == 0 ? 0.0 : std::exp(log_sum / count);
}

DoctorReport run_doctor(double seconds) {
  if (!(seconds > 0 && seconds <= kMaxSeconds))
    MIXTRAIN_FAIL(kInvalidInput, "doctor: measurement time must be in (0, 3600] seconds, got " << seconds,
                  "about 1 second is enough");
  DoctorReport r;
  r.cpu = inspect_cpu();
  r.gpu = kernels::probe_gpus();
  r.cuda_backend = ops::load_cuda_backend();
  r.seconds_budget = seconds;
  TimeUse use;
  r.measurements = measure_gemm(seconds, &r.seconds_spent, &use);
  r.cpu_share = use.wall > 0 ? use.cpu / (use.wall * r.cpu.gemm_threads) : 0;
  add_cpu_verdicts(&r);
  r.gpu_gemm = measure_gpu_gemm(r.gpu, r.cuda_backend);
  for (PolicyVerdict& v : gpu_verdicts(r.gpu, r.gpu_gemm)) r.verdicts.push_back(std::move(v));
  r.fp8 = fp8_lines(r.cpu.bf16_method, r.gpu);
  return r;
}

namespace {
Json measurements_json(const std::vector<GemmMeasurement>& ms) {
  Json out = Json::array();
  for (const GemmMeasurement& m : ms) {
    Json o = Json::object({{"dtype", dtype_name(m.dtype)},
                           {"size", m.size},
                           {"repetitions", m.repetitions},
                           {"best_seconds", m.best_seconds},
                           {"gflops", m.gflops},
                           {"ratio", m.ratio}});
    if (m.per_run != 1) o["per_run"] = m.per_run;
    out.push_back(o);
  }
  return out;
}
}  // namespace

Json doctor_to_json(const DoctorReport& r) {
  Json j = Json::object();
  Json features = Json::object();
  for (const CpuFeatureFlag& f : r.cpu.features) features[f.key] = f.present;
  j["cpu"] = Json::object({{"model_name", r.cpu.model_name},
                           {"vendor", r.cpu.vendor},
                           {"logical_cores", r.cpu.logical_cores},
                           {"gemm_threads", r.cpu.gemm_threads},
                           {"gemm_isa", r.cpu.gemm_isa},
                           {"gemm_bf16_method", r.cpu.bf16_method},
                           {"gemm_f16_method", r.cpu.f16_method},
                           {"gemm_f16_interval", r.cpu.f16_interval},
                           {"amx_granted", r.cpu.amx_granted},
                           {"amx_status", r.cpu.amx_status},
                           {"features", features}});
  Json devices = Json::array();
  for (size_t i = 0; i < r.gpu.gpus.size(); ++i) {
    const kernels::GpuInfo& g = r.gpu.gpus[i];
    Json d = Json::object({{"name", g.name},
                           {"memory_bytes", g.memory_bytes},
                           {"compute_capability", cc_text(g)},
                           {"fast_float16", kernels::gpu_has_fast_float16(g)},
                           {"bfloat16", kernels::gpu_has_bfloat16(g)}});
    if (i < r.gpu_gemm.size()) {
      const GpuGemmReport& rep = r.gpu_gemm[i];
      d["gemm"] = Json::object({{"device", rep.device},
                                {"method", rep.method},
                                {"measurements", measurements_json(rep.measurements)},
                                {"not_measured", rep.not_measured}});
    }
    devices.push_back(d);
  }
  j["gpus"] = Json::object({{"driver_found", r.gpu.driver_found}, {"status", r.gpu.status}, {"devices", devices}});
  Json backend_ops = Json::array();
  for (const std::string& op : r.cuda_backend.ops) backend_ops.push_back(op);
  if (!r.nccl.empty()) j["nccl"] = r.nccl;
  j["cuda_backend"] = Json::object({{"compiled", r.cuda_backend.compiled},
                                    {"loaded", r.cuda_backend.loaded},
                                    {"device_count", r.cuda_backend.device_count},
                                    {"detail", r.cuda_backend.detail},
                                    {"ops", backend_ops}});
  j["measurements"] = measurements_json(r.measurements);
  Json verdicts = Json::array();
  for (const PolicyVerdict& v : r.verdicts) {
    Json o = Json::object({{"device", v.device}, {"policy", v.policy}, {"verdict", v.verdict}, {"reason", v.reason}});
    o["speedup"] = v.speedup > 0 ? Json(v.speedup) : Json();
    verdicts.push_back(o);
  }
  j["verdicts"] = verdicts;
  Json fp8 = Json::array();
  for (const std::string& line : r.fp8) fp8.push_back(line);
  j["fp8"] = fp8;
  j["thresholds"] = Json::object({{"recommend_speedup", kRecommendSpeedup}});
  j["seconds"] = Json::object({{"budget", r.seconds_budget}, {"spent", r.seconds_spent}});
  j["cpu_share"] = r.cpu_share;
  j["busy"] = r.busy();
  return j;
}

std::string format_doctor(const DoctorReport& r) {
  std::string s;
  s += "CPU       " + r.cpu.model_name + (r.cpu.vendor.empty() ? "" : " (" + r.cpu.vendor + ")") + ", " +
       std::to_string(r.cpu.logical_cores) + (r.cpu.logical_cores == 1 ? " logical core" : " logical cores") + "\n";
  std::string flags;
  for (const CpuFeatureFlag& f : r.cpu.features)
    flags += (flags.empty() ? "" : "  ") + std::string(f.label) + (f.present ? " yes" : " no");
  s += "features  " + flags + "\n";
  s += "GEMM      " + r.cpu.gemm_isa + " path, " + std::to_string(r.cpu.gemm_threads) +
       (r.cpu.gemm_threads == 1 ? " thread" : " threads") + "; bfloat16 by " + r.cpu.bf16_method + ", float16 by " +
       r.cpu.f16_method + (r.cpu.f16_method == "fp16" ? " (float32 every " + std::to_string(r.cpu.f16_interval) + " k)" : "") +
       "\n";
  s += "AMX       tile state " + r.cpu.amx_status + "\n";
  s += "GPU       " + r.gpu.status + "\n";
  for (size_t i = 0; i < r.gpu.gpus.size(); ++i) {
    const kernels::GpuInfo& g = r.gpu.gpus[i];
    s += "          gpu" + std::to_string(i) + "  " + g.name + ", " + gib(g.memory_bytes) + ", compute capability " +
         cc_text(g) + "\n";
  }
  const ops::CudaBackendStatus& cb = r.cuda_backend;
  s += std::string("backend   CUDA ") +
       (cb.loaded ? "loaded (" + std::to_string(cb.ops.size()) + " ops): " : cb.compiled ? "built, not loaded: " : "") +
       cb.detail + "\n";
  if (!r.nccl.empty()) s += "multi-GPU " + r.nccl + "\n";
  for (size_t i = 0; i < r.fp8.size(); ++i) s += (i == 0 ? "FP8       " : "          ") + r.fp8[i] + "\n";

  s += "\nGEMM C = A x B, n x n, inputs and output in dtype, by the methods above (" + fixed(r.seconds_spent, 2) +
       " s)\n";
  s += "     n  dtype      GFLOP/s  vs float32  runs\n";
  for (const GemmMeasurement& m : r.measurements)
    s += pad_left(std::to_string(m.size), 6) + "  " + pad(dtype_name(m.dtype), 9) + pad_left(fixed(m.gflops, 1), 9) +
         pad_left(fixed(m.ratio, 2) + "x", 12) + pad_left(std::to_string(m.repetitions), 6) + "\n";
  if (r.busy()) s += "note: " + busy_text(r) + "; rerun on an idle machine, or with a longer --seconds\n";
  for (const GpuGemmReport& g : r.gpu_gemm) {
    if (g.measurements.empty()) continue;
    s += "\nGEMM on " + g.device + " (cuda:" + g.device.substr(3) + "), ops::matmul on the CUDA backend (" + g.method +
         "), runs of back-to-back products between device synchronizations\n";
    s += "     n  dtype      GFLOP/s  vs float32      runs\n";
    for (const GemmMeasurement& m : g.measurements)
      s += pad_left(std::to_string(m.size), 6) + "  " + pad(dtype_name(m.dtype), 9) + pad_left(fixed(m.gflops, 1), 9) +
           pad_left(fixed(m.ratio, 2) + "x", 12) +
           pad_left(std::to_string(m.repetitions) + " x " + std::to_string(m.per_run), 10) + "\n";
    if (!g.not_measured.empty()) s += "note: " + g.not_measured + "\n";
  }

  s += "\nVerdicts (mixed policy recommended from " + format_speedup(kRecommendSpeedup) + "x float32 GEMM speed)\n";
  size_t device_w = 6, policy_w = 6;
  for (const PolicyVerdict& v : r.verdicts) {
    device_w = std::max(device_w, v.device.size() + 2);
    policy_w = std::max(policy_w, v.policy.size() + 2);
  }
  for (const PolicyVerdict& v : r.verdicts) {
    s += pad(v.device, device_w) + pad(v.policy, policy_w) + v.verdict + "\n";
    if (!v.reason.empty()) s += wrap(v.reason, device_w + policy_w + 2, kTextWidth);
  }
  return s;
}

}  // namespace mixtrain
