// What the GEMM's epilogue does besides the sum, on every instruction-set path and 16-bit method this CPU has, 1, 2
// and 3 threads, every transpose case and C dtype, k = 0 included:
//  - gemm_with_post_op(), with and without accumulation: the post-op sees every element of C exactly once, at the
//    block's place in C, holding the final bits of the plain gemm(), and what it writes there stays;
//  - scaled_gemm(): each element is alpha times the float32 sum gemm() gives, then plus the bias, each operation
//    rounded on its own, then rounded once into C's dtype.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/gemm_internal.h"
#include "mixtrain/core/half.h"
#include "mixtrain/kernels/gemm.h"

namespace mixtrain::kernels {
namespace {

constexpr DType kFloatTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// A row-major matrix of any float dtype, as raw bytes; ld = cols + pad.
struct Matrix {
  DType dtype;
  int64_t rows, cols, ld;
  std::vector<unsigned char> bytes;

  Matrix(DType d, int64_t r, int64_t c, int64_t pad)
      : dtype(d), rows(r), cols(c), ld(c + pad), bytes(static_cast<size_t>(r * (c + pad)) * dtype_size(d)) {}
  void fill_uniform(std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int64_t i = 0; i < rows * ld; ++i) {
      const float v = dist(rng);
      if (dtype == DType::kFloat16) {
        reinterpret_cast<uint16_t*>(bytes.data())[i] = float_to_half_bits(v);
      } else if (dtype == DType::kBFloat16) {
        reinterpret_cast<uint16_t*>(bytes.data())[i] = float_to_bf16_bits(v);
      } else {
        reinterpret_cast<float*>(bytes.data())[i] = v;
      }
    }
  }
  void* data() { return bytes.data(); }
  unsigned char* at(int64_t r, int64_t c) { return bytes.data() + (r * ld + c) * dtype_size(dtype); }
  float get(int64_t r, int64_t c) {
    float v;
    std::memcpy(&v, at(r, c), sizeof v);
    return v;  // float32 matrices only
  }
};

// v rounded into `dtype` (to nearest even, as the GEMM's output conversion), as bytes.
std::vector<unsigned char> rounded_bytes(float v, DType dtype) {
  std::vector<unsigned char> out(dtype_size(dtype));
  if (dtype == DType::kFloat32) {
    std::memcpy(out.data(), &v, sizeof v);
  } else {
    const uint16_t bits = dtype == DType::kFloat16 ? float_to_half_bits(v) : float_to_bf16_bits(v);
    std::memcpy(out.data(), &bits, sizeof bits);
  }
  return out;
}

// What the post-op under test records: a visit count per element, a dense copy of each block as handed over,
// and any call that did not describe a block of C as the contract says.
struct Recorder {
  Matrix* c;
  std::vector<std::atomic<int>> visits;  // (m, n)
  std::vector<unsigned char> seen;       // (m, n) in C's dtype, dense
  std::atomic<int> bad_calls{0};

  explicit Recorder(Matrix* target)
      : c(target),
        visits(static_cast<size_t>(target->rows * target->cols)),
        seen(static_cast<size_t>(target->rows * target->cols) * dtype_size(target->dtype)) {}
};

// Copies the block as it is, then flips the sign bit of each of its elements in place.
void record_and_negate(void* ctx, void* c, int64_t ldc, int64_t row, int64_t col, int64_t rows, int64_t cols) {
  Recorder& r = *static_cast<Recorder*>(ctx);
  const int64_t m = r.c->rows, n = r.c->cols;
  if (ldc != r.c->ld || row < 0 || col < 0 || rows <= 0 || cols <= 0 || row + rows > m || col + cols > n ||
      c != r.c->at(row, col)) {
    ++r.bad_calls;
    return;
  }
  const size_t e = dtype_size(r.c->dtype);
  for (int64_t i = 0; i < rows; ++i) {
    unsigned char* src = r.c->at(row + i, col);
    std::memcpy(r.seen.data() + ((row + i) * n + col) * e, src, static_cast<size_t>(cols) * e);
    for (int64_t j = 0; j < cols; ++j) {
      ++r.visits[static_cast<size_t>((row + i) * n + col + j)];
      src[j * static_cast<int64_t>(e) + static_cast<int64_t>(e) - 1] ^= 0x80;  // little-endian: the sign byte
    }
  }
}

struct Shape3 {
  int64_t m, n, k;
};

// One product of the sweep: where it runs, its shape, layout and dtypes, and its team size.
struct Case {
  std::string path;
  Shape3 s;
  bool trans_a, trans_b;
  DType ab, c_dtype;
  int threads;
  std::string where() const {
    std::ostringstream w;
    w << path << " m=" << s.m << " n=" << s.n << " k=" << s.k << " trans_a=" << trans_a << " trans_b=" << trans_b
      << " ab=" << dtype_name(ab) << " c=" << dtype_name(c_dtype) << " threads=" << threads;
    return w.str();
  }
};

// A and B (uniform in [-1, 1], padded rows) and a float32 bias for c's product.
struct Operands {
  Matrix a, b;
  std::vector<float> bias;
};
Operands random_operands(const Case& c, std::mt19937& rng) {
  Operands o{Matrix(c.ab, c.trans_a ? c.s.k : c.s.m, c.trans_a ? c.s.m : c.s.k, 1),
             Matrix(c.ab, c.trans_b ? c.s.n : c.s.k, c.trans_b ? c.s.k : c.s.n, 2),
             std::vector<float>(static_cast<size_t>(c.s.n))};
  o.a.fill_uniform(rng);
  o.b.fill_uniform(rng);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : o.bias) v = dist(rng);
  return o;
}

// Runs one product with the post-op and without it and checks the post-op's view.
void check_post_op(const Case& cs, bool accumulate, std::mt19937& rng) {
  const std::string where = cs.where() + " accumulate=" + (accumulate ? "1" : "0");
  const Shape3 s = cs.s;
  Operands o = random_operands(cs, rng);
  Matrix plain(cs.c_dtype, s.m, s.n, 3);
  plain.fill_uniform(rng);  // the old C when accumulating, and padding that must keep its bytes
  Matrix fused = plain;
  Matrix before = plain;

  gemm(cs.trans_a, cs.trans_b, s.m, s.n, s.k, cs.ab, o.a.data(), o.a.ld, o.b.data(), o.b.ld, cs.c_dtype, plain.data(),
       plain.ld, accumulate, o.bias.data());
  Recorder rec(&fused);
  gemm_with_post_op(cs.trans_a, cs.trans_b, s.m, s.n, s.k, cs.ab, o.a.data(), o.a.ld, o.b.data(), o.b.ld, cs.c_dtype,
                    fused.data(), fused.ld, accumulate, o.bias.data(), GemmPostOp{&record_and_negate, &rec});

  ASSERT_EQ(rec.bad_calls.load(), 0) << where << ": a block outside C, or not where its row and column say";
  const size_t e = dtype_size(cs.c_dtype);
  int64_t wrong_visits = 0, wrong_seen = 0, wrong_after = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      wrong_visits += rec.visits[static_cast<size_t>(i * s.n + j)].load() != 1;
      const unsigned char* expected = plain.at(i, j);
      const unsigned char* after = fused.at(i, j);
      wrong_seen += std::memcmp(rec.seen.data() + (i * s.n + j) * e, expected, e) != 0;
      wrong_after += std::memcmp(after, expected, e - 1) != 0 || (after[e - 1] ^ 0x80) != expected[e - 1];
    }
    const size_t pad = static_cast<size_t>(fused.ld - s.n) * e;
    ASSERT_EQ(std::memcmp(fused.at(i, s.n), before.at(i, s.n), pad), 0)
        << where << ": wrote past column n in row " << i;
  }
  EXPECT_EQ(wrong_visits, 0) << where << ": elements not visited exactly once";
  EXPECT_EQ(wrong_seen, 0) << where << ": the post-op saw other bits than gemm() leaves in C";
  EXPECT_EQ(wrong_after, 0) << where << ": the post-op's writes did not stay";
}

// scaled_gemm() against gemm()'s float32 sums: alpha S + bias, two float32 roundings (a fused multiply-add would give
// other bits for many elements), then one into C's dtype.
void check_scaled(const Case& cs, float alpha, std::mt19937& rng) {
  const std::string where = cs.where() + " alpha=" + std::to_string(alpha);
  const Shape3 s = cs.s;
  Operands o = random_operands(cs, rng);
  Matrix sums(DType::kFloat32, s.m, s.n, 0);
  Matrix c(cs.c_dtype, s.m, s.n, 3);
  c.fill_uniform(rng);  // never read (no accumulation); the padding must keep its bytes
  const Matrix before = c;
  gemm(cs.trans_a, cs.trans_b, s.m, s.n, s.k, cs.ab, o.a.data(), o.a.ld, o.b.data(), o.b.ld, DType::kFloat32,
       sums.data(), sums.ld, false, nullptr);
  scaled_gemm(cs.trans_a, cs.trans_b, s.m, s.n, s.k, cs.ab, o.a.data(), o.a.ld, o.b.data(), o.b.ld, alpha,
              o.bias.data(), cs.c_dtype, c.data(), c.ld);
  const size_t e = dtype_size(cs.c_dtype);
  int64_t wrong = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      volatile float scaled = alpha * sums.get(i, j);  // volatile: rounded to float32 before the bias is added
      const std::vector<unsigned char> want = rounded_bytes(scaled + o.bias[static_cast<size_t>(j)], cs.c_dtype);
      if (std::memcmp(c.at(i, j), want.data(), e) != 0 && ++wrong <= 3)
        ADD_FAILURE() << where << ": element (" << i << ", " << j << ") is not alpha * sum + bias";
    }
    ASSERT_EQ(std::memcmp(c.at(i, s.n), before.bytes.data() + (i * c.ld + s.n) * e, (c.ld - s.n) * e), 0)
        << where << ": wrote past column n in row " << i;
  }
  EXPECT_EQ(wrong, 0) << where;
}

// The shapes: odd edges, several row chunks (m past mc), several column blocks (n past nc = 2048), several k
// blocks (k past kc, which a 16-bit C sums in float32 scratch first), a single row or column, and k = 0.
std::vector<Shape3> shapes(bool emulated) {
  if (emulated)  // the portable emulations are slow; their blocks are small, so these still cross each
    return {{1, 1, 1}, {17, 33, 130}, {130, 17, 257}, {33, 257, 17}, {5, 19, 0}};
  return {{1, 1, 1},      {17, 33, 130}, {130, 17, 257},  {257, 1000, 33}, {1000, 130, 17},
          {33, 257, 1000}, {1, 1000, 257}, {1000, 1, 33}, {17, 2100, 33},  {130, 33, 1100}, {5, 19, 0}};
}

// check(case) for every shape, transpose case, input and C dtype, on 1, 2 and 3 threads, until one fails; the
// thread count is put back afterwards.
template <class Check>
void for_each_case(const std::string& path, const std::vector<DType>& ab_dtypes, bool emulated, Check check) {
  const int saved = omp_get_max_threads();
  for (const Shape3& s : shapes(emulated))
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        for (DType ab : ab_dtypes)
          for (DType c_dtype : kFloatTypes)
            for (int threads : {1, 2, 3}) {
              omp_set_num_threads(threads);
              check(Case{path, s, trans_a, trans_b, ab, c_dtype, threads});
              if (::testing::Test::HasFailure()) {
                omp_set_num_threads(saved);
                return;
              }
            }
  omp_set_num_threads(saved);
}

void check_all(const std::string& path, const std::vector<DType>& ab_dtypes, bool emulated) {
  std::mt19937 rng(42);
  for_each_case(path, ab_dtypes, emulated, [&](const Case& c) {
    for (bool accumulate : {false, true}) check_post_op(c, accumulate, rng);
  });
}

void check_all_scaled(const std::string& path, const std::vector<DType>& ab_dtypes, bool emulated) {
  std::mt19937 rng(43);
  for_each_case(path, ab_dtypes, emulated, [&](const Case& c) {
    // Inexact products either way; 7.3 sends some of a float16 C's sums past its largest value.
    check_scaled(c, c.threads == 2 ? 7.3f : 1.0f / 3000.0f, rng);
  });
}

// Paths with every input dtype widened to float32 ("scalar", "avx2", "avx512"), and the methods that keep 16-bit
// inputs ("bf16:dot", "bf16:amx", "f16:fp16", "f16:amx", and their portable emulations).
class GemmPostOpPath : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string param = GetParam();
    set_gemm_bf16_method_for_testing("widen");
    set_gemm_f16_method_for_testing("widen");
    const size_t colon = param.find(':');
    if (colon == std::string::npos) {
      if (param != set_gemm_isa_for_testing(param.c_str())) GTEST_SKIP() << "this CPU has no " << param << " path";
      ab_dtypes_ = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
      return;
    }
    const std::string kind = param.substr(0, colon), method = param.substr(colon + 1);
    emulated_ = method.find("_emulated") != std::string::npos;
    const bool on_avx512 = std::string(set_gemm_isa_for_testing("avx512")) == "avx512";
    if (emulated_) set_gemm_isa_for_testing(nullptr);  // any path
    const std::string got = kind == "bf16" ? set_gemm_bf16_method_for_testing(method.c_str())
                                           : set_gemm_f16_method_for_testing(method.c_str());
    if (got != method || (!emulated_ && !on_avx512)) GTEST_SKIP() << "this CPU has no " << param << " method";
    ab_dtypes_ = {kind == "bf16" ? DType::kBFloat16 : DType::kFloat16};
  }
  void TearDown() override {
    set_gemm_isa_for_testing(nullptr);
    set_gemm_bf16_method_for_testing(nullptr);
    set_gemm_f16_method_for_testing(nullptr);
  }
  std::vector<DType> ab_dtypes_;
  bool emulated_ = false;
};

TEST_P(GemmPostOpPath, SeesEveryElementOnceWithItsFinalBits) { check_all(GetParam(), ab_dtypes_, emulated_); }

TEST_P(GemmPostOpPath, ScaledGemmIsAlphaTimesTheSumThenTheBias) {
  check_all_scaled(GetParam(), ab_dtypes_, emulated_);
}

INSTANTIATE_TEST_SUITE_P(Path, GemmPostOpPath,
                         ::testing::Values("scalar", "avx2", "avx512", "bf16:dot", "bf16:amx", "bf16:amx_emulated",
                                           "f16:fp16", "f16:fp16_emulated", "f16:amx", "f16:amx_emulated"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == ':') ch = '_';
                           return name;
                         });

TEST(GemmPostOpArgs, NullFunctionIsPlainGemm) {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1}, c1[4] = {}, c2[4] = {};
  gemm(false, false, 2, 2, 3, DType::kFloat32, a, 3, b, 2, DType::kFloat32, c1, 2, false, nullptr);
  gemm_with_post_op(false, false, 2, 2, 3, DType::kFloat32, a, 3, b, 2, DType::kFloat32, c2, 2, false, nullptr,
                    kernels::GemmPostOp{nullptr, nullptr});
  EXPECT_EQ(std::memcmp(c1, c2, sizeof(c1)), 0);
  EXPECT_EQ(c1[0], 1 + 3.0f);  // row 0 of A times column 0 of B: 1*1 + 2*0 + 3*1
}

TEST(GemmPostOpArgs, EmptyProductCallsNothing) {
  int calls = 0;
  auto count = [](void* ctx, void*, int64_t, int64_t, int64_t, int64_t, int64_t) { ++*static_cast<int*>(ctx); };
  float a[6] = {}, b[6] = {}, c[9] = {};
  gemm_with_post_op(false, false, 0, 3, 2, DType::kFloat32, a, 2, b, 3, DType::kFloat32, c, 3, false, nullptr,
                    kernels::GemmPostOp{count, &calls});
  gemm_with_post_op(false, false, 3, 0, 2, DType::kFloat32, a, 2, b, 1, DType::kFloat32, c, 1, false, nullptr,
                    kernels::GemmPostOp{count, &calls});
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace mixtrain::kernels
