// The FP8 element steps the CUDA kernels run (src/ops/shared/fp8_element.h), checked on the host against the CPU
// ops: fp8_quantize's element and fp8_amax's key against ops::fp8_quantize / fp8_amax on every bfloat16 pattern
// (every float8 code, every midpoint between codes and everything past the formats' ranges), in each input dtype,
// format, overflow rule and three scales, and on odd lengths; MXFP8's block step against ops::mx_block_quantize;
// the float8 cast's element against ops::cast in both
// directions; the test the FP8 GEMM uses to read an operand back as codes; and the FP8 GEMM's route rules
// (src/ops/cuda/fp8_gemm_route.h). Bit for bit everywhere. Runs on every machine, with or without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/core/float8.h"
#include "mixtrain/core/random.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "mixtrain/ops/transfer.h"
#include "mx_block_reference.h"
#include "ops/cuda/fp8_gemm_route.h"
#include "ops/shared/fp8_element.h"

namespace mixtrain::ops {
namespace {

constexpr DType kFormats[] = {DType::kFloat8E4M3FN, DType::kFloat8E5M2};

// Every bfloat16 bit pattern as a (65536,) tensor of dtype `in` (rounded into float16 for a float16 input).
Tensor every_bfloat16(DType in) {
  Tensor t = Tensor::empty({65536}, DType::kBFloat16);
  for (uint32_t i = 0; i < 65536; ++i) t.data<bfloat16>()[i].bits = static_cast<uint16_t>(i);
  return t.to(in);
}

uint16_t bits_at(const Tensor& bf16, int64_t i) { return bf16.data<bfloat16>()[i].bits; }

// The amax the shared key gives for x's elements (read as float32).
uint32_t shared_amax_bits(const std::vector<float>& xs) {
  uint32_t key = 0;
  for (float v : xs) key = std::max(key, shared::amax_key(v));
  return float_bits(shared::amax_from_key(key));
}

TEST(CudaSharedMath, Fp8QuantizeElementGivesTheCpuOpsBitsOnEveryPattern) {
  for (DType in : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const Tensor x = every_bfloat16(in);
    const std::vector<float> xs = x.to_floats();
    for (DType format : kFormats)
      for (Float8Overflow o : {Float8Overflow::kSaturate, Float8Overflow::kNonSaturating})
        for (float scale : {1.0f, 0.75f, 0.0009765625f}) {
          const Fp8Operand q = fp8_quantize(x, format, scale, o);
          const bool e5m2 = format == DType::kFloat8E5M2;
          int64_t differ = 0, first = -1;
          for (int64_t i = 0; i < x.numel(); ++i)
            if (shared::fp8_quantized_bfloat16(xs[static_cast<size_t>(i)], scale, e5m2, o) != bits_at(q.values, i)) {
              if (first < 0) first = i;
              ++differ;
            }
          EXPECT_EQ(differ, 0) << dtype_name(in) << " -> " << dtype_name(format) << " scale " << scale
                               << (o == Float8Overflow::kSaturate ? " saturating" : "") << ", first at pattern "
                               << first;
          // Every pattern includes NaNs, so both amaxes are NaN: the key's NaN is the CPU's (0x7FC00000).
          EXPECT_EQ(float_bits(q.amax), shared_amax_bits(xs));
        }
  }
}

// Odd lengths, NaN and infinities in places, and a NaN-free run: the amax key against the CPU op, bit for bit.
TEST(CudaSharedMath, Fp8AmaxKeyGivesTheCpuOpsAmax) {
  Rng r(7);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{17}, int64_t{31}, int64_t{129}, int64_t{2049}, int64_t{70001}})
    for (int special = 0; special < 4; ++special) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = std::ldexp(r.uniform(-1.0f, 1.0f), static_cast<int>(r.uniform(-30.0f, 30.0f)));
      const size_t at = static_cast<size_t>(n - 1) / (special + 1);
      if (special == 1) v[at] = -INFINITY;
      if (special == 2) v[at] = -NAN;
      if (special == 3) v[at] = -0.0f, v[0] = INFINITY;
      for (DType in : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
        const Tensor x = Tensor::from_floats({n}, v, in);
        EXPECT_EQ(float_bits(fp8_amax(x)), shared_amax_bits(x.to_floats()))
            << dtype_name(in) << " n " << n << " case " << special;
      }
    }
}

// The GPU cast's element (decode exactly, encode with the format's cast overflow) against ops::cast on the CPU.
TEST(CudaSharedMath, Float8CastElementGivesTheCpuCastsBits) {
  for (DType in : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const Tensor x = every_bfloat16(in);
    const std::vector<float> xs = x.to_floats();
    for (DType format : kFormats) {
      const bool e5m2 = format == DType::kFloat8E5M2;
      const Tensor codes = cast(x, format);
      int64_t differ = 0;
      for (int64_t i = 0; i < x.numel(); ++i)
        differ += shared::float8_code(xs[static_cast<size_t>(i)], e5m2, shared::cast_overflow(e5m2)) !=
                  static_cast<const uint8_t*>(codes.raw())[i];
      EXPECT_EQ(differ, 0) << dtype_name(in) << " -> " << dtype_name(format);
    }
  }
  for (DType format : kFormats) {
    const bool e5m2 = format == DType::kFloat8E5M2;
    Tensor codes = Tensor::empty({256}, format);
    for (int c = 0; c < 256; ++c) static_cast<uint8_t*>(codes.raw())[c] = static_cast<uint8_t>(c);
    for (DType out : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      const Tensor wide = cast(codes, out);
      Tensor expected = Tensor::empty({256}, DType::kFloat32);
      for (int c = 0; c < 256; ++c)
        expected.data<float>()[c] = shared::float8_value(static_cast<uint8_t>(c), e5m2);
      const Tensor rounded = expected.to(out);  // exact: every code's value is a value of each wide dtype
      EXPECT_EQ(std::memcmp(wide.raw(), rounded.raw(), wide.nbytes()), 0) << dtype_name(format) << " -> "
                                                                           << dtype_name(out);
    }
  }
}

// Every code's value is a value of its format (and reads back as that code); values between codes, and past the
// range, are not. An fp8_quantize output is values of its format throughout.
TEST(CudaSharedMath, Float8ValueTestAcceptsExactlyTheFormatsValues) {
  for (bool e5m2 : {false, true}) {
    for (int c = 0; c < 256; ++c) {
      const float v = shared::float8_value(static_cast<uint8_t>(c), e5m2);
      EXPECT_TRUE(shared::is_float8_value(v, e5m2)) << c;
      if (!std::isnan(v)) {
        EXPECT_EQ(shared::float8_code(v, e5m2, Float8Overflow::kNonSaturating), c) << c;
      }
    }
    EXPECT_FALSE(shared::is_float8_value(e5m2 ? 1.125f : 1.0625f, e5m2));  // half a unit above 1
    EXPECT_FALSE(shared::is_float8_value(e5m2 ? 65536.0f : 512.0f, e5m2));
    EXPECT_FALSE(shared::is_float8_value(e5m2 ? 0x1p-17f : 0x1p-10f, e5m2));  // half the smallest subnormal
  }
  EXPECT_FALSE(shared::is_float8_value(INFINITY, false));  // E4M3 has no infinity
  EXPECT_TRUE(shared::is_float8_value(-INFINITY, true));
  EXPECT_FALSE(shared::is_float8_value(1024.0f, false));   // an E5M2 value beyond E4M3's range
  EXPECT_FALSE(shared::is_float8_value(1.875f, true));     // an E4M3 value E5M2 cannot hold (3 mantissa bits)
  for (DType format : kFormats) {
    Rng r(3);
    std::vector<float> v(4099);
    for (float& x : v) x = std::ldexp(r.uniform(-1.0f, 1.0f), static_cast<int>(r.uniform(-12.0f, 10.0f)));
    const Fp8Operand q = fp8_quantize(Tensor::from_floats({4099}, v), format, 3.0f, Float8Overflow::kSaturate);
    int64_t outside = 0;
    for (float y : q.values.to_floats()) outside += !shared::is_float8_value(y, format == DType::kFloat8E5M2);
    EXPECT_EQ(outside, 0) << dtype_name(format);
  }
}

// MXFP8's block step (every block of the matrix, as the GPU kernel runs it) against the CPU's mx_block_quantize: odd
// shapes, both directions and formats, each input dtype; magnitudes from float32's subnormals to near its largest
// value, so scale exponents run from -127 up, with zero blocks, a NaN and an infinity placed.
TEST(CudaSharedMath, MxBlockStepGivesTheCpuOpsBits) {
  for (const auto& [rows, cols] : {std::array<int64_t, 2>{1, 1}, {7, 45}, {33, 31}, {17, 129}, {70, 64}}) {
    const std::vector<float> v = mx_test::every_range_values(rows, cols, /*subnormal_amaxes=*/true);
    for (DType in : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      const Tensor x = Tensor::from_floats({rows, cols}, v, in);
      for (DType format : kFormats)
        for (bool down : {false, true}) {
          const Tensor expected = mx_block_quantize(x, format, down);
          std::vector<uint16_t> out(static_cast<size_t>(rows * cols), 0xFFFFu);
          const int64_t blocks = shared::mx_block_count(rows, cols, down);
          for (int64_t b = 0; b < blocks; ++b)
            shared::mx_quantize_block(x.raw(), shared::float_code(in), rows, cols, down, b,
                                      format == DType::kFloat8E5M2, out.data());
          int64_t differ = 0;
          for (int64_t i = 0; i < rows * cols; ++i) differ += out[static_cast<size_t>(i)] != bits_at(expected, i);
          EXPECT_EQ(differ, 0) << rows << "x" << cols << " " << dtype_name(in) << " -> " << dtype_name(format)
                               << (down ? " down columns" : " along rows");
        }
    }
  }
  for (int k = -127; k <= 127; ++k) EXPECT_EQ(shared::power_of_two(k), std::ldexp(1.0f, k)) << k;
}

// The stored form's block steps (every block, as the GPU's encode and decode kernels run them) against the CPU's
// mx_block_encode and mx_block_decode: the same codes, scale bytes and decoded bits, on the inputs of the test above.
TEST(CudaSharedMath, MxEncodeAndDecodeStepsGiveTheCpuOpsBytes) {
  for (const auto& [rows, cols] : {std::array<int64_t, 2>{1, 1}, {7, 45}, {33, 31}, {17, 129}, {70, 64}}) {
    const Tensor x = Tensor::from_floats({rows, cols}, mx_test::every_range_values(rows, cols, false));
    for (DType format : kFormats)
      for (bool down : {false, true}) {
        const MxBlockCodes want = mx_block_encode(x, format, down);
        const Tensor want_values = mx_block_decode(want);
        const int64_t blocks = shared::mx_block_count(rows, cols, down);
        std::vector<uint8_t> codes(static_cast<size_t>(rows * cols), 0xAB), scales(static_cast<size_t>(blocks));
        std::vector<uint16_t> values(static_cast<size_t>(rows * cols), 0xFFFFu);
        const bool e5m2 = format == DType::kFloat8E5M2;
        for (int64_t b = 0; b < blocks; ++b) {
          const shared::MxBlockSpan s = shared::mx_block_span(rows, cols, down, b);
          scales[static_cast<size_t>(b)] =
              shared::mx_encode_block(x.raw(), shared::float_code(DType::kFloat32), s, e5m2, codes.data() + s.first,
                                      s.step);
          shared::mx_decode_block(codes.data() + s.first, s.step, scales[static_cast<size_t>(b)], s, e5m2,
                                  values.data());
        }
        const uint8_t* wc = static_cast<const uint8_t*>(want.codes.raw());
        const uint8_t* ws = static_cast<const uint8_t*>(want.scales.raw());
        int64_t differ = 0;
        for (int64_t i = 0; i < rows * cols; ++i)
          differ += codes[static_cast<size_t>(i)] != wc[i] || values[static_cast<size_t>(i)] != bits_at(want_values, i);
        for (int64_t b = 0; b < blocks; ++b) differ += scales[static_cast<size_t>(b)] != ws[b];
        EXPECT_EQ(differ, 0) << rows << "x" << cols << " " << dtype_name(format) << (down ? " down" : " along");
      }
  }
}

// The FP8 GEMM's codes in the "TN" layout, multiplied as cuBLASLt defines its product (column-major A (k, n) read
// transposed, B (k, m), D (n, m) = alpha op(A) B, in float64 here), against the CPU's scaled_matmul of the same
// bfloat16 values: every transposition, each format pair. Holds the layout reasoning of fp8_matmul.cu (which operand
// is cuBLASLt's A, which codes are written across their storage) on the host; both sums are of the same exact
// products, the CPU's in float32, so the bound is k * 2^-24 * alpha * sum |a_ik b_kj|.
TEST(CudaSharedMath, Fp8GemmTnCodesMultiplyToTheCpuProduct) {
  const DType pairs[][2] = {{DType::kFloat8E4M3FN, DType::kFloat8E4M3FN},
                            {DType::kFloat8E5M2, DType::kFloat8E4M3FN},
                            {DType::kFloat8E4M3FN, DType::kFloat8E5M2}};
  const float alpha = 0.001f;
  for (const auto& [m, n, k] : {std::array<int64_t, 3>{16, 32, 48}, {48, 16, 32}})
    for (const auto& pair : pairs)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          Rng r(static_cast<uint64_t>(m + 2 * ta + tb));
          std::vector<float> av(static_cast<size_t>(m * k)), bv(static_cast<size_t>(k * n));
          for (float& x : av) x = r.uniform(-300.0f, 300.0f);
          for (float& x : bv) x = r.uniform(-3.0f, 3.0f);
          const Tensor a = fp8_quantize(Tensor::from_floats(ta ? Shape{k, m} : Shape{m, k}, av), pair[0], 1.0f,
                                        Float8Overflow::kSaturate).values;
          const Tensor b = fp8_quantize(Tensor::from_floats(tb ? Shape{n, k} : Shape{k, n}, bv), pair[1], 1.0f,
                                        Float8Overflow::kSaturate).values;
          const std::vector<float> as = a.to_floats(), bs = b.to_floats();
          const cuda::TnSources tn = cuda::tn_sources(ta, tb);
          const bool a_e5m2 = pair[0] == DType::kFloat8E5M2, b_e5m2 = pair[1] == DType::kFloat8E5M2;
          std::vector<uint8_t> a_codes(static_cast<size_t>(m * k)), b_codes(static_cast<size_t>(n * k));
          for (int64_t i = 0; i < m * k; ++i)
            a_codes[static_cast<size_t>(i)] = shared::float8_code(
                as[static_cast<size_t>(shared::tn_source_index(i, m, k, tn.a_transposed))], a_e5m2,
                Float8Overflow::kNonSaturating);
          for (int64_t i = 0; i < n * k; ++i)
            b_codes[static_cast<size_t>(i)] = shared::float8_code(
                bs[static_cast<size_t>(shared::tn_source_index(i, n, k, tn.b_transposed))], b_e5m2,
                Float8Overflow::kNonSaturating);
          const std::vector<float> c = scaled_matmul(a, b, ta, tb, alpha, Tensor(), DType::kFloat32).to_floats();
          int64_t bad = 0;
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double d = 0.0, abs_sum = 0.0;  // D (j, i) of cuBLASLt's column-major (n, m) result
              for (int64_t p = 0; p < k; ++p) {
                const double prod =
                    static_cast<double>(shared::float8_value(b_codes[static_cast<size_t>(j * k + p)], b_e5m2)) *
                    shared::float8_value(a_codes[static_cast<size_t>(i * k + p)], a_e5m2);
                d += prod;
                abs_sum += std::fabs(prod);
              }
              const double cv = c[static_cast<size_t>(i * n + j)];
              bad += !(std::fabs(alpha * d - cv) <= static_cast<double>(k) * 0x1p-24 * alpha * abs_sum + 1e-30);
            }
          EXPECT_EQ(bad, 0) << m << "x" << n << "x" << k << (ta ? " a^T" : "") << (tb ? " b^T" : "") << " "
                            << dtype_name(pair[0]) << " x " << dtype_name(pair[1]);
        }
}

TEST(CudaSharedMath, Fp8GemmRouteTakesTheTensorCoresOnlyWhereCublasLtCan) {
  using cuda::choose_fp8_gemm_route;
  const cuda::Fp8Exactness e4m3{true, false}, e5m2{false, true}, both{true, true}, neither{false, false};
  cuda::Fp8GemmRoute r = choose_fp8_gemm_route(32, 48, 64, e4m3, e5m2);
  EXPECT_TRUE(r.tensor_cores);
  EXPECT_FALSE(r.a_e5m2);
  EXPECT_TRUE(r.b_e5m2);
  EXPECT_EQ(r.why, "");
  r = choose_fp8_gemm_route(32, 48, 64, both, both);  // E4M3 where both hold the values
  EXPECT_TRUE(r.tensor_cores && !r.a_e5m2 && !r.b_e5m2);
  r = choose_fp8_gemm_route(32, 48, 64, e5m2, e4m3);
  EXPECT_TRUE(r.tensor_cores && r.a_e5m2 && !r.b_e5m2);
  r = choose_fp8_gemm_route(32, 48, 64, e5m2, e5m2);
  EXPECT_FALSE(r.tensor_cores);
  EXPECT_NE(r.why.find("E5M2 x E5M2"), std::string::npos) << r.why;
  r = choose_fp8_gemm_route(32, 48, 64, e4m3, neither);
  EXPECT_FALSE(r.tensor_cores);
  EXPECT_NE(r.why.find("operand b"), std::string::npos) << r.why;
  for (const auto& [m, n, k] : {std::array<int64_t, 3>{17, 48, 64}, {32, 40, 64}, {32, 48, 24}, {32, 48, 0}}) {
    r = choose_fp8_gemm_route(m, n, k, e4m3, e4m3);
    EXPECT_FALSE(r.tensor_cores) << m << " " << n << " " << k;
    EXPECT_NE(r.why.find("multiples of 16"), std::string::npos) << r.why;
  }
  EXPECT_NO_THROW(cuda::require_fp8_capability(8, 9, "cuda:0 (an Ada GPU)"));
  EXPECT_NO_THROW(cuda::require_fp8_capability(9, 0, "cuda:0 (an H100)"));
  EXPECT_NO_THROW(cuda::require_fp8_capability(10, 0, "cuda:0 (a B200)"));
  try {
    cuda::require_fp8_capability(8, 6, "cuda:1 (an A10)");
    FAIL() << "compute capability 8.6 runs no FP8 GEMM";
  } catch (const Error& e) {
    const std::string what = e.message();
    EXPECT_NE(what.find("cuda:1 (an A10) has compute capability 8.6"), std::string::npos) << what;
    EXPECT_NE(what.find("8.9 or above"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace mixtrain::ops
