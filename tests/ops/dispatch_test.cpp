// The dispatch seam: a device whose backend lacks a kernel (or has no backend) names the op and the device; a kernel
// a backend holds is the one the op entry calls; inputs on different devices are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/conv2d.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/dispatch.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/softmax.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops {
namespace {

// A stand-in backend for the cuda device type with one kernel, installed for a test where no real one is loaded.
int g_stand_in_calls = 0;
void stand_in_fill(Tensor&, float) { ++g_stand_in_calls; }

class StandInBackend final : public Backend {
 public:
  StandInBackend() : Backend(DeviceType::kCuda) { kernels().set<Op::fill>(&stand_in_fill); }
};

TEST(Backend, MissingDeviceKernelIsAClearError) {
  if (find_backend(DeviceType::kCuda) != nullptr) GTEST_SKIP() << "a CUDA backend is loaded";
  const auto expect_names = [](const std::function<void()>& call, const char* op) {
    try {
      call();
      ADD_FAILURE() << op << ": a device without the kernel returned one";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(op), std::string::npos) << what;
      EXPECT_NE(what.find("cuda:1"), std::string::npos) << what;
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    }
  };
  // No backend at all for the type: kernels and device services alike.
  EXPECT_FALSE(supports<Op::softmax>(DeviceType::kCuda));
  expect_names([] { kernel_for<Op::softmax>(Device::cuda(1)); }, "softmax");
  expect_names([] { synchronize(Device::cuda(1)); }, "synchronize");
  // A backend without that kernel, or without that service.
  StandInBackend stand_in;
  install_backend(&stand_in);
  EXPECT_TRUE(supports<Op::fill>(DeviceType::kCuda));
  EXPECT_FALSE(supports<Op::softmax>(DeviceType::kCuda));
  expect_names([] { kernel_for<Op::scale>(Device::cuda(1)); }, "scale");
  expect_names([] { kernel_for<Op::attention>(Device::cuda(1)); }, "scaled_dot_product_attention");
  expect_names([] { make_current(Device::cuda(1)); }, "make_current");
  Tensor unused;
  g_stand_in_calls = 0;
  kernel_for<Op::fill>(Device::cuda(1))(unused, 1.0f);
  EXPECT_EQ(g_stand_in_calls, 1);
  EXPECT_EQ(stand_in.op_names(), std::vector<std::string>{"fill"});
  uninstall_backend(DeviceType::kCuda);
  EXPECT_EQ(find_backend(DeviceType::kCuda), nullptr);
  EXPECT_FALSE(supports<Op::fill>(DeviceType::kCuda));
}

TEST(Backend, OpsAreNamedAsInErrors) {
  EXPECT_EQ(static_cast<int>(all_ops().size()), kNumOps);
  EXPECT_STREQ(op_name(Op::scale), "scale");
  EXPECT_STREQ(op_name(Op::mse), "mean_squared_error");
  EXPECT_STREQ(op_name(Op::attention_backward), "scaled_dot_product_attention_backward");
  EXPECT_STREQ(op_name(all_ops().back()), "global_norm");
}

// A stand-in kernel installed in the CPU backend for a scope, then restored: the op entry validates, allocates and
// calls whatever the backend holds.
int g_scale_calls = 0;
void counting_scale(const Tensor& x, float s, Tensor& y) {
  ++g_scale_calls;
  const std::vector<float> v = x.to_floats();
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = v[static_cast<size_t>(i)] * s + 1000.0f;
}

TEST(Backend, OpEntriesCallTheInstalledKernel) {
  kernel::ScaleFn* original = cpu_backend().kernels().get<Op::scale>();
  Tensor y;
  {
    KernelOverride<Op::scale> counting(cpu_backend(), &counting_scale);
    EXPECT_EQ(counting.original(), original);
    y = scale(Tensor::from_floats({2}, {1.0f, 2.0f}), 2.0f);
  }
  EXPECT_EQ(cpu_backend().kernels().get<Op::scale>(), original);
  EXPECT_EQ(g_scale_calls, 1);
  EXPECT_EQ(y.to_floats(), (std::vector<float>{1002.0f, 1004.0f}));
  EXPECT_EQ(scale(Tensor::from_floats({1}, {1.0f}), 2.0f).item(), 2.0f);
}

// A CUDA entry exists only where the CUDA backend loaded on a GPU and lists the op: the GEMM's tables (bmm, the
// Dense layer's fused product and activation, convolution, which unfolds its patches into the GEMM) exactly when
// cuBLASLt loaded with it.
TEST(Backend, EveryOpHasACpuKernelAndCudaOnlyWhereTheBackendRegisteredOne) {
  EXPECT_TRUE(ops::supports<ops::Op::bmm>(DeviceType::kCpu));
  EXPECT_TRUE(ops::supports<ops::Op::linear_activation>(DeviceType::kCpu));
  EXPECT_TRUE(ops::supports<ops::Op::conv2d>(DeviceType::kCpu));
  EXPECT_TRUE(ops::supports<ops::Op::softmax>(DeviceType::kCpu));
  EXPECT_TRUE(ops::supports<ops::Op::count_nonfinite>(DeviceType::kCpu));
  const CudaBackendStatus cuda = load_cuda_backend();
  const auto lists = [&](const char* op) { return std::find(cuda.ops.begin(), cuda.ops.end(), op) != cuda.ops.end(); };
  const bool gemm = cuda.loaded && lists("bmm");
  EXPECT_EQ(ops::supports<ops::Op::bmm>(DeviceType::kCuda), gemm);
  EXPECT_EQ(ops::supports<ops::Op::linear_activation>(DeviceType::kCuda), gemm && lists("linear_activation"));
  EXPECT_EQ(ops::supports<ops::Op::linear_activation>(DeviceType::kCuda), gemm);
  EXPECT_EQ(ops::supports<ops::Op::conv2d>(DeviceType::kCuda), gemm && lists("conv2d"));
  EXPECT_EQ(ops::supports<ops::Op::conv2d>(DeviceType::kCuda), gemm);
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
