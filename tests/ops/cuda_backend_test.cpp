// The CUDA backend behind the dispatch seam. Everywhere: load_cuda_backend() says what this build and machine
// have, and without a GPU no table gains a CUDA kernel (so every op stays on the CPU). On a GPU: each CUDA kernel
// gives the CPU kernel's bits (the loss-scaling chain, fill, copies) and the device allocator counts its bytes.
// MIXTRAIN_REQUIRE_GPU=1 (scripts/gpu-check.sh) turns the GPU tests' skip into a failure.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "mixtrain/core/allocator.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/loss_scale.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops {
namespace {

bool gpu_required() {
  const char* v = std::getenv("MIXTRAIN_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

// Skips (or fails, when a GPU is required) unless the backend is loaded.
#define REQUIRE_CUDA_BACKEND()                                                       \
  do {                                                                               \
    const CudaBackendStatus s_ = load_cuda_backend();                                \
    if (!s_.loaded) {                                                                \
      if (gpu_required()) FAIL() << "MIXTRAIN_REQUIRE_GPU=1 but: " << s_.detail;     \
      GTEST_SKIP() << s_.detail;                                                     \
    }                                                                                \
  } while (0)

bool bit_equal(const Tensor& a, const Tensor& b) {
  const Tensor ha = to_device(a, Device::cpu()), hb = to_device(b, Device::cpu());
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

TEST(CudaBackend, StatusSaysWhatThisBuildAndMachineHave) {
  const CudaBackendStatus s = load_cuda_backend();
  EXPECT_FALSE(s.detail.empty());
  if (!s.loaded) {
    // Nothing was installed: ops on cuda tensors are refused by name, every op keeps running on the CPU.
    EXPECT_FALSE(kernel::unscale_check_table().supports(DeviceType::kCuda));
    EXPECT_FALSE(kernel::fill_table().supports(DeviceType::kCuda));
    EXPECT_THROW(Tensor::empty({4}, DType::kFloat32, Device::cuda(0)), Error);
    if (!s.compiled) {
      EXPECT_NE(s.detail.find("no CUDA backend"), std::string::npos) << s.detail;
    }
    if (gpu_required()) {
      ADD_FAILURE() << "MIXTRAIN_REQUIRE_GPU=1 but: " << s.detail;
    }
    return;
  }
  EXPECT_TRUE(s.compiled);
  EXPECT_GE(s.device_count, 1);
  EXPECT_TRUE(kernel::unscale_check_table().supports(DeviceType::kCuda));
  EXPECT_TRUE(kernel::update_loss_scale_table().supports(DeviceType::kCuda));
  EXPECT_FALSE(kernel::bmm_table().supports(DeviceType::kCuda));  // not in this backend yet
  EXPECT_EQ(load_cuda_backend().ops, s.ops);                      // installed once
}

TEST(CudaBackend, CopiesRoundTripAndTheAllocatorCounts) {
  REQUIRE_CUDA_BACKEND();
  const Device gpu = Device::cuda(0);
  const int64_t live = memory_stats(gpu).live_bytes;
  {
    const Tensor h = Tensor::from_floats({3, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, DType::kBFloat16);
    const Tensor d = to_device(h, gpu);
    EXPECT_EQ(d.device(), gpu);
    EXPECT_EQ(memory_stats(gpu).live_bytes, live + static_cast<int64_t>(h.nbytes()));
    EXPECT_TRUE(bit_equal(d, h));
    EXPECT_TRUE(bit_equal(to_device(h.transpose(0, 1), gpu), h.transpose(0, 1).contiguous()));
  }
  EXPECT_EQ(memory_stats(gpu).live_bytes, live);
}

TEST(CudaBackend, FillMatchesTheCpuInEveryFloatDtype) {
  REQUIRE_CUDA_BACKEND();
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t n : {1, 17, 70001}) {
      Tensor h = Tensor::empty({n}, dt);
      Tensor d = Tensor::empty({n}, dt, Device::cuda(0));
      fill(h, 0.1f);
      fill(d, 0.1f);
      EXPECT_TRUE(bit_equal(d, h)) << dtype_name(dt) << " n=" << n;
    }
  }
}

// The whole device-side step of a LossScaleOptimizer: unscale and check, the rule, the scaled loss seed.
TEST(CudaBackend, LossScaleChainGivesTheCpuBits) {
  REQUIRE_CUDA_BACKEND();
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t n : {1, 17, 129, 70001}) {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 101 - 50) * 3.0f;
      for (bool overflow : {false, true}) {
        if (overflow) v[static_cast<size_t>(n - 1)] = std::numeric_limits<float>::infinity();
        const Tensor scaled = Tensor::from_floats({n}, v, dt);
        const Tensor state = Tensor::from_floats({2}, {1024.0f, 1024.0f});
        Tensor h_flag = Tensor::zeros({1}, DType::kFloat32), h_out = Tensor::empty({n}, DType::kFloat32);
        unscale_and_check(scaled, state, h_flag, h_out);
        Tensor d_flag = to_device(Tensor::zeros({1}, DType::kFloat32), gpu);
        Tensor d_out = Tensor::empty({n}, DType::kFloat32, gpu);
        unscale_and_check(to_device(scaled, gpu), to_device(state, gpu), d_flag, d_out);
        EXPECT_TRUE(bit_equal(d_out, h_out)) << dtype_name(dt) << " n=" << n;
        EXPECT_TRUE(bit_equal(d_flag, h_flag)) << dtype_name(dt) << " n=" << n << " overflow=" << overflow;
      }
    }
  }

  LossScaleRule rule;
  rule.growth_steps = 2;
  rule.min_scale = 2.0f;
  rule.max_scale = 64.0f;
  rule.hysteresis = 2;
  rule.floor_alarm_steps = 2;
  Tensor h_state = Tensor::from_floats({2}, {8.0f, 8.0f});
  Tensor h_counters = Tensor::zeros({kLsNumCounters}, DType::kInt32);
  h_counters.data<int32_t>()[kLsHysteresisLeft] = 2;
  Tensor d_state = to_device(h_state, gpu), d_counters = to_device(h_counters, gpu);
  for (bool overflow : {false, false, false, true, true, true, true, true, true, false, false, false}) {
    const Tensor flag = Tensor::from_floats({1}, {overflow ? 1.0f : 0.0f});
    update_loss_scale(h_state, h_counters, flag, rule);
    update_loss_scale(d_state, d_counters, to_device(flag, gpu), rule);
    ASSERT_TRUE(bit_equal(d_state, h_state));
    ASSERT_TRUE(bit_equal(d_counters, h_counters));
  }

  const Tensor loss = Tensor::from_floats({3}, {2.5f, -1.0f, 60000.0f});
  EXPECT_TRUE(bit_equal(apply_loss_scale(to_device(loss, gpu), d_state), apply_loss_scale(loss, h_state)));
}

}  // namespace
}  // namespace mixtrain::ops
