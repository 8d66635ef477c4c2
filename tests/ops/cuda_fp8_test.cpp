// The FP8 pieces on a GPU against the CPU ops (skips without a GPU; scripts/gpu-check.sh runs the CudaBackend suite
// with MIXTRAIN_REQUIRE_GPU=1): the float8 casts, fp8_amax, fp8_quantize and mx_block_quantize bit for bit, and scaled_matmul on
// cuBLASLt's FP8 GEMM within the accumulation bound written below (the CPU's is a float32 sum in another order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/float8.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "op_test_util.h"
#ifdef MIXTRAIN_HAVE_CUDA
#include "ops/cuda/fp8_gemm_route.h"
#endif

namespace mixtrain::ops {
namespace {

using testing::random_tensor;

constexpr DType kFormats[] = {DType::kFloat8E4M3FN, DType::kFloat8E5M2};
constexpr DType kWide[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

Tensor every_bfloat16() {
  Tensor t = Tensor::empty({65536}, DType::kBFloat16);
  for (uint32_t i = 0; i < 65536; ++i) t.data<bfloat16>()[i].bits = static_cast<uint16_t>(i);
  return t;
}

Tensor every_code(DType format) {
  Tensor t = Tensor::empty({256}, format);
  for (int c = 0; c < 256; ++c) static_cast<uint8_t*>(t.raw())[c] = static_cast<uint8_t>(c);
  return t;
}

TEST(CudaBackend, Float8CastGivesTheCpusBits) {
  REQUIRE_CUDA_BACKEND();
  const Tensor patterns = every_bfloat16();
  for (DType in : kWide) {
    const Tensor x = patterns.to(in);
    for (DType format : kFormats)
      EXPECT_TRUE(bit_equal(cast(gpu(x), format), cast(x, format))) << dtype_name(in) << " -> " << dtype_name(format);
  }
  const Tensor odd = random_tensor({129}, 5, DType::kFloat32, -600.0f, 600.0f);  // past E4M3's 448
  for (DType format : kFormats) {
    EXPECT_TRUE(bit_equal(cast(gpu(odd), format), cast(odd, format))) << dtype_name(format);
    const Tensor codes = every_code(format);
    for (DType out : kWide)
      EXPECT_TRUE(bit_equal(cast(gpu(codes), out), cast(codes, out))) << dtype_name(format) << " -> " << dtype_name(out);
    for (DType other : kFormats)
      EXPECT_TRUE(bit_equal(cast(gpu(codes), other), cast(codes, other))) << dtype_name(format) << " -> "
                                                                          << dtype_name(other);
  }
}

TEST(CudaBackend, Fp8AmaxAndQuantizeGiveTheCpusBits) {
  REQUIRE_CUDA_BACKEND();
  for (DType in : kWide)
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{17}, int64_t{31}, int64_t{129}, int64_t{5000},
                      (int64_t{1} << 20) + 3}) {
      Tensor x = random_tensor({n}, 11 + n, DType::kFloat32, -40.0f, 40.0f);
      if (n > 7) x.data<float>()[n / 3] = 0x1p-20f, x.data<float>()[n / 2] = -0.0f;
      x = x.to(in);
      EXPECT_EQ(float_bits(fp8_amax(gpu(x))), float_bits(fp8_amax(x))) << dtype_name(in) << " n " << n;
      for (DType format : kFormats)
        for (Float8Overflow o : {Float8Overflow::kSaturate, Float8Overflow::kNonSaturating})
          for (float scale : {1.0f, 24.0f, 0.75f}) {  // 24: past both maxima's reach for E4M3
            const Fp8Operand g = fp8_quantize(gpu(x), format, scale, o), c = fp8_quantize(x, format, scale, o);
            EXPECT_TRUE(bit_equal(g.values, c.values)) << dtype_name(in) << " n " << n << " " << dtype_name(format)
                                                       << " scale " << scale;
            EXPECT_EQ(float_bits(g.amax), float_bits(c.amax));
          }
    }
  // NaN wins the amax, and a bfloat16 tensor quantizes over itself.
  Tensor x = random_tensor({1000}, 3, DType::kBFloat16, -2.0f, 2.0f);
  const Fp8Operand expected = fp8_quantize(x, DType::kFloat8E4M3FN, 100.0f);
  Tensor gx = gpu(x);
  const Fp8Operand in_place = fp8_quantize(gx, DType::kFloat8E4M3FN, 100.0f, std::nullopt, gx);
  EXPECT_TRUE(bit_equal(gx, expected.values));
  EXPECT_EQ(float_bits(in_place.amax), float_bits(expected.amax));
  Tensor with_nan = random_tensor({77}, 4, DType::kFloat32);
  with_nan.data<float>()[40] = NAN;
  EXPECT_EQ(float_bits(fp8_amax(gpu(with_nan))), float_bits(fp8_amax(with_nan)));
}

TEST(CudaBackend, MxBlockQuantizeGivesTheCpusBits) {
  REQUIRE_CUDA_BACKEND();
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {7, 45}, {33, 31}, {17, 129}, {1000, 257}})
    for (DType in : kWide) {
      Tensor x = random_tensor({rows, cols}, 21 + rows, DType::kFloat32, -1000.0f, 1000.0f);
      if (rows * cols > 40) x.data<float>()[7] = NAN, x.data<float>()[30] = 0x1p-140f;
      x = x.to(in);
      for (DType format : kFormats)
        for (bool down : {false, true})
          EXPECT_TRUE(bit_equal(mx_block_quantize(gpu(x), format, down), mx_block_quantize(x, format, down)))
              << rows << "x" << cols << " " << dtype_name(in) << " " << dtype_name(format) << (down ? " down" : "");
    }
}

// The stored form on the GPU: the CPU's codes and scale bytes, and the CPU's values decoded from them.
TEST(CudaBackend, MxBlockEncodeAndDecodeGiveTheCpusBytes) {
  REQUIRE_CUDA_BACKEND();
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {33, 31}, {17, 129}, {1000, 257}})
    for (DType in : kWide) {
      Tensor x = random_tensor({rows, cols}, 23 + rows, DType::kFloat32, -1000.0f, 1000.0f);
      if (rows * cols > 40) x.data<float>()[7] = NAN, x.data<float>()[30] = 0x1p-140f;
      x = x.to(in);
      for (DType format : kFormats)
        for (bool down : {false, true}) {
          const MxBlockCodes on_gpu = mx_block_encode(gpu(x), format, down), on_cpu = mx_block_encode(x, format, down);
          const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + dtype_name(in) + " " +
                                   dtype_name(format) + (down ? " down" : "");
          EXPECT_TRUE(bit_equal(on_gpu.codes, on_cpu.codes)) << what;
          EXPECT_TRUE(bit_equal(on_gpu.scales, on_cpu.scales)) << what;
          EXPECT_TRUE(bit_equal(mx_block_decode(on_gpu), mx_block_decode(on_cpu))) << what;
        }
    }
}

struct Operands {
  Tensor a, b;  // bfloat16 values of their formats, stored as trans_* says
};

Operands quantized_operands(int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType fa, DType fb, uint64_t seed) {
  const Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, seed, DType::kFloat32, -3.0f, 3.0f);
  const Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, seed + 1, DType::kFloat32, -0.01f, 0.01f);
  return {fp8_quantize(a, fa, 100.0f, Float8Overflow::kSaturate).values,
          fp8_quantize(b, fb, 20000.0f, Float8Overflow::kSaturate).values};
}

// Each element of the GPU's c against the CPU's: both are alpha times a sum of the same exact products (bfloat16 *
// bfloat16 is exact in float32), the CPU's in float32, and Hopper's FP8 tensor cores keep fewer bits than float32 in
// the partial sums they promote to float32 now and then (about 14 significand bits by DeepSeek-V3's report;
// cuBLASLt without fast accumulation promotes after each instruction's 32 products). Each of those 32 additions may
// lose up to 2^-14 of the running sum, at most sum |a_ik b_kj|, so the bound is 32 * 2^-14 = 2^-9 times
// alpha * sum |a_ik b_kj| (the float32 orders' own error, k * 2^-24 of it, fits inside), plus one unit in the last
// place of a 16-bit output, which the two float32 values may round to either side of. A wrong layout or scale is
// off by about the sum itself.
void expect_close(const Tensor& gpu_c, const Tensor& cpu_c, const Operands& o, bool ta, bool tb, float alpha,
                  const std::string& what) {
  const std::vector<float> g = to_device(gpu_c, Device::cpu()).to_floats(), c = cpu_c.to_floats();
  const std::vector<float> a = o.a.to_floats(), b = o.b.to_floats();
  const int64_t m = cpu_c.dim(0), n = cpu_c.dim(1), k = ta ? o.a.dim(0) : o.a.dim(1);
  const double ulp16 = cpu_c.dtype() == DType::kFloat32 ? 0.0 : cpu_c.dtype() == DType::kBFloat16 ? 0x1p-8 : 0x1p-11;
  int64_t bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double abs_sum = 0.0;
      for (int64_t p = 0; p < k; ++p)
        abs_sum += std::fabs(static_cast<double>(a[static_cast<size_t>(ta ? p * m + i : i * k + p)]) *
                             b[static_cast<size_t>(tb ? j * k + p : p * n + j)]);
      const double cv = c[static_cast<size_t>(i * n + j)], gv = g[static_cast<size_t>(i * n + j)];
      const double bound = 0x1p-9 * alpha * abs_sum + ulp16 * std::fabs(cv) + 1e-30;
      if (!(std::fabs(gv - cv) <= bound) && bad++ < 3)
        ADD_FAILURE() << what << " at (" << i << ", " << j << "): gpu " << gv << " cpu " << cv << " bound " << bound;
    }
  EXPECT_EQ(bad, 0) << what;
}

TEST(CudaBackend, Fp8ScaledMatmulMatchesTheCpuWithinTheAccumulationBound) {
  REQUIRE_CUDA_GEMM();
#ifdef MIXTRAIN_HAVE_CUDA
  const float alpha = 1.0f / (100.0f * 20000.0f);
  const Tensor bias = random_tensor({48}, 9, DType::kFloat32);
  if (first_gpu_capability() < cuda::kFp8MinComputeCapability) {
    const Operands o = quantized_operands(32, 48, 64, false, true, DType::kFloat8E4M3FN, DType::kFloat8E4M3FN, 1);
    EXPECT_THROW(scaled_matmul(gpu(o.a), gpu(o.b), false, true, alpha, Tensor(), DType::kBFloat16), Error);
    GTEST_SKIP() << "this GPU has no FP8 tensor cores: " << load_cuda_backend().detail;
  }
  const DType kPairs[][2] = {{DType::kFloat8E4M3FN, DType::kFloat8E4M3FN},
                             {DType::kFloat8E5M2, DType::kFloat8E4M3FN},
                             {DType::kFloat8E4M3FN, DType::kFloat8E5M2}};
  const int64_t tensor_core_before = cuda::fp8_gemm_count(true);
  int64_t calls = 0;
  for (const auto& pair : kPairs)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (DType out : {DType::kFloat32, DType::kBFloat16})
          for (bool with_bias : {false, true}) {
            const Operands o = quantized_operands(32, 48, 64, ta, tb, pair[0], pair[1], 7 + calls);
            const Tensor bb = with_bias ? bias : Tensor();
            const Tensor g = scaled_matmul(gpu(o.a), gpu(o.b), ta, tb, alpha, gpu(bb), out);
            const Tensor c = scaled_matmul(o.a, o.b, ta, tb, alpha, bb, out);
            expect_close(g, c, o, ta, tb, alpha,
                         std::string(dtype_name(pair[0])) + " x " + dtype_name(pair[1]) + (ta ? " a^T" : "") +
                             (tb ? " b^T" : "") + " into " + dtype_name(out) + (with_bias ? " + bias" : ""));
            ++calls;
          }
  EXPECT_EQ(cuda::fp8_gemm_count(true) - tensor_core_before, calls) << "every product above fits the FP8 GEMM";
  // Odd shapes and E5M2 x E5M2 take the 16-bit GEMM: the same values, the same bound.
  const int64_t wide_before = cuda::fp8_gemm_count(false);
  const Operands odd = quantized_operands(17, 33, 31, true, false, DType::kFloat8E4M3FN, DType::kFloat8E5M2, 3);
  expect_close(scaled_matmul(gpu(odd.a), gpu(odd.b), true, false, alpha, Tensor(), DType::kBFloat16),
               scaled_matmul(odd.a, odd.b, true, false, alpha, Tensor(), DType::kBFloat16), odd, true, false, alpha,
               "17 x 33 x 31");
  const Operands e5 = quantized_operands(32, 48, 64, false, false, DType::kFloat8E5M2, DType::kFloat8E5M2, 4);
  expect_close(scaled_matmul(gpu(e5.a), gpu(e5.b), false, false, alpha, Tensor(), DType::kFloat32),
               scaled_matmul(e5.a, e5.b, false, false, alpha, Tensor(), DType::kFloat32), e5, false, false, alpha,
               "E5M2 x E5M2");
  EXPECT_EQ(cuda::fp8_gemm_count(false) - wide_before, 2);
#endif
}

}  // namespace
}  // namespace mixtrain::ops
