// The dispatch seam: a KernelTable without a kernel for a device names the op and the device; set()
// installs a kernel that is then called; inputs on different devices are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "mixtrain/ops/conv2d.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/dispatch.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/softmax.h"

namespace mixtrain::ops {
namespace {

using TestFn = int(int);
int cpu_kernel(int x) { return x + 1; }
int cuda_kernel(int x) { return x * 10; }

TEST(KernelTable, MissingDeviceKernelIsAClearError) {
  KernelTable<TestFn> table("frobnicate", &cpu_kernel);
  EXPECT_TRUE(table.supports(DeviceType::kCpu));
  EXPECT_FALSE(table.supports(DeviceType::kCuda));
  EXPECT_EQ(table(Device::cpu())(1), 2);
  try {
    table(Device::cuda(1));
    FAIL() << "a table without a cuda kernel returned one";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("frobnicate"), std::string::npos) << what;
    EXPECT_NE(what.find("cuda:1"), std::string::npos) << what;
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
  }
}

TEST(KernelTable, SetInstallsAKernelThatIsThenCalled) {
  KernelTable<TestFn> table("frobnicate", nullptr);
  EXPECT_THROW(table(Device::cpu()), Error);
  table.set(DeviceType::kCuda, &cuda_kernel);
  EXPECT_TRUE(table.supports(DeviceType::kCuda));
  EXPECT_EQ(table(Device::cuda(0))(3), 30);
  table.set(DeviceType::kCpu, &cpu_kernel);
  EXPECT_EQ(table(Device::cpu())(3), 4);
}

// A stand-in "device" kernel installed into a real op's table for the CPU entry, then restored: the
// op entry validates, allocates and calls whatever the table holds.
int g_scale_calls = 0;
void counting_scale(const Tensor& x, float s, Tensor& y) {
  ++g_scale_calls;
  const std::vector<float> v = x.to_floats();
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = v[static_cast<size_t>(i)] * s + 1000.0f;
}

TEST(KernelTable, OpEntriesCallTheInstalledKernel) {
  auto& table = kernel::scale_table();
  EXPECT_STREQ(table.op(), "scale");
  kernel::ScaleFn* original = table(Device::cpu());
  table.set(DeviceType::kCpu, &counting_scale);
  Tensor y = scale(Tensor::from_floats({2}, {1.0f, 2.0f}), 2.0f);
  table.set(DeviceType::kCpu, original);
  EXPECT_EQ(g_scale_calls, 1);
  EXPECT_EQ(y.to_floats(), (std::vector<float>{1002.0f, 1004.0f}));
  EXPECT_EQ(scale(Tensor::from_floats({1}, {1.0f}), 2.0f).item(), 2.0f);
}

// A CUDA entry exists only where the CUDA backend loaded on a GPU and lists the op: the GEMM's tables (bmm, the
// Dense layer's fused product and activation, convolution, which unfolds its patches into the GEMM) exactly when
// cuBLASLt loaded with it.
TEST(KernelTable, EveryOpHasACpuKernelAndCudaOnlyWhereTheBackendRegisteredOne) {
  EXPECT_TRUE(kernel::bmm_table().supports(DeviceType::kCpu));
  EXPECT_TRUE(kernel::linear_activation_table().supports(DeviceType::kCpu));
  EXPECT_TRUE(kernel::conv2d_table().supports(DeviceType::kCpu));
  EXPECT_TRUE(kernel::softmax_table().supports(DeviceType::kCpu));
  EXPECT_TRUE(kernel::count_nonfinite_table().supports(DeviceType::kCpu));
  const CudaBackendStatus cuda = load_cuda_backend();
  const auto lists = [&](const char* op) { return std::find(cuda.ops.begin(), cuda.ops.end(), op) != cuda.ops.end(); };
  const bool gemm = cuda.loaded && lists("bmm");
  EXPECT_EQ(kernel::bmm_table().supports(DeviceType::kCuda), gemm);
  EXPECT_EQ(kernel::linear_activation_table().supports(DeviceType::kCuda), gemm && lists("linear_activation"));
  EXPECT_EQ(kernel::linear_activation_table().supports(DeviceType::kCuda), gemm);
  EXPECT_EQ(kernel::conv2d_table().supports(DeviceType::kCuda), gemm && lists("conv2d"));
  EXPECT_EQ(kernel::conv2d_table().supports(DeviceType::kCuda), gemm);
}

TEST(CommonDevice, CpuInputsAndUndefinedOnesAgree) {
  Tensor a = Tensor::zeros({2}, DType::kFloat32), b = Tensor::zeros({3}, DType::kFloat16);
  EXPECT_EQ(common_device("op", {&a, &b}), Device::cpu());
  Tensor none;
  EXPECT_EQ(common_device("op", {&none, &a}), Device::cpu());
  EXPECT_EQ(common_device("op", {}), Device::cpu());
}

}  // namespace
}  // namespace mixtrain::ops
