// The CNN ops' CUDA kernels against the CPU kernels. Pooling (max, average, global average) and batch normalization
// (moments, forward with batch or moving statistics, backward) give the CPU's bits, NaN payloads aside (a GPU sum
// with a NaN operand returns the canonical NaN, where the CPU keeps the operand's payload: a NaN must match a NaN
// there). conv2d's unfolding, folding and dbias follow the CPU's order too, but its products run through cuBLASLt,
// which sums in its own order: y, dkernel and dx are compared with tolerances written beside each check, dbias bit
// for bit. Skips without a GPU (MIXTRAIN_REQUIRE_GPU=1, set by scripts/gpu-check.sh, makes the skip a failure).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/gemm_internal.h"  // the CPU reference's float16 method
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/batch_norm.h"
#include "mixtrain/ops/conv2d.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/pooling.h"
#include "mixtrain/ops/transfer.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::subnormal_step;
using testing::unit;

// Bit for bit, except that any NaN matches any NaN.
bool same_values(const Tensor& got, const Tensor& want) {
  if (!got.defined() || !want.defined()) return got.defined() == want.defined();
  const Tensor g = to_device(got, Device::cpu());
  if (g.dtype() != want.dtype() || g.shape() != want.shape()) return false;
  const std::vector<float> gv = g.to_floats(), wv = want.to_floats();
  for (size_t i = 0; i < gv.size(); ++i) {
    if (std::isnan(gv[i]) && std::isnan(wv[i])) continue;
    if (std::memcmp(&gv[i], &wv[i], sizeof(float)) != 0) return false;  // float32 holds every 16-bit value exactly
  }
  return true;
}

// |gpu - cpu| <= tol(i, cpu value) for every element (NaN must match NaN).
template <typename TolFn>
void expect_close(const Tensor& got, const Tensor& want, TolFn&& tol, const std::string& what) {
  const Tensor g = to_device(got, Device::cpu());
  ASSERT_EQ(g.dtype(), want.dtype()) << what;
  ASSERT_EQ(g.shape(), want.shape()) << what;
  const std::vector<float> gv = g.to_floats(), cv = want.to_floats();
  int reported = 0;
  for (size_t i = 0; i < cv.size(); ++i) {
    if (gv[i] == cv[i] || (std::isnan(cv[i]) && std::isnan(gv[i]))) continue;
    const double t = tol(i, static_cast<double>(cv[i]));
    if (std::fabs(static_cast<double>(gv[i]) - cv[i]) <= t) continue;
    ADD_FAILURE() << what << ": element " << i << " gpu " << gv[i] << " cpu " << cv[i] << " tolerance " << t;
    if (++reported == 5) return;
  }
}

TEST(CudaBackend, CnnOpsAreInstalledWithTheBackend) {
  const CudaBackendStatus s = load_cuda_backend();
  const bool on = s.loaded;
  EXPECT_EQ(ops::supports<ops::Op::pool2d>(DeviceType::kCuda), on);
  EXPECT_EQ(ops::supports<ops::Op::pool2d_backward>(DeviceType::kCuda), on);
  EXPECT_EQ(ops::supports<ops::Op::global_average_pool2d>(DeviceType::kCuda), on);
  EXPECT_EQ(ops::supports<ops::Op::global_average_pool2d_backward>(DeviceType::kCuda), on);
  EXPECT_EQ(ops::supports<ops::Op::batch_moments>(DeviceType::kCuda), on);
  EXPECT_EQ(ops::supports<ops::Op::batch_norm>(DeviceType::kCuda), on);
  EXPECT_EQ(ops::supports<ops::Op::batch_norm_backward>(DeviceType::kCuda), on);
  EXPECT_EQ(ops::supports<ops::Op::batch_channel_sums>(DeviceType::kCuda), on);
  EXPECT_EQ(ops::supports<ops::Op::batch_norm_input_grad>(DeviceType::kCuda), on);
  // conv2d multiplies through the GEMM's cuBLASLt: installed exactly when matmul is.
  EXPECT_EQ(ops::supports<ops::Op::conv2d>(DeviceType::kCuda), ops::supports<ops::Op::bmm>(DeviceType::kCuda));
  EXPECT_EQ(ops::supports<ops::Op::conv2d_backward>(DeviceType::kCuda),
            ops::supports<ops::Op::bmm>(DeviceType::kCuda));
  if (!on && gpu_required()) ADD_FAILURE() << "MIXTRAIN_REQUIRE_GPU=1 but: " << s.detail;
}

// ---------------------------------------------------------------------------------------------------------------
// Pooling

struct PoolCase {
  Shape x;
  Size2 pool, strides;
  Padding padding;
};
const PoolCase kPoolCases[] = {
    {{2, 7, 5, 3}, 2, 2, Padding::kValid},   {{2, 7, 5, 3}, 2, 2, Padding::kSame},
    {{1, 9, 7, 17}, 3, 2, Padding::kSame},   {{3, 8, 9, 1}, {3, 2}, {1, 2}, Padding::kValid},
    {{2, 5, 6, 4}, 3, 1, Padding::kSame},    {{1, 4, 4, 2}, 4, 4, Padding::kValid},
    {{2, 9, 8, 5}, 2, 3, Padding::kValid},   {{1, 1, 1, 7}, 3, 2, Padding::kSame},
    {{16, 28, 28, 32}, 2, 2, Padding::kValid},  // a training-sized batch: many blocks of threads
    {{0, 4, 4, 3}, 2, 2, Padding::kValid},
};

// Ties, signed zeros, infinities, NaN and float16 overflow among random values.
Tensor pool_input(const Shape& shape, uint64_t seed, DType dt) {
  std::vector<float> v = random_tensor(shape, seed, DType::kFloat32, -4.0f, 4.0f).to_floats();
  for (size_t i = 0; i < v.size(); ++i)
    if (i % 7 == 3) v[i] = std::round(v[i]);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float special[] = {nan, -inf, inf, -0.0f, 0.0f, 70000.0f, 1e-41f};
  if (!v.empty())
    for (size_t i = 0; i < std::size(special); ++i) v[(i * 37 + 5) % v.size()] = special[i];
  return Tensor::from_floats(shape, v, dt);
}

TEST(CudaBackend, PoolingAndItsGradientGiveTheCpuBits) {
  REQUIRE_CUDA_BACKEND();
  for (DType dt : kFloatDTypes) {
    for (const PoolCase& pc : kPoolCases) {
      const Pool2dOptions o{pc.pool, pc.strides, pc.padding};
      const Tensor x = pool_input(pc.x, 101 + static_cast<uint64_t>(pc.x.numel()), dt);
      const Tensor xg = gpu(x);
      const std::string what = std::string(dtype_name(dt)) + " " + pc.x.to_string() + " " + padding_name(pc.padding);
      // A maximum is one of its inputs: the bits, NaN payloads included.
      EXPECT_TRUE(bit_equal(max_pool2d(xg, o), max_pool2d(x, o))) << "max_pool2d " << what;
      EXPECT_TRUE(same_values(avg_pool2d(xg, o), avg_pool2d(x, o))) << "avg_pool2d " << what;
      const Shape y_shape = pool2d_output_shape(pc.x, o);
      for (DType dy_dt : {dt, DType::kFloat32}) {
        const Tensor dy = random_tensor(y_shape, 103, dy_dt);
        const Tensor dyg = gpu(dy);
        EXPECT_TRUE(bit_equal(max_pool2d_backward(dyg, xg, o), max_pool2d_backward(dy, x, o)))
            << "max_pool2d_backward dy " << dtype_name(dy_dt) << " " << what;
        EXPECT_TRUE(bit_equal(avg_pool2d_backward(dyg, pc.x, dt, o), avg_pool2d_backward(dy, pc.x, dt, o)))
            << "avg_pool2d_backward dy " << dtype_name(dy_dt) << " " << what;
      }
      EXPECT_TRUE(same_values(global_average_pool2d(xg), global_average_pool2d(x))) << "global_average " << what;
      const Tensor gdy = random_tensor({pc.x[0], pc.x[3]}, 107, dt);
      EXPECT_TRUE(bit_equal(global_average_pool2d_backward(gpu(gdy), pc.x, dt),
                            global_average_pool2d_backward(gdy, pc.x, dt)))
          << "global_average backward " << what;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Batch normalization

TEST(CudaBackend, BatchNormAndItsGradientGiveTheCpuBits) {
  REQUIRE_CUDA_BACKEND();
  constexpr float kEps = 1e-3f;
  for (DType dt : kFloatDTypes) {
    // 257 and 600 rows: the channel sums' blocks of 256, the last one short; an image batch (rows = N * H * W).
    for (const Shape& shape : {Shape({1, 1}), Shape({7, 3}), Shape({257, 5}), Shape({600, 64}),
                               Shape({16, 14, 14, 32}), Shape({3, 5, 7, 31})}) {
      const int64_t c = shape[-1];
      // Terms of mixed magnitudes around an offset, so that another summation order shows in the bits.
      std::vector<float> xv = random_tensor(shape, 109 + static_cast<uint64_t>(shape.numel()), DType::kFloat32).to_floats();
      for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::ldexp(xv[i], static_cast<int>(i * 7 % 23) - 11) + 100.0f;
      const Tensor x = Tensor::from_floats(shape, xv, dt);
      const Tensor gamma = random_tensor({c}, 113, DType::kFloat32, 0.5f, 1.5f);
      const Tensor beta = random_tensor({c}, 127, DType::kFloat32);
      const Tensor xg = gpu(x), gammag = gpu(gamma), betag = gpu(beta);
      const std::string what = std::string(dtype_name(dt)) + " " + shape.to_string();
      const BatchNormStats st = batch_moments(x);
      const BatchNormStats stg = batch_moments(xg);
      EXPECT_TRUE(bit_equal(stg.mean, st.mean)) << "batch_moments mean " << what;
      EXPECT_TRUE(bit_equal(stg.variance, st.variance)) << "batch_moments variance " << what;
      // A synchronized layer's parts: the raw channel sums of both passes.
      EXPECT_TRUE(bit_equal(batch_channel_sums(xg), batch_channel_sums(x))) << "batch_channel_sums " << what;
      EXPECT_TRUE(bit_equal(batch_channel_sums(xg, gpu(st.mean)), batch_channel_sums(x, st.mean)))
          << "batch_channel_sums about the mean " << what;
      const Tensor moving_mean = random_tensor({c}, 131, DType::kFloat32, 99.0f, 101.0f);
      const Tensor moving_var = random_tensor({c}, 137, DType::kFloat32, 0.0f, 2.0f);
      for (bool training : {true, false}) {
        // Both devices read the CPU's statistics, so they see the same inputs.
        const Tensor m = training ? st.mean : moving_mean, v = training ? st.variance : moving_var;
        const Tensor mg = gpu(m), vg = gpu(v);
        const std::string mode = what + (training ? " training" : " inference");
        EXPECT_TRUE(bit_equal(batch_norm(xg, mg, vg, gammag, betag, kEps), batch_norm(x, m, v, gamma, beta, kEps)))
            << "batch_norm " << mode;
        for (DType dy_dt : {dt, DType::kFloat32}) {
          const Tensor dy = random_tensor(shape, 139, dy_dt);
          const Tensor dyg = gpu(dy);
          for (bool need_x : {true, false}) {
            const std::string which = mode + " dy " + dtype_name(dy_dt) + (need_x ? "" : " without dx");
            const BatchNormGrads want = batch_norm_backward(dy, x, m, v, gamma, kEps, training, need_x);
            const BatchNormGrads got = batch_norm_backward(dyg, xg, mg, vg, gammag, kEps, training, need_x);
            EXPECT_TRUE(bit_equal(got.dx, want.dx)) << "batch_norm_backward dx " << which;
            EXPECT_TRUE(bit_equal(got.dgamma, want.dgamma)) << "batch_norm_backward dgamma " << which;
            EXPECT_TRUE(bit_equal(got.dbeta, want.dbeta)) << "batch_norm_backward dbeta " << which;
          }
          // dx from given sums (a synchronized layer's global ones; here the CPU's own dbeta and dgamma).
          const BatchNormGrads sums = batch_norm_backward(dy, x, m, v, gamma, kEps, false, false);
          const Tensor sdy = sums.dbeta, sdyx = sums.dgamma;
          const Tensor want = batch_norm_input_grad(dy, x, m, v, gamma, kEps, sdy, sdyx);
          EXPECT_TRUE(bit_equal(batch_norm_input_grad(dyg, xg, mg, vg, gammag, kEps, gpu(sdy), gpu(sdyx)), want))
              << "batch_norm_input_grad " << mode << " dy " << dtype_name(dy_dt);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// conv2d

struct ConvCase {
  Shape x;
  Size2 kernel, strides;
  Padding padding;
  int64_t cout;
};
const ConvCase kConvCases[] = {
    {{2, 7, 5, 3}, 3, 1, Padding::kSame, 4},           {{2, 7, 5, 3}, 3, 2, Padding::kValid, 5},
    {{1, 9, 8, 2}, {3, 2}, {2, 3}, Padding::kSame, 7}, {{3, 6, 6, 4}, 1, 1, Padding::kValid, 3},  // x is col
    {{2, 5, 5, 3}, 1, 2, Padding::kSame, 2},           {{1, 4, 6, 1}, 5, 1, Padding::kSame, 17},
    {{2, 8, 7, 5}, 2, 3, Padding::kValid, 6},          {{1, 1, 1, 3}, 3, 1, Padding::kSame, 2},
    {{8, 28, 28, 1}, 3, 1, Padding::kSame, 32},        {{8, 14, 14, 32}, 3, 1, Padding::kSame, 64},
    {{0, 5, 5, 3}, 3, 1, Padding::kValid, 4},  // an empty batch: an empty output, zero kernel and bias gradients
};

Tensor magnitudes(const Tensor& t) {
  std::vector<float> v = t.to_floats();
  for (float& e : v) e = std::fabs(e);
  return Tensor::from_floats(t.shape(), v, DType::kFloat32);
}

// Runs one case on both devices and compares: y within the products' float32 accumulation error (each side sums
// K terms in its own order: within K units of float32 of the sum of the terms' magnitudes, which the CPU op computes
// from |x| and |kernel|), then one rounding into y's dtype each; likewise dkernel over the rows and dx over cout
// products plus at most kh * kw folded terms; dbias bit for bit.
void check_conv(const ConvCase& cc, DType dt, const std::string& label) {
  // The CPU reference sums its float32 products exactly, as cuBLASLt does: its float16 GEMM on a CPU with AMX may
  // take the split that drops each product's low-by-low term (up to 2^-16 |a||b|), more than these tolerances allow
  // for a short K, so the reference takes the widening method for the duration.
  struct WidenedF16Reference {
    WidenedF16Reference() { kernels::set_gemm_f16_method_for_testing("widen"); }
    ~WidenedF16Reference() { kernels::set_gemm_f16_method_for_testing(nullptr); }
  } widened;
  const int64_t cin = cc.x[3];
  const Shape kshape{cc.kernel.h, cc.kernel.w, cin, cc.cout};
  const Conv2dOptions o{cc.strides, cc.padding};
  const Tensor x = random_tensor(cc.x, 149 + static_cast<uint64_t>(cc.x.numel()), dt);
  const Tensor kernel = random_tensor(kshape, 151, dt);
  const Tensor bias = random_tensor({cc.cout}, 157, DType::kFloat32, -2.0f, 2.0f);
  const Tensor xg = gpu(x), kg = gpu(kernel), bg = gpu(bias);
  const double k = static_cast<double>(kshape.numel() / cc.cout);
  const std::string what = label + std::string(dtype_name(dt)) + " " + cc.x.to_string() + " kernel " +
                           kshape.to_string() + " " + padding_name(cc.padding);
  const Tensor ax = magnitudes(x), ak = magnitudes(kernel);
  const std::vector<float> mag_y = conv2d(ax, ak, Tensor(), o).to_floats();
  auto tol_y = [&](size_t i, double c) {
    return 2 * unit(dt) * std::fabs(c) + 2.0 * k * 0x1p-24 * mag_y[i] + 2 * subnormal_step(dt);
  };
  // Beside a 16-bit y, cuBLASLt's epilogue adds the bias rounded to y's dtype (its documented bias type,
  // src/ops/cuda/gemm_plan_cache.h's gemm_bias_dtype): up to unit(dt) |bias| more than the CPU's float32 bias.
  const std::vector<float> bv = bias.to_floats();
  auto tol_biased = [&](size_t i, double c) {
    return tol_y(i, c) + (dt == DType::kFloat32 ? 0.0 : unit(dt) * std::fabs(bv[i % bv.size()]));
  };
  expect_close(conv2d(xg, kg, bg, o), conv2d(x, kernel, bias, o), tol_biased, "conv2d " + what);
  expect_close(conv2d(xg, kg, Tensor(), o), conv2d(x, kernel, Tensor(), o), tol_y, "conv2d without bias " + what);

  const Shape y_shape = conv2d_output_shape(cc.x, kshape, o);
  const Tensor dy = random_tensor(y_shape, 163, dt);
  const Tensor dyg = gpu(dy);
  const Conv2dGrads mag = conv2d_backward(magnitudes(dy), ax, ak, o, true, false);
  const std::vector<float> mag_dk = mag.dkernel.to_floats(), mag_dx = mag.dx.to_floats();
  const double rows = static_cast<double>(y_shape.numel() / cc.cout);
  const double folded = static_cast<double>(cc.cout + cc.kernel.h * cc.kernel.w);
  for (bool need_x : {true, false}) {
    for (bool need_bias : {true, false}) {
      const std::string which = what + (need_x ? "" : " without dx") + (need_bias ? "" : " without dbias");
      const Conv2dGrads want = conv2d_backward(dy, x, kernel, o, need_x, need_bias);
      const Conv2dGrads got = conv2d_backward(dyg, xg, kg, o, need_x, need_bias);
      expect_close(
          got.dkernel, want.dkernel,
          [&](size_t i, double) { return 2.0 * rows * 0x1p-24 * mag_dk[i] + 2 * subnormal_step(DType::kFloat32); },
          "conv2d_backward dkernel " + which);
      EXPECT_EQ(got.dx.defined(), need_x) << which;
      if (need_x) {
        expect_close(
            got.dx, want.dx,
            [&](size_t i, double c) {
              return 2 * unit(dt) * std::fabs(c) + 2.0 * folded * 0x1p-24 * mag_dx[i] + 2 * subnormal_step(dt);
            },
            "conv2d_backward dx " + which);
      }
      EXPECT_TRUE(bit_equal(got.dbias, want.dbias)) << "conv2d_backward dbias " << which;
    }
  }
}

TEST(CudaBackend, Conv2dAndItsGradientMatchTheCpu) {
  REQUIRE_CUDA_BACKEND();
  if (!ops::supports<ops::Op::conv2d>(DeviceType::kCuda)) {
    if (gpu_required()) FAIL() << "MIXTRAIN_REQUIRE_GPU=1 but: " << load_cuda_backend().detail;
    GTEST_SKIP() << load_cuda_backend().detail;
  }
  for (DType dt : kFloatDTypes)
    for (const ConvCase& cc : kConvCases) check_conv(cc, dt, "");
  // A window larger than the padded input is refused on the GPU as on the CPU, before any kernel.
  const Tensor x = Tensor::zeros({2, 2, 2, 3}, DType::kFloat32), k = Tensor::zeros({3, 3, 3, 4}, DType::kFloat32);
  EXPECT_THROW(conv2d(x, k, Tensor(), Conv2dOptions{1, Padding::kValid}), Error);
  EXPECT_THROW(conv2d(gpu(x), gpu(k), Tensor(), Conv2dOptions{1, Padding::kValid}), Error);
}

// More patches than one of the GPU kernel's chunks (32 Mi elements): two chunks, whose dkernel products add up.
TEST(CudaBackend, Conv2dSplitsALargeBatchIntoChunks) {
  REQUIRE_CUDA_GEMM();  // conv2d's GPU kernel multiplies through the GEMM: registered with it
  ASSERT_TRUE(ops::supports<ops::Op::conv2d>(DeviceType::kCuda));
  // 230 images of 32 x 32 patches of K = 144: 33.9 Mi elements, 227 images in the first chunk.
  check_conv(ConvCase{{230, 32, 32, 16}, 3, 1, Padding::kSame, 8}, DType::kBFloat16, "two chunks ");
}

}  // namespace
}  // namespace mixtrain::ops
