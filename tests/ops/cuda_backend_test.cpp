// The CUDA backend behind the dispatch seam. Everywhere: load_cuda_backend() says what this build and machine
// have, and without a GPU no table gains a CUDA kernel (so every op stays on the CPU). On a GPU: each CUDA kernel
// gives the CPU kernel's bits (the loss-scaling chain, fill, copies, the elementwise ops but sigmoid and tanh, the
// reductions, layer normalization and the embedding lookup with their gradients) and the device allocator counts its
// bytes. The CNN ops' kernels (pooling, batch normalization, conv2d) are checked in cuda_cnn_test.cpp. The kernels whose arithmetic differs from the CPU's in
// summation order or in exp/log/tanh (softmax, cross-entropy, sigmoid, tanh, the cuBLASLt GEMM) are compared with
// dtype-aware tolerances written beside each check; the casts bit for bit.
// MIXTRAIN_REQUIRE_GPU=1 (scripts/gpu-check.sh) turns the GPU tests' skip into a failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mixtrain/ops/backend.h"
#include "mixtrain/core/allocator.h"
#include "mixtrain/ops/attention.h"
#include "cuda_test_util.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/embedding.h"
#include "mixtrain/ops/fused_update.h"
#include "mixtrain/ops/layer_norm.h"
#include "mixtrain/ops/loss_scale.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/reduce.h"
#include "mixtrain/ops/softmax.h"
#include "mixtrain/ops/transfer.h"
#include "op_test_util.h"
#ifdef MIXTRAIN_HAVE_CUDA
#include "ops/cuda/backend.h"  // the casts, which no op table carries
#endif

namespace mixtrain::ops {
namespace {

TEST(CudaBackend, StatusSaysWhatThisBuildAndMachineHave) {
  const CudaBackendStatus s = load_cuda_backend();
  EXPECT_FALSE(s.detail.empty());
  if (!s.loaded) {
    // Nothing was installed: ops on cuda tensors are refused by name, every op keeps running on the CPU.
    EXPECT_FALSE(ops::supports<ops::Op::unscale_and_check>(DeviceType::kCuda));
    EXPECT_FALSE(ops::supports<ops::Op::fill>(DeviceType::kCuda));
    EXPECT_FALSE(ops::supports<ops::Op::bmm>(DeviceType::kCuda));
    EXPECT_FALSE(ops::supports<ops::Op::softmax>(DeviceType::kCuda));
    EXPECT_FALSE(ops::supports<ops::Op::activation>(DeviceType::kCuda));
    EXPECT_FALSE(ops::supports<ops::Op::reduce_sum>(DeviceType::kCuda));
    EXPECT_FALSE(ops::supports<ops::Op::layer_norm>(DeviceType::kCuda));
    EXPECT_FALSE(ops::supports<ops::Op::embedding_backward>(DeviceType::kCuda));
    EXPECT_FALSE(ops::supports<ops::Op::fused_update>(DeviceType::kCuda));
    EXPECT_FALSE(ops::supports<ops::Op::mse>(DeviceType::kCuda));
    EXPECT_FALSE(ops::supports<ops::Op::attention>(DeviceType::kCuda));
    EXPECT_FALSE(ops::supports<ops::Op::cast>(DeviceType::kCuda));
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
  EXPECT_TRUE(ops::supports<ops::Op::unscale_and_check>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::update_loss_scale>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::mse>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::mse_backward>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::sum_all>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::accuracy>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::unscale_and_count_nonfinite>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::cast>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::softmax>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::crossentropy_backward>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::activation_backward>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::sum_rows>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::count_nonfinite>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::reduce_sum_backward>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::layer_norm>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::layer_norm_backward>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::embedding>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::embedding_backward>(DeviceType::kCuda));
  EXPECT_TRUE(ops::supports<ops::Op::fused_update>(DeviceType::kCuda));
  // matmul (the bmm table) needs cuBLASLt, loaded at run time: listed exactly when its kernel is installed, and the
  // detail says which library served it or why none did.
  const bool has_matmul = std::find(s.ops.begin(), s.ops.end(), "bmm") != s.ops.end();
  EXPECT_EQ(ops::supports<ops::Op::bmm>(DeviceType::kCuda), has_matmul);
  // attention's products are bmm's: installed with it.
  EXPECT_EQ(ops::supports<ops::Op::attention>(DeviceType::kCuda), has_matmul);
  EXPECT_EQ(ops::supports<ops::Op::attention_backward>(DeviceType::kCuda), has_matmul);
  EXPECT_NE(s.detail.find("matmul"), std::string::npos) << s.detail;
  EXPECT_EQ(load_cuda_backend().ops, s.ops);  // installed once
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

// Freed device memory stays reserved in blocks that split and merge (src/ops/cuda/block_pool.h): a tensor freed at
// a step's end serves smaller ones after it without another cudaMalloc, and each keeps its own bytes. Whatever
// earlier tests left free, the freed 300 MiB can hold both, so nothing more is reserved.
TEST(CudaBackend, AFreedTensorsMemoryServesSmallerTensorsWithoutReservingMore) {
  REQUIRE_CUDA_BACKEND();
  const Device gpu = Device::cuda(0);
  constexpr int64_t kMiB = int64_t{1} << 20;
  { const Tensor big = Tensor::empty({150 * kMiB}, DType::kFloat16, gpu); }  // 300 MiB, freed at once
  const MemoryStats before = memory_stats(gpu);
  EXPECT_GE(before.reserved_bytes, 300 * kMiB);
  EXPECT_GE(before.cached_bytes, 300 * kMiB);
  Tensor a = Tensor::empty({100 * kMiB}, DType::kFloat16, gpu);  // 200 MiB
  Tensor b = Tensor::empty({48 * kMiB}, DType::kFloat16, gpu);   // 96 MiB
  EXPECT_EQ(memory_stats(gpu).reserved_bytes, before.reserved_bytes) << "both came out of freed memory";
  EXPECT_LE(memory_stats(gpu).cached_bytes, before.cached_bytes - 296 * kMiB);
  fill(a, 1.0f);
  fill(b, 2.0f);
  EXPECT_TRUE(bit_equal(a, Tensor::full({100 * kMiB}, DType::kFloat16, 1.0f)));
  EXPECT_TRUE(bit_equal(b, Tensor::full({48 * kMiB}, DType::kFloat16, 2.0f)));
}

// A tensor larger than the GPU: the allocator's refusal is a MemoryLimitExceeded (what --batch-size auto's search
// counts as "too big"), and the device works on after it.
TEST(CudaBackend, ATensorLargerThanTheGpuIsAMemoryLimitExceeded) {
  REQUIRE_CUDA_BACKEND();
  const Device gpu = Device::cuda(0);
  const int64_t live = memory_stats(gpu).live_bytes;
  try {
    (void)Tensor::empty({int64_t{1} << 50}, DType::kUInt8, gpu);  // 1 PiB
    FAIL() << "allocated";
  } catch (const MemoryLimitExceeded& e) {
    EXPECT_NE(std::string(e.what()).find("out of GPU memory on cuda:0"), std::string::npos) << e.what();
    EXPECT_EQ(e.requested_bytes(), int64_t{1} << 50);
  }
  EXPECT_EQ(memory_stats(gpu).live_bytes, live);
  EXPECT_TRUE(bit_equal(to_device(Tensor::full({5}, DType::kFloat32, 3.0f), gpu), Tensor::full({5}, DType::kFloat32, 3.0f)));
  EXPECT_GT(ops::device_memory(gpu).total_bytes, int64_t{1} << 30);
  EXPECT_LE(ops::device_memory(gpu).free_bytes, ops::device_memory(gpu).total_bytes);
}

// Uploads larger than a pinned staging slot (8 MiB) go in slot-sized pieces, and more of them than the ring has
// slots (8) wrap round it: every byte arrives, in order, also when several such uploads are queued back to back.
TEST(CudaBackend, UploadsLargerThanTheStagingRingArriveWhole) {
  REQUIRE_CUDA_BACKEND();
  const Device gpu = Device::cuda(0);
  std::vector<Tensor> hosts, devices;
  for (int64_t n : {(int64_t{8} << 20) / 4 + 3, (int64_t{80} << 20) / 4 + 1, int64_t{1} << 20}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i % 100003) + 0.25f;
    hosts.push_back(Tensor::from_floats({n}, v, DType::kFloat32));
    devices.push_back(to_device(hosts.back(), gpu));  // queued; nothing read until below
  }
  for (size_t i = 0; i < hosts.size(); ++i) EXPECT_TRUE(bit_equal(devices[i], hosts[i])) << hosts[i].numel();
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

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::subnormal_step;
using testing::unit;

// Float32 differences from a different summation order, exp or log: a few dozen units of float32 rounding
// (the sums here run over at most a thousand terms).
constexpr double kFloat32Slack = 64 * 0x1p-24;

// |gpu - cpu| <= tol(i, cpu value) for every element (NaN must match NaN).
template <typename TolFn>
void expect_close(const Tensor& gpu, const Tensor& cpu, TolFn&& tol, const std::string& what) {
  const Tensor g = to_device(gpu, Device::cpu());
  ASSERT_EQ(g.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(g.shape(), cpu.shape()) << what;
  const std::vector<float> gv = g.to_floats(), cv = cpu.contiguous().to_floats();
  int reported = 0;
  for (size_t i = 0; i < cv.size(); ++i) {
    if (gv[i] == cv[i] || (std::isnan(cv[i]) && std::isnan(gv[i]))) continue;  // infinities compare equal
    const double t = tol(i, static_cast<double>(cv[i]));
    if (std::fabs(static_cast<double>(gv[i]) - cv[i]) <= t) continue;
    ADD_FAILURE() << what << ": element " << i << " gpu " << gv[i] << " cpu " << cv[i] << " tolerance " << t;
    if (++reported == 5) return;
  }
}

TEST(CudaBackend, CastsGiveTheCpuBitsBetweenEveryFloatDtype) {
  REQUIRE_CUDA_BACKEND();
#ifndef MIXTRAIN_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA backend";
#else
  // Float32 patterns that exercise every branch of the rounding: ties, subnormals, overflow, NaN payloads.
  std::vector<uint32_t> patterns = {0x00000000u, 0x80000000u, 0x3F800000u, 0x3F801000u, 0x3F802000u, 0x3F803000u,
                                    0x3F808000u, 0x3F818000u, 0x477FEFFFu, 0x477FF000u, 0x7F7FFFFFu, 0x7F800000u,
                                    0xFF800000u, 0x7FC00001u, 0x7F800001u, 0xFFA12345u, 0x33000000u, 0x33000001u,
                                    0x387FC000u, 0x00000001u, 0x807FFFFFu, 0x38800000u};
  for (uint32_t u = 0; u < 4000; ++u) patterns.push_back(u * 1073741u + 12345u);
  const int64_t n = static_cast<int64_t>(patterns.size());
  Tensor f32 = Tensor::empty({n}, DType::kFloat32);
  std::memcpy(f32.raw(), patterns.data(), f32.nbytes());
  const Device gpu = Device::cuda(0);
  for (DType from : kFloatDTypes) {
    const Tensor h_src = f32.to(from);  // every 16-bit source also seen as data
    const Tensor d_src = to_device(h_src, gpu);
    for (DType to : kFloatDTypes) {
      Tensor d_dst = Tensor::empty({n}, to, gpu);
      cuda::cast(d_src, d_dst);
      EXPECT_TRUE(bit_equal(d_dst, h_src.to(to))) << dtype_name(from) << " -> " << dtype_name(to);
    }
  }
#endif
}

// Tensor::contiguous, to and clone of GPU views go through the backend's strided copy (core's register_device_copy):
// the CPU's bits for every pair of floating dtypes, and int32 moved as it is.
TEST(CudaBackend, ViewsCompactAndConvertOnTheGpuWithTheCpuBits) {
  REQUIRE_CUDA_BACKEND();
  for (DType from : kFloatDTypes) {
    const Tensor host = random_tensor({5, 6, 7}, 71, from, -3.0f, 3.0f);
    const Tensor h_view = host.permute({2, 0, 1}).slice(2, 1, 5);
    const Tensor d_view = gpu(host).permute({2, 0, 1}).slice(2, 1, 5);
    ASSERT_FALSE(d_view.is_contiguous());
    const Tensor dense = d_view.contiguous();
    EXPECT_EQ(dense.device(), kGpu);
    EXPECT_TRUE(bit_equal(dense, h_view.contiguous())) << dtype_name(from);
    EXPECT_TRUE(bit_equal(d_view.clone(), h_view.clone())) << dtype_name(from);
    for (DType to : kFloatDTypes)
      EXPECT_TRUE(bit_equal(d_view.to(to).contiguous(), h_view.to(to).contiguous()))
          << dtype_name(from) << " -> " << dtype_name(to);
  }
  const Tensor ids = Tensor::from_ints({3, 4}, {1, -2, 3, 4, 5, 6, 7, 8, 9, 10, 11, -12});
  EXPECT_TRUE(bit_equal(gpu(ids).transpose(0, 1).contiguous(), ids.transpose(0, 1).contiguous()));
}

TEST(CudaBackend, SoftmaxAndItsGradientMatchTheCpu) {
  REQUIRE_CUDA_BACKEND();
  const Device gpu = Device::cuda(0);
  for (DType dt : kFloatDTypes) {
    // Rounding of the output dtype (either side may land on the neighbour), plus float32 slack.
    const double rel = 2 * unit(dt) + kFloat32Slack, floor = 2 * subnormal_step(dt);
    for (const Shape& shape : {Shape({1, 1}), Shape({3, 7}), Shape({5, 17}), Shape({2, 3, 129}), Shape({4, 1000})}) {
      const Tensor x = random_tensor(shape, 7 + static_cast<uint64_t>(shape.numel()), dt, -8.0f, 8.0f);
      const Tensor dy = random_tensor(shape, 9 + static_cast<uint64_t>(shape.numel()), dt);
      const Tensor x_gpu = to_device(x, gpu), dy_gpu = to_device(dy, gpu);
      for (bool log : {false, true}) {
        const std::string what = std::string(log ? "log_softmax " : "softmax ") + x.describe();
        const Tensor y = log ? log_softmax(x) : softmax(x);
        const Tensor y_gpu = log ? log_softmax(x_gpu) : softmax(x_gpu);
        // log-softmax is x - logsumexp(x): its error scales with the logits (|x| <= 8, logsumexp <= 8 + log n).
        expect_close(
            y_gpu, y, [&](size_t, double c) { return rel * (std::fabs(c) + (log ? 16.0 : 0.0)) + floor; }, what);
        const Tensor g = log ? log_softmax_backward(dy, y) : softmax_backward(dy, y);
        const Tensor y_on_gpu = to_device(y, gpu);  // the CPU's output, so both backwards read the same y
        const Tensor g_gpu = log ? log_softmax_backward(dy_gpu, y_on_gpu) : softmax_backward(dy_gpu, y_on_gpu);
        // dx = y (dy - sum(dy y)) or dy - exp(y) sum(dy): terms of size up to |dy| (<= 1) times the row length
        // for the log form's sum.
        const double scale = log ? static_cast<double>(shape[-1]) : 2.0;
        expect_close(
            g_gpu, g, [&](size_t, double c) { return rel * (std::fabs(c) + scale) + floor; }, what + " backward");
      }
    }
  }
}

TEST(CudaBackend, CrossentropyMatchesTheCpuInEveryForm) {
  REQUIRE_CUDA_BACKEND();
  const Device gpu = Device::cuda(0);
  for (DType dt : kFloatDTypes) {
    const double rel = 2 * unit(dt) + kFloat32Slack, floor = 2 * subnormal_step(dt);
    for (int64_t rows : {1, 7, 129}) {
      for (int64_t classes : {1, 17, 1000}) {
        const Tensor logits =
            random_tensor({rows, classes}, 3 + static_cast<uint64_t>(rows * classes), dt, -6.0f, 6.0f);
        const Tensor probs = softmax(logits);
        std::vector<int64_t> label(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) label[static_cast<size_t>(r)] = (r * 7 + 5) % classes;
        const Tensor labels64 = Tensor::from_int64s({rows}, label);
        const Tensor labels32 = labels64.to(DType::kInt32);
        const Tensor targets = random_tensor({rows, classes}, 5, DType::kFloat32, 0.0f, 1.0f);
        const float dloss = 1.5f;
        const double k = dloss / static_cast<double>(rows);
        for (bool from_logits : {true, false}) {
          const Tensor& x = from_logits ? logits : probs;
          const Tensor dxg = to_device(x, gpu);
          const std::string what = std::string(from_logits ? "logits " : "probabilities ") + dtype_name(dt) + " (" +
                                   std::to_string(rows) + ", " + std::to_string(classes) + ")";
          // The loss is float32 whatever x's dtype; both sides read the same rounded inputs.
          auto loss_tol = [&](size_t, double c) { return kFloat32Slack * (std::fabs(c) + 1.0); };
          // Gradients: k (p - t) or -k t / p, rounded into x's dtype.
          auto grad_tol = [&](size_t, double c) { return rel * (std::fabs(c) + k) + floor; };
          for (const Tensor* l : {&labels32, &labels64}) {
            const Tensor dl = to_device(*l, gpu);
            expect_close(sparse_categorical_crossentropy(dxg, dl, from_logits),
                         sparse_categorical_crossentropy(x, *l, from_logits), loss_tol,
                         "sparse " + what + " " + dtype_name(l->dtype()));
            expect_close(sparse_categorical_crossentropy_backward(dxg, dl, from_logits, dloss),
                         sparse_categorical_crossentropy_backward(x, *l, from_logits, dloss), grad_tol,
                         "sparse backward " + what);
          }
          const Tensor dt_gpu = to_device(targets, gpu);
          expect_close(categorical_crossentropy(dxg, dt_gpu, from_logits),
                       categorical_crossentropy(x, targets, from_logits), loss_tol, "dense " + what);
          // The dense gradient from logits is k (p sum(t) - t), sum(t) up to the class count.
          expect_close(
              categorical_crossentropy_backward(dxg, dt_gpu, from_logits, dloss),
              categorical_crossentropy_backward(x, targets, from_logits, dloss),
              [&](size_t, double c) { return rel * (std::fabs(c) + k * static_cast<double>(classes)) + floor; },
              "dense backward " + what);
        }
      }
    }
  }
  // A label outside [0, classes) on the device is found by the kernel, kept there, and named as the CPU entry names
  // it when the host next reads from the GPU (here the loss, which is NaN); the error is raised once.
  const Tensor x = to_device(random_tensor({3, 4}, 1, DType::kFloat32), gpu);
  const Tensor bad = to_device(Tensor::from_ints({3}, {0, 4, 1}), gpu);
  const Tensor loss = sparse_categorical_crossentropy(x, bad, true);  // queued: nothing read yet
  try {
    (void)read_scalar(loss);
    ADD_FAILURE() << "a label of 4 for 4 classes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 4 at row 1"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::isnan(read_scalar(loss)));  // the record was cleared by the first read
  // Found by a synchronization as well.
  (void)sparse_categorical_crossentropy(x, bad, true);
  EXPECT_THROW(synchronize(gpu), Error);
  synchronize(gpu);
}

// Bit for bit, except that NaNs compare equal whatever their payloads: x86 arithmetic passes an operand's NaN on,
// CUDA's arithmetic writes its canonical NaN.
bool same_bits_any_nan(const Tensor& gpu, const Tensor& cpu) {
  const Tensor g = to_device(gpu, Device::cpu());
  if (g.dtype() != cpu.dtype() || g.shape() != cpu.shape()) return false;
  const std::vector<float> gv = g.to_floats(), cv = cpu.contiguous().to_floats();
  for (size_t i = 0; i < gv.size(); ++i) {
    if (std::isnan(gv[i]) && std::isnan(cv[i])) continue;
    uint32_t a, b;
    std::memcpy(&a, &gv[i], sizeof a);
    std::memcpy(&b, &cv[i], sizeof b);
    if (a != b) return false;
  }
  return true;
}

// Activation inputs: a spread past GELU's clamp and both sigmoid branches, plus the values where the element
// steps branch (signed zeros, infinities, NaN, subnormals).
Tensor activation_inputs(const Shape& shape, uint64_t seed, DType dt) {
  std::vector<float> v = random_tensor(shape, seed, DType::kFloat32, -18.0f, 18.0f).to_floats();
  const float special[] = {0.0f, -0.0f, 1e-41f, -1e-41f, 15.0f, -15.0f, -90.0f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < v.size() && i < std::size(special); ++i) v[i * 7 % v.size()] = special[i];
  return Tensor::from_floats(shape, v, dt);
}

TEST(CudaBackend, ElementwiseOpsGiveTheCpuBits) {
  REQUIRE_CUDA_BACKEND();
  const Device gpu = Device::cuda(0);
  for (DType dt : kFloatDTypes) {
    for (const Shape& shape : {Shape({1}), Shape({7}), Shape({3, 17}), Shape({2, 3, 129}), Shape({70001})}) {
      const std::string what = std::string(dtype_name(dt)) + " " + shape.to_string();
      const Tensor x = activation_inputs(shape, 101 + static_cast<uint64_t>(shape.numel()), dt);
      const Tensor dy = random_tensor(shape, 103, dt, -2.0f, 2.0f);
      const Tensor x_gpu = to_device(x, gpu), dy_gpu = to_device(dy, gpu);
      for (Activation a : {Activation::kRelu, Activation::kGelu, Activation::kSigmoid, Activation::kTanh}) {
        const std::string name = std::string(activation_name(a)) + " " + what;
        const Tensor y = activation(x, a), y_gpu = activation(x_gpu, a);
        if (a == Activation::kRelu || a == Activation::kGelu) {
          EXPECT_TRUE(bit_equal(y_gpu, y)) << name;
        } else {
          // CUDA's expf and tanhf are within 2 float32 units, glibc's within 1; sigmoid's 1 / (1 + e) carries e's
          // error at most once more, so 8 units of float32 cover both sides, then one rounding into dt each.
          const double rel = 2 * unit(dt) + 8 * 0x1p-24, floor = 4 * subnormal_step(dt);
          expect_close(y_gpu, y, [&](size_t, double c) { return rel * std::fabs(c) + floor; }, name);
        }
        // The backward reads the CPU's saved output, so both sides see the same inputs: bit for bit.
        const Tensor y_on_gpu = to_device(y, gpu);
        EXPECT_TRUE(
            same_bits_any_nan(activation_backward(dy_gpu, x_gpu, y_on_gpu, a), activation_backward(dy, x, y, a)))
            << name << " backward";
      }
      const Tensor b = random_tensor(shape, 107, DType::kFloat32, -3.0f, 3.0f);
      const Tensor b_gpu = to_device(b, gpu);
      EXPECT_TRUE(same_bits_any_nan(add(x_gpu, dy_gpu), add(x, dy))) << "add " << what;
      EXPECT_TRUE(same_bits_any_nan(add(x_gpu, b_gpu), add(x, b))) << "add float32 " << what;
      Tensor acc = dy.clone(), acc_gpu = to_device(dy, gpu);
      add_into(acc, b);
      add_into(acc_gpu, b_gpu);
      EXPECT_TRUE(bit_equal(acc_gpu, acc)) << "add_into " << what;
      EXPECT_TRUE(same_bits_any_nan(scale(x_gpu, 0.37f), scale(x, 0.37f))) << "scale " << what;
      for (DType bias_dt : {dt, DType::kFloat32}) {
        const Tensor bias = random_tensor({shape[-1]}, 109, bias_dt, -5.0f, 5.0f);
        EXPECT_TRUE(bit_equal(bias_add(dy_gpu, to_device(bias, gpu)), bias_add(dy, bias)))
            << "bias_add " << dtype_name(bias_dt) << " " << what;
      }
      Tensor mask = Tensor::empty(shape, DType::kUInt8);
      for (int64_t i = 0; i < mask.numel(); ++i) mask.data<uint8_t>()[i] = (i * 13 + 2) % 5 < 3;
      const Tensor mask_gpu = to_device(mask, gpu);
      EXPECT_TRUE(bit_equal(dropout(dy_gpu, mask_gpu, 0.4f), dropout(dy, mask, 0.4f))) << "dropout " << what;
      EXPECT_TRUE(bit_equal(dropout_backward(dy_gpu, mask_gpu, 0.4f), dropout_backward(dy, mask, 0.4f)))
          << "dropout_backward " << what;
      EXPECT_EQ(count_nonfinite(x_gpu), count_nonfinite(x)) << "count_nonfinite " << what;
      const Tensor drawn = dropout_mask(shape, 0.3f, 99, gpu);
      EXPECT_EQ(drawn.device(), gpu);
      EXPECT_TRUE(bit_equal(drawn, dropout_mask(shape, 0.3f, 99, Device::cpu()))) << "dropout_mask " << what;
    }
  }
}

// Each GPU sum is one thread adding in the CPU's order, so the reductions agree bit for bit too.
TEST(CudaBackend, ReductionsGiveTheCpuBits) {
  REQUIRE_CUDA_BACKEND();
  const Device gpu = Device::cuda(0);
  for (DType dt : kFloatDTypes) {
    for (const Shape& shape : {Shape({1}), Shape({7, 1}), Shape({5, 17, 9}), Shape({3, 129, 31}), Shape({4, 20000})}) {
      const std::string what = std::string(dtype_name(dt)) + " " + shape.to_string();
      // Terms of mixed magnitudes, so that any other summation order shows in the bits.
      std::vector<float> v = random_tensor(shape, 113, DType::kFloat32).to_floats();
      for (size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], static_cast<int>(i * 7 % 23) - 11);
      const Tensor x = Tensor::from_floats(shape, v, dt), x_gpu = to_device(x, gpu);
      EXPECT_TRUE(bit_equal(sum_rows(x_gpu), sum_rows(x))) << "sum_rows " << what;
      for (int axis = -shape.rank(); axis < shape.rank(); ++axis) {
        for (bool keepdims : {false, true}) {
          for (DType out : {dt, DType::kFloat32}) {
            const std::string which = what + " axis " + std::to_string(axis) + " keepdims " +
                                      std::to_string(keepdims) + " -> " + dtype_name(out);
            const Tensor y = reduce_sum(x, axis, keepdims, out);
            EXPECT_TRUE(bit_equal(reduce_sum(x_gpu, axis, keepdims, out), y)) << "reduce_sum " << which;
            const Tensor dy = random_tensor(y.shape(), 127, out);
            EXPECT_TRUE(bit_equal(reduce_sum_backward(to_device(dy, gpu), x_gpu, axis, keepdims),
                                  reduce_sum_backward(dy, x, axis, keepdims)))
                << "reduce_sum_backward " << which;
          }
        }
      }
    }
    // Every inf and NaN counted, in a tensor long enough for many blocks.
    std::vector<float> v(300000, 1.0f);
    for (size_t i = 0; i < v.size(); i += 977) v[i] = i % 2 ? std::numeric_limits<float>::quiet_NaN()
                                                            : -std::numeric_limits<float>::infinity();
    v[5] = 1e38f;  // infinity in float16 only
    const Tensor x = Tensor::from_floats({300000}, v, dt);
    EXPECT_EQ(count_nonfinite(to_device(x, gpu)), count_nonfinite(x)) << dtype_name(dt);
    EXPECT_FALSE(all_finite({to_device(x, gpu)})) << dtype_name(dt);
    EXPECT_TRUE(all_finite({to_device(Tensor::zeros({70001}, dt), gpu)})) << dtype_name(dt);
  }
}

// Every sum of these kernels runs in the CPU's order (ops/shared/layer_norm_row.h, one lane per row sum, the column
// sums in the CPU's blocks of rows), so they agree bit for bit; NaN-free inputs, so no payload question arises.
TEST(CudaBackend, LayerNormAndItsGradientGiveTheCpuBits) {
  REQUIRE_CUDA_BACKEND();
  const Device gpu = Device::cuda(0);
  constexpr float kEps = 1e-3f;
  for (DType dt : kFloatDTypes) {
    for (const Shape& shape : {Shape({1, 1}), Shape({3, 7}), Shape({5, 17}), Shape({2, 3, 129}), Shape({130, 31}),
                               Shape({4, 1000}), Shape({300, 64}), Shape({0, 5})}) {
      const int64_t d = shape[-1];
      // Terms of mixed magnitudes around an offset, so that another summation order shows in the bits.
      std::vector<float> xv =
          random_tensor(shape, 131 + static_cast<uint64_t>(shape.numel()), DType::kFloat32).to_floats();
      for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::ldexp(xv[i], static_cast<int>(i * 7 % 23) - 11) + 100.0f;
      const Tensor x = Tensor::from_floats(shape, xv, dt);
      const Tensor gamma = random_tensor({d}, 137, DType::kFloat32, 0.5f, 1.5f);
      const Tensor beta = random_tensor({d}, 139, DType::kFloat32);
      const Tensor x_gpu = to_device(x, gpu), gamma_gpu = to_device(gamma, gpu), beta_gpu = to_device(beta, gpu);
      const LayerNormOutput want = layer_norm(x, gamma, beta, kEps);
      const LayerNormOutput got = layer_norm(x_gpu, gamma_gpu, beta_gpu, kEps);
      const std::string what = std::string(dtype_name(dt)) + " " + shape.to_string();
      EXPECT_TRUE(bit_equal(got.y, want.y)) << "layer_norm " << what;
      EXPECT_TRUE(bit_equal(got.mean, want.mean)) << "layer_norm mean " << what;
      EXPECT_TRUE(bit_equal(got.rstd, want.rstd)) << "layer_norm rstd " << what;
      for (DType dy_dt : {dt, DType::kFloat32}) {
        const Tensor dy = random_tensor(shape, 149, dy_dt);
        const Tensor dy_gpu = to_device(dy, gpu);
        // Both backwards read the CPU's statistics, so they see the same inputs.
        const Tensor mean_gpu = to_device(want.mean, gpu), rstd_gpu = to_device(want.rstd, gpu);
        for (bool need_x : {true, false}) {
          const std::string which = what + " dy " + dtype_name(dy_dt) + (need_x ? "" : " without dx");
          const LayerNormGrads g = layer_norm_backward(dy, x, want.mean, want.rstd, gamma, need_x);
          const LayerNormGrads g_gpu = layer_norm_backward(dy_gpu, x_gpu, mean_gpu, rstd_gpu, gamma_gpu, need_x);
          if (need_x) {
            EXPECT_TRUE(bit_equal(g_gpu.dx, g.dx)) << "layer_norm_backward dx " << which;
          }
          EXPECT_EQ(g_gpu.dx.defined(), need_x) << which;
          EXPECT_TRUE(bit_equal(g_gpu.dgamma, g.dgamma)) << "layer_norm_backward dgamma " << which;
          EXPECT_TRUE(bit_equal(g_gpu.dbeta, g.dbeta)) << "layer_norm_backward dbeta " << which;
        }
      }
    }
  }
}

// The gather copies or rounds once; the scatter-add sums each table row's positions from +0 in position order,
// as the CPU does: bit for bit, NaN payloads included (a copy, or core's rounding rule, moves no payload).
TEST(CudaBackend, EmbeddingAndItsGradientGiveTheCpuBits) {
  REQUIRE_CUDA_BACKEND();
  const Device gpu = Device::cuda(0);
  for (int64_t input_dim : {1, 13, 1000}) {
    for (int64_t out_dim : {1, 7, 33, 129}) {
      std::vector<float> tv = random_tensor({input_dim, out_dim}, 151, DType::kFloat32, -3.0f, 3.0f).to_floats();
      tv[0] = -0.0f;
      tv[tv.size() - 1] = std::numeric_limits<float>::quiet_NaN();
      for (const Shape& ids_shape : {Shape({1}), Shape({17}), Shape({4, 33}), Shape({2, 3, 129})}) {
        // Ids drawn from the first half of the table: many repeat, some rows are never named.
        std::vector<int64_t> id(static_cast<size_t>(ids_shape.numel()));
        Rng rng(157 + static_cast<uint64_t>(id.size() + input_dim));
        for (int64_t& v : id) v = static_cast<int64_t>(rng.below(static_cast<uint64_t>((input_dim + 1) / 2)));
        for (DType id_dt : {DType::kInt32, DType::kInt64}) {
          const Tensor ids = id_dt == DType::kInt64
                                 ? Tensor::from_int64s(ids_shape, id)
                                 : Tensor::from_ints(ids_shape, std::vector<int32_t>(id.begin(), id.end()));
          const Tensor ids_gpu = to_device(ids, gpu);
          const std::string what = "ids " + std::string(dtype_name(id_dt)) + " " + ids_shape.to_string() + " table (" +
                                   std::to_string(input_dim) + ", " + std::to_string(out_dim) + ")";
          for (DType table_dt : kFloatDTypes) {
            const Tensor table = Tensor::from_floats({input_dim, out_dim}, tv, table_dt);
            const Tensor table_gpu = to_device(table, gpu);
            for (DType out_dt : kFloatDTypes)
              EXPECT_TRUE(bit_equal(embedding(ids_gpu, table_gpu, out_dt), embedding(ids, table, out_dt)))
                  << "embedding " << what << " " << dtype_name(table_dt) << " -> " << dtype_name(out_dt);
          }
          std::vector<int64_t> dy_shape = ids_shape.dims();
          dy_shape.push_back(out_dim);
          for (DType dy_dt : kFloatDTypes) {
            // Mixed magnitudes, so that another summation order shows in the bits.
            std::vector<float> gv = random_tensor(Shape(dy_shape), 163, DType::kFloat32).to_floats();
            for (size_t i = 0; i < gv.size(); ++i) gv[i] = std::ldexp(gv[i], static_cast<int>(i * 7 % 23) - 11);
            const Tensor dy = Tensor::from_floats(Shape(dy_shape), gv, dy_dt);
            EXPECT_TRUE(bit_equal(embedding_backward(to_device(dy, gpu), ids_gpu, input_dim),
                                  embedding_backward(dy, ids, input_dim)))
                << "embedding_backward " << what << " dy " << dtype_name(dy_dt);
          }
        }
      }
    }
  }
  // Batches as training makes them (64 x 4097 positions, many repeats, a 50,000-row table): the backward's sort
  // then spans many blocks.
  {
    const int64_t rows = 50000, d = 7;
    std::vector<int64_t> id(64 * 4097);
    Rng rng(171);
    for (int64_t& v : id)
      v = static_cast<int64_t>(rng.below(rng.below(4) == 0 ? static_cast<uint64_t>(rows) : uint64_t{300}));
    const Tensor ids = Tensor::from_int64s({64, 4097}, id);
    const Tensor dy = random_tensor({64, 4097, d}, 173, DType::kBFloat16);
    EXPECT_TRUE(bit_equal(embedding_backward(to_device(dy, gpu), to_device(ids, gpu), rows),
                          embedding_backward(dy, ids, rows)))
        << "embedding_backward of 64 x 4097 positions";
  }
  // An id outside [0, input_dim) on the device is found by the kernel, kept on the device (the call reads nothing
  // back), and named as the CPU entry names it (the first bad position) at the host's next read from that GPU;
  // the read after that is clean again. The bad positions' output rows are NaN meanwhile, and their gradients are
  // left out of the table's: it is the CPU's table of the good positions alone.
  const Tensor table = to_device(random_tensor({10, 3}, 167, DType::kFloat32), gpu);
  const Tensor bad_dy = random_tensor({2, 3, 3}, 169, DType::kFloat32);
  std::vector<float> good_dy = bad_dy.to_floats();
  for (size_t i : {size_t{2}, size_t{4}})
    for (size_t j = 0; j < 3; ++j) good_dy[i * 3 + j] = 0.0f;  // the bad positions' rows, added as +0 to row 0
  const Tensor want_table = embedding_backward(Tensor::from_floats({2, 3, 3}, good_dy, DType::kFloat32),
                                               Tensor::from_int64s({2, 3}, {0, 3, 0, 9, 0, 1}), 10);
  for (int64_t bad : {int64_t{10}, int64_t{-1}, int64_t{1000}}) {
    for (DType id_dt : {DType::kInt32, DType::kInt64}) {
      const Tensor ids = to_device(Tensor::from_int64s({2, 3}, {0, 3, bad, 9, bad, 1}).to(id_dt), gpu);
      for (bool backward : {false, true}) {
        const Tensor out = backward ? embedding_backward(to_device(bad_dy, gpu), ids, 10)
                                    : embedding(ids, table, DType::kFloat32);
        try {
          (void)to_device(out, Device::cpu());
          ADD_FAILURE() << "id " << bad << " was accepted (backward " << backward << ")";
        } catch (const Error& e) {
          const std::string m = e.message();
          EXPECT_NE(m.find("id " + std::to_string(bad) + " at position 2"), std::string::npos) << m;
          EXPECT_NE(m.find("input_dim 10"), std::string::npos) << m;
          EXPECT_NE(m.find(backward ? "embedding_backward:" : "embedding:"), std::string::npos) << m;
        }
        const std::vector<float> v = to_device(out, Device::cpu()).to_floats();  // the error was raised once
        if (!backward) {
          EXPECT_TRUE(std::isnan(v[6]) && std::isnan(v[12])) << "the bad positions' rows";
          EXPECT_FALSE(std::isnan(v[0]) || std::isnan(v[3]) || std::isnan(v[9])) << "the good positions' rows";
        } else {
          EXPECT_TRUE(bit_equal(to_device(out, Device::cpu()), want_table)) << "the good positions' gradients, id " << bad;
        }
      }
    }
  }
  // No ids: an empty output, and a zero gradient table.
  const Tensor none = to_device(Tensor::from_ints({0}, {}), gpu);
  EXPECT_EQ(embedding(none, table, DType::kFloat16).shape(), Shape({0, 3}));
  EXPECT_TRUE(bit_equal(embedding_backward(to_device(Tensor::zeros({0, 3}, DType::kFloat32), gpu), none, 10),
                        Tensor::zeros({10, 3}, DType::kFloat32)));
}

// Sum over the product's terms of |a| |b| per element of C (float64), the scale of its accumulation error.
std::vector<double> magnitude_product(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const Tensor a2 = ta ? a.transpose(-2, -1).contiguous() : a.contiguous();
  const Tensor b2 = tb ? b.transpose(-2, -1).contiguous() : b.contiguous();
  const int64_t m = a2.dim(-2), k = a2.dim(-1), n = b2.dim(-1);
  const std::vector<float> av = a2.to_floats(), bv = b2.to_floats();
  std::vector<double> out(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j)
        out[static_cast<size_t>(i * n + j)] += std::fabs(static_cast<double>(av[static_cast<size_t>(i * k + p)])) *
                                               std::fabs(bv[static_cast<size_t>(p * n + j)]);
  return out;
}

TEST(CudaBackend, MatmulMatchesTheCpuForEveryDtypeAndTranspose) {
  REQUIRE_CUDA_BACKEND();
  if (!ops::supports<ops::Op::bmm>(DeviceType::kCuda)) {
    if (gpu_required()) FAIL() << "MIXTRAIN_REQUIRE_GPU=1 but: " << load_cuda_backend().detail;
    GTEST_SKIP() << load_cuda_backend().detail;
  }
  const Device gpu = Device::cuda(0);
  struct Case {
    int64_t m, k, n;
  };
  for (DType dt : kFloatDTypes) {
    for (const Case& cs : {Case{1, 1, 1}, Case{7, 129, 17}, Case{31, 7, 1}, Case{65, 300, 33}}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const Tensor a = random_tensor(ta ? Shape({cs.k, cs.m}) : Shape({cs.m, cs.k}), 17, dt);
          const Tensor b = random_tensor(tb ? Shape({cs.n, cs.k}) : Shape({cs.k, cs.n}), 19, dt);
          const std::vector<double> mag = magnitude_product(a, b, ta, tb);
          for (DType out : {dt, DType::kFloat32, DType::kFloat16}) {
            // Both sides sum k float32 products in their own order: each within k units of float32 of sum |a||b|
            // (TF32 is off unless MIXTRAIN_CUDA_TF32=1); then one rounding into the output dtype each.
            auto tol = [&](size_t i, double c) {
              return 2 * unit(out) * std::fabs(c) + 2.0 * static_cast<double>(cs.k) * 0x1p-24 * mag[i] +
                     2 * subnormal_step(out);
            };
            const std::string what = std::string(dtype_name(dt)) + " -> " + dtype_name(out) +
                                     " m=" + std::to_string(cs.m) + " k=" + std::to_string(cs.k) +
                                     " n=" + std::to_string(cs.n) + " trans_a=" + std::to_string(ta) +
                                     " trans_b=" + std::to_string(tb);
            expect_close(matmul(to_device(a, gpu), to_device(b, gpu), ta, tb, out), matmul(a, b, ta, tb, out), tol,
                         what);
          }
        }
      }
    }
  }
}

TEST(CudaBackend, BatchedMatmulBroadcastsAndReadsTransposedViewsInPlace) {
  REQUIRE_CUDA_GEMM();
  const Device gpu = Device::cuda(0);
  for (DType dt : kFloatDTypes) {
    const double rel = 2 * unit(dt), acc = 2.0 * 33 * 0x1p-24 * 33;  // k = 33 products of |values| <= 1
    auto tol = [&](size_t, double c) { return rel * std::fabs(c) + acc + 2 * subnormal_step(dt); };
    // (3, 2, 5, 33) x (33, 9): b broadcast over both batch dimensions.
    const Tensor a = random_tensor({3, 2, 5, 33}, 23, dt), b = random_tensor({33, 9}, 29, dt);
    expect_close(matmul(to_device(a, gpu), to_device(b, gpu)), matmul(a, b), tol,
                 std::string("broadcast ") + dtype_name(dt));
    // (3, 1, 5, 33) x (2, 33, 9): each operand broadcast along a different dimension (a host loop outside).
    const Tensor a1 = random_tensor({3, 1, 5, 33}, 31, dt), b1 = random_tensor({2, 33, 9}, 37, dt);
    expect_close(bmm(to_device(a1, gpu), to_device(b1, gpu)), bmm(a1, b1), tol,
                 std::string("cross broadcast ") + dtype_name(dt));
    // A transposed view, read in place on both devices.
    const Tensor bt = random_tensor({2, 9, 33}, 41, dt);
    expect_close(bmm(to_device(a1, gpu), to_device(bt, gpu).transpose(-2, -1)), bmm(a1, bt.transpose(-2, -1)), tol,
                 std::string("transposed view ") + dtype_name(dt));
    // A view at an odd element offset with an odd row stride (2-byte aligned in a 16-bit dtype), read in place: by
    // cuBLASLt, or by the backend's own kernel where it offers no algorithm (cuda_gemm_fallback_test.cpp).
    const Tensor wide = random_tensor({3, 1, 5, 35}, 43, dt);
    expect_close(bmm(to_device(wide, gpu).slice(-1, 1, 34), to_device(b1, gpu)), bmm(wide.slice(-1, 1, 34), b1), tol,
                 std::string("odd offset view ") + dtype_name(dt));
  }
}

// Beside a 16-bit output cuBLASLt's epilogue reads the bias in the output's dtype (its documented rule,
// gemm_bias_dtype in src/ops/cuda/gemm_plan_cache.h), so the GPU adds the bias rounded to it: up to unit(dt) |bias|
// more than the CPU, which adds the float32 bias. Beside a float32 output the bias is float32 on both.
double bias_rounding(DType dt, const std::vector<float>& bias, size_t i) {
  return dt == DType::kFloat32 ? 0.0 : unit(dt) * std::fabs(bias[i % bias.size()]);
}

TEST(CudaBackend, LinearAddsItsFloat32BiasBeforeTheOneRounding) {
  REQUIRE_CUDA_GEMM();
  const Device gpu = Device::cuda(0);
  for (DType dt : kFloatDTypes) {
    for (int64_t in : {1, 17, 129}) {
      const Tensor x = random_tensor({2, 7, in}, 43, dt), w = random_tensor({in, 31}, 47, dt);
      const Tensor bias = random_tensor({31}, 53, DType::kFloat32, -4.0f, 4.0f);
      const std::vector<float> bv = bias.to_floats();
      const double acc = 2.0 * static_cast<double>(in) * 0x1p-24 * static_cast<double>(in);
      expect_close(
          linear(to_device(x, gpu), to_device(w, gpu), to_device(bias, gpu)), linear(x, w, bias),
          [&](size_t i, double c) {
            return 2 * unit(dt) * std::fabs(c) + acc + 2 * subnormal_step(dt) + bias_rounding(dt, bv, i);
          },
          std::string("linear ") + dtype_name(dt) + " in=" + std::to_string(in));
      // Without a bias.
      expect_close(
          linear(to_device(x, gpu), to_device(w, gpu), Tensor()), linear(x, w, Tensor()),
          [&](size_t, double c) { return 2 * unit(dt) * std::fabs(c) + acc + 2 * subnormal_step(dt); },
          std::string("linear without bias ") + dtype_name(dt));
    }
    // An empty inner dimension: C is zeros (cuBLASLt is not asked; a kernel writes them).
    const Tensor x0 = Tensor::empty({4, 0}, dt), w0 = Tensor::empty({0, 6}, dt);
    EXPECT_TRUE(bit_equal(matmul(to_device(x0, gpu), to_device(w0, gpu)), matmul(x0, w0))) << dtype_name(dt);
  }
}

// The Dense layer's product and activation on the GPU: ReLU inside the product (cuBLASLt's RELU / RELU_BIAS epilogue,
// max(., 0) before the one rounding), GELU and a kept pre-activation as the product then the activation kernel.
// Against the CPU's fused kernel, with the tolerance of the product (both activations move a value by at most
// about as much as their input moved), and against the unfused ops on the same GPU.
TEST(CudaBackend, DenseActivationsRunWithTheProductAsLinearThenActivationWould) {
  REQUIRE_CUDA_GEMM();
  ASSERT_TRUE(ops::supports<ops::Op::linear_activation>(DeviceType::kCuda));
  for (DType dt : kFloatDTypes) {
    for (int64_t in : {17, 129}) {
      const Tensor x = random_tensor({2, 7, in}, 61, dt), w = random_tensor({in, 32}, 67, dt);
      const Tensor bias = random_tensor({32}, 71, DType::kFloat32, -1.0f, 1.0f);
      const std::vector<float> bv = bias.to_floats();
      const double acc = 2.0 * static_cast<double>(in) * 0x1p-24 * static_cast<double>(in);
      // (Without a bias the bias term only widens the bound by at most unit(dt) per element.)
      const auto tol = [&](size_t i, double c) {
        return 2.5 * (2 * unit(dt) * std::fabs(c) + acc + 2 * subnormal_step(dt) + bias_rounding(dt, bv, i));
      };
      for (Activation act : {Activation::kRelu, Activation::kGelu}) {
        for (bool keep : {false, true}) {
          for (bool with_bias : {false, true}) {
            const Tensor b = with_bias ? bias : Tensor();
            const std::string what = std::string(act == Activation::kRelu ? "relu " : "gelu ") + dtype_name(dt) +
                                     " in=" + std::to_string(in) + (keep ? " keeping the pre-activation" : "") +
                                     (with_bias ? " with bias" : "");
            const LinearActivation on_gpu = linear_activation(gpu(x), gpu(w), gpu(b), act, keep);
            const LinearActivation on_cpu = linear_activation(x, w, b, act, keep);
            expect_close(on_gpu.y, on_cpu.y, tol, what);
            EXPECT_EQ(on_gpu.pre_activation.defined(), keep) << what;
            if (keep) expect_close(on_gpu.pre_activation, on_cpu.pre_activation, tol, what + " (pre-activation)");
            // The unfused ops on the same GPU: the same values within the products' orders.
            expect_close(on_gpu.y, to_device(activation(linear(gpu(x), gpu(w), gpu(b)), act), Device::cpu()), tol,
                         what + " against linear then activation on the GPU");
            if (act == Activation::kRelu) {
              const std::vector<float> y = to_device(on_gpu.y, Device::cpu()).to_floats();
              EXPECT_TRUE(std::none_of(y.begin(), y.end(), [](float v) { return v < 0; })) << what;
            }
          }
        }
      }
    }
  }
}

// A non-finite input row: whatever ReLU's epilogue makes of a NaN product, the layer's weight gradient is not
// finite, so a loss-scaled step that met it is skipped (the loss-scale optimizer's check).
TEST(CudaBackend, ANonFiniteInputToTheFusedReluStillGivesANonFiniteWeightGradient) {
  REQUIRE_CUDA_GEMM();
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<float> xv = random_tensor({4, 16}, 73, DType::kFloat32).to_floats();
    xv[5] = std::numeric_limits<float>::quiet_NaN();  // row 0's products are NaN: relu() passes them, the epilogue may not
    const Tensor x = Tensor::from_floats({4, 16}, xv, dt), w = random_tensor({16, 8}, 79, dt);
    const Tensor bias = random_tensor({8}, 83, DType::kFloat32);
    const std::vector<float> bv = bias.to_floats();
    const LinearActivation r = linear_activation(gpu(x), gpu(w), gpu(bias), Activation::kRelu, false);
    // Rows 1 to 3 are the CPU's within the product's order (and the bias's rounding to dt).
    const LinearActivation c = linear_activation(x, w, bias, Activation::kRelu, false);
    expect_close(r.y.slice(0, 1, 4).contiguous(), c.y.slice(0, 1, 4).contiguous(),
                 [&](size_t i, double v) {
                   return 2 * unit(dt) * std::fabs(v) + 32 * 0x1p-24 * 16 + 2 * subnormal_step(dt) +
                          bias_rounding(dt, bv, i);
                 },
                 std::string("finite rows ") + dtype_name(dt));
    const Tensor dy = Tensor::full({4, 8}, dt, 1.0f);
    const LinearGrads g = linear_activation_backward(gpu(dy), gpu(x), gpu(w), r.y, Tensor(), Activation::kRelu,
                                                     /*need_x=*/true, /*need_bias=*/true);
    EXPECT_GT(count_nonfinite(g.dw), 0) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace mixtrain::ops
