// The GEMM's plan cache (src/ops/cuda/gemm_plan_cache.h). Everywhere: the key a product gets (every field that
// decides cuBLASLt's descriptors or its heuristic's choice separates two products, pointers only by alignment
// class), lookups that hit and miss, least-recently-used eviction, and each plan destroyed exactly once, on
// eviction, on clear or with the cache, never under a caller still holding it. On a GPU: a repeated product gives
// the first call's bits from the cached plan, products of other shapes interleaved with it do not take its plan,
// and a cached bias product reads each call's own bias.
// The GPU tests are CudaBackend.* so that scripts/gpu-check.sh runs them, with MIXTRAIN_REQUIRE_GPU=1 turning their
// skip into a failure.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/ops/matmul.h"
#include "op_test_util.h"
#include "ops/cuda/gemm_plan_cache.h"
#include "ops/cuda/gemm_refusal.h"

namespace mixtrain::ops::cuda {
namespace {

using testing::random_tensor;
using testing::unit;

// A plan that reports its destruction.
struct CountedPlan {
  int id = 0;
  std::vector<int>* destroyed = nullptr;
  ~CountedPlan() {
    if (destroyed) destroyed->push_back(id);
  }
};

GemmPlanKey key_with_m(int64_t m) {
  GemmPlanKey k;
  k.m = m;
  k.n = 8;
  k.k = 8;
  return k;
}

// A plan maker that counts its calls and numbers its plans 1, 2, ...
struct Maker {
  int calls = 0;
  std::vector<int> destroyed;
  std::function<std::shared_ptr<CountedPlan>()> fn() {
    return [this] {
      auto p = std::make_shared<CountedPlan>();
      p->id = ++calls;
      p->destroyed = &destroyed;
      return p;
    };
  }
};

TEST(GemmPlanCache, AHitReturnsTheStoredPlanAndAMissMakesOne) {
  Maker make;
  GemmPlanCache<CountedPlan> cache(4);
  const std::shared_ptr<CountedPlan> first = cache.get(key_with_m(3), make.fn());
  const std::shared_ptr<CountedPlan> again = cache.get(key_with_m(3), make.fn());
  EXPECT_EQ(make.calls, 1);
  EXPECT_EQ(first.get(), again.get());
  const std::shared_ptr<CountedPlan> other = cache.get(key_with_m(4), make.fn());
  EXPECT_EQ(make.calls, 2);
  EXPECT_NE(other.get(), first.get());
  const GemmPlanCacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 2);
  EXPECT_EQ(s.evictions, 0);
  EXPECT_EQ(s.size, 2u);
  EXPECT_EQ(s.capacity, 4u);
}

TEST(GemmPlanCache, EveryKeyFieldSeparatesTwoPlans) {
  const GemmPlanKey base = [] {
    GemmPlanKey k;
    k.device = 0;
    k.m = 5, k.n = 6, k.k = 7, k.lda = 7, k.ldb = 6, k.ldd = 6;
    k.count = 3, k.a_stride = 35, k.b_stride = 42, k.d_stride = 30;
    k.ab_dtype = DType::kFloat16, k.d_dtype = DType::kFloat16;
    k.align_a = 256, k.align_b = 256, k.align_d = 256;
    return k;
  }();
  std::vector<std::pair<std::string, std::function<void(GemmPlanKey&)>>> changes = {
      {"device", [](GemmPlanKey& k) { k.device = 1; }},
      {"m", [](GemmPlanKey& k) { k.m = 9; }},
      {"n", [](GemmPlanKey& k) { k.n = 9; }},
      {"k", [](GemmPlanKey& k) { k.k = 9; }},
      {"lda", [](GemmPlanKey& k) { k.lda = 9; }},
      {"ldb", [](GemmPlanKey& k) { k.ldb = 9; }},
      {"ldd", [](GemmPlanKey& k) { k.ldd = 9; }},
      {"count", [](GemmPlanKey& k) { k.count = 4; }},
      {"a_stride", [](GemmPlanKey& k) { k.a_stride = 0; }},
      {"b_stride", [](GemmPlanKey& k) { k.b_stride = 0; }},
      {"d_stride", [](GemmPlanKey& k) { k.d_stride = 31; }},
      {"trans_a", [](GemmPlanKey& k) { k.trans_a = true; }},
      {"trans_b", [](GemmPlanKey& k) { k.trans_b = true; }},
      {"ab_dtype", [](GemmPlanKey& k) { k.ab_dtype = DType::kBFloat16; }},
      {"d_dtype", [](GemmPlanKey& k) { k.d_dtype = DType::kFloat32; }},
      {"tf32", [](GemmPlanKey& k) { k.tf32 = true; }},
      {"epilogue", [](GemmPlanKey& k) { k.epilogue = GemmEpilogue::kBias; }},
      {"relu epilogue", [](GemmPlanKey& k) { k.epilogue = GemmEpilogue::kRelu; }},
      {"relu and bias epilogue", [](GemmPlanKey& k) { k.epilogue = GemmEpilogue::kReluBias; }},
      {"bias dtype", [](GemmPlanKey& k) { k.bias_dtype = DType::kFloat16; }},
      {"align_a", [](GemmPlanKey& k) { k.align_a = 2; }},
      {"align_b", [](GemmPlanKey& k) { k.align_b = 2; }},
      {"align_d", [](GemmPlanKey& k) { k.align_d = 2; }},
      {"align_bias", [](GemmPlanKey& k) { k.align_bias = 16; }},
  };
  Maker make;
  GemmPlanCache<CountedPlan> cache(64);
  const std::shared_ptr<CountedPlan> base_plan = cache.get(base, make.fn());
  for (const auto& [field, change] : changes) {
    GemmPlanKey k = base;
    change(k);
    EXPECT_FALSE(k == base) << field;
    const int before = make.calls;
    EXPECT_NE(cache.get(k, make.fn()).get(), base_plan.get()) << field;
    EXPECT_EQ(make.calls, before + 1) << field << " found another key's plan";
  }
  EXPECT_EQ(cache.get(base, make.fn()).get(), base_plan.get());
  EXPECT_EQ(cache.stats().size, changes.size() + 1);
}

// The key a product gets from the arguments of one cuBLASLt call.
struct ProblemFixture {
  kernel::BmmLayout l;
  alignas(256) unsigned char memory[4096] = {};
  GemmProblem p{};
  ProblemFixture() {
    l.m = 5, l.n = 6, l.k = 7, l.lda = 7, l.ldb = 6;
    p = {&l, DType::kFloat32, memory, memory + 1024, 35, 42, 3, memory + 2048, DType::kFloat32, nullptr};
  }
};

TEST(GemmPlanCache, TheKeyOfAProblemFollowsEveryArgumentThatDecidesThePlan) {
  ProblemFixture f;
  const GemmPlanKey base = gemm_plan_key(0, f.p, false);
  EXPECT_EQ(base.m, 5);
  EXPECT_EQ(base.ldd, 6);
  EXPECT_EQ(base.d_stride, 30);
  // float32 strides of 35 and 42 elements: 140 and 168 bytes, so A's batch steps are 4-byte aligned, B's 8.
  EXPECT_EQ(base.align_a, 4u);
  EXPECT_EQ(base.align_b, 8u);
  EXPECT_EQ(base.align_d, 8u);  // 30 float32 = 120 bytes
  EXPECT_EQ(base.epilogue, GemmEpilogue::kNone);
  EXPECT_EQ(base.align_bias, 0u);

  const float* bias = reinterpret_cast<const float*>(f.memory + 3072);
  std::vector<std::pair<std::string, std::function<GemmPlanKey(ProblemFixture&)>>> changes = {
      {"device", [](ProblemFixture& g) { return gemm_plan_key(1, g.p, false); }},
      {"m", [](ProblemFixture& g) { g.l.m = 4; return gemm_plan_key(0, g.p, false); }},
      {"n", [](ProblemFixture& g) { g.l.n = 4; return gemm_plan_key(0, g.p, false); }},
      {"k", [](ProblemFixture& g) { g.l.k = 4; return gemm_plan_key(0, g.p, false); }},
      {"lda", [](ProblemFixture& g) { g.l.lda = 8; return gemm_plan_key(0, g.p, false); }},
      {"ldb", [](ProblemFixture& g) { g.l.ldb = 8; return gemm_plan_key(0, g.p, false); }},
      {"trans_a", [](ProblemFixture& g) { g.l.trans_a = true; return gemm_plan_key(0, g.p, false); }},
      {"trans_b", [](ProblemFixture& g) { g.l.trans_b = true; return gemm_plan_key(0, g.p, false); }},
      {"count", [](ProblemFixture& g) { g.p.count = 2; return gemm_plan_key(0, g.p, false); }},
      {"a_stride", [](ProblemFixture& g) { g.p.a_stride = 0; return gemm_plan_key(0, g.p, false); }},
      {"b_stride", [](ProblemFixture& g) { g.p.b_stride = 0; return gemm_plan_key(0, g.p, false); }},
      {"ab_dtype", [](ProblemFixture& g) { g.p.ab_dtype = DType::kFloat16; return gemm_plan_key(0, g.p, false); }},
      {"d_dtype", [](ProblemFixture& g) { g.p.d_dtype = DType::kBFloat16; return gemm_plan_key(0, g.p, false); }},
      {"tf32", [](ProblemFixture& g) { return gemm_plan_key(0, g.p, true); }},
      {"bias", [bias](ProblemFixture& g) { g.p.bias = bias; return gemm_plan_key(0, g.p, false); }},
      {"relu", [](ProblemFixture& g) { g.p.relu = true; return gemm_plan_key(0, g.p, false); }},
      {"a alignment", [](ProblemFixture& g) { g.p.a = g.memory + 2; return gemm_plan_key(0, g.p, false); }},
      {"b alignment", [](ProblemFixture& g) { g.p.b = g.memory + 1026; return gemm_plan_key(0, g.p, false); }},
      {"d alignment", [](ProblemFixture& g) { g.p.d = g.memory + 2050; return gemm_plan_key(0, g.p, false); }},
  };
  for (const auto& [what, change] : changes) {
    ProblemFixture g;
    EXPECT_FALSE(change(g) == base) << what;
  }
  // The bias's alignment class too, once there is one.
  ProblemFixture g;
  g.p.bias = bias;
  const GemmPlanKey with_bias = gemm_plan_key(0, g.p, false);
  EXPECT_EQ(with_bias.epilogue, GemmEpilogue::kBias);
  EXPECT_EQ(with_bias.align_bias, 256u);
  g.p.bias = bias + 4;  // 16 bytes further
  EXPECT_EQ(gemm_plan_key(0, g.p, false).align_bias, 16u);
  // The epilogue reads the bias it is given (a rounded copy beside a 16-bit D): its alignment is that copy's.
  g.p.epilogue_bias = g.memory + 3584 + 8;
  EXPECT_EQ(gemm_plan_key(0, g.p, false).align_bias, 8u);
  g.p.epilogue_bias = nullptr;
  // ReLU after the bias, and without one: each its own epilogue, so its own plan.
  g.p.relu = true;
  EXPECT_EQ(gemm_plan_key(0, g.p, false).epilogue, GemmEpilogue::kReluBias);
  g.p.bias = nullptr;
  EXPECT_EQ(gemm_plan_key(0, g.p, false).epilogue, GemmEpilogue::kRelu);
  EXPECT_EQ(gemm_plan_key(0, g.p, false).align_bias, 0u);
}

TEST(GemmPlanCache, WhatDoesNotChangeThePlanDoesNotChangeTheKey) {
  ProblemFixture f;
  f.p.count = 1;
  f.p.a_stride = f.p.b_stride = 0;
  const GemmPlanKey base = gemm_plan_key(0, f.p, false);
  EXPECT_EQ(base.align_a, 256u);
  // Other pointers of the same alignment class: the same descriptors and the same heuristic answer.
  ProblemFixture g;
  g.p.count = 1;
  g.p.a = g.memory + 512;
  g.p.b = g.memory + 1536;
  g.p.d = g.memory + 3840;
  EXPECT_TRUE(gemm_plan_key(0, g.p, false) == base);
  // A single product's layouts carry no batch stride.
  g.p.a_stride = 35;
  g.p.b_stride = 1;
  EXPECT_TRUE(gemm_plan_key(0, g.p, false) == base);
  // TF32 applies to float32 inputs only.
  g.p.ab_dtype = DType::kBFloat16;
  EXPECT_TRUE(gemm_plan_key(0, g.p, true) == gemm_plan_key(0, g.p, false));
  // Equal keys hash alike.
  EXPECT_EQ(GemmPlanKeyHash()(gemm_plan_key(0, g.p, true)), GemmPlanKeyHash()(gemm_plan_key(0, g.p, false)));
}

// cuBLASLt's rule for the bias epilogue's type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE): the output's dtype. Both cases
// through the key a product gets, which is what the plan's descriptor is set from.
TEST(GemmPlanCache, TheBiasEpilogueReadsABiasOfTheOutputsDtype) {
  EXPECT_EQ(gemm_bias_dtype(DType::kFloat32), DType::kFloat32);
  EXPECT_EQ(gemm_bias_dtype(DType::kFloat16), DType::kFloat16);
  EXPECT_EQ(gemm_bias_dtype(DType::kBFloat16), DType::kBFloat16);
  ProblemFixture f;
  const float* bias = reinterpret_cast<const float*>(f.memory + 3072);
  f.p.bias = bias;
  // A float32 output: the float32 bias itself.
  EXPECT_EQ(gemm_plan_key(0, f.p, false).bias_dtype, DType::kFloat32);
  EXPECT_EQ(epilogue_bias_of(f.p), static_cast<const void*>(bias));
  // A 16-bit output, from 16-bit inputs or (through the float32 scratch's rounding, where no epilogue runs) not:
  // a bias of its dtype, read from the rounded copy.
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    f.p.ab_dtype = d;
    f.p.d_dtype = d;
    f.p.epilogue_bias = f.memory + 3584;
    const GemmPlanKey k = gemm_plan_key(0, f.p, false);
    EXPECT_EQ(k.bias_dtype, d) << dtype_name(d);
    EXPECT_EQ(epilogue_bias_of(f.p), static_cast<const void*>(f.memory + 3584)) << dtype_name(d);
    EXPECT_NE(describe_gemm(k).find(std::string("bias ") + dtype_name(d)), std::string::npos) << describe_gemm(k);
  }
  // Without a bias the field is not part of what decides the plan beyond its default.
  f.p.bias = nullptr;
  f.p.epilogue_bias = nullptr;
  EXPECT_EQ(gemm_plan_key(0, f.p, false).bias_dtype, DType::kFloat32);
}

// Sets MIXTRAIN_REQUIRE_GPU for a scope, restoring what was there.
struct RequireGpu {
  std::optional<std::string> before;
  explicit RequireGpu(const char* value) {
    if (const char* v = std::getenv("MIXTRAIN_REQUIRE_GPU")) before = v;
    if (value)
      setenv("MIXTRAIN_REQUIRE_GPU", value, 1);
    else
      unsetenv("MIXTRAIN_REQUIRE_GPU");
  }
  ~RequireGpu() {
    if (before)
      setenv("MIXTRAIN_REQUIRE_GPU", before->c_str(), 1);
    else
      unsetenv("MIXTRAIN_REQUIRE_GPU");
  }
};

// A stand-in for cuBLASLt's heuristic query: the answer it gives, as matmul.cpp's make_plan receives it.
int stand_in_heuristic(int answer) { return answer; }

// An INVALID_VALUE answer: a counted decline (the scratch or the fallback kernel keep the product), or under
// MIXTRAIN_REQUIRE_GPU=1 an error naming the product's shape, layouts and leading dimensions. NOT_SUPPORTED (no
// algorithm for the combination) declines either way; SUCCESS runs.
TEST(GemmPlanCache, AnInvalidValueAnswerIsAnErrorNamingTheProductWhenAGpuIsRequired) {
  kernel::BmmLayout l;
  l.m = 11, l.n = 24, l.k = 203, l.lda = 203, l.ldb = 24, l.trans_b = false;
  alignas(256) static unsigned char memory[4096];
  GemmProblem p{&l, DType::kFloat16, memory + 2, memory + 1024, 0, 0, 1, memory + 2048, DType::kFloat16,
                reinterpret_cast<const float*>(memory + 3072)};
  p.epilogue_bias = memory + 3584;
  const GemmPlanKey key = gemm_plan_key(0, p, false);
  {
    RequireGpu off(nullptr);
    EXPECT_FALSE(gemm_declined(stand_in_heuristic(kLtSuccess), key, "cublasLtMatmulAlgoGetHeuristic", "ok"));
    EXPECT_TRUE(gemm_declined(stand_in_heuristic(kLtInvalidValue), key, "cublasLtMatmulAlgoGetHeuristic", "invalid"));
    EXPECT_TRUE(gemm_declined(stand_in_heuristic(kLtNotSupported), key, "cublasLtMatmulAlgoGetHeuristic", "ns"));
  }
  {
    RequireGpu off("0");
    EXPECT_TRUE(gemm_declined(stand_in_heuristic(kLtInvalidValue), key, "cublasLtMatmul", "invalid"));
  }
  RequireGpu on("1");
  EXPECT_FALSE(gemm_declined(stand_in_heuristic(kLtSuccess), key, "cublasLtMatmulAlgoGetHeuristic", "ok"));
  EXPECT_TRUE(gemm_declined(stand_in_heuristic(kLtNotSupported), key, "cublasLtMatmulAlgoGetHeuristic", "ns"));
  try {
    (void)gemm_declined(stand_in_heuristic(kLtInvalidValue), key, "cublasLtMatmulAlgoGetHeuristic",
                        "CUBLAS_STATUS_INVALID_VALUE");
    ADD_FAILURE() << "an INVALID_VALUE answer under MIXTRAIN_REQUIRE_GPU=1 did not throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* part : {"cublasLtMatmulAlgoGetHeuristic", "CUBLAS_STATUS_INVALID_VALUE", "C (11, 24) float16",
                             "k 203", "lda 203", "ldb 24", "ldd 24", "column-major layouts", "A (24, 203) ld 24",
                             "B (203, 11) ld 203", "D (24, 11) ld 24", "epilogue BIAS (bias float16",
                             "alignments a 2 b 256 d 256", "MIXTRAIN_REQUIRE_GPU=1"})
      EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' missing from: " << m;
  }
}

TEST(GemmPlanCache, EvictsTheLeastRecentlyUsedAndDestroysIt) {
  Maker make;
  GemmPlanCache<CountedPlan> cache(3);
  for (int64_t m : {1, 2, 3}) cache.get(key_with_m(m), make.fn());  // plans 1, 2, 3
  EXPECT_TRUE(make.destroyed.empty());
  cache.get(key_with_m(1), make.fn());  // a hit: 1 is now the most recent, 2 the least
  cache.get(key_with_m(4), make.fn());  // plan 4 evicts plan 2
  EXPECT_EQ(make.destroyed, std::vector<int>({2}));
  cache.get(key_with_m(3), make.fn());  // a hit: the order is now 3, 4, 1
  EXPECT_EQ(make.calls, 4);
  cache.get(key_with_m(2), make.fn());  // made again (plan 5), evicting plan 1
  EXPECT_EQ(make.calls, 5);
  EXPECT_EQ(make.destroyed, std::vector<int>({2, 1}));
  const GemmPlanCacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.misses, 5);
  EXPECT_EQ(s.evictions, 2);
  EXPECT_EQ(s.size, 3u);
}

TEST(GemmPlanCache, APlanHeldByACallOutlivesItsEvictionAndEachPlanDiesOnce) {
  Maker make;
  {
    GemmPlanCache<CountedPlan> cache(1);
    std::shared_ptr<CountedPlan> held = cache.get(key_with_m(1), make.fn());
    cache.get(key_with_m(2), make.fn());  // evicts plan 1, which is still in use
    EXPECT_TRUE(make.destroyed.empty());
    EXPECT_EQ(held->id, 1);
    held.reset();
    EXPECT_EQ(make.destroyed, std::vector<int>({1}));
    cache.get(key_with_m(3), make.fn());  // evicts plan 2, held by no one
    EXPECT_EQ(make.destroyed, std::vector<int>({1, 2}));
    cache.clear();
    EXPECT_EQ(make.destroyed, std::vector<int>({1, 2, 3}));
    EXPECT_EQ(cache.stats().size, 0u);
    cache.get(key_with_m(4), make.fn());
  }
  // The last one with the cache.
  EXPECT_EQ(make.destroyed, std::vector<int>({1, 2, 3, 4}));
}

TEST(GemmPlanCache, AMakerThatThrowsStoresNothing) {
  Maker make;
  GemmPlanCache<CountedPlan> cache(2);
  EXPECT_THROW(cache.get(key_with_m(1), []() -> std::shared_ptr<CountedPlan> { throw std::runtime_error("no"); }),
               std::runtime_error);
  EXPECT_EQ(cache.stats().size, 0u);
  cache.get(key_with_m(1), make.fn());
  EXPECT_EQ(make.calls, 1);
}

TEST(GemmPlanCache, ThreadsSharingTheCacheMakeEachPlanOnce) {
  std::atomic<int> made{0};
  GemmPlanCache<int> cache(16);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        const int64_t m = i % 8;
        const std::shared_ptr<int> plan = cache.get(key_with_m(m), [&] {
          ++made;
          return std::make_shared<int>(static_cast<int>(m));
        });
        if (*plan != m) ++wrong;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(made.load(), 8);  // 8 keys, capacity 16: nothing is ever evicted
  EXPECT_EQ(wrong.load(), 0);
  const GemmPlanCacheStats s = cache.stats();
  EXPECT_EQ(s.hits + s.misses, 8000);
}

// On a GPU: the cached plans through ops::matmul and ops::linear.
// |gpu - cpu| within both sides' float32 summation of k products of values in [-1, 1], then one rounding each.
// (extra: what else may separate them, e.g. a bias the GPU rounded to the output's dtype.)
void expect_near_cpu(const Tensor& gpu, const Tensor& cpu, int64_t k, const std::string& what, double extra = 0) {
  const std::vector<float> g = to_device(gpu, Device::cpu()).to_floats(), c = cpu.to_floats();
  ASSERT_EQ(g.size(), c.size()) << what;
  const double acc = 2.0 * static_cast<double>(k) * 0x1p-24 * static_cast<double>(k);
  int reported = 0;
  for (size_t i = 0; i < c.size() && reported < 5; ++i) {
    const double tol = 2 * unit(cpu.dtype()) * std::fabs(c[i]) + acc + 0x1p-20 + extra;
    if (std::fabs(static_cast<double>(g[i]) - c[i]) > tol) {
      ADD_FAILURE() << what << ": element " << i << " gpu " << g[i] << " cpu " << c[i];
      ++reported;
    }
  }
}

TEST(CudaBackend, RepeatedProductsGiveTheFirstCallsBitsFromTheCachedPlan) {
  REQUIRE_CUDA_GEMM();
  const Device gpu = Device::cuda(0);
  struct Case {
    int64_t m, k, n;
    bool ta, tb;
  };
  // Interleaved shapes, two of them differing only in a transpose, one only in k: none may take another's plan.
  const Case cases[] = {{7, 129, 17, false, false}, {7, 129, 17, true, false}, {7, 130, 17, false, false},
                        {17, 129, 7, false, true},  {64, 64, 64, false, false}, {1, 1, 1, false, false}};
  for (DType dt : testing::kFloatDTypes) {
    std::vector<Tensor> as, bs, firsts, cpus;
    for (const Case& cs : cases) {
      as.push_back(to_device(random_tensor(cs.ta ? Shape({cs.k, cs.m}) : Shape({cs.m, cs.k}), 61, dt), gpu));
      bs.push_back(to_device(random_tensor(cs.tb ? Shape({cs.n, cs.k}) : Shape({cs.k, cs.n}), 67, dt), gpu));
      cpus.push_back(matmul(to_device(as.back(), Device::cpu()), to_device(bs.back(), Device::cpu()), cs.ta, cs.tb));
      firsts.push_back(matmul(as.back(), bs.back(), cs.ta, cs.tb));
    }
    for (int round = 0; round < 3; ++round) {
      for (size_t i = 0; i < std::size(cases); ++i) {
        const Case& cs = cases[i];
        const std::string what = std::string(dtype_name(dt)) + " case " + std::to_string(i) + " round " +
                                 std::to_string(round);
        const Tensor again = matmul(as[i], bs[i], cs.ta, cs.tb);
        EXPECT_TRUE(bit_equal(again, firsts[i])) << what;
        expect_near_cpu(again, cpus[i], cs.k, what);
      }
    }
  }
}

TEST(CudaBackend, ACachedBiasProductReadsEachCallsBias) {
  REQUIRE_CUDA_GEMM();
  const Device gpu = Device::cuda(0);
  for (DType dt : testing::kFloatDTypes) {
    const Tensor x = random_tensor({9, 33}, 71, dt), w = random_tensor({33, 20}, 73, dt);
    const Tensor b1 = random_tensor({20}, 79, DType::kFloat32, -4.0f, 4.0f);
    const Tensor b2 = random_tensor({20}, 83, DType::kFloat32, -4.0f, 4.0f);
    const Tensor xg = to_device(x, gpu), wg = to_device(w, gpu), b1g = to_device(b1, gpu), b2g = to_device(b2, gpu);
    const Tensor y1 = linear(xg, wg, b1g), y2 = linear(xg, wg, b2g);
    // Beside a 16-bit output the epilogue adds the bias rounded to its dtype (gemm_bias_dtype): up to 4 unit(dt).
    const double bias_rounding = dt == DType::kFloat32 ? 0.0 : 4 * unit(dt);
    expect_near_cpu(y1, linear(x, w, b1), 33, std::string("bias 1 ") + dtype_name(dt), bias_rounding);
    expect_near_cpu(y2, linear(x, w, b2), 33, std::string("bias 2 ") + dtype_name(dt), bias_rounding);
    EXPECT_FALSE(bit_equal(y1, y2)) << dtype_name(dt);
    EXPECT_TRUE(bit_equal(linear(xg, wg, b1g), y1)) << dtype_name(dt);
    EXPECT_TRUE(bit_equal(linear(xg, wg, b2g), y2)) << dtype_name(dt);
  }
}

#ifdef MIXTRAIN_HAVE_CUDA
TEST(CudaBackend, ARepeatedProductHitsTheGemmPlanCache) {
  REQUIRE_CUDA_GEMM();
  const Device gpu = Device::cuda(0);
  // A shape no other test uses, so its first call is a miss.
  const Tensor a = to_device(random_tensor({13, 211}, 89, DType::kFloat16), gpu);
  const Tensor b = to_device(random_tensor({211, 19}, 97, DType::kFloat16), gpu);
  const GemmPlanCacheStats before = gemm_plan_cache_stats();
  const Tensor first = matmul(a, b);
  const GemmPlanCacheStats after_first = gemm_plan_cache_stats();
  EXPECT_EQ(after_first.misses, before.misses + 1);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(bit_equal(matmul(a, b), first));
  const GemmPlanCacheStats after = gemm_plan_cache_stats();
  EXPECT_EQ(after.misses, after_first.misses);
  EXPECT_EQ(after.hits, after_first.hits + 5);
}

// Whether the bias and ReLU epilogues ran inside cuBLASLt's product: the values are the same either way (the other
// tests), so the decline counters say it. The bias is given in the type cuBLASLt documents for each output (float32
// beside float32, the output's dtype beside a 16-bit one: gemm_bias_dtype), and every operand's leading dimension is
// a multiple of 16 bytes in every dtype (k = 208, n = 24), as cuBLASLt's tensor-core kernels read them, so no plan
// may be declined; the answers are also recorded in the test's JSON (scripts/gpu-check.sh keeps it) and printed.
TEST(CudaBackend, TheBiasAndReluEpiloguesRunInsideTheProductOrCountTheirDecline) {
  REQUIRE_CUDA_GEMM();
  for (DType dt : testing::kFloatDTypes) {
    // Shapes no other test uses, so each call makes its plan here.
    const Tensor x = gpu(random_tensor({11, 208}, 101, dt)), w = gpu(random_tensor({208, 24}, 103, dt));
    const Tensor bias = gpu(random_tensor({24}, 107, DType::kFloat32));
    const int64_t bias_before = gemm_plans_declined(GemmEpilogue::kBias);
    const int64_t relu_before = gemm_plans_declined(GemmEpilogue::kReluBias);
    (void)linear(x, w, bias);
    (void)linear_activation(x, w, bias, Activation::kRelu, /*keep_pre_activation=*/false);
    const bool bias_fused = gemm_plans_declined(GemmEpilogue::kBias) == bias_before;
    const bool relu_fused = gemm_plans_declined(GemmEpilogue::kReluBias) == relu_before;
    const std::string name = dtype_name(dt);
    RecordProperty("epilogue_bias_" + name, bias_fused ? "fused" : "declined");
    RecordProperty("epilogue_relu_bias_" + name, relu_fused ? "fused" : "declined");
    std::printf("cuBLASLt %s product with a %s bias: BIAS %s, RELU_BIAS %s\n", name.c_str(),
                dtype_name(gemm_bias_dtype(dt)), bias_fused ? "fused" : "declined", relu_fused ? "fused" : "declined");
    EXPECT_TRUE(bias_fused) << "cuBLASLt declined its documented " << name << " BIAS epilogue";
    EXPECT_TRUE(relu_fused) << "cuBLASLt declined its documented " << name << " RELU_BIAS epilogue";
  }
}
#endif

}  // namespace
}  // namespace mixtrain::ops::cuda
