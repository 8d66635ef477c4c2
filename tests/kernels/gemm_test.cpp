// gemm() on every instruction-set path this CPU has, and on the bfloat16 dot-product path where the CPU
// has AVX512_BF16, against a float64 reference computed from the same rounded inputs: all transpose
// cases, input dtypes, output dtypes, accumulate and bias, odd shapes.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/gemm_internal.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/half.h"
#include "mixtrain/kernels/cpu_features.h"
#include "mixtrain/kernels/gemm.h"

namespace mixtrain::kernels {
namespace {

constexpr DType kFloatTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// A row-major matrix of any float dtype; padding columns (ld > cols) hold NaN, so a kernel that reads
// them poisons its result.
struct Matrix {
  DType dtype;
  int64_t rows, cols, ld;
  std::vector<unsigned char> bytes;

  Matrix(DType d, int64_t r, int64_t c, int64_t pad)
      : dtype(d), rows(r), cols(c), ld(c + pad), bytes(static_cast<size_t>(r * (c + pad)) * dtype_size(d)) {
    for (int64_t i = 0; i < r * ld; ++i) set_flat(i, NAN);
  }
  void set_flat(int64_t i, float v) {
    switch (dtype) {
      case DType::kFloat16:
        reinterpret_cast<uint16_t*>(bytes.data())[i] = float_to_half_bits(v);
        break;
      case DType::kBFloat16:
        reinterpret_cast<uint16_t*>(bytes.data())[i] = float_to_bf16_bits(v);
        break;
      default:
        reinterpret_cast<float*>(bytes.data())[i] = v;
    }
  }
  double get(int64_t r, int64_t c) const {
    const int64_t i = r * ld + c;
    switch (dtype) {
      case DType::kFloat16:
        return half_bits_to_float(reinterpret_cast<const uint16_t*>(bytes.data())[i]);
      case DType::kBFloat16:
        return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(bytes.data())[i]);
      default:
        return reinterpret_cast<const float*>(bytes.data())[i];
    }
  }
  void fill_uniform(std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) set_flat(r * ld + c, dist(rng));
  }
  void* data() { return bytes.data(); }
};

// Unit roundoff (half an ulp at 1, relative) of each output dtype.
double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return std::ldexp(1.0, -11);
    case DType::kBFloat16:
      return std::ldexp(1.0, -8);
    default:
      return std::ldexp(1.0, -24);
  }
}

// Error bound for one element of C. The float32 result sums k products plus C and bias, k + 2 terms in
// some order; any such float32 sum is within gamma_(k+2) ~ (k + 2) * 2^-24 of the exact one, relative to
// the sum of the terms' magnitudes `abs_sum` (FMA or not, whatever the blocking). Then C is rounded once
// into its dtype: relative error unit_roundoff(c_dtype), plus, for float16, up to half the smallest
// subnormal (2^-25) in absolute terms when the result is tiny. The 1.01 covers gamma's second-order terms.
// f16_terms > 0 (the float16 FMA method): each float16 partial sum of at most f16_terms products adds
// up to f16_terms * 2^-11 relative to the magnitudes it sums, and each float16 rounding of a tiny sum up
// to 2^-25 absolute (half the smallest float16 subnormal), k of them at most.
// bf16_split (the float16 "amx" method): 3k products are summed, and each float16 product a b misses
// a_lo b_lo, at most 2^-16 |a b| (gemm_amx_kernel.h); their terms' magnitudes sum to at most (1 + 2^-7) abs_sum.
double tolerance(int64_t k, double abs_sum, double exact, DType c_dtype, int64_t f16_terms = 0,
                 bool bf16_split = false) {
  double accumulation = 1.01 * static_cast<double>(k + 2) * std::ldexp(1.0, -24) * abs_sum;
  if (bf16_split)
    accumulation = 1.01 * static_cast<double>(3 * k + 2) * std::ldexp(1.0, -24) * abs_sum +
                   std::ldexp(1.0, -16) * abs_sum;
  if (f16_terms > 0)
    accumulation += 1.01 * static_cast<double>(f16_terms) * std::ldexp(1.0, -11) * abs_sum +
                    static_cast<double>(k) * std::ldexp(1.0, -25);
  const double u = unit_roundoff(c_dtype);
  const double subnormal_floor = c_dtype == DType::kFloat16 ? std::ldexp(1.0, -25) : 0.0;
  return accumulation + u * (std::fabs(exact) + accumulation) + subnormal_floor;
}

struct Shape3 {
  int64_t m, n, k;
};

// C = A B + bias (B transposed and not, every C dtype) with inputs of `ab`, once on one thread and once on two:
// the results must match bit for bit, as each thread owns whole output blocks and sums in the same order.
// Runs each shape (B as stored and transposed, every output dtype, accumulating, with a bias) once under
// `first` and once under `second` (settings applied before each gemm) and expects the same bytes of C.
void expect_same_bits(const char* path, DType ab, const std::vector<Shape3>& shapes, std::mt19937& rng,
                      const std::function<void()>& first, const std::function<void()>& second, const char* what) {
  for (const Shape3& s : shapes) {
    for (bool trans_b : {false, true}) {
      for (DType c_dtype : kFloatTypes) {
        Matrix a(ab, s.m, s.k, 0);
        Matrix b(ab, trans_b ? s.n : s.k, trans_b ? s.k : s.n, 0);
        a.fill_uniform(rng);
        b.fill_uniform(rng);
        std::vector<float> bias(static_cast<size_t>(s.n), 0.25f);
        Matrix c1(c_dtype, s.m, s.n, 0);
        c1.fill_uniform(rng);
        Matrix c2 = c1;
        first();
        gemm(false, trans_b, s.m, s.n, s.k, ab, a.data(), a.ld, b.data(), b.ld, c_dtype, c1.data(), c1.ld, true,
             bias.data());
        second();
        gemm(false, trans_b, s.m, s.n, s.k, ab, a.data(), a.ld, b.data(), b.ld, c_dtype, c2.data(), c2.ld, true,
             bias.data());
        EXPECT_EQ(c1.bytes, c2.bytes) << path << " (" << what << ") m=" << s.m << " n=" << s.n << " k=" << s.k
                                      << " trans_b=" << trans_b << " c=" << dtype_name(c_dtype);
      }
    }
  }
}

// 1 against 2 and 3 threads: row slabs of unequal heights sharing each packed B block (SharedB in gemm.cpp), and
// column splits.
void expect_same_bits_on_one_and_two_threads(const char* path, DType ab, const std::vector<Shape3>& shapes,
                                             std::mt19937& rng) {
  const int saved = omp_get_max_threads();
  expect_same_bits(path, ab, shapes, rng, [] { omp_set_num_threads(1); }, [] { omp_set_num_threads(2); },
                   "1 and 2 threads");
  expect_same_bits(path, ab, shapes, rng, [] { omp_set_num_threads(1); }, [] { omp_set_num_threads(3); },
                   "1 and 3 threads");
  omp_set_num_threads(saved);
}

// The AMX paths' column kernel (row tiles against one B panel in slices of steps) against one tile at a time.
void expect_column_kernel_bits(const char* path, DType ab, const std::vector<Shape3>& shapes, std::mt19937& rng) {
  expect_same_bits(path, ab, shapes, rng, [] { set_gemm_column_kernel_for_testing(true); },
                   [] { set_gemm_column_kernel_for_testing(false); }, "column kernel and tile by tile");
  set_gemm_column_kernel_for_testing(true);
}

// A C of 4 MiB and more is written with non-temporal stores (gemm.cpp: kStreamOutBytes) where its rows start on
// cache lines; the same product computed in eight row blocks, each below that size, gives the same bytes. C's rows
// are 64-byte aligned, and not (C one 16-bit element in, or ldc padded); every C dtype, with and without a bias
// (only aligned rows without a bias when `quick`, for the slow emulations).
void expect_streamed_c_bits(const char* path, DType ab, int64_t k, bool quick = false) {
  std::mt19937 rng(31);
  const int64_t m = 2048, n = 1056;
  Matrix a(ab, m, k, 0), b(ab, k, n, 0);
  a.fill_uniform(rng);
  b.fill_uniform(rng);
  std::vector<float> bias(static_cast<size_t>(n), 0.5f);
  for (DType c_dtype : kFloatTypes) {
    const int64_t size = static_cast<int64_t>(dtype_size(c_dtype));
    for (int64_t pad : {0, 3}) {
      for (int64_t offset : {0, 2}) {  // bytes past a 64-byte boundary
        for (const float* bias_ptr : {static_cast<const float*>(nullptr), static_cast<const float*>(bias.data())}) {
          if (quick && (pad != 0 || offset != 0 || bias_ptr != nullptr)) continue;
          const int64_t ldc = n + pad, bytes = m * ldc * size + 64;
          std::unique_ptr<char, decltype(&std::free)> whole(static_cast<char*>(std::aligned_alloc(64, bytes)), &std::free);
          std::unique_ptr<char, decltype(&std::free)> pieces(static_cast<char*>(std::aligned_alloc(64, bytes)), &std::free);
          std::memset(whole.get(), 0x7f, static_cast<size_t>(bytes));
          std::memset(pieces.get(), 0x7f, static_cast<size_t>(bytes));
          gemm(false, false, m, n, k, ab, a.data(), a.ld, b.data(), b.ld, c_dtype, whole.get() + offset, ldc, false,
               bias_ptr);
          const int64_t a_size = static_cast<int64_t>(dtype_size(ab));
          for (int64_t i0 = 0; i0 < m; i0 += m / 8)  // blocks of 1 MiB or less: not streamed
            gemm(false, false, m / 8, n, k, ab, a.bytes.data() + i0 * a.ld * a_size, a.ld, b.data(), b.ld, c_dtype,
                 pieces.get() + offset + i0 * ldc * size, ldc, false, bias_ptr);
          EXPECT_EQ(std::memcmp(whole.get(), pieces.get(), static_cast<size_t>(bytes)), 0)
              << path << " c=" << dtype_name(c_dtype) << " pad=" << pad << " offset=" << offset
              << " bias=" << (bias_ptr != nullptr);
        }
      }
    }
  }
}

// Everything for one (shape, transposes, input dtype): runs every output dtype, accumulate and bias
// combination and checks each element of C and that C's padding columns are untouched.
void check_all_outputs(const char* isa, Shape3 s, bool trans_a, bool trans_b, DType ab, std::mt19937& rng,
                       int64_t f16_terms = 0, bool bf16_split = false) {
  const int64_t m = s.m, n = s.n, k = s.k;
  const int64_t pad = (m + n + k) % 3 == 0 ? 0 : 3;  // some cases with ld > cols
  Matrix a(ab, trans_a ? k : m, trans_a ? m : k, pad);
  Matrix b(ab, trans_b ? n : k, trans_b ? k : n, pad);
  a.fill_uniform(rng);
  b.fill_uniform(rng);
  std::vector<float> bias(static_cast<size_t>(n));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : bias) x = dist(rng);

  // Exact products of the rounded inputs, and the sum of their magnitudes, in float64.
  std::vector<double> product(static_cast<size_t>(m * n)), magnitude(static_cast<size_t>(m * n));  // (m, n)
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = trans_a ? a.get(p, i) : a.get(i, p);
        const double y = trans_b ? b.get(j, p) : b.get(p, j);
        sum += x * y;
        mag += std::fabs(x * y);
      }
      product[i * n + j] = sum;
      magnitude[i * n + j] = mag;
    }
  }

  for (DType c_dtype : kFloatTypes) {
    for (bool accumulate : {false, true}) {
      for (bool with_bias : {false, true}) {
        std::ostringstream where;
        where << isa << " m=" << m << " n=" << n << " k=" << k << " trans_a=" << trans_a << " trans_b=" << trans_b
              << " ab=" << dtype_name(ab) << " c=" << dtype_name(c_dtype) << " accumulate=" << accumulate
              << " bias=" << with_bias;
        Matrix c(c_dtype, m, n, 2);
        if (accumulate) c.fill_uniform(rng);  // otherwise C is NaN and must not be read
        const Matrix c_before = c;
        gemm(trans_a, trans_b, m, n, k, ab, a.data(), a.ld, b.data(), b.ld, c_dtype, c.data(), c.ld, accumulate,
             with_bias ? bias.data() : nullptr);

        int failures = 0;
        for (int64_t i = 0; i < m && failures < 5; ++i) {
          for (int64_t j = 0; j < n && failures < 5; ++j) {
            double exact = product[i * n + j], abs_sum = magnitude[i * n + j];
            if (accumulate) {
              exact += c_before.get(i, j);
              abs_sum += std::fabs(c_before.get(i, j));
            }
            if (with_bias) {
              exact += bias[j];
              abs_sum += std::fabs(bias[j]);
            }
            const double got = c.get(i, j);
            const double tol = tolerance(k, abs_sum, exact, c_dtype, f16_terms, bf16_split);
            if (!(std::fabs(got - exact) <= tol)) {
              ADD_FAILURE() << where.str() << ": C[" << i << "][" << j << "] = " << got << ", expected " << exact
                            << " +- " << tol;
              ++failures;
            }
          }
        }
        const size_t elem = dtype_size(c_dtype);
        for (int64_t i = 0; i < m; ++i) {  // padding columns keep their bytes
          const size_t off = static_cast<size_t>(i * c.ld + n) * elem;
          ASSERT_EQ(std::memcmp(c.bytes.data() + off, c_before.bytes.data() + off, 2 * elem), 0)
              << where.str() << ": wrote past column n in row " << i;
        }
        ASSERT_EQ(failures, 0);
      }
    }
  }
}

// Runs a test once per path; skips paths this CPU lacks. bfloat16 inputs are widened to float32 here
// (the dot-product method has its own tests below).
// MIXTRAIN_REQUIRE_GEMM=amx,dot,fp16,avx512,avx2 (a comma-separated list) makes the named methods and paths
// mandatory: a test that would skip for lack of one fails instead, so a CI machine that should run it cannot
// pass silently. "detected" names every one that cpuid reports on this machine (.ci/run sets it): the processor
// behind a CI machine varies, and a path its CPU has must then run, not skip.
bool cpu_reports(const std::string& method) {
  const CpuFeatures& f = cpu_features();
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c;
  if (method == "avx2") return f.avx2 && f.fma && f.f16c;
  if (method == "avx512") return avx512;
  if (method == "dot") return avx512 && f.avx512_bf16;
  if (method == "fp16") return avx512 && f.avx512_fp16;
  if (method == "amx") return avx512 && f.amx_bf16;
  return false;
}

bool required(const std::string& method) {
  const char* env = std::getenv("MIXTRAIN_REQUIRE_GEMM");
  if (env == nullptr) return false;
  std::stringstream list(env);
  std::string item;
  while (std::getline(list, item, ','))
    if (item == method || (item == "detected" && cpu_reports(method))) return true;
  return false;
}

class GemmPath : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    set_gemm_bf16_method_for_testing("widen");
    set_gemm_f16_method_for_testing("widen");
    if (std::strcmp(set_gemm_isa_for_testing(GetParam()), GetParam()) != 0) {
      if (required(GetParam())) FAIL() << "MIXTRAIN_REQUIRE_GEMM names " << GetParam() << ", which this CPU cannot run";
      GTEST_SKIP() << "this CPU has no " << GetParam() << " path";
    }
  }
  void TearDown() override {
    set_gemm_isa_for_testing(nullptr);
    set_gemm_bf16_method_for_testing(nullptr);
    set_gemm_f16_method_for_testing(nullptr);
  }
};

TEST_P(GemmPath, OddShapesAllTransposesAndDtypes) {
  const int64_t sizes[] = {1, 7, 17, 31, 129};
  std::vector<Shape3> shapes;
  for (int64_t m : sizes)
    for (int64_t n : sizes)
      for (int64_t k : sizes) shapes.push_back({m, n, k});
  shapes.push_back({1000, 33, 257});  // k past one cache block, many row panels, both threads
  std::mt19937 rng(1234);
  for (const Shape3& s : shapes)
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        for (DType ab : kFloatTypes) check_all_outputs(GetParam(), s, trans_a, trans_b, ab, rng);
}

TEST_P(GemmPath, EmptyInnerDimensionGivesBiasAndOldC) {
  std::mt19937 rng(7);
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true})
      for (DType ab : kFloatTypes) check_all_outputs(GetParam(), {5, 19, 0}, trans_a, trans_b, ab, rng);
}

TEST_P(GemmPath, SeveralColumnAndDepthBlocks) {
  // n past the widest column block (2048 on every path) and k over several k blocks (at most 1024 deep):
  // partial sums carried from block to block, through float32 scratch when C is 16-bit.
  std::mt19937 rng(99);
  for (DType ab : kFloatTypes) check_all_outputs(GetParam(), {5, 4133, 2100}, false, ab == DType::kFloat16, ab, rng);
}

// Each element is summed in the same order whatever the team size, so the bits match.
TEST_P(GemmPath, OneAndTwoThreadsGiveIdenticalBits) {
  // Rows split between threads; columns split (a single row panel); odd edges; several k blocks.
  std::mt19937 rng(5);
  for (DType ab : kFloatTypes)
    expect_same_bits_on_one_and_two_threads(GetParam(), ab,
                                            {{300, 200, 600}, {7, 1000, 300}, {129, 515, 257}, {70, 300, 2100}}, rng);
}

// C = 1 x row: each C element is one product, 0 + 1 * x, so the output is exactly x rounded once into
// C's dtype, which must match half.h bit for bit on every path: ties to even, subnormals, overflow to
// infinity, NaN (kept NaN, quiet, same sign and top payload bits).
TEST_P(GemmPath, RoundsIntoCDtypeExactlyLikeHalfConversions) {
  std::mt19937 rng(11);
  std::vector<float> row;  // (1, n)
  for (int i = 0; i < 20000; ++i) row.push_back(bits_float(static_cast<uint32_t>(rng())));
  for (uint32_t h = 0; h < 0x10000; h += 7) {  // just above and below every 16-bit midpoint region
    row.push_back(half_bits_to_float(static_cast<uint16_t>(h)) * (1.0f + 1.0f / 4096));
    row.push_back(bf16_bits_to_float(static_cast<uint16_t>(h)) + 0.0f);
  }
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, 65519.99f, 5.9604645e-08f,
                  2.9802322e-08f, 2.9802326e-08f, 1e-40f, 3.3895314e+38f})
    row.push_back(x);
  const int64_t n = static_cast<int64_t>(row.size());
  const float one = 1.0f;
  for (DType c_dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    Matrix c(c_dtype, 1, n, 0);
    gemm(false, false, 1, n, 1, DType::kFloat32, &one, 1, row.data(), n, c_dtype, c.data(), n, false, nullptr);
    int failures = 0;
    for (int64_t j = 0; j < n && failures < 5; ++j) {
      const float exact = 0.0f + row[j];  // the kernel's sum starts at +0, so -0 becomes +0
      Matrix want(c_dtype, 1, 1, 0);
      want.set_flat(0, exact);
      const size_t size = dtype_size(c_dtype);
      if (std::memcmp(c.bytes.data() + j * size, want.bytes.data(), size) != 0) {
        ADD_FAILURE() << GetParam() << " c=" << dtype_name(c_dtype) << ": " << exact << " (bits 0x" << std::hex
                      << float_bits(exact) << std::dec << ") rounded to " << c.get(0, j) << ", expected "
                      << want.get(0, 0);
        ++failures;
      }
    }
  }
}

TEST_P(GemmPath, LargeCStreamedGivesTheBitsOfSmallerProducts) {
  expect_streamed_c_bits(GetParam(), DType::kFloat32, 40, std::strcmp(GetParam(), "scalar") == 0);
}

INSTANTIATE_TEST_SUITE_P(Isa, GemmPath, ::testing::Values("scalar", "avx2", "avx512"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// ---- bfloat16 methods that keep the values 16-bit: vdpbf16ps ("dot"), AMX tiles ("amx"), and the AMX
// kernel on the portable emulation of its instructions ("amx_emulated", which runs on every CPU) ----
//
// The same float32-accumulation bound as every other path, tolerance() above: each vdpbf16ps or tdpbf16ps
// adds exact products to the running float32 sum, so an element of C is still a float32 sum of k + 2 terms
// (k products, old C, bias) in some order, within gamma_(k+2) of the exact sum. Both instructions read
// bfloat16 subnormals as zero and flush subnormal results to zero, which that bound does not cover; the
// inputs here (uniform in [-1, 1], bias and old C likewise) have no bfloat16 subnormals, and every nonzero
// partial sum of their products is far above the float32 subnormal range, so neither ever happens.

class GemmBf16Pairs : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string method = GetParam();
    const bool on_avx512 = std::strcmp(set_gemm_isa_for_testing("avx512"), "avx512") == 0;
    if (method == "amx_emulated") set_gemm_isa_for_testing(nullptr);  // any path
    if (set_gemm_bf16_method_for_testing(GetParam()) != method || (method != "amx_emulated" && !on_avx512)) {
      if (required(method)) FAIL() << "MIXTRAIN_REQUIRE_GEMM names " << method << ", which this CPU cannot run";
      GTEST_SKIP() << "this CPU has no bfloat16 method " << method;
    }
  }
  void TearDown() override {
    set_gemm_isa_for_testing(nullptr);
    set_gemm_bf16_method_for_testing(nullptr);
  }
  bool emulated() const { return std::strcmp(GetParam(), "amx_emulated") == 0; }
};

TEST_P(GemmBf16Pairs, OddShapesAllTransposesAndDtypes) {
  const int64_t sizes[] = {1, 7, 17, 31, 129};
  std::vector<Shape3> shapes;
  for (int64_t m : sizes)
    for (int64_t n : sizes)
      for (int64_t k : sizes) shapes.push_back({m, n, k});
  shapes.push_back({1000, 33, 257});
  std::mt19937 rng(4321);
  for (const Shape3& s : shapes)
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true}) check_all_outputs(GetParam(), s, trans_a, trans_b, DType::kBFloat16, rng);
}

// Every k from 1 to 66 (odd ones pad the last pair with zero; 32 and 64 end a packing block or a tile
// step exactly) and a few past, each with both layouts of A and B; C's padding and the NaN in the
// operands' padding columns catch a pair that reads one element too far.
TEST_P(GemmBf16Pairs, OddAndEvenDepths) {
  std::mt19937 rng(8);
  std::vector<int64_t> depths;
  for (int64_t k = 1; k <= 66; ++k) depths.push_back(k);
  for (int64_t k : {95, 97, 255, 513}) depths.push_back(k);
  for (int64_t k : depths)
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        check_all_outputs(GetParam(), {13, 45, k}, trans_a, trans_b, DType::kBFloat16, rng);
}

TEST_P(GemmBf16Pairs, SeveralColumnAndDepthBlocks) {
  // n past the column block (2048; 96 emulated) and k over two k blocks (at most 2048 deep, 1024 on AMX,
  // 96 emulated) of odd and even depth: the padded pair sits in the middle of the sum.
  std::mt19937 rng(98);
  const Shape3 shape = emulated() ? Shape3{37, 211, 301} : Shape3{5, 4133, 2101};
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true}) check_all_outputs(GetParam(), shape, trans_a, trans_b, DType::kBFloat16, rng);
}

TEST_P(GemmBf16Pairs, OneAndTwoThreadsGiveIdenticalBits) {
  std::mt19937 rng(6);
  expect_same_bits_on_one_and_two_threads(
      GetParam(), DType::kBFloat16,
      {{300, 200, 600}, {7, 1000, 301}, {129, 515, 257}, {70, 300, emulated() ? 999 : 4199}}, rng);
}

// Shapes whose chunks hold several row tiles and whose depth crosses several slices (2 steps each in the
// emulation, 8 on the AMX tiles), with ragged edges.
TEST_P(GemmBf16Pairs, ColumnKernelGivesTheTileByTileBits) {
  std::mt19937 rng(23);
  expect_column_kernel_bits(GetParam(), DType::kBFloat16,
                            emulated() ? std::vector<Shape3>{{70, 40, 200}, {64, 33, 95}}
                                       : std::vector<Shape3>{{130, 70, 1000}, {128, 64, 257}, {97, 300, 2100}},
                            rng);
}

// A bfloat16 C of whole tiles: the AMX path rounds each row with vcvtne2ps2bf16, which reads subnormals as zero, so
// rows with a subnormal take the integer rounding. Either way every value must round as half.h does. The values
// come in through the bias (A and B are zero, so each element of C is +0 + bias).
TEST_P(GemmBf16Pairs, RoundsWholeTilesIntoBFloat16LikeHalfConversions) {
  std::mt19937 rng(13);
  std::vector<float> bias;
  for (int i = 0; i < 4000; ++i) bias.push_back(bits_float(static_cast<uint32_t>(rng())));
  for (uint32_t h = 0; h < 0x10000; h += 5) bias.push_back(bf16_bits_to_float(static_cast<uint16_t>(h)) * (1.0f + 1.0f / 512));
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, -1e-40f, 1.1754942e-38f, 3.3895314e+38f,
                  3.4028235e+38f})
    bias.push_back(x);
  while (bias.size() % 32 != 0) bias.push_back(1.0f / 3.0f);
  const int64_t m = 64, n = static_cast<int64_t>(bias.size()), k = emulated() ? 32 : 64;
  Matrix a(DType::kBFloat16, m, k, 0), b(DType::kBFloat16, k, n, 0), c(DType::kBFloat16, m, n, 0);
  for (int64_t i = 0; i < m * k; ++i) a.set_flat(i, 0.0f);
  for (int64_t i = 0; i < k * n; ++i) b.set_flat(i, 0.0f);
  gemm(false, false, m, n, k, DType::kBFloat16, a.data(), a.ld, b.data(), b.ld, DType::kBFloat16, c.data(), c.ld, false,
       bias.data());
  int failures = 0;
  for (int64_t i = 0; i < m && failures < 5; ++i) {
    for (int64_t j = 0; j < n && failures < 5; ++j) {
      const float exact = 0.0f + bias[static_cast<size_t>(j)];
      const uint16_t got = reinterpret_cast<const uint16_t*>(c.bytes.data())[i * n + j];
      if (got != float_to_bf16_bits(exact)) {
        ADD_FAILURE() << GetParam() << ": " << exact << " (bits 0x" << std::hex << float_bits(exact) << ") rounded to 0x"
                      << got << ", expected 0x" << float_to_bf16_bits(exact) << std::dec << " at (" << i << ", " << j
                      << ")";
        ++failures;
      }
    }
  }
}

TEST_P(GemmBf16Pairs, LargeCStreamedGivesTheBitsOfSmallerProducts) {
  expect_streamed_c_bits(GetParam(), DType::kBFloat16, emulated() ? 32 : 96);
}

INSTANTIATE_TEST_SUITE_P(Method, GemmBf16Pairs, ::testing::Values("dot", "amx", "amx_emulated"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// ---- float16 with AVX512-FP16 FMAs (the "fp16" method), and its kernel on the portable emulation of the
// instructions ("fp16_emulated", on every CPU) ----

class GemmF16Fma : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string method = GetParam();
    const bool on_avx512 = std::strcmp(set_gemm_isa_for_testing("avx512"), "avx512") == 0;
    if (method == "fp16_emulated") set_gemm_isa_for_testing(nullptr);  // any path
    if (set_gemm_f16_method_for_testing(GetParam()) != method || (method != "fp16_emulated" && !on_avx512)) {
      if (required("fp16")) FAIL() << "MIXTRAIN_REQUIRE_GEMM names fp16, which this CPU cannot run";
      GTEST_SKIP() << "this CPU has no float16 method " << method;
    }
  }
  void TearDown() override {
    set_gemm_isa_for_testing(nullptr);
    set_gemm_f16_method_for_testing(nullptr);
    set_gemm_f16_promote_interval_for_testing(0);
  }
  // Products in one float16 partial sum of a lane: half the promotion interval.
  static int64_t terms() { return gemm_f16_promote_interval() / 2; }
};

TEST_P(GemmF16Fma, OddShapesAllTransposesAndDtypes) {
  // The emulation is slow: fewer shapes, still around the 12 x 32 micro-tile and its blocks.
  const bool emulated = std::strcmp(GetParam(), "fp16_emulated") == 0;
  const std::vector<int64_t> sizes = emulated ? std::vector<int64_t>{1, 13, 33, 70} : std::vector<int64_t>{1, 7, 17, 31, 129};
  std::vector<Shape3> shapes;
  for (int64_t m : sizes)
    for (int64_t n : sizes)
      for (int64_t k : sizes) shapes.push_back({m, n, k});
  if (!emulated) shapes.push_back({1000, 33, 257});
  std::mt19937 rng(777);
  for (const Shape3& s : shapes)
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        check_all_outputs(GetParam(), s, trans_a, trans_b, DType::kFloat16, rng, terms());
}

// Every k from 1 to 70 around the promotion points (interval 8 here: a promotion every 4 pairs) and the
// packing blocks of 32, both layouts of A and B.
TEST_P(GemmF16Fma, OddAndEvenDepthsAroundPromotions) {
  set_gemm_f16_promote_interval_for_testing(8);
  std::mt19937 rng(9);
  for (int64_t k = 1; k <= 70; ++k)
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        check_all_outputs(GetParam(), {13, 45, k}, trans_a, trans_b, DType::kFloat16, rng, terms());
}

TEST_P(GemmF16Fma, SeveralColumnAndDepthBlocks) {
  std::mt19937 rng(97);
  const bool emulated = std::strcmp(GetParam(), "fp16_emulated") == 0;
  const Shape3 shape = emulated ? Shape3{29, 150, 301} : Shape3{5, 4133, 2101};
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true})
      check_all_outputs(GetParam(), shape, trans_a, trans_b, DType::kFloat16, rng, terms());
}

TEST_P(GemmF16Fma, OneAndTwoThreadsGiveIdenticalBits) {
  std::mt19937 rng(16);
  const bool emulated = std::strcmp(GetParam(), "fp16_emulated") == 0;
  expect_same_bits_on_one_and_two_threads(
      GetParam(), DType::kFloat16,
      emulated ? std::vector<Shape3>{{100, 70, 200}, {7, 300, 101}, {45, 100, 257}}
               : std::vector<Shape3>{{300, 200, 600}, {7, 1000, 301}, {129, 515, 257}},
      rng);
}

// The promise of the default interval, as a mixed_float16 forward pass uses it (float16 A, B and C):
// the error against the exact product, both its root mean square and its largest value over 64 x 64
// outputs, stays within 4x that of float32 accumulation (the "widen" method) up to k = 8192. (Float32
// accumulation's error here is mostly C's rounding into float16; the float16 partial sums add to it.)
TEST_P(GemmF16Fma, ErrorWithin4xOfFloat32AccumulationUpTo8192) {
  const bool emulated = std::strcmp(GetParam(), "fp16_emulated") == 0;
  std::mt19937 rng(2024);
  constexpr int64_t kM = 64, kN = 64;
  for (int64_t k : {256, 1024, 4096, 8192}) {
    if (emulated && k > 1024) break;  // the emulation is slow; the kernel's order is the same
    Matrix a(DType::kFloat16, kM, k, 0), b(DType::kFloat16, k, kN, 0);
    a.fill_uniform(rng);
    b.fill_uniform(rng);
    Matrix c_fp16(DType::kFloat16, kM, kN, 0), c_widen(DType::kFloat16, kM, kN, 0);
    gemm(false, false, kM, kN, k, DType::kFloat16, a.data(), a.ld, b.data(), b.ld, DType::kFloat16, c_fp16.data(),
         c_fp16.ld, false, nullptr);
    set_gemm_f16_method_for_testing("widen");
    gemm(false, false, kM, kN, k, DType::kFloat16, a.data(), a.ld, b.data(), b.ld, DType::kFloat16, c_widen.data(),
         c_widen.ld, false, nullptr);
    set_gemm_f16_method_for_testing(GetParam());
    double sq_fp16 = 0, sq_widen = 0, max_fp16 = 0, max_widen = 0;
    for (int64_t i = 0; i < kM; ++i) {
      for (int64_t j = 0; j < kN; ++j) {
        double exact = 0;
        for (int64_t p = 0; p < k; ++p) exact += a.get(i, p) * b.get(p, j);
        const double e_fp16 = std::fabs(c_fp16.get(i, j) - exact), e_widen = std::fabs(c_widen.get(i, j) - exact);
        sq_fp16 += e_fp16 * e_fp16;
        sq_widen += e_widen * e_widen;
        max_fp16 = std::max(max_fp16, e_fp16);
        max_widen = std::max(max_widen, e_widen);
      }
    }
    const double rms_ratio = std::sqrt(sq_fp16 / sq_widen), max_ratio = max_fp16 / max_widen;
    EXPECT_LE(rms_ratio, 4.0) << GetParam() << " k=" << k;
    EXPECT_LE(max_ratio, 4.0) << GetParam() << " k=" << k;
    std::printf("%s k=%lld: error vs float32 accumulation: rms %.2fx, max %.2fx\n", GetParam(),
                static_cast<long long>(k), rms_ratio, max_ratio);
  }
}

TEST_P(GemmF16Fma, LargeCStreamedGivesTheBitsOfSmallerProducts) {
  expect_streamed_c_bits(GetParam(), DType::kFloat16, 32, std::strcmp(GetParam(), "fp16_emulated") == 0);
}

INSTANTIATE_TEST_SUITE_P(Method, GemmF16Fma, ::testing::Values("fp16", "fp16_emulated"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// ---- float16 on bfloat16 AMX tiles ("amx": each value split into hi + lo, three products per product;
// "amx_emulated" on every CPU) ----

class GemmF16Split : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string method = GetParam();
    const bool on_avx512 = std::strcmp(set_gemm_isa_for_testing("avx512"), "avx512") == 0;
    if (method == "amx_emulated") set_gemm_isa_for_testing(nullptr);  // any path
    if (set_gemm_f16_method_for_testing(GetParam()) != method || (method != "amx_emulated" && !on_avx512)) {
      if (required("amx")) FAIL() << "MIXTRAIN_REQUIRE_GEMM names amx, which this CPU cannot run";
      GTEST_SKIP() << "this CPU has no float16 method " << method;
    }
  }
  void TearDown() override {
    set_gemm_isa_for_testing(nullptr);
    set_gemm_f16_method_for_testing(nullptr);
  }
  bool emulated() const { return std::strcmp(GetParam(), "amx_emulated") == 0; }
};

TEST_P(GemmF16Split, OddShapesAllTransposesAndDtypes) {
  const std::vector<int64_t> sizes = emulated() ? std::vector<int64_t>{1, 13, 33, 70}
                                                : std::vector<int64_t>{1, 7, 17, 31, 129};
  std::vector<Shape3> shapes;
  for (int64_t m : sizes)
    for (int64_t n : sizes)
      for (int64_t k : sizes) shapes.push_back({m, n, k});
  if (!emulated()) shapes.push_back({1000, 33, 257});
  std::mt19937 rng(4242);
  for (const Shape3& s : shapes)
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        check_all_outputs(GetParam(), s, trans_a, trans_b, DType::kFloat16, rng, 0, /*bf16_split=*/true);
}

// Depths whose tripled k straddles the pairs and blocks of the AMX kernel at every offset.
TEST_P(GemmF16Split, OddAndEvenDepths) {
  std::mt19937 rng(10);
  for (int64_t k = 1; k <= (emulated() ? 34 : 70); ++k)
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        check_all_outputs(GetParam(), {13, 45, k}, trans_a, trans_b, DType::kFloat16, rng, 0, true);
}

TEST_P(GemmF16Split, SeveralColumnAndDepthBlocks) {
  std::mt19937 rng(99);
  const Shape3 shape = emulated() ? Shape3{37, 211, 101} : Shape3{5, 4133, 701};
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true})
      check_all_outputs(GetParam(), shape, trans_a, trans_b, DType::kFloat16, rng, 0, true);
}

TEST_P(GemmF16Split, OneAndTwoThreadsGiveIdenticalBits) {
  std::mt19937 rng(17);
  expect_same_bits_on_one_and_two_threads(
      GetParam(), DType::kFloat16,
      emulated() ? std::vector<Shape3>{{100, 70, 200}, {7, 300, 101}}
                 : std::vector<Shape3>{{300, 200, 600}, {7, 1000, 301}, {129, 515, 1500}},
      rng);
}

TEST_P(GemmF16Split, ColumnKernelGivesTheTileByTileBits) {
  std::mt19937 rng(29);
  expect_column_kernel_bits(GetParam(), DType::kFloat16,
                            emulated() ? std::vector<Shape3>{{70, 40, 100}, {64, 33, 45}}
                                       : std::vector<Shape3>{{130, 70, 700}, {128, 64, 90}, {97, 300, 1500}},
                            rng);
}

// As a mixed_float16 forward pass uses it (float16 A, B and C): the error against the exact product stays
// within 1.5x that of widening up to k = 8192, root mean square and largest (it is mostly C's rounding).
// Values of mixed magnitude (x 2^-12 .. 2^12) and an infinity show the split keeps range and non-finiteness.
TEST_P(GemmF16Split, ErrorOfWideningUpTo8192AndNonFiniteInputs) {
  std::mt19937 rng(2025);
  constexpr int64_t kM = 32, kN = 48;
  std::uniform_int_distribution<int> exponent(-12, 12);
  for (int64_t k : {256, 1024, 4096, 8192}) {
    if (emulated() && k > 1024) break;  // the emulation is slow; the kernel's order is the same
    Matrix a(DType::kFloat16, kM, k, 0), b(DType::kFloat16, k, kN, 0);
    a.fill_uniform(rng);
    b.fill_uniform(rng);
    for (int64_t p = 0; p < k; p += 7) a.set_flat(p, static_cast<float>(std::ldexp(a.get(0, p), exponent(rng))));
    Matrix c_split(DType::kFloat16, kM, kN, 0), c_widen(DType::kFloat16, kM, kN, 0);
    gemm(false, false, kM, kN, k, DType::kFloat16, a.data(), a.ld, b.data(), b.ld, DType::kFloat16, c_split.data(),
         c_split.ld, false, nullptr);
    set_gemm_f16_method_for_testing("widen");
    gemm(false, false, kM, kN, k, DType::kFloat16, a.data(), a.ld, b.data(), b.ld, DType::kFloat16, c_widen.data(),
         c_widen.ld, false, nullptr);
    set_gemm_f16_method_for_testing(GetParam());
    double sq_split = 0, sq_widen = 0, max_split = 0, max_widen = 0;
    for (int64_t i = 0; i < kM; ++i) {
      for (int64_t j = 0; j < kN; ++j) {
        double exact = 0;
        for (int64_t p = 0; p < k; ++p) exact += a.get(i, p) * b.get(p, j);
        if (std::fabs(exact) >= 65504) continue;  // overflows float16 either way
        const double e_split = std::fabs(c_split.get(i, j) - exact), e_widen = std::fabs(c_widen.get(i, j) - exact);
        sq_split += e_split * e_split;
        sq_widen += e_widen * e_widen;
        max_split = std::max(max_split, e_split);
        max_widen = std::max(max_widen, e_widen);
      }
    }
    EXPECT_LE(std::sqrt(sq_split / sq_widen), 1.5) << GetParam() << " k=" << k;
    EXPECT_LE(max_split / max_widen, 1.5) << GetParam() << " k=" << k;
    std::printf("%s k=%lld: error vs widening: rms %.3fx, max %.3fx\n", GetParam(), static_cast<long long>(k),
                std::sqrt(sq_split / sq_widen), max_split / max_widen);
  }
  // An infinite input makes its row of C non-finite (NaN or infinite), never a finite number.
  Matrix a(DType::kFloat16, 20, 40, 0), b(DType::kFloat16, 40, 24, 0), c(DType::kFloat32, 20, 24, 0);
  a.fill_uniform(rng);
  b.fill_uniform(rng);
  a.set_flat(3 * 40 + 5, INFINITY);
  gemm(false, false, 20, 24, 40, DType::kFloat16, a.data(), a.ld, b.data(), b.ld, DType::kFloat32, c.data(), c.ld,
       false, nullptr);
  for (int64_t i = 0; i < 20; ++i)
    for (int64_t j = 0; j < 24; ++j) EXPECT_EQ(std::isfinite(c.get(i, j)), i != 3) << i << ", " << j;
}

TEST_P(GemmF16Split, LargeCStreamedGivesTheBitsOfSmallerProducts) {
  expect_streamed_c_bits(GetParam(), DType::kFloat16, 32);
}

INSTANTIATE_TEST_SUITE_P(Method, GemmF16Split, ::testing::Values("amx", "amx_emulated"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// Whether a forced method runs here: the CPU reports it, AMX also needs its tile state granted, and the AVX-512
// path must be the active one (MIXTRAIN_ISA may lower it).
bool forced_method_runs(const std::string& method) {
  return cpu_reports(method) && (method != "amx" || gemm_amx_granted()) && std::string(gemm_isa()) == "avx512";
}

TEST(GemmF16Method, ForcedMethodsIntervalAndLowerPaths) {
  const std::string chosen = gemm_f16_method();  // calibrated (widen or amx), or MIXTRAIN_F16_GEMM
  if (std::getenv("MIXTRAIN_F16_GEMM") == nullptr) {
    EXPECT_TRUE(chosen == "widen" || chosen == "amx") << chosen << ": fp16 is never chosen by itself";
    if (chosen == "amx") {
      EXPECT_TRUE(gemm_amx_granted());
    }
  }
  EXPECT_STREQ(set_gemm_f16_method_for_testing("widen"), "widen");
  EXPECT_STREQ(set_gemm_f16_method_for_testing("fp16_emulated"), "fp16_emulated");
  EXPECT_STREQ(set_gemm_f16_method_for_testing("amx_emulated"), "amx_emulated");
  // A forced method runs where the CPU has it, and leaves the calibrated choice in place where it does not.
  const std::string fma = set_gemm_f16_method_for_testing("fp16");
  EXPECT_EQ(fma, forced_method_runs("fp16") ? "fp16" : chosen);
  const std::string amx = set_gemm_f16_method_for_testing("amx");
  EXPECT_EQ(amx, forced_method_runs("amx") ? "amx" : chosen);
  set_gemm_f16_method_for_testing("fp16");
  set_gemm_isa_for_testing("avx2");  // fp16 and amx need the AVX-512 path
  EXPECT_STREQ(gemm_f16_method(), "widen");
  set_gemm_f16_method_for_testing("amx");
  EXPECT_STREQ(gemm_f16_method(), "widen");
  set_gemm_isa_for_testing(nullptr);
  EXPECT_EQ(set_gemm_f16_method_for_testing(nullptr), chosen);
  EXPECT_THROW(set_gemm_f16_method_for_testing("half"), Error);
  EXPECT_EQ(set_gemm_f16_promote_interval_for_testing(64), 64);
  EXPECT_THROW(set_gemm_f16_promote_interval_for_testing(7), Error);
  EXPECT_THROW(set_gemm_f16_promote_interval_for_testing(2048), Error);
  const int back = set_gemm_f16_promote_interval_for_testing(0);
  EXPECT_EQ(back, gemm_f16_promote_interval());
}

TEST(GemmBf16Method, ForcedMethodsAndLowerPaths) {
  const std::string chosen = gemm_bf16_method();  // calibrated, or MIXTRAIN_BF16_GEMM
  EXPECT_TRUE(chosen == "amx" || chosen == "dot" || chosen == "widen") << chosen;
  EXPECT_STREQ(set_gemm_bf16_method_for_testing("widen"), "widen");
  EXPECT_STREQ(set_gemm_bf16_method_for_testing("amx_emulated"), "amx_emulated");  // runs anywhere
  for (const char* method : {"dot", "amx"}) {  // the timed choice on a CPU without the method
    const std::string got = set_gemm_bf16_method_for_testing(method);
    EXPECT_EQ(got, forced_method_runs(method) ? method : chosen) << method;
    set_gemm_isa_for_testing("avx2");  // dot and amx need the AVX-512 path
    EXPECT_STREQ(gemm_bf16_method(), "widen");
    set_gemm_isa_for_testing(nullptr);
  }
  EXPECT_EQ(gemm_amx_granted(), std::string(gemm_amx_status()) == "granted") << gemm_amx_status();
  EXPECT_EQ(set_gemm_bf16_method_for_testing(nullptr), chosen);
  EXPECT_THROW(set_gemm_bf16_method_for_testing("fast"), Error);
}

TEST(Gemm, RejectsBadArguments) {
  float a[4] = {}, b[4] = {}, c[4] = {};
  const auto f32 = DType::kFloat32;
  EXPECT_THROW(gemm(false, false, -1, 2, 2, f32, a, 2, b, 2, f32, c, 2, false, nullptr), Error);
  EXPECT_THROW(gemm(false, false, 2, 2, 2, f32, a, 1, b, 2, f32, c, 2, false, nullptr), Error);  // lda < k
  EXPECT_THROW(gemm(true, false, 2, 2, 3, f32, a, 1, b, 2, f32, c, 2, false, nullptr), Error);   // lda < m
  EXPECT_THROW(gemm(false, true, 2, 2, 2, f32, a, 2, b, 1, f32, c, 2, false, nullptr), Error);   // ldb < k
  EXPECT_THROW(gemm(false, false, 2, 2, 2, f32, a, 2, b, 2, f32, c, 1, false, nullptr), Error);  // ldc < n
  EXPECT_THROW(gemm(false, false, 2, 2, 2, f32, nullptr, 2, b, 2, f32, c, 2, false, nullptr), Error);
  EXPECT_THROW(gemm(false, false, 2, 2, 2, DType::kInt32, a, 2, b, 2, f32, c, 2, false, nullptr), Error);
  EXPECT_THROW(gemm(false, false, 2, 2, 2, f32, a, 2, b, 2, DType::kUInt8, c, 2, false, nullptr), Error);
  // Empty products need no pointers.
  EXPECT_NO_THROW(gemm(false, false, 0, 0, 5, f32, nullptr, 5, nullptr, 0, f32, nullptr, 0, false, nullptr));
  try {
    gemm(false, false, 2, 2, 2, f32, a, 1, b, 2, f32, c, 2, false, nullptr);
    FAIL() << "a too-small lda was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("lda=1"), std::string::npos) << e.message();
    EXPECT_FALSE(e.hint().empty());
  }
}

TEST(Gemm, UnknownTestPathIsAnError) { EXPECT_THROW(set_gemm_isa_for_testing("sse9"), Error); }

}  // namespace
}  // namespace mixtrain::kernels
