// The CUDA kernels of the mean squared error and its gradient, sum / mean, the regularization penalty and its
// gradient, the global norm, the sparse categorical accuracy and the unscale with a count, against the CPU kernels.
// The gradients, the accuracy and the unscale give the CPU's bits; the totals add the CPU's double terms in another
// fixed order, which moves the float32 result by at most one unit (the tolerance beside the check). Skips without a
// GPU (MIXTRAIN_REQUIRE_GPU=1, set by scripts/gpu-check.sh, makes the skip a failure).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/core/random.h"
#include "mixtrain/ops/global_norm.h"
#include "mixtrain/ops/loss_scale.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/transfer.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;

// A float32 scalar from either device.
float scalar(const Tensor& t) { return to_device(t, Device::cpu()).to_floats()[0]; }

// Within one float32 unit of the CPU's value: both round a double total once, the totals differing in the
// double's last places only.
void expect_within_a_unit(float got, float want, const std::string& what) {
  if (got == want || (std::isnan(got) && std::isnan(want))) return;
  EXPECT_LE(std::fabs(static_cast<double>(got) - want), std::fabs(static_cast<double>(want)) * 0x1p-23)
      << what << ": gpu " << got << " cpu " << want;
}

TEST(CudaBackend, MeanSquaredErrorAndItsGradientMatchTheCpu) {
  REQUIRE_CUDA_BACKEND();
  for (DType dt : kFloatDTypes) {
    for (const Shape& shape : {Shape({1}), Shape({7, 3}), Shape({17, 31}), Shape({2, 129, 5}), Shape({300001})}) {
      const std::string what = std::string(dtype_name(dt)) + " " + shape.to_string();
      const Tensor p = random_tensor(shape, 3 + static_cast<uint64_t>(shape.numel()), dt, -50.0f, 50.0f);
      const Tensor t = random_tensor(shape, 5 + static_cast<uint64_t>(shape.numel()), dt, -50.0f, 50.0f);
      const Tensor loss = mean_squared_error(gpu(p), gpu(t));
      EXPECT_EQ(loss.device(), kGpu);
      expect_within_a_unit(scalar(loss), scalar(mean_squared_error(p, t)), "mse " + what);
      for (float dloss : {1.0f, -0.25f}) {
        EXPECT_TRUE(bit_equal(mean_squared_error_backward(gpu(p), gpu(t), dloss), mean_squared_error_backward(p, t, dloss)))
            << "mse backward " << what << " dloss " << dloss;
      }
    }
    // A float32 target for a 16-bit prediction, and an empty pair (loss 0).
    const Tensor p = random_tensor({9, 4}, 7, dt), t = random_tensor({9, 4}, 8, DType::kFloat32);
    expect_within_a_unit(scalar(mean_squared_error(gpu(p), gpu(t))), scalar(mean_squared_error(p, t)),
                         std::string("mixed dtypes ") + dtype_name(dt));
    EXPECT_TRUE(bit_equal(mean_squared_error_backward(gpu(p), gpu(t), 2.0f), mean_squared_error_backward(p, t, 2.0f)));
    const Tensor e = Tensor::empty({0, 3}, dt);
    EXPECT_EQ(scalar(mean_squared_error(gpu(e), gpu(e))), 0.0f);
  }
}

TEST(CudaBackend, SumAndMeanMatchTheCpu) {
  REQUIRE_CUDA_BACKEND();
  for (DType dt : kFloatDTypes) {
    for (const Shape& shape : {Shape({1}), Shape({5, 17}), Shape({3, 129, 31}), Shape({1000003})}) {
      const std::string what = std::string(dtype_name(dt)) + " " + shape.to_string();
      // Mixed magnitudes and signs: cancellation, where a float32 sum would lose the small terms.
      std::vector<float> v = random_tensor(shape, 11, DType::kFloat32).to_floats();
      for (size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], static_cast<int>(i * 7 % 23) - 11);
      const Tensor x = Tensor::from_floats(shape, v, dt);
      expect_within_a_unit(scalar(sum(gpu(x))), scalar(sum(x)), "sum " + what);
      expect_within_a_unit(scalar(mean(gpu(x))), scalar(mean(x)), "mean " + what);
      EXPECT_TRUE(bit_equal(mean_backward(gpu(x), 0.5f), mean_backward(x, 0.5f))) << what;
    }
    const Tensor e = Tensor::empty({0}, dt);
    EXPECT_EQ(scalar(sum(gpu(e))), 0.0f);
    EXPECT_EQ(scalar(mean(gpu(e))), 0.0f);
    // A NaN anywhere makes the total NaN; an infinity stays one.
    std::vector<float> v(70001, 1.0f);
    v[40000] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(scalar(sum(gpu(Tensor::from_floats({70001}, v, dt)))), std::numeric_limits<float>::infinity());
    v[123] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(scalar(sum(gpu(Tensor::from_floats({70001}, v, dt))))));
  }
  // An integer tensor: the GPU kernels read and write floats, so they refuse it clearly rather than read a uint8
  // tensor's bytes as floats past its end (the CPU converts).
  for (DType dt : {DType::kInt32, DType::kUInt8, DType::kInt64}) {
    const Tensor x = gpu(Tensor::zeros({5}, dt));
    EXPECT_THROW((void)sum(x), Error) << dtype_name(dt);
    EXPECT_THROW((void)mean(x), Error) << dtype_name(dt);
    EXPECT_THROW((void)sum_backward(x, 1.0f), Error) << dtype_name(dt);
  }
}

TEST(CudaBackend, RegularizationPenaltyAndItsGradientMatchTheCpu) {
  REQUIRE_CUDA_BACKEND();
  for (DType dt : kFloatDTypes) {
    for (const Shape& shape : {Shape({1}), Shape({7, 3}), Shape({129, 31}), Shape({300001})}) {
      const std::string what = std::string(dtype_name(dt)) + " " + shape.to_string();
      const Tensor w = random_tensor(shape, 9 + static_cast<uint64_t>(shape.numel()), dt, -2.0f, 2.0f);
      const Tensor p = regularization_penalty(gpu(w), 0.01f, 0.001f);
      EXPECT_EQ(p.device(), kGpu);
      expect_within_a_unit(scalar(p), scalar(regularization_penalty(w, 0.01f, 0.001f)), "penalty " + what);
      const Tensor seed = Tensor::from_floats({1}, {0.5f});
      EXPECT_TRUE(bit_equal(regularization_penalty_backward(gpu(w), 0.01f, 0.001f, gpu(seed)),
                            regularization_penalty_backward(w, 0.01f, 0.001f, seed)))
          << "penalty backward " << what;
    }
  }
}

// An arena's gradients are slices of one buffer per dtype, summed on the GPU as one span each; tensors apart in
// memory are summed one by one. Either way the norm is the CPU's within a float32 unit, and a non-finite element
// makes it non-finite.
TEST(CudaBackend, GlobalNormMatchesTheCpu) {
  REQUIRE_CUDA_BACKEND();
  std::vector<Tensor> cpu_xs, gpu_xs;
  for (DType dt : kFloatDTypes) {
    const Tensor flat = random_tensor({300001}, 17, dt, -3.0f, 3.0f);
    const Tensor on_gpu = gpu(flat);
    for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{0, 7}, {7, 1000}, {1000, 300001}}) {
      cpu_xs.push_back(flat.slice(0, begin, end));
      gpu_xs.push_back(on_gpu.slice(0, begin, end));
    }
    const Tensor apart = random_tensor({5, 129}, 18, dt);
    cpu_xs.push_back(apart);
    gpu_xs.push_back(gpu(apart));
    const std::string what = std::string("through ") + dtype_name(dt);
    const Tensor norm = global_norm(gpu_xs);
    EXPECT_EQ(norm.device(), kGpu);
    expect_within_a_unit(scalar(norm), scalar(global_norm(cpu_xs)), what);
  }
  EXPECT_EQ(scalar(global_norm({gpu(Tensor::empty({0}, DType::kFloat32))})), 0.0f);
  gpu_xs.push_back(gpu(Tensor::from_floats({2}, {1.0f, std::numeric_limits<float>::infinity()})));
  EXPECT_TRUE(std::isinf(scalar(global_norm(gpu_xs))));
}

TEST(CudaBackend, AccuracyCountsTheCpusRows) {
  REQUIRE_CUDA_BACKEND();
  Rng r(17);
  for (DType dt : kFloatDTypes) {
    for (int64_t classes : {1, 2, 7, 33, 129, 1000}) {
      for (DType label_dtype : {DType::kInt32, DType::kInt64}) {
        const int64_t batch = 300;
        // Few distinct values (many ties: the first maximum counts), a NaN in front of some rows.
        std::vector<float> s(static_cast<size_t>(batch * classes));
        for (float& x : s) x = std::round(r.uniform(-3.0f, 3.0f));
        for (int64_t b = 0; b < batch; b += 11) s[static_cast<size_t>(b * classes)] = std::numeric_limits<float>::quiet_NaN();
        for (int64_t b = 5; b < batch; b += 13) s[static_cast<size_t>(b * classes + classes / 2)] = std::numeric_limits<float>::quiet_NaN();
        std::vector<int64_t> l(static_cast<size_t>(batch));
        for (int64_t& x : l) x = static_cast<int64_t>(r.uniform(0.0f, static_cast<float>(classes))) % classes;
        const Tensor scores = Tensor::from_floats({batch, classes}, s, dt);
        const Tensor labels = Tensor::from_int64s({batch}, l).to(label_dtype);
        const std::string what = std::string(dtype_name(dt)) + " classes=" + std::to_string(classes) + " " +
                                 dtype_name(label_dtype);
        EXPECT_EQ(sparse_categorical_accuracy(gpu(scores), gpu(labels)), sparse_categorical_accuracy(scores, labels))
            << what;
        // (B, T, C) scores with (B, T) labels: rows of every position.
        EXPECT_EQ(sparse_categorical_accuracy(gpu(scores.reshape({10, 30, classes})), gpu(labels.reshape({10, 30}))),
                  sparse_categorical_accuracy(scores.reshape({10, 30, classes}), labels.reshape({10, 30})))
            << what;
      }
    }
  }
  // A case that can only pass by counting: every row right.
  const Tensor eye = Tensor::from_floats({3, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1});
  const Tensor labels = Tensor::from_ints({3}, {0, 1, 2});
  EXPECT_EQ(sparse_categorical_accuracy(gpu(eye), gpu(labels)), 1.0);
}

// A label outside [0, classes) on the device is found by the accuracy kernel and named as the CPU entry names it:
// at once where the count is read (sparse_categorical_accuracy), at the next read for count_correct (fit's).
TEST(CudaBackend, AccuracyNamesALabelOutsideTheClasses) {
  REQUIRE_CUDA_BACKEND();
  const Tensor scores = gpu(Tensor::from_floats({3, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}));
  const Tensor bad = gpu(Tensor::from_ints({3}, {0, 4, 1}));
  try {
    (void)sparse_categorical_accuracy(scores, bad);
    ADD_FAILURE() << "a label of 4 for 4 classes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("accuracy: label 4 at row 1"), std::string::npos) << e.what();
  }
  const Tensor count = count_correct(scores, bad);  // queued: nothing read yet
  EXPECT_THROW((void)read_scalar(count), Error);
  EXPECT_EQ(read_scalar(count), 1.0f);  // row 0 only: the bad row is not counted, row 2's arg-max is 2
  const Tensor good = gpu(Tensor::from_ints({3}, {0, 1, 2}));
  EXPECT_EQ(sparse_categorical_accuracy(scores, good), 1.0);
}

TEST(CudaBackend, UnscaleAndCountGiveTheCpuBitsAndCount) {
  REQUIRE_CUDA_BACKEND();
  for (DType dt : kFloatDTypes) {
    for (int64_t n : {1, 17, 129, 70001, 1000003}) {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 101 - 50) * 3.0f;
      for (int64_t i = 3; i < n; i += 997) v[static_cast<size_t>(i)] = std::numeric_limits<float>::infinity();
      for (int64_t i = 5; i < n; i += 1999) v[static_cast<size_t>(i)] = std::numeric_limits<float>::quiet_NaN();
      const Tensor scaled = Tensor::from_floats({n}, v, dt);
      for (float inv : {1.0f / 1024.0f, 4.0f, 3e38f}) {  // 3e38: finite inputs overflow once unscaled
        const std::string what = std::string(dtype_name(dt)) + " n=" + std::to_string(n) + " inv=" + std::to_string(inv);
        Tensor h_out = Tensor::empty({n}, DType::kFloat32), d_out = Tensor::empty({n}, DType::kFloat32, kGpu);
        const int64_t want = unscale_and_count_nonfinite(scaled, inv, h_out);
        EXPECT_EQ(unscale_and_count_nonfinite(gpu(scaled), inv, d_out), want) << what;
        EXPECT_TRUE(bit_equal(d_out, h_out)) << what;
        if (dt == DType::kFloat32) {  // in place
          Tensor d_in = gpu(scaled);
          EXPECT_EQ(unscale_and_count_nonfinite(d_in, inv), want) << what;
          EXPECT_TRUE(bit_equal(d_in, h_out)) << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace mixtrain::ops
