// ops::time_matmul, the timed GEMM of `mixtrain bench gemm --device` and doctor's GPU lines, on the CPU (which
// every machine has): the product it returns is ops::matmul's, the timing fields agree with each other, and bad
// arguments or an unusable device are refused by name. The GPU run against the CPU is in
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
