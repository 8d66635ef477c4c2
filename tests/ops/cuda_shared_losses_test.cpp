// The arithmetic the CUDA loss kernels share with the CPU (src/ops/shared/loss_terms.h), checked on the host
// against the CPU kernels behind ops::mean_squared_error, its gradient, ops::sum / mean and
// ops::sparse_categorical_accuracy, bit for bit: the element terms added in the CPU's order give its totals, the
// gradient element its bits, and the arg-max states, scanned in a warp's strided slices and merged in its
// butterfly order (as cuda/losses.cu does), choose std::max_element's index on rows with ties, signed zeros,
// infinities and NaNs. Runs everywhere, with or without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/ops/losses.h"
#include "op_test_util.h"
#include "ops/shared/float16_convert.h"
#include "ops/shared/loss_terms.h"

namespace mixtrain::ops {
namespace {

using testing::bits;
using testing::kFloatDTypes;
using testing::kOddSizes;
using testing::random_tensor;

// Element i of t (contiguous, floating) widened to float32 by the kernels' load.
float element(const Tensor& t, int64_t i) { return shared::load_as_float(t.raw(), shared::float_code(t.dtype()), i); }

TEST(CudaSharedMath, MseTermsAndGradientGiveTheCpuKernelsBits) {
  for (DType dt : kFloatDTypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{129}, int64_t{4097}}) {
      const std::string what = std::string(dtype_name(dt)) + " n=" + std::to_string(n);
      const Tensor p = random_tensor({n}, 11 + static_cast<uint64_t>(n), dt, -300.0f, 300.0f);
      const Tensor t = random_tensor({n}, 12 + static_cast<uint64_t>(n), DType::kFloat32, -300.0f, 300.0f);
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) s = shared::dadd_rn(s, shared::mse_term(element(p, i), element(t, i)));
      EXPECT_EQ(bits(shared::float_total(s, n, true)), bits(mean_squared_error(p, t).to_floats()[0])) << what;

      for (float dloss : {1.0f, -0.37f, 3e30f}) {
        const Tensor want = mean_squared_error_backward(p, t, dloss);
        Tensor got = Tensor::empty({n}, dt);
        const float k = shared::mse_grad_scale(dloss, n);
        for (int64_t i = 0; i < n; ++i)
          shared::store_from_float(got.raw(), shared::float_code(dt), i, shared::mse_grad(k, element(p, i), element(t, i)));
        EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << what << " dloss=" << dloss;
      }
    }
  }
}

TEST(CudaSharedMath, SumAndMeanTotalsGiveTheCpuKernelsBits) {
  for (DType dt : kFloatDTypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{31}, int64_t{129}, int64_t{100003}}) {
      const std::string what = std::string(dtype_name(dt)) + " n=" + std::to_string(n);
      // Large and small terms, so that the order of a float32 sum would show (the CPU's is double).
      const Tensor x = random_tensor({n}, 21 + static_cast<uint64_t>(n), dt, -1000.0f, 1000.0f);
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) s = shared::dadd_rn(s, static_cast<double>(element(x, i)));
      EXPECT_EQ(bits(shared::float_total(s, n, false)), bits(sum(x).to_floats()[0])) << what;
      EXPECT_EQ(bits(shared::float_total(s, n, true)), bits(mean(x).to_floats()[0])) << what;
    }
  }
}

// The arg-max as the accuracy kernel takes it: lane l scans elements l, l + 32, ... and the lanes' states merge
// in the butterfly order of __shfl_xor_sync (every lane ends with the same state; lane 0's is used).
int64_t warp_argmax(const std::vector<float>& row) {
  constexpr int kWarp = 32;
  std::vector<shared::ArgMax> lanes(kWarp, shared::kNoArgMax);
  for (int l = 0; l < kWarp; ++l)
    for (size_t j = static_cast<size_t>(l); j < row.size(); j += kWarp)
      lanes[static_cast<size_t>(l)] = shared::argmax_take(lanes[static_cast<size_t>(l)], row[j], static_cast<int64_t>(j));
  for (int o = kWarp / 2; o > 0; o /= 2) {
    std::vector<shared::ArgMax> next(kWarp);
    for (int l = 0; l < kWarp; ++l)
      next[static_cast<size_t>(l)] = shared::argmax_merge(lanes[static_cast<size_t>(l)], lanes[static_cast<size_t>(l ^ o)]);
    lanes = next;
  }
  return shared::argmax_index(lanes[0], row.empty() ? 0.0f : row[0]);
}

int64_t first_max_element(const std::vector<float>& row) {
  return static_cast<int64_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

TEST(CudaSharedMath, WarpArgMaxChoosesMaxElementsIndex) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<std::vector<float>> rows = {
      {},
      {nan},
      {-inf},
      {1.0f, 1.0f, 1.0f},
      {-0.0f, 0.0f},
      {0.0f, -0.0f},
      {nan, 5.0f, 7.0f},
      {3.0f, nan, 7.0f, nan},
      {nan, nan, nan},
      {-inf, -inf, nan, -inf},
      {2.0f, inf, 1.0f, inf},
  };
  // Long rows: the maximum repeated in several lanes' slices, a NaN in front or inside, all equal.
  Rng r(5);
  for (int64_t n : {33, 64, 65, 129, 1000}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = std::round(r.uniform(-4.0f, 4.0f));  // few distinct values: many ties
    rows.push_back(v);
    v[static_cast<size_t>(n / 3)] = nan;
    rows.push_back(v);
    v[0] = nan;
    rows.push_back(v);
    rows.push_back(std::vector<float>(static_cast<size_t>(n), -0.0f));
    std::vector<float> w(static_cast<size_t>(n), 1.0f);
    w[static_cast<size_t>(n - 1)] = 2.0f;
    w[static_cast<size_t>(n - 33)] = 2.0f;  // the same lane as the last one, earlier
    rows.push_back(w);
  }
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(warp_argmax(rows[i]), first_max_element(rows[i])) << "row " << i;

  // And the count the kernel makes from them is the CPU accuracy's.
  for (int64_t cols : kOddSizes) {
    const int64_t batch = 64;
    std::vector<float> s(static_cast<size_t>(batch * cols));
    for (float& x : s) x = std::round(r.uniform(-2.0f, 2.0f));
    for (int64_t b = 0; b < batch; b += 7) s[static_cast<size_t>(b * cols)] = nan;
    std::vector<int32_t> labels(static_cast<size_t>(batch));
    int64_t correct = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const std::vector<float> row(s.begin() + b * cols, s.begin() + (b + 1) * cols);
      labels[static_cast<size_t>(b)] = static_cast<int32_t>(b % cols);
      correct += warp_argmax(row) == b % cols;
    }
    for (DType dt : kFloatDTypes) {
      const Tensor scores = Tensor::from_floats({batch, cols}, s, dt);  // small integers: exact in every dtype
      Tensor l = Tensor::empty({batch}, DType::kInt32);
      std::memcpy(l.raw(), labels.data(), l.nbytes());
      EXPECT_EQ(sparse_categorical_accuracy(scores, l), static_cast<double>(correct) / batch) << dtype_name(dt) << " cols=" << cols;
    }
  }
}

}  // namespace
}  // namespace mixtrain::ops
