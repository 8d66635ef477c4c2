// run_doctor(): a short real measurement on this machine, and the verdict rules on made-up speedups.
#include "mixtrain/precision/doctor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/gemm_timing.h"

namespace mixtrain {
namespace {

TEST(Doctor, VerdictStringsFollowTheThreshold) {
  EXPECT_EQ(measured_verdict(DType::kFloat32, 1.0), "baseline");
  EXPECT_EQ(measured_verdict(DType::kFloat32, 3.0), "baseline");
  EXPECT_EQ(measured_verdict(DType::kFloat16, 2.1), "recommended (float16 GEMM measured 2.1x float32)");
  EXPECT_EQ(measured_verdict(DType::kFloat16, 0.93),
            "no benefit on this hardware: stay in float32 (float16 GEMM measured 0.93x float32)");
  EXPECT_EQ(measured_verdict(DType::kBFloat16, 1.5), "recommended (bfloat16 GEMM measured 1.5x float32)");
  EXPECT_EQ(measured_verdict(DType::kBFloat16, 1.0),
            "no benefit on this hardware: stay in float32 (bfloat16 GEMM measured 1.0x float32)");
  // At the threshold, and just either side of it as shown with two decimals.
  EXPECT_EQ(measured_verdict(DType::kFloat16, 1.15), "recommended (float16 GEMM measured 1.15x float32)");
  EXPECT_EQ(measured_verdict(DType::kFloat16, 1.1499), "recommended (float16 GEMM measured 1.15x float32)");
  EXPECT_EQ(measured_verdict(DType::kFloat16, 1.144),
            "no benefit on this hardware: stay in float32 (float16 GEMM measured 1.14x float32)");
}

// A busy machine's ratio can clear the threshold from noise alone where the GEMM widens 16-bit inputs to float32:
// the CPU verdict then withholds the recommendation. A 16-bit method keeps its measured verdict, and so does every
// verdict on an idle machine and every verdict that is not a recommendation.
TEST(Doctor, ABusyMachineWithholdsARecommendationWithoutSixteenBitArithmetic) {
  EXPECT_EQ(cpu_verdict(DType::kFloat16, 1.22, true, false),
            "inconclusive on a busy machine: stay in float32 until measured on an idle one (float16 GEMM measured 1.22x "
            "float32)");
  EXPECT_EQ(cpu_verdict(DType::kFloat16, 1.22, false, false), measured_verdict(DType::kFloat16, 1.22));
  EXPECT_EQ(cpu_verdict(DType::kBFloat16, 1.9, true, true), measured_verdict(DType::kBFloat16, 1.9));
  EXPECT_EQ(cpu_verdict(DType::kBFloat16, 0.9, true, false), measured_verdict(DType::kBFloat16, 0.9));
  EXPECT_EQ(cpu_verdict(DType::kFloat32, 1.0, true, false), "baseline");
  EXPECT_TRUE(cpu_gemm_has_16bit_arithmetic(DType::kFloat16, "fp16", "widen"));
  EXPECT_TRUE(cpu_gemm_has_16bit_arithmetic(DType::kFloat16, "amx", "amx"));
  EXPECT_FALSE(cpu_gemm_has_16bit_arithmetic(DType::kFloat16, "widen", "dot"));
  EXPECT_TRUE(cpu_gemm_has_16bit_arithmetic(DType::kBFloat16, "widen", "dot"));
  EXPECT_FALSE(cpu_gemm_has_16bit_arithmetic(DType::kBFloat16, "fp16", "widen"));
}

TEST(Doctor, SpeedupFormatting) {
  EXPECT_EQ(format_speedup(2.1), "2.1");
  EXPECT_EQ(format_speedup(0.93), "0.93");
  EXPECT_EQ(format_speedup(1.0), "1.0");
  EXPECT_EQ(format_speedup(12.345), "12.35");
  EXPECT_EQ(format_speedup(0.5), "0.5");
}

TEST(Doctor, SpeedupIsGeometricMeanOverSizes) {
  DoctorReport r;
  r.measurements = {{DType::kFloat32, 512, 3, 1e-3, 100, 1.0},
                    {DType::kFloat16, 512, 3, 2e-3, 50, 0.5},
                    {DType::kFloat32, 1024, 3, 8e-3, 100, 1.0},
                    {DType::kFloat16, 1024, 3, 4e-3, 200, 2.0}};
  EXPECT_DOUBLE_EQ(measured_speedup(r, DType::kFloat32), 1.0);
  EXPECT_NEAR(measured_speedup(r, DType::kFloat16), 1.0, 1e-12);
  EXPECT_EQ(measured_speedup(r, DType::kBFloat16), 0.0);  // not measured
}

TEST(Doctor, RejectsBadBudgets) {
  EXPECT_THROW(run_doctor(0), Error);
  EXPECT_THROW(run_doctor(-1), Error);
  EXPECT_THROW(run_doctor(std::nan("")), Error);
  EXPECT_THROW(run_doctor(1e9), Error);
}

TEST(Doctor, MeasuresEveryDTypeOnThisMachine) {
  const DoctorReport r = run_doctor(0.2);
  EXPECT_FALSE(r.cpu.model_name.empty());
  EXPECT_GE(r.cpu.logical_cores, 1);
  EXPECT_GE(r.cpu.gemm_threads, 1);
  EXPECT_EQ(r.cpu.features.size(), 8u);
  EXPECT_FALSE(r.gpu.status.empty());
  EXPECT_GT(r.seconds_spent, 0);
  EXPECT_LT(r.seconds_spent, 30);  // a small budget stays small, even on a loaded machine
  ASSERT_FALSE(r.fp8.empty());
  EXPECT_EQ(r.fp8[0].rfind("cpu: emulated", 0), 0u);
  EXPECT_NE(format_doctor(r).find("FP8       cpu: emulated"), std::string::npos);
  EXPECT_TRUE(doctor_to_json(r)["fp8"].is_array());

  ASSERT_GE(r.measurements.size(), 3u);
  ASSERT_EQ(r.measurements.size() % 3, 0u);
  for (size_t i = 0; i < r.measurements.size(); ++i) {
    const GemmMeasurement& m = r.measurements[i];
    const DType expected[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
    EXPECT_EQ(m.dtype, expected[i % 3]);
    EXPECT_EQ(m.size, r.measurements[i - i % 3].size);
    EXPECT_GE(m.repetitions, 2);
    EXPECT_TRUE(std::isfinite(m.gflops) && m.gflops > 0) << dtype_name(m.dtype) << " " << m.gflops;
    EXPECT_TRUE(std::isfinite(m.ratio) && m.ratio > 0) << dtype_name(m.dtype) << " " << m.ratio;
    if (m.dtype == DType::kFloat32) {
      EXPECT_EQ(m.ratio, 1.0);
    }
    EXPECT_NEAR(m.gflops, 2.0 * m.size * m.size * m.size / m.best_seconds / 1e9, 1e-9 * m.gflops);
  }

  // One CPU line per policy, each consistent with its measured speedup; GPU lines after them.
  ASSERT_GE(r.verdicts.size(), 3u);
  const char* policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  for (int i = 0; i < 3; ++i) {
    const PolicyVerdict& v = r.verdicts[i];
    EXPECT_EQ(v.device, "cpu");
    EXPECT_EQ(v.policy, policies[i]);
    EXPECT_DOUBLE_EQ(v.speedup, measured_speedup(r, dtypes[i]));
    const bool sixteen = cpu_gemm_has_16bit_arithmetic(dtypes[i], r.cpu.f16_method, r.cpu.bf16_method);
    EXPECT_EQ(v.verdict, cpu_verdict(dtypes[i], v.speedup, r.busy(), sixteen));
    EXPECT_FALSE(v.reason.empty());
    if (i == 0) continue;
    const bool recommended = std::stod(format_speedup(v.speedup)) >= kRecommendSpeedup - 1e-9;
    const char* prefix = !recommended           ? "no benefit on this hardware: stay in float32 ("
                         : r.busy() && !sixteen ? "inconclusive on a busy machine: stay in float32"
                                                : "recommended (";
    EXPECT_EQ(v.verdict.rfind(prefix, 0), 0u) << v.verdict;
  }
  EXPECT_EQ(r.verdicts[0].verdict, "baseline");
  EXPECT_EQ(r.verdicts.size(), 3 + 3 * r.gpu.gpus.size());
  for (size_t i = 3; i < r.verdicts.size(); ++i) EXPECT_EQ(r.verdicts[i].device.rfind("gpu", 0), 0u);

  const Json j = doctor_to_json(r);
  for (const char* key : {"cpu", "gpus", "measurements", "verdicts", "thresholds", "seconds"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_TRUE(j.at("cpu").at("features").at("avx2").is_bool());
  EXPECT_EQ(j.at("verdicts").at(0).at("verdict").as_string(), "baseline");
  EXPECT_EQ(Json::parse(j.dump(2), "doctor json"), j);

  const std::string text = format_doctor(r);
  EXPECT_NE(text.find(r.cpu.gemm_isa + " path"), std::string::npos) << text;
  EXPECT_NE(text.find("AVX512-FP16"), std::string::npos) << text;
  EXPECT_NE(text.find("bfloat16 by " + r.cpu.bf16_method), std::string::npos) << text;
  EXPECT_NE(text.find("tile state " + r.cpu.amx_status), std::string::npos) << text;
  // The methods and the AMX answer are the kernels' own.
  EXPECT_EQ(r.cpu.bf16_method, kernels::gemm_bf16_method());
  EXPECT_EQ(r.cpu.f16_method, kernels::gemm_f16_method());
  EXPECT_EQ(r.cpu.amx_granted, kernels::gemm_amx_granted());
  EXPECT_EQ(j.at("cpu").at("gemm_bf16_method").as_string(), r.cpu.bf16_method);
  EXPECT_TRUE(j.at("cpu").at("amx_granted").is_bool());
  EXPECT_NE(text.find(r.gpu.status), std::string::npos) << text;
  EXPECT_NE(text.find(r.verdicts[1].verdict), std::string::npos) << text;
  // The mixed_float16 verdict says how float16 products run: the calibrated method, not widening by default.
  const std::string f16_how = r.cpu.f16_method == "amx"    ? "three AMX tile products"
                              : r.cpu.f16_method == "fp16" ? "float16 FMAs (AVX512-FP16)"
                                                           : "inputs widened to float32";
  EXPECT_NE(r.verdicts[1].reason.find(f16_how), std::string::npos) << r.verdicts[1].reason;
}

// FP8 tensor cores start at compute capability 8.9 (Ada) and include 9.0 (Hopper); the CPU line names the bfloat16
// method the widened FP8 operands run on.
TEST(Doctor, Fp8LinesSayHowFp8RunsHere) {
  kernels::GpuProbe probe;
  probe.driver_found = true;
  probe.gpus = {{"Ampere", int64_t{40} << 30, 8, 6}, {"Ada", int64_t{24} << 30, 8, 9}, {"Hopper", int64_t{80} << 30, 9, 0}};
  const std::vector<std::string> lines = fp8_lines("amx", probe);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].rfind("cpu: emulated", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("AMX bfloat16 tiles"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("compute capability 8.6 has no FP8 tensor cores (they need 8.9)"), std::string::npos);
  EXPECT_NE(lines[2].find("compute capability 8.9 has FP8 tensor cores"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find("compute capability 9.0 has FP8 tensor cores"), std::string::npos) << lines[3];
  EXPECT_NE(fp8_lines("dot", {})[0].find("vdpbf16ps"), std::string::npos);
  const std::vector<std::string> no_gpu = fp8_lines("widen", {});
  ASSERT_EQ(no_gpu.size(), 2u);
  EXPECT_NE(no_gpu[0].find("widened to float32"), std::string::npos);
  EXPECT_NE(no_gpu[1].find("compute capability 8.9 or later"), std::string::npos);
}

TEST(Doctor, GpuLinesFollowComputeCapability) {
  kernels::GpuProbe probe;
  probe.driver_found = true;
  probe.gpus = {
      {"Pascal", int64_t{8} << 30, 6, 1}, {"Turing", int64_t{16} << 30, 7, 5}, {"Hopper", int64_t{141} << 30, 9, 0}};
  const std::vector<PolicyVerdict> v = gpu_verdicts(probe);
  ASSERT_EQ(v.size(), 9u);
  const char* expected[9][3] = {
      {"gpu0", "float32", "baseline"},
      {"gpu0", "mixed_float16", "unsupported"},
      {"gpu0", "mixed_bfloat16", "unsupported"},
      {"gpu1", "float32", "baseline"},
      {"gpu1", "mixed_float16", "recommended (float16 tensor cores, compute capability 7.5)"},
      {"gpu1", "mixed_bfloat16", "unsupported"},
      {"gpu2", "float32", "baseline"},
      {"gpu2", "mixed_float16", "recommended (float16 tensor cores, compute capability 9.0)"},
      {"gpu2", "mixed_bfloat16", "recommended (bfloat16 tensor cores, compute capability 9.0)"},
  };
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i].device, expected[i][0]);
    EXPECT_EQ(v[i].policy, expected[i][1]);
    EXPECT_EQ(v[i].verdict, expected[i][2]);
    EXPECT_FALSE(v[i].reason.empty());
  }
  EXPECT_NE(v[6].reason.find("Hopper, 141.0 GiB"), std::string::npos) << v[6].reason;
  EXPECT_TRUE(gpu_verdicts(kernels::GpuProbe{}).empty());
}


// A GPU's measured GEMMs as measure_gpu_gemm reports them: float32 first, ratios against it.
GpuGemmReport measured_gpu(const std::string& device, double f32_gflops, std::vector<std::pair<DType, double>> ratios,
                           const std::string& not_measured = "") {
  GpuGemmReport r;
  r.device = device;
  r.method = "cublaslt";
  r.measurements.push_back({DType::kFloat32, kGpuGemmSize, 5, 2.0 * kGpuGemmSize * kGpuGemmSize * kGpuGemmSize /
                                                                  (f32_gflops * 1e9),
                            f32_gflops, 1.0, 40});
  for (const auto& [dtype, ratio] : ratios) {
    const double g = f32_gflops * ratio;
    r.measurements.push_back(
        {dtype, kGpuGemmSize, 6, 2.0 * kGpuGemmSize * kGpuGemmSize * kGpuGemmSize / (g * 1e9), g, ratio, 90});
  }
  r.not_measured = not_measured;
  return r;
}

TEST(Doctor, MeasuredGpuLinesFollowTheCpuRule) {
  kernels::GpuProbe probe;
  probe.driver_found = true;
  probe.gpus = {{"Turing", int64_t{16} << 30, 7, 5},
                {"Hopper", int64_t{141} << 30, 9, 0},
                {"Ampere", int64_t{80} << 30, 8, 0},
                {"Elsewhere", int64_t{24} << 30, 8, 9}};
  std::vector<GpuGemmReport> gemm = {
      measured_gpu("gpu0", 8000, {{DType::kFloat16, 7.9}}),
      measured_gpu("gpu1", 50000, {{DType::kFloat16, 1.1}, {DType::kBFloat16, 12.345}}),
      measured_gpu("gpu2", 19000, {{DType::kFloat16, 3.0}}, "bfloat16 GEMM failed: out of GPU memory"),
      GpuGemmReport{"gpu3", "", {}, "no GPU: the CUDA runtime sees none"}};
  const std::vector<PolicyVerdict> v = gpu_verdicts(probe, gemm);
  ASSERT_EQ(v.size(), 12u);
  const char* expected[12][3] = {
      {"gpu0", "float32", "baseline"},
      {"gpu0", "mixed_float16", "recommended (float16 GEMM measured 7.9x float32)"},
      {"gpu0", "mixed_bfloat16", "unsupported"},
      {"gpu1", "float32", "baseline"},
      {"gpu1", "mixed_float16", "no benefit on this hardware: stay in float32 (float16 GEMM measured 1.1x float32)"},
      {"gpu1", "mixed_bfloat16", "recommended (bfloat16 GEMM measured 12.35x float32)"},
      {"gpu2", "float32", "baseline"},
      {"gpu2", "mixed_float16", "recommended (float16 GEMM measured 3.0x float32)"},
      {"gpu2", "mixed_bfloat16", "recommended (bfloat16 tensor cores, compute capability 8.0)"},
      {"gpu3", "float32", "baseline"},
      {"gpu3", "mixed_float16", "recommended (float16 tensor cores, compute capability 8.9)"},
      {"gpu3", "mixed_bfloat16", "recommended (bfloat16 tensor cores, compute capability 8.9)"},
  };
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i].device, expected[i][0]) << i;
    EXPECT_EQ(v[i].policy, expected[i][1]) << i;
    EXPECT_EQ(v[i].verdict, expected[i][2]) << i;
    EXPECT_FALSE(v[i].reason.empty()) << i;
  }
  // The measured lines carry their speedup and are the CPU rule's strings for it.
  EXPECT_DOUBLE_EQ(v[4].speedup, 1.1);
  EXPECT_EQ(v[4].verdict, measured_verdict(DType::kFloat16, v[4].speedup));
  EXPECT_DOUBLE_EQ(v[5].speedup, 12.345);
  EXPECT_DOUBLE_EQ(v[3].speedup, 1.0);
  EXPECT_EQ(v[2].speedup, 0.0);
  EXPECT_EQ(v[8].speedup, 0.0);
  EXPECT_NE(v[3].reason.find("Hopper, 141.0 GiB, compute capability 9.0; float32 GEMM ran at 50000.0 GFLOP/s at n = "
                             "4096"),
            std::string::npos)
      << v[3].reason;
  EXPECT_NE(v[1].reason.find("ran 7.9x float32 (n = 4096, best of 6 runs of 90 products)"), std::string::npos)
      << v[1].reason;
  EXPECT_NE(v[1].reason.find("loss scaling"), std::string::npos) << v[1].reason;
  EXPECT_EQ(v[4].reason.find("loss scaling"), std::string::npos) << v[4].reason;  // not recommended
  EXPECT_NE(v[8].reason.find("not measured: bfloat16 GEMM failed: out of GPU memory"), std::string::npos)
      << v[8].reason;
  for (size_t i = 9; i < 12; ++i)
    EXPECT_NE(v[i].reason.find("not measured: no GPU: the CUDA runtime sees none"), std::string::npos) << v[i].reason;
}

TEST(Doctor, GpuMeasurementsAppearInTheTextAndTheJson) {
  DoctorReport r;
  r.cpu_share = 1;
  r.gpu.driver_found = true;
  r.gpu.status = "1 GPU (CUDA driver 13.0)";
  r.gpu.gpus = {{"Hopper", int64_t{141} << 30, 9, 0}};
  r.gpu_gemm = {measured_gpu("gpu0", 50000, {{DType::kFloat16, 14.0}, {DType::kBFloat16, 15.5}})};
  r.verdicts = gpu_verdicts(r.gpu, r.gpu_gemm);
  const std::string text = format_doctor(r);
  EXPECT_NE(text.find("GEMM on gpu0 (cuda:0), ops::matmul on the CUDA backend (cublaslt)"), std::string::npos) << text;
  EXPECT_NE(text.find("  4096  float32    50000.0       1.00x    5 x 40\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  4096  bfloat16  775000.0      15.50x    6 x 90\n"), std::string::npos) << text;
  EXPECT_NE(text.find("recommended (bfloat16 GEMM measured 15.5x float32)"), std::string::npos) << text;

  const Json j = doctor_to_json(r);
  const Json& g = j.at("gpus").at("devices").at(0).at("gemm");
  EXPECT_EQ(g.at("device").as_string(), "gpu0");
  EXPECT_EQ(g.at("method").as_string(), "cublaslt");
  EXPECT_EQ(g.at("not_measured").as_string(), "");
  ASSERT_EQ(g.at("measurements").size(), 3u);
  EXPECT_EQ(g.at("measurements").at(2).at("dtype").as_string(), "bfloat16");
  EXPECT_DOUBLE_EQ(g.at("measurements").at(2).at("ratio").as_number(), 15.5);
  EXPECT_EQ(g.at("measurements").at(2).at("per_run").as_number(), 90);
  EXPECT_DOUBLE_EQ(j.at("verdicts").at(2).at("speedup").as_number(), 15.5);
  // The CPU's measurements stay where they were, without the GPU's.
  EXPECT_EQ(j.at("measurements").size(), 0u);
}

TEST(Doctor, AGpuTheBackendCannotUseIsNotMeasuredAndSaysWhy) {
  kernels::GpuProbe probe;
  probe.driver_found = true;
  probe.gpus = {{"Hopper", int64_t{141} << 30, 9, 0}};
  ops::CudaBackendStatus none;
  none.detail = "this build has no CUDA backend (configure with -DMIXTRAIN_CUDA=ON)";
  std::vector<GpuGemmReport> g = measure_gpu_gemm(probe, none);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].device, "gpu0");
  EXPECT_TRUE(g[0].measurements.empty());
  EXPECT_EQ(g[0].not_measured, none.detail);
  // The driver and the runtime disagree on the count: the GPUs cannot be matched by index.
  ops::CudaBackendStatus two;
  two.compiled = two.loaded = true;
  two.device_count = 2;
  g = measure_gpu_gemm(probe, two);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_TRUE(g[0].measurements.empty());
  EXPECT_NE(g[0].not_measured.find("the driver lists 1 GPU(s) and the CUDA runtime 2"), std::string::npos)
      << g[0].not_measured;
  EXPECT_TRUE(measure_gpu_gemm(kernels::GpuProbe{}, two).empty());
}

TEST(Doctor, MeasuresEveryGpuTheBackendCanUse) {
  const DoctorReport r = run_doctor(0.1);
  ASSERT_EQ(r.gpu_gemm.size(), r.gpu.gpus.size());
  const bool usable = r.cuda_backend.loaded && r.cuda_backend.device_count == static_cast<int>(r.gpu.gpus.size());
  if (std::getenv("MIXTRAIN_REQUIRE_GPU") != nullptr && std::string(std::getenv("MIXTRAIN_REQUIRE_GPU")) == "1") {
    ASSERT_TRUE(usable && !r.gpu.gpus.empty()) << r.gpu.status << "; " << r.cuda_backend.detail;
  }
  for (size_t i = 0; i < r.gpu_gemm.size(); ++i) {
    const GpuGemmReport& g = r.gpu_gemm[i];
    EXPECT_EQ(g.device, "gpu" + std::to_string(i));
    if (g.measurements.empty()) {
      EXPECT_FALSE(g.not_measured.empty());
      EXPECT_FALSE(usable && ops::gemm_device_problem(Device::cuda(static_cast<int>(i))).empty())
          << "gpu" << i << " could have been measured: " << g.not_measured;
      continue;
    }
    EXPECT_EQ(g.measurements[0].dtype, DType::kFloat32);
    for (const GemmMeasurement& m : g.measurements) {
      EXPECT_EQ(m.size, kGpuGemmSize);
      EXPECT_GE(m.repetitions, 2);
      EXPECT_TRUE(std::isfinite(m.gflops) && m.gflops > 0) << m.gflops;
      EXPECT_NEAR(m.ratio, m.gflops / g.measurements[0].gflops, 1e-9 * m.ratio);
    }
    // Three lines per GPU after the CPU's, the measured ones with their speedup.
    EXPECT_EQ(r.verdicts[3 + 3 * i].speedup, 1.0);
  }
}

}  // namespace
}  // namespace mixtrain
