// linear_cross_entropy's CUDA kernel (src/ops/cuda/linear_cross_entropy.cu) against the CPU kernel, every floating
// dtype, several chunkings, and a label outside the vocabulary raised at the next read. Skips without a GPU or
// cuBLASLt (MIXTRAIN_REQUIRE_GPU=1, set by scripts/gpu-check.sh, makes the skip a failure).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/ops/linear_cross_entropy.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::random_tensor;
using testing::unit;

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

void expect_close(const Tensor& got, const Tensor& want, double rel, double abs_tol, const std::string& what) {
  const std::vector<float> x = to_device(got, Device::cpu()).to_floats(), y = want.to_floats();
  ASSERT_EQ(x.size(), y.size()) << what;
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(x[i], y[i], rel * std::fabs(y[i]) + abs_tol) << what << " element " << i;
}

Tensor labels_of(int64_t n, int64_t v, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> l(static_cast<size_t>(n));
  for (int32_t& y : l) y = static_cast<int32_t>(r.next_u64() % static_cast<uint64_t>(v));
  return Tensor::from_ints({n}, l);
}

// Tolerances (those the host driver meets in tests/ops/linear_cross_entropy_rows_test.cpp): the loss to 1e-5
// relative; dx and dw within 4 units of the dtype (1e-5 for float32) of the tensor's largest element, as a dlogit
// rounded into a 16-bit operand may land one unit apart; dbias to 1e-5 of its largest element. The count of
// correct rows is exact (random logits: no near ties).
TEST(CudaLinearCrossEntropy, MatchesTheCpuKernel) {
  REQUIRE_CUDA_GEMM();
  EXPECT_TRUE(supports<Op::linear_cross_entropy>(DeviceType::kCuda));
  for (DType dt : testing::kFloatDTypes)
    for (int64_t n : {1, 17, 129, 300})
      for (int64_t chunk : {7, 0})
        for (bool with_bias : {true, false}) {
          const int64_t d = 40, v = 131;
          const uint64_t s = static_cast<uint64_t>(n * 10 + chunk);
          const Tensor x = random_tensor({n, d}, s, dt, -2, 2), w = random_tensor({d, v}, s + 1, dt, -1, 1);
          const Tensor bias = with_bias ? random_tensor({v}, s + 2, DType::kFloat32, -1, 1) : Tensor();
          const Tensor labels = labels_of(n, v, s + 3);
          const Tensor seed = Tensor::from_floats({1}, {dt == DType::kFloat16 ? 1024.0f : 1.0f});
          const std::string what = std::string(dtype_name(dt)) + " n" + std::to_string(n) + " chunk" +
                                   std::to_string(chunk) + (with_bias ? " bias" : "");
          const LinearCrossEntropy want = linear_cross_entropy(x, w, bias, labels, seed, chunk);
          const LinearCrossEntropy got = linear_cross_entropy(gpu(x), gpu(w), gpu(bias), gpu(labels), gpu(seed), chunk);
          const float loss = to_device(got.loss, Device::cpu()).item();
          EXPECT_NEAR(loss, want.loss.item(), 1e-5 * (1 + std::fabs(want.loss.item()))) << what;
          EXPECT_EQ(to_device(got.correct, Device::cpu()).item(), want.correct.item()) << what;
          const double rel = dt == DType::kFloat32 ? 1e-5 : 4 * unit(dt);
          expect_close(got.dx, want.dx, unit(dt), rel * max_abs(want.dx.to_floats()) + testing::subnormal_step(dt),
                       what + " dx");
          expect_close(got.dw, want.dw, 1e-5, rel * max_abs(want.dw.to_floats()), what + " dw");
          EXPECT_EQ(got.dbias.defined(), with_bias) << what;
          if (with_bias) expect_close(got.dbias, want.dbias, 1e-5, 1e-5 * max_abs(want.dbias.to_floats()), what + " dbias");
          // Without a seed: the loss and the count only.
          const LinearCrossEntropy plain = linear_cross_entropy(gpu(x), gpu(w), gpu(bias), gpu(labels), Tensor(), chunk);
          EXPECT_FALSE(plain.dx.defined()) << what;
          EXPECT_NEAR(to_device(plain.loss, Device::cpu()).item(), loss, 1e-6 * (1 + std::fabs(loss))) << what;
        }
}

// A label outside [0, V) on the GPU is found by the kernel and raised at the host's next read, naming the op.
TEST(CudaLinearCrossEntropy, ALabelOutsideTheVocabularyIsRaisedAtTheNextRead) {
  REQUIRE_CUDA_GEMM();
  const Tensor x = random_tensor({5, 8}, 1, DType::kFloat32), w = random_tensor({8, 11}, 2, DType::kFloat32);
  const Tensor labels = Tensor::from_ints({5}, std::vector<int32_t>{0, 3, 11, 2, 1});
  EXPECT_THROW(
      {
        const LinearCrossEntropy r = linear_cross_entropy(gpu(x), gpu(w), Tensor(), gpu(labels), Tensor(), 2);
        (void)to_device(r.loss, Device::cpu());
      },
      Error);
}

}  // namespace
}  // namespace mixtrain::ops
