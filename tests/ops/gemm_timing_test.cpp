// ops::time_matmul, the timed GEMM of `mixtrain bench gemm --device` and doctor's GPU lines, on the CPU (which
// every machine has): the product it returns is ops::matmul's, the timing fields agree with each other, and bad
// arguments or an unusable device are refused by name. ops::time_cpu_matmul_once and time_cpu_matmul, the CPU
// timers of `bench gemm` and the doctor, write the product into the caller's C. The GPU run against the CPU is in
// cuda_gemm_timing_test.cpp.
#include "mixtrain/ops/gemm_timing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cuda_test_util.h"
#include "mixtrain/core/error.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/transfer.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

TEST(GemmTiming, TheCpuTimerWritesTheProductIntoTheCallersBuffer) {
  for (DType dt : testing::kFloatDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const GemmTiming ref = time_matmul(Device::cpu(), dt, 17, 0.01, 3);  // seeded operands and their product
    Tensor c = Tensor::zeros({17, 17}, dt);
    const void* where = c.raw();
    const double once = time_cpu_matmul_once(ref.a, ref.b, c);
    EXPECT_TRUE(std::isfinite(once) && once >= 0) << once;
    EXPECT_EQ(c.raw(), where);  // in place
    const std::vector<float> want = ref.c.to_floats(), got = c.to_floats();
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(want[i], got[i]) << i;

    const GemmTiming t = time_cpu_matmul(ref.a, ref.b, c, 0.01);
    EXPECT_EQ(t.device, Device::cpu());
    EXPECT_EQ(t.dtype, dt);
    EXPECT_EQ(t.n, 17);
    EXPECT_GE(t.batches, 2);
    EXPECT_LE(t.batches, 1000);
    EXPECT_EQ(t.per_batch, 1);
    EXPECT_TRUE(std::isfinite(t.best_seconds) && t.best_seconds > 0) << t.best_seconds;
    EXPECT_NEAR(t.gflops, 2.0 * 17 * 17 * 17 / t.best_seconds / 1e9, 1e-9 * t.gflops);
    EXPECT_EQ(t.method, gemm_method(Device::cpu(), dt));
    EXPECT_FALSE(t.a.defined());
  }
  Tensor a = Tensor::zeros({4, 4}, DType::kFloat32), b = Tensor::zeros({4, 5}, DType::kFloat32);
  Tensor c = Tensor::zeros({4, 4}, DType::kFloat32);
  EXPECT_THROW(time_cpu_matmul_once(a, b, c), Error);
  Tensor c16 = Tensor::zeros({4, 4}, DType::kFloat16);
  EXPECT_THROW(time_cpu_matmul_once(a, a, c16), Error);
  EXPECT_THROW(time_cpu_matmul(a, a, c, 0.0), Error);
}

TEST(GemmTiming, OnTheCpuReturnsMatmulsProductAndConsistentFigures) {
  for (DType dt : testing::kFloatDTypes) {
    const GemmTiming t = time_matmul(Device::cpu(), dt, 33, 0.02, 5);
    EXPECT_EQ(t.device, Device::cpu());
    EXPECT_EQ(t.dtype, dt);
    EXPECT_EQ(t.n, 33);
    EXPECT_GE(t.batches, 2);
    EXPECT_GE(t.per_batch, 1);
    EXPECT_TRUE(std::isfinite(t.best_seconds) && t.best_seconds > 0) << t.best_seconds;
    EXPECT_NEAR(t.gflops, 2.0 * 33 * 33 * 33 / t.best_seconds / 1e9, 1e-9 * t.gflops);
    EXPECT_EQ(t.method, gemm_method(Device::cpu(), dt));
    ASSERT_EQ(t.a.shape(), Shape({33, 33}));
    ASSERT_EQ(t.b.shape(), Shape({33, 33}));
    ASSERT_EQ(t.c.dtype(), dt);
    // The operands are the seeded uniform draws in [-1, 1), distinct from each other.
    const std::vector<float> av = t.a.to_floats(), bv = t.b.to_floats();
    for (float v : av) ASSERT_TRUE(v >= -1 && v < 1) << v;
    EXPECT_NE(av, bv);
    EXPECT_TRUE(bit_equal(t.a, time_matmul(Device::cpu(), dt, 33, 0.001, 5).a));
    // The same kernel on the same operands: the same bits as one product through the op.
    EXPECT_TRUE(bit_equal(t.c, matmul(t.a, t.b))) << dtype_name(dt);
  }
  EXPECT_EQ(gemm_method(Device::cpu(), DType::kFloat32), kernels::gemm_isa());
  EXPECT_EQ(gemm_method(Device::cpu(), DType::kBFloat16), kernels::gemm_bf16_method());
  EXPECT_EQ(gemm_method(Device::cpu(), DType::kFloat16), kernels::gemm_f16_method());
}

TEST(GemmTiming, RefusesBadArguments) {
  EXPECT_THROW(time_matmul(Device::cpu(), DType::kFloat32, 0, 0.01), Error);
  EXPECT_THROW(time_matmul(Device::cpu(), DType::kFloat32, 8, 0), Error);
  EXPECT_THROW(time_matmul(Device::cpu(), DType::kFloat32, 8, std::nan("")), Error);
  EXPECT_THROW(time_matmul(Device::cpu(), DType::kInt32, 8, 0.01), Error);
}

TEST(GemmTiming, AnUnusableGpuIsRefusedNamingTheDeviceAndWhy) {
  EXPECT_EQ(gemm_device_problem(Device::cpu()), "");
  const CudaBackendStatus s = load_cuda_backend();
  // An index past every GPU the runtime sees (none, on a machine without one).
  const Device missing = Device::cuda(s.device_count);
  const std::string problem = gemm_device_problem(missing);
  ASSERT_FALSE(problem.empty());
  if (s.loaded)
    EXPECT_NE(problem.find("cuda:" + std::to_string(s.device_count) + " does not exist"), std::string::npos) << problem;
  else
    EXPECT_EQ(problem, s.detail);
  try {
    time_matmul(missing, DType::kFloat16, 8, 0.01);
    ADD_FAILURE() << "time_matmul ran on " << missing.str();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(e.message().find(missing.str()), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(problem), std::string::npos) << e.message();
    EXPECT_NE(e.hint().find("CUDA"), std::string::npos) << e.hint();
  }
  if (!s.loaded) {
    EXPECT_NE(gemm_device_problem(Device::cuda(0)), "");
    EXPECT_THROW(time_matmul(Device::cuda(0), DType::kFloat32, 8, 0.01), Error);
  }
}

}  // namespace
}  // namespace mixtrain::ops
