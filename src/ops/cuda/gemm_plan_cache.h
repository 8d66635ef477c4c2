// The GEMM's plan cache (matmul.cpp): the cuBLASLt descriptors of a product and the algorithm its heuristic chose,
// kept per problem, so that the many small products of a training step, asked again every step with the same
// shapes, skip building four descriptors and a heuristic query on the host each time.
//
// Plain C++, no CUDA type: the key, the lookup and the eviction are tested on every machine
// (tests/ops/cuda_gemm_plan_cache_test.cpp); matmul.cpp supplies the value type holding the descriptors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "mixtrain/core/dtype.h"
#include "mixtrain/ops/matmul.h"

namespace mixtrain::ops::cuda {

// The bias dtype cuBLASLt's BIAS and RELU_BIAS epilogues read beside an output D of d_dtype. NVIDIA's rule
// (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE; the cuBLAS documentation of cublasLtMatmulDescAttributes_t says
// the same): "Bias vector elements are the same type as the elements of output matrix (Dtype)", the exceptions being
// integer (IMMA) and fp8 kernels, which mixtrain does not use. So a float32 bias beside a float32 D, and beside a
// float16 or bfloat16 D a bias of that dtype: matmul.cpp rounds the float32 bias into it first (n values, once per
// call), so the epilogue adds the rounded bias to the float32 sum before the one rounding of the result, as PyTorch's
// and Keras' 16-bit Dense layers add a bias of the compute dtype. (A float32 bias beside a 16-bit D is outside the
// documentation: cuBLASLt may answer INVALID_VALUE, which used to send every biased 16-bit product to the scratch.)
inline DType gemm_bias_dtype(DType d_dtype) { return d_dtype; }

// One cuBLASLt call: `count` products D[p] (m, n) row-major = alpha op(A[p]) op(B[p]) [+ bias], A[p] = a + p *
// a_stride elements (likewise B), D[p] = d + p * m * n elements of d_dtype. alpha scales the float32 sum before the
// bias and the one rounding; it is an argument of each call, not of the plan (no key field).
struct GemmProblem {
  const kernel::BmmLayout* l;
  DType ab_dtype;
  const void* a;
  const void* b;
  int64_t a_stride, b_stride, count;
  void* d;
  DType d_dtype;
  const float* bias;  // float32 (the scratch way and the fallback kernel add it); null: no bias epilogue
  bool relu = false;  // max(., 0) after the bias, before the rounding (linear_activation's epilogue)
  float alpha = 1.0f;  // attention's scale on its scores (scaled_bmm); 1 for every other product
  // The bias as the epilogue reads it, in gemm_bias_dtype(d_dtype): set when that is not float32 (a rounded copy of
  // bias); null: bias itself.
  const void* epilogue_bias = nullptr;
};

// The pointer cuBLASLt's bias epilogue reads for p (null without a bias).
inline const void* epilogue_bias_of(const GemmProblem& p) { return p.epilogue_bias ? p.epilogue_bias : p.bias; }

// kBias: a float32 bias along the rows, then the rounding; kRelu and kReluBias: max(., 0) after it (if any), before
// the rounding.
enum class GemmEpilogue : uint8_t { kNone, kBias, kRelu, kReluBias };
// Every epilogue, in enum order (tables indexed by one, counts summed over all).
inline constexpr GemmEpilogue kGemmEpilogues[] = {GemmEpilogue::kNone, GemmEpilogue::kBias, GemmEpilogue::kRelu,
                                                  GemmEpilogue::kReluBias};

// Everything that decides the descriptors and the heuristic's choice for a GemmProblem on one GPU. Pointers enter
// only through their alignment classes (the heuristic's minimum-alignment preferences); the bias pointer itself is
// set on the descriptor at each call.
struct GemmPlanKey {
  int device = 0;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  int64_t count = 1;                                 // products in the call
  int64_t a_stride = 0, b_stride = 0, d_stride = 0;  // elements between them; 0 when count is 1
  bool trans_a = false, trans_b = false;
  DType ab_dtype = DType::kFloat32, d_dtype = DType::kFloat32;  // compute is always float32 ...
  bool tf32 = false;  // ... on TF32 tensor cores for float32 inputs when MIXTRAIN_CUDA_TF32=1 opts in
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  DType bias_dtype = DType::kFloat32;  // with a bias epilogue: gemm_bias_dtype(d_dtype)
  uint32_t align_a = 0, align_b = 0, align_d = 0, align_bias = 0;  // bytes, powers of two up to 256

  bool operator==(const GemmPlanKey&) const = default;
};

// The largest power of two up to 256 dividing p and every batch step after it (cuBLASLt assumes 256 unless told).
inline uint32_t gemm_alignment(const void* p, int64_t batch_stride_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(batch_stride_bytes) | 256u;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// The key of problem p on GPU device; tf32 is whether MIXTRAIN_CUDA_TF32=1 (it matters for float32 inputs only).
inline GemmPlanKey gemm_plan_key(int device, const GemmProblem& p, bool tf32) {
  const kernel::BmmLayout& l = *p.l;
  const bool batched = p.count > 1;  // one product: its layout carries no stride
  const int64_t eab = static_cast<int64_t>(dtype_size(p.ab_dtype)), ed = static_cast<int64_t>(dtype_size(p.d_dtype));
  GemmPlanKey key;
  key.device = device;
  key.m = l.m;
  key.n = l.n;
  key.k = l.k;
  key.lda = l.lda;
  key.ldb = l.ldb;
  key.ldd = l.n;
  key.count = p.count;
  key.a_stride = batched ? p.a_stride : 0;
  key.b_stride = batched ? p.b_stride : 0;
  key.d_stride = batched ? l.m * l.n : 0;
  key.trans_a = l.trans_a;
  key.trans_b = l.trans_b;
  key.ab_dtype = p.ab_dtype;
  key.d_dtype = p.d_dtype;
  key.tf32 = tf32 && p.ab_dtype == DType::kFloat32;
  key.epilogue = p.relu ? (p.bias ? GemmEpilogue::kReluBias : GemmEpilogue::kRelu)
                        : (p.bias ? GemmEpilogue::kBias : GemmEpilogue::kNone);
  key.align_a = gemm_alignment(p.a, key.a_stride * eab);
  key.align_b = gemm_alignment(p.b, key.b_stride * eab);
  key.align_d = gemm_alignment(p.d, key.d_stride * ed);
  key.bias_dtype = p.bias ? gemm_bias_dtype(p.d_dtype) : DType::kFloat32;
  key.align_bias = p.bias ? gemm_alignment(epilogue_bias_of(p), 0) : 0;
  return key;
}

struct GemmPlanKeyHash {
  size_t operator()(const GemmPlanKey& k) const {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](uint64_t v) { h = (h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2))) * 0x100000001b3ull; };
    mix(static_cast<uint64_t>(k.device));
    for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldd, k.count, k.a_stride, k.b_stride, k.d_stride})
      mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(k.trans_a) | static_cast<uint64_t>(k.trans_b) << 1 | static_cast<uint64_t>(k.tf32) << 2 |
        static_cast<uint64_t>(k.epilogue) << 3 | static_cast<uint64_t>(k.ab_dtype) << 8 |
        static_cast<uint64_t>(k.d_dtype) << 16 | static_cast<uint64_t>(k.bias_dtype) << 24);
    mix(static_cast<uint64_t>(k.align_a) | static_cast<uint64_t>(k.align_b) << 16 |
        static_cast<uint64_t>(k.align_d) << 32 | static_cast<uint64_t>(k.align_bias) << 48);
    return static_cast<size_t>(h);
  }
};

struct GemmPlanCacheStats {
  int64_t hits = 0, misses = 0, evictions = 0;
  size_t size = 0, capacity = 0;
};

// At most `capacity` plans, the least recently used evicted first; thread-safe. Plans are shared: one evicted while
// a call still uses it is destroyed when that call lets go of it, so its descriptors never outlive their last user
// nor die under one.
template <typename Plan>
class GemmPlanCache {
 public:
  explicit GemmPlanCache(size_t capacity) : capacity_(capacity > 0 ? capacity : 1) {}
  GemmPlanCache(const GemmPlanCache&) = delete;
  GemmPlanCache& operator=(const GemmPlanCache&) = delete;

  // The plan for key, now the most recently used: the cached one, or make()'s (a std::shared_ptr<Plan>), stored.
  // make runs under the cache's lock (a miss is rare, and two threads never build the same plan); when it throws,
  // nothing is stored.
  template <typename Make>
  std::shared_ptr<Plan> get(const GemmPlanKey& key, Make&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    ++misses_;
    std::shared_ptr<Plan> plan = std::forward<Make>(make)();
    lru_.emplace_front(key, plan);
    index_.emplace(key, lru_.begin());
    while (lru_.size() > capacity_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();  // the plan is destroyed here unless a call still holds it
      ++evictions_;
    }
    return plan;
  }

  // Drops every plan (each destroyed once no call holds it).
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    index_.clear();
    lru_.clear();
  }

  GemmPlanCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {hits_, misses_, evictions_, lru_.size(), capacity_};
  }

 private:
  using Entry = std::pair<GemmPlanKey, std::shared_ptr<Plan>>;
  mutable std::mutex mu_;
  const size_t capacity_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<GemmPlanKey, typename std::list<Entry>::iterator, GemmPlanKeyHash> index_;
  int64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

// The GEMM's own cache, across GPUs (matmul.cpp; only in a build with the CUDA backend).
GemmPlanCacheStats gemm_plan_cache_stats();

// How many plans with this epilogue cuBLASLt has declined in this process (its heuristic offered no algorithm, or
// refused the one it offered): those products ran the other way (a float32 scratch and a rounding kernel, or the
// product then the activation kernel).
int64_t gemm_plans_declined(GemmEpilogue epilogue);

}  // namespace mixtrain::ops::cuda
