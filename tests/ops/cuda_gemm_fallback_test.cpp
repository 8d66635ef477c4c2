// The GPU's own GEMM (src/ops/cuda/gemm_fallback.h), which runs the products cuBLASLt has no algorithm for. On every
// machine: its element rule (src/ops/shared/gemm_element.h) reads each layout's operands where they lie and is a
// product, within float32's accumulation bound of a float64 reference. On a GPU: with every product sent to the
// kernel, matmul, bmm (broadcast, transposed and odd-offset views), linear and its ReLU give the rule's bits
// exactly, whatever the tiles (odd shapes, k not a multiple of 16, more products than one grid holds).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/core/random.h"
#include "mixtrain/ops/matmul.h"
#include "op_test_util.h"
#include "ops/shared/float16_convert.h"
#include "ops/shared/gemm_element.h"
#ifdef MIXTRAIN_HAVE_CUDA
#include "ops/cuda/gemm_fallback.h"
#endif

namespace mixtrain::ops {
namespace {

using testing::bits;
using testing::kFloatDTypes;
using testing::random_tensor;

// op(A) op(B) [+ bias] (m, n) in float32 by the element rule, from op(A)'s (m, k) and op(B)'s (k, n) values in
// row-major order: what the kernel computes, before its rounding into C's dtype.
std::vector<float> rule_product(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t k,
                                int64_t n, const float* bias) {
  std::vector<float> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t t = 0; t < k; ++t)
        acc = shared::gemm_accumulate(acc, a[static_cast<size_t>(i * k + t)], b[static_cast<size_t>(t * n + j)]);
      c[static_cast<size_t>(i * n + j)] = shared::gemm_finish(acc, 1.0f, bias, j);
    }
  return c;
}

// Every layout (A and B each row-major or transposed, rows padded past their ends with NaN that must never be
// read) through gemm_a_offset / gemm_b_offset gives the rule's bits from the logical values; and the rule is a
// product: each element within k float32 units of sum |a||b| of the float64 product, plus the bias' rounding.
TEST(CudaGemmFallback, TheElementRuleReadsEveryLayoutAndIsAProduct) {
  const int64_t m = 5, k = 37, n = 7, pad = 3;
  const float nan = std::nanf("");
  Rng r(61);
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), bias(static_cast<size_t>(n));
  for (float& v : a) v = r.uniform(-1.0f, 1.0f);
  for (float& v : b) v = r.uniform(-1.0f, 1.0f);
  for (float& v : bias) v = r.uniform(-4.0f, 4.0f);
  const std::vector<float> want = rule_product(a, b, m, k, n, bias.data());
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // A's memory: (m, k) row-major, or (k, m) for trans_a; each row pad elements longer.
      const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad;
      std::vector<float> am(static_cast<size_t>((ta ? k : m) * lda), nan), bm(static_cast<size_t>((tb ? n : k) * ldb), nan);
      // Laid out by hand (not through the offsets under test): op(A)[i][t] is row i, column t of A's memory, or
      // row t, column i when A is stored transposed; likewise B.
      for (int64_t i = 0; i < m; ++i)
        for (int64_t t = 0; t < k; ++t)
          am[static_cast<size_t>(ta ? t * lda + i : i * lda + t)] = a[static_cast<size_t>(i * k + t)];
      for (int64_t t = 0; t < k; ++t)
        for (int64_t j = 0; j < n; ++j)
          bm[static_cast<size_t>(tb ? j * ldb + t : t * ldb + j)] = b[static_cast<size_t>(t * n + j)];
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          float acc = 0.0f;
          for (int64_t t = 0; t < k; ++t)
            acc = shared::gemm_accumulate(acc, am[static_cast<size_t>(shared::gemm_a_offset(ta, lda, i, t))],
                                          bm[static_cast<size_t>(shared::gemm_b_offset(tb, ldb, t, j))]);
          const float got = shared::gemm_finish(acc, 1.0f, bias.data(), j);
          const size_t e = static_cast<size_t>(i * n + j);
          EXPECT_EQ(bits(got), bits(want[e])) << "trans_a=" << ta << " trans_b=" << tb << " (" << i << ", " << j << ")";
          double exact = bias[static_cast<size_t>(j)], magnitude = 0.0;
          for (int64_t t = 0; t < k; ++t) {
            const double p = static_cast<double>(a[static_cast<size_t>(i * k + t)]) * b[static_cast<size_t>(t * n + j)];
            exact += p;
            magnitude += std::fabs(p);
          }
          EXPECT_LE(std::fabs(got - exact), static_cast<double>(k) * 0x1p-24 * magnitude + 0x1p-24 * std::fabs(exact))
              << "(" << i << ", " << j << ")";
        }
    }
  }
  // The sum starts from +0, and the bias is added once.
  const std::vector<float> neg = {-0.0f, -0.0f}, pos = {1.0f, 1.0f};
  EXPECT_EQ(bits(rule_product(neg, pos, 1, 2, 1, nullptr)[0]), bits(0.0f));
  const float two = 2.0f;
  EXPECT_EQ(rule_product(pos, pos, 1, 2, 1, &two)[0], 4.0f);
}

// Without a loaded backend no GPU GEMM has run: the public counts are zeros (bench step reads them on a GPU).
TEST(CudaGemmFallback, TheGemmCountsAreZerosWithoutAGpu) {
  if (load_cuda_backend().loaded) GTEST_SKIP() << "a GPU is present: TheKernelGivesTheElementRulesBits counts";
  const CudaGemmCounts c = cuda_gemm_counts();
  EXPECT_EQ(c.declined_plans, 0);
  EXPECT_EQ(c.fallback_products, 0);
}

#ifdef MIXTRAIN_HAVE_CUDA
// v rounded once into dt, widened back.
float round_into(float v, DType dt) { return shared::through_dtype(v, shared::float_code(dt)); }

// t's values in row-major order, transposed first when it holds op(X) transposed.
std::vector<float> logical(const Tensor& t, bool transposed) {
  return (transposed ? t.transpose(-2, -1) : t).contiguous().to_floats();
}

// Sends every product to the kernel while a test runs.
struct FallbackOnly {
  FallbackOnly() { cuda::set_gemm_fallback_only(true); }
  ~FallbackOnly() { cuda::set_gemm_fallback_only(false); }
};

// got (on the GPU) has the rule's bits: want (float32, before rounding) rounded into got's dtype.
void expect_rule_bits(const Tensor& got, const std::vector<float>& want, const std::string& what) {
  const std::vector<float> g = got.to_floats();
  ASSERT_EQ(g.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < g.size() && bad < 5; ++i)
    if (bits(g[i]) != bits(round_into(want[i], got.dtype()))) {
      ++bad;
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << ", the rule gives "
                    << round_into(want[i], got.dtype());
    }
}

TEST(CudaGemmFallback, TheKernelGivesTheElementRulesBits) {
  REQUIRE_CUDA_GEMM();
  const FallbackOnly only;
  const int64_t before = cuda::gemm_fallback_products(), public_before = cuda_gemm_counts().fallback_products;
  int64_t products = 0;
  struct Case {
    int64_t m, k, n;
  };
  for (DType dt : kFloatDTypes) {
    // Odd sizes, k one past a tile, a tile exactly, and several tiles each way.
    for (const Case& cs : {Case{1, 1, 1}, Case{7, 17, 5}, Case{16, 16, 16}, Case{33, 129, 47}}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const Tensor a = random_tensor(ta ? Shape({cs.k, cs.m}) : Shape({cs.m, cs.k}), 17, dt);
          const Tensor b = random_tensor(tb ? Shape({cs.n, cs.k}) : Shape({cs.k, cs.n}), 19, dt);
          const std::vector<float> want = rule_product(logical(a, ta), logical(b, tb), cs.m, cs.k, cs.n, nullptr);
          // Into the inputs' dtype, and into another (float32 from 16-bit inputs, float16 from float32 ones).
          for (DType out : {dt, dt == DType::kFloat32 ? DType::kFloat16 : DType::kFloat32}) {
            expect_rule_bits(matmul(gpu(a), gpu(b), ta, tb, out), want,
                             std::string(dtype_name(dt)) + " -> " + dtype_name(out) + " m=" + std::to_string(cs.m) +
                                 " k=" + std::to_string(cs.k) + " n=" + std::to_string(cs.n) +
                                 " trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb));
            ++products;
          }
        }
      }
    }
    // A batch with each operand broadcast along a different dimension, and a view at an odd element offset with
    // an odd row stride: (3, 1, 5, 33) x (2, 33, 9) -> (3, 2, 5, 9).
    const Tensor wide = random_tensor({3, 1, 5, 35}, 43, dt), b1 = random_tensor({2, 33, 9}, 37, dt);
    const Tensor a1 = wide.slice(-1, 1, 34);
    const std::vector<float> av = a1.contiguous().to_floats(), bv = b1.to_floats();
    std::vector<float> want;
    for (int64_t o = 0; o < 3; ++o)
      for (int64_t q = 0; q < 2; ++q) {
        const std::vector<float> ao(av.begin() + o * 5 * 33, av.begin() + (o + 1) * 5 * 33);
        const std::vector<float> bq(bv.begin() + q * 33 * 9, bv.begin() + (q + 1) * 33 * 9);
        const std::vector<float> c = rule_product(ao, bq, 5, 33, 9, nullptr);
        want.insert(want.end(), c.begin(), c.end());
      }
    expect_rule_bits(bmm(gpu(wide).slice(-1, 1, 34), gpu(b1)), want, std::string("batch ") + dtype_name(dt));
    products += 6;
    // A Dense layer: its float32 bias added before the one rounding, and ReLU after it.
    const Tensor x = random_tensor({2, 7, 19}, 47, dt), w = random_tensor({19, 31}, 53, dt);
    const Tensor bias = random_tensor({31}, 59, DType::kFloat32, -2.0f, 2.0f);
    const std::vector<float> bv2 = bias.to_floats();
    const std::vector<float> lin = rule_product(x.to_floats(), w.to_floats(), 14, 19, 31, bv2.data());
    expect_rule_bits(linear(gpu(x), gpu(w), gpu(bias)), lin, std::string("linear ") + dtype_name(dt));
    std::vector<float> relu = lin;
    for (float& v : relu) v = round_into(v, dt) < 0.0f ? 0.0f : v;
    expect_rule_bits(linear_activation(gpu(x), gpu(w), gpu(bias), Activation::kRelu, false).y, relu,
                     std::string("linear relu ") + dtype_name(dt));
    products += 2;
  }
  // The last slice's one real term is added (an infinite one), however many zeros the slice stages.
  std::vector<float> col(17, 1.0f);
  col[16] = std::numeric_limits<float>::infinity();
  const Tensor ones = Tensor::from_floats({1, 17}, std::vector<float>(17, 1.0f), DType::kFloat32);
  const Tensor last = Tensor::from_floats({17, 1}, col, DType::kFloat32);
  EXPECT_EQ(matmul(gpu(ones), gpu(last)).to_floats()[0], std::numeric_limits<float>::infinity());
  ++products;
  // More products than a grid's z dimension holds (65535) in one call: the kernel loops over the rest.
  const int64_t count = 70000;
  const Tensor many_a = random_tensor({count, 1, 3}, 61, DType::kBFloat16);
  const Tensor many_b = random_tensor({count, 3, 2}, 67, DType::kBFloat16);
  const std::vector<float> mav = many_a.to_floats(), mbv = many_b.to_floats();
  std::vector<float> many;
  for (int64_t q = 0; q < count; ++q) {
    const std::vector<float> c = rule_product(std::vector<float>(mav.begin() + q * 3, mav.begin() + (q + 1) * 3),
                                              std::vector<float>(mbv.begin() + q * 6, mbv.begin() + (q + 1) * 6), 1,
                                              3, 2, nullptr);
    many.insert(many.end(), c.begin(), c.end());
  }
  expect_rule_bits(bmm(gpu(many_a), gpu(many_b)), many, "70000 products");
  products += count;
  EXPECT_EQ(cuda::gemm_fallback_products() - before, products);
  EXPECT_EQ(cuda_gemm_counts().fallback_products - public_before, products);
}
#endif

}  // namespace
}  // namespace mixtrain::ops
