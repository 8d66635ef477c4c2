// The batched product on the GPU (ops::bmm / matmul / linear's kCuda kernel) through cuBLASLt, loaded at run
// time (cublaslt_api.h). Numerics as the CPU's kernels::gemm promises them: float16 and bfloat16 inputs multiply
// with float32 accumulation (CUBLAS_COMPUTE_32F); float32 inputs in plain float32 (TF32 tensor cores, which
// round the inputs to 10 significand bits, only when MIXTRAIN_CUDA_TF32=1 opts in); the result is rounded
// once into C's dtype, after the bias is added to the float32 sum (beside a 16-bit C, cuBLASLt's epilogue adds the
// bias rounded into C's dtype: see below).
//
// cuBLAS is column-major and a row-major (r, c) matrix with row stride ld is the column-major (c, r) matrix with
// the same ld, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: cuBLASLt's first operand is b's memory,
// its second a's, and its (n, m) result is C's row-major memory. The bias then runs along the result's rows, as
// cuBLASLt's bias epilogue expects.
//
// scaled_bmm multiplies the float32 sum by alpha before the bias and that rounding (cuBLASLt's alpha; the scratch
// way and the fallback kernel likewise), so attention's scores round once, after the scale, into a 16-bit C.
//
// Where cuBLASLt cannot write C's dtype (float32 inputs into a 16-bit C) or declines the bias epilogue, the
// product goes to a float32 scratch and one kernel adds the bias and rounds (convert.cu): one rounding either way.
// A product cuBLASLt has no algorithm for at all runs on the backend's own tiled kernel (gemm_fallback.h). Both are
// counted (gemm_plans_declined, gemm_fallback_products), and an INVALID_VALUE answer is an error under
// MIXTRAIN_REQUIRE_GPU=1 (gemm_refusal.h). The bias epilogue reads a bias of D's dtype, as cuBLASLt documents
// (gemm_bias_dtype in gemm_plan_cache.h): beside a 16-bit D the float32 bias is rounded into it first.
//
// Each call's descriptors and algorithm come from a plan cache (gemm_plan_cache.h) keyed by all that decides them,
// so a repeated product builds nothing and asks the heuristic nothing: it runs the algorithm the first call chose.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "backend.h"
#include "cublaslt_api.h"
#include "gemm_fallback.h"
#include "gemm_plan_cache.h"
#include "gemm_refusal.h"
#include "mixtrain/core/allocator.h"
#include "mixtrain/core/environment.h"
#include "mixtrain/ops/matmul.h"

namespace mixtrain::ops::cuda {

namespace {

static_assert(kLtSuccess == CUBLAS_STATUS_SUCCESS && kLtInvalidValue == CUBLAS_STATUS_INVALID_VALUE &&
              kLtNotSupported == CUBLAS_STATUS_NOT_SUPPORTED, "gemm_refusal.h's statuses are cuBLAS's");

// cuBLASLt's split-k and stream-k algorithms need scratch; 32 MiB is what its documentation suggests for Hopper.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct DeviceState {
  int device = 0;
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;  // kWorkspaceBytes of the device's block pool, held for the process
};

void check_lt(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  MIXTRAIN_FAIL(kInternal, "cuBLASLt: " << what << " failed: " << cublaslt().status_string(status),
                "check the GPU with nvidia-smi; MIXTRAIN_CUDA=OFF or cpu tensors avoid the GPU GEMM");
}

// cuBLASLt's workspace on a GPU, from the backend's block pool like any tensor: a GPU without the memory for it
// raises the MemoryLimitExceeded of every allocation (which --batch-size auto reads as "this batch does not fit"),
// not an internal error, and its bytes are counted with the device's and reused by the pool's cache.
Tensor make_workspace(int device) {
  try {
    return Tensor::empty({static_cast<int64_t>(kWorkspaceBytes)}, DType::kUInt8, Device::cuda(device));
  } catch (const MemoryLimitExceeded& e) {
    throw MemoryLimitExceeded(e.requested_bytes(), e.live_bytes(), "cuBLASLt's workspace: " + e.message(), e.hint());
  }
}

// One handle and workspace per GPU, made on first use and kept for the process (kernels on the legacy default
// stream are ordered, so calls from several threads can share the workspace).
DeviceState& device_state(int device) {
  static std::mutex mu;
  static std::map<int, DeviceState>* states = new std::map<int, DeviceState>();  // never destroyed: see allocator
  std::lock_guard<std::mutex> lock(mu);
  DeviceState& s = (*states)[device];
  if (s.handle == nullptr) {
    // Both or neither: a state with a handle and no workspace (an out-of-memory between the two) would hand
    // cuBLASLt a null workspace of kWorkspaceBytes on every later call. The workspace first: a call that finds no
    // memory for it leaves no handle, and a later call (a smaller batch) makes both.
    Tensor workspace = make_workspace(device);
    cublasLtHandle_t handle = nullptr;
    check_lt(cublaslt().create(&handle), "cublasLtCreate");  // the workspace returns to the pool on a throw
    s.device = device;
    s.workspace = std::move(workspace);
    s.handle = handle;
  }
  return s;
}

bool tf32_opted_in() {
  static const bool on = [] {
    const std::optional<std::string> v = env::mixtrain_cuda_tf32();
    return v && *v == "1";
  }();
  return on;
}

cudaDataType_t cuda_type(DType dt) {
  return dt == DType::kFloat16 ? CUDA_R_16F : dt == DType::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
}

// Result dtypes cuBLASLt writes itself with float32 compute: the inputs' dtype, or float32 from 16-bit inputs.
bool writes_directly(DType ab, DType c) { return c == ab || (c == DType::kFloat32 && is_low_precision(ab)); }

// Descriptors, destroyed with their plan.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  MatmulDesc() = default;
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  ~MatmulDesc() {
    if (d) cublaslt().desc_destroy(d);
  }
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& v) {
    check_lt(cublaslt().desc_set(d, attr, &v, sizeof v), "cublasLtMatmulDescSetAttribute");
  }
};
struct Layout {
  cublasLtMatrixLayout_t d = nullptr;
  Layout() = default;
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  ~Layout() {
    if (d) cublaslt().layout_destroy(d);
  }
};
struct Preference {
  cublasLtMatmulPreference_t d = nullptr;
  Preference() = default;
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  ~Preference() {
    if (d) cublaslt().pref_destroy(d);
  }
  template <typename T>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
    check_lt(cublaslt().pref_set(d, attr, &v, sizeof v), "cublasLtMatmulPreferenceSetAttribute");
  }
};

// A column-major (rows, cols) matrix with leading dimension ld, count of them stride elements apart.
void make_layout(Layout& l, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t count,
                 int64_t stride) {
  check_lt(cublaslt().layout_create(&l.d, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
           "cublasLtMatrixLayoutCreate");
  if (count > 1) {
    const int32_t c = static_cast<int32_t>(count);
    check_lt(cublaslt().layout_set(l.d, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c, sizeof c), "batch count");
    check_lt(cublaslt().layout_set(l.d, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
             "batch stride");
  }
}

// Plans cuBLASLt declined, by epilogue (gemm_plans_declined): whether the bias and relu epilogues ran inside the
// product on a given GPU is a figure the GPU run reports, not something the results show.
std::array<std::atomic<int64_t>, std::size(kGemmEpilogues)> declined_plans{};
void count_decline(GemmEpilogue e) { declined_plans[static_cast<size_t>(e)].fetch_add(1, std::memory_order_relaxed); }

// What a GemmPlanKey decides: the descriptors and the heuristic's answer, made once and reused by every call with
// that key (gemm_plan_cache.h).
struct GemmPlan {
  MatmulDesc desc;
  Layout first, second, out;
  // The heuristic's answer, not SUCCESS when it offered no algorithm; or the first call's, when cuBLASLt refused
  // the algorithm the heuristic offered (read without the lock by every call).
  std::atomic<cublasStatus_t> status{CUBLAS_STATUS_NOT_SUPPORTED};
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;  // what the algorithm needs of the device's workspace
  // The bias pointer differs from call to call: it is set on the shared descriptor just before the call, under
  // this lock, and cuBLASLt has read it when cublasLtMatmul returns.
  std::mutex mu;
};

// Builds the descriptors of p (key = gemm_plan_key(p)) and asks the heuristic for its best algorithm.
std::shared_ptr<GemmPlan> make_plan(const GemmProblem& p, const GemmPlanKey& key, DeviceState& s) {
  const kernel::BmmLayout& l = *p.l;
  auto plan = std::make_shared<GemmPlan>();
  MatmulDesc& desc = plan->desc;
  const cublasComputeType_t compute = key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check_lt(cublaslt().desc_create(&desc.d, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  // First operand: op(B)^T, from b's memory; second: op(A)^T, from a's (see the top of this file).
  const int32_t op_first = l.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t op_second = l.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op_first);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op_second);
  const bool has_bias = key.epilogue == GemmEpilogue::kBias || key.epilogue == GemmEpilogue::kReluBias;
  if (key.epilogue != GemmEpilogue::kNone) {
    const cublasLtEpilogue_t e = key.epilogue == GemmEpilogue::kBias   ? CUBLASLT_EPILOGUE_BIAS
                                 : key.epilogue == GemmEpilogue::kRelu ? CUBLASLT_EPILOGUE_RELU
                                                                       : CUBLASLT_EPILOGUE_RELU_BIAS;
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(e));
  }
  if (has_bias) {
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, epilogue_bias_of(p));  // this call's; each later call sets its own
    // The bias in D's dtype, as cuBLASLt documents it (gemm_bias_dtype): float32 beside a float32 D, the rounded
    // copy beside a 16-bit one. A refusal declines the plan (the scratch way adds the float32 bias).
    const int32_t bias_type = cuda_type(key.bias_dtype);
    const cublasStatus_t bs =
        cublaslt().desc_set(desc.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
    if (gemm_declined(bs, key, "cublasLtMatmulDescSetAttribute (bias data type)", cublaslt().status_string(bs))) {
      count_decline(key.epilogue);
      plan->status = bs;
      return plan;
    }
  }
  const cudaDataType_t tab = cuda_type(p.ab_dtype), td = cuda_type(p.d_dtype);
  // b's memory: row-major (k, n), i.e. column-major (n, k); or (n, k) row-major when trans_b, i.e. (k, n).
  make_layout(plan->first, tab, l.trans_b ? l.k : l.n, l.trans_b ? l.n : l.k, l.ldb, key.count, key.b_stride);
  make_layout(plan->second, tab, l.trans_a ? l.m : l.k, l.trans_a ? l.k : l.m, l.lda, key.count, key.a_stride);
  make_layout(plan->out, td, l.n, l.m, key.ldd, key.count, key.d_stride);

  Preference pref;  // only the heuristic reads it
  check_lt(cublaslt().pref_create(&pref.d), "cublasLtMatmulPreferenceCreate");
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);  // cuBLASLt's A is b's memory
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d);
  // A split-k algorithm may reduce its partial sums in the output buffer and dtype, or add the bias to a 16-bit
  // partial sum: for a 16-bit D that rounds more than once. Only a float32 reduction (or none) keeps the one
  // rounding of the float32 sum this file promises; into a float32 D every scheme keeps it.
  if (key.d_dtype != DType::kFloat32)
    pref.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs = cublaslt().heuristic(s.handle, desc.d, plan->first.d, plan->second.d, plan->out.d,
                                                 plan->out.d, pref.d, 1, &result, &found);
  // A refusal is a decline (the caller's other ways keep the product, the last of them the backend's own kernel,
  // gemm_fallback.h), except INVALID_VALUE under MIXTRAIN_REQUIRE_GPU=1: an error naming the product.
  const cublasStatus_t status =
      hs != CUBLAS_STATUS_SUCCESS ? hs : found == 0 ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_SUCCESS;
  (void)gemm_declined(status, key, "cublasLtMatmulAlgoGetHeuristic", cublaslt().status_string(status));
  if (status == CUBLAS_STATUS_SUCCESS) {
    plan->algo = result.algo;
    plan->workspace_bytes = result.workspaceSize;
  } else {
    count_decline(key.epilogue);
  }
  plan->status = status;
  return plan;
}

// A training step asks for a few hundred distinct products at most; a model that keeps changing its shapes (a
// varying sequence length) evicts the least recently used.
constexpr size_t kPlanCacheCapacity = 1024;

// Destroyed at exit, after the last product (made on first use, so after cuBLASLt was loaded and before any of its
// own teardown): descriptors are host memory, freed then, on eviction, or never while a call holds them.
GemmPlanCache<GemmPlan>& plan_cache() {
  static GemmPlanCache<GemmPlan> cache(kPlanCacheCapacity);
  return cache;
}

// Runs the product with its cached plan (made on the first call with its key), or returns the heuristic's status
// when cuBLASLt offers no algorithm for it (an unsupported combination of dtypes and epilogue; the caller then takes
// the float32 scratch path). The answer is cached too, so a declined product is not asked about again.
cublasStatus_t run(const GemmProblem& p, DeviceState& s) {
  if (p.bias && gemm_bias_dtype(p.d_dtype) != DType::kFloat32 && p.epilogue_bias == nullptr)
    MIXTRAIN_FAIL(kInternal, "GPU GEMM: a " << dtype_name(p.d_dtype) << " product's bias was not rounded for the epilogue",
                  "report this: matmul.cpp's callers round it (epilogue_bias_copy)");
  const GemmPlanKey key = gemm_plan_key(s.device, p, tf32_opted_in());
  const std::shared_ptr<GemmPlan> plan = plan_cache().get(key, [&] { return make_plan(p, key, s); });
  if (plan->status != CUBLAS_STATUS_SUCCESS) return plan->status;
  std::lock_guard<std::mutex> lock(plan->mu);
  if (plan->status != CUBLAS_STATUS_SUCCESS) return plan->status;  // declined by a call this one waited for
  if (p.bias) plan->desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, epilogue_bias_of(p));
  const float beta = 0.0f;  // alpha: host memory, read when the call is queued (the default pointer mode)
  const cublasStatus_t st =
      cublaslt().matmul(s.handle, plan->desc.d, &p.alpha, p.b, plan->first.d, p.a, plan->second.d, &beta, p.d,
                        plan->out.d, p.d, plan->out.d, &plan->algo, s.workspace.raw(), kWorkspaceBytes, /*stream=*/nullptr);
  // cuBLASLt checks a call before it launches anything: a refusal of what its heuristic offered declines this plan
  // for good, as the heuristic would have, and nothing was written (INVALID_VALUE under MIXTRAIN_REQUIRE_GPU=1: an
  // error). Failures of the GPU itself stay errors.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    (void)gemm_declined(st, key, "cublasLtMatmul", cublaslt().status_string(st));
    plan->status = st;
    count_decline(key.epilogue);
    return st;
  }
  check_lt(st, "cublasLtMatmul");
  return CUBLAS_STATUS_SUCCESS;
}

// One strided block of products into p.d (of p.d_dtype, with p.bias): written by cuBLASLt directly where it
// can, else through the float32 scratch (made when first needed, reused) and one rounding kernel. Returns the
// failing status when cuBLASLt has no algorithm either way.
cublasStatus_t run_block(const GemmProblem& p, DeviceState& state, bool bias_epilogue_ok, Tensor& scratch) {
  if (writes_directly(p.ab_dtype, p.d_dtype) && bias_epilogue_ok && run(p, state) == CUBLAS_STATUS_SUCCESS)
    return CUBLAS_STATUS_SUCCESS;
  const kernel::BmmLayout& l = *p.l;
  if (!scratch.defined() || scratch.numel() < p.count * l.m * l.n)
    scratch = Tensor::empty({p.count * l.m, l.n}, DType::kFloat32, Device::cuda(state.device));
  GemmProblem f = p;
  f.d = scratch.raw();
  f.d_dtype = DType::kFloat32;
  f.bias = nullptr;
  f.epilogue_bias = nullptr;
  const cublasStatus_t st = run(f, state);
  if (st == CUBLAS_STATUS_SUCCESS) round_rows_into(scratch.data<float>(), p.bias, p.count * l.m, l.n, p.d, p.d_dtype);
  return st;
}

// The batch dimensions split in two: the trailing ones that one strided cuBLASLt call covers (each operand's
// stride steps evenly through them; a broadcast operand has stride 0 throughout), and the leading rest, looped
// on the host.
struct BatchSplit {
  int outer_rank = 0;       // batch dimensions [0, outer_rank) are looped
  int64_t inner_count = 1;  // products per cuBLASLt call
  int64_t a_stride = 0, b_stride = 0;
};

BatchSplit split_batch(const kernel::BmmLayout& l) {
  BatchSplit s;
  int d = static_cast<int>(l.batch.size()) - 1;
  while (d >= 0 && l.batch[static_cast<size_t>(d)] == 1) --d;  // trailing 1s are nothing
  if (d < 0) return s;
  if (l.batch[static_cast<size_t>(d)] > INT32_MAX) {  // cuBLASLt counts a batch in int32: looped one by one
    s.outer_rank = d + 1;
    return s;
  }
  s.a_stride = l.a_batch_strides[static_cast<size_t>(d)];
  s.b_stride = l.b_batch_strides[static_cast<size_t>(d)];
  s.inner_count = l.batch[static_cast<size_t>(d)];
  for (--d; d >= 0; --d) {
    const size_t i = static_cast<size_t>(d);
    if (l.batch[i] == 1) continue;
    if (l.a_batch_strides[i] != s.a_stride * s.inner_count || l.b_batch_strides[i] != s.b_stride * s.inner_count ||
        s.inner_count * l.batch[i] > INT32_MAX)
      break;
    s.inner_count *= l.batch[i];
  }
  s.outer_rank = d + 1;
  return s;
}

// cuBLASLt's bias epilogues read a 16-byte-aligned bias; a bias view at an odd offset goes the scratch way
// (bmm) or the unfused way (linear_activation). No bias needs no alignment.
bool bias_readable_in_place(const void* bias) {
  return bias == nullptr || reinterpret_cast<uintptr_t>(bias) % 16 == 0;
}

// The bias as the epilogue reads it beside a D of d_dtype (gemm_bias_dtype): null where that is the float32 bias
// itself (or there is none), else a copy of it rounded into d_dtype (n values), kept alive by holder for the call.
const void* epilogue_bias_copy(const Tensor& bias, DType d_dtype, Tensor& holder) {
  if (!bias.defined() || gemm_bias_dtype(d_dtype) == DType::kFloat32) return nullptr;
  holder = Tensor::empty(bias.shape(), gemm_bias_dtype(d_dtype), bias.device());
  cast(bias, holder);
  return holder.raw();
}

}  // namespace

CublasLtContext cublaslt_context(int device) {
  DeviceState& s = device_state(device);
  return {s.handle, s.workspace.raw(), kWorkspaceBytes};
}

GemmPlanCacheStats gemm_plan_cache_stats() { return plan_cache().stats(); }

int64_t gemm_plans_declined(GemmEpilogue epilogue) {
  return declined_plans[static_cast<size_t>(epilogue)].load(std::memory_order_relaxed);
}

const char* gemm_method(DType dtype) {
  return dtype == DType::kFloat32 && tf32_opted_in() ? "cublaslt tf32" : "cublaslt";
}

void bmm(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::BmmLayout& l, Tensor& c) {
  scaled_bmm(a, b, bias, l, 1.0f, c);
}

void scaled_bmm(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::BmmLayout& l, float alpha,
                Tensor& c) {
  int64_t count = 1;
  for (int64_t d : l.batch) count *= d;
  if (count == 0 || l.m == 0 || l.n == 0) return;
  check_cuda(cudaSetDevice(c.device().index), "cudaSetDevice");
  const float* biasp = bias.defined() ? bias.data<float>() : nullptr;
  const size_t ec = dtype_size(c.dtype());
  if (l.k == 0) {  // an empty sum: C = bias (or 0), which cuBLASLt does not serve
    round_rows_into(nullptr, biasp, count * l.m, l.n, c.raw(), c.dtype());
    return;
  }
  DeviceState& state = device_state(c.device().index);
  const BatchSplit split = split_batch(l);
  const size_t eab = dtype_size(a.dtype());
  const DType ab = a.dtype();
  Tensor rounded_bias;  // the bias in C's dtype, for the epilogue beside a 16-bit C
  const void* lt_bias = writes_directly(ab, c.dtype()) && !gemm_fallback_only()
                            ? epilogue_bias_copy(bias, c.dtype(), rounded_bias)
                            : nullptr;
  const bool bias_epilogue_ok = bias_readable_in_place(lt_bias ? lt_bias : biasp);
  Tensor scratch;  // float32, for the products cuBLASLt cannot write in C's dtype

  int64_t outer = 1;
  for (int d = 0; d < split.outer_rank; ++d) outer *= l.batch[static_cast<size_t>(d)];
  for (int64_t o = 0; o < outer; ++o) {
    // Element offsets of this outer index's first product.
    int64_t oa = 0, ob = 0, rest = o;
    for (int d = split.outer_rank - 1; d >= 0; --d) {
      const size_t i = static_cast<size_t>(d);
      const int64_t idx = rest % l.batch[i];
      rest /= l.batch[i];
      oa += idx * l.a_batch_strides[i];
      ob += idx * l.b_batch_strides[i];
    }
    const char* a_block = static_cast<const char*>(a.raw()) + oa * static_cast<int64_t>(eab);
    const char* b_block = static_cast<const char*>(b.raw()) + ob * static_cast<int64_t>(eab);
    char* c_block = static_cast<char*>(c.raw()) + o * split.inner_count * l.m * l.n * static_cast<int64_t>(ec);
    GemmProblem p{&l,      ab,        a_block, b_block, split.a_stride, split.b_stride, split.inner_count,
                  c_block, c.dtype(), biasp};
    p.epilogue_bias = lt_bias;
    p.alpha = alpha;
    if (gemm_fallback_only()) {
      gemm_fallback(p);
      continue;
    }
    cublasStatus_t st = run_block(p, state, bias_epilogue_ok, scratch);
    // A strided batch cuBLASLt declines (a broadcast operand's stride 0, an odd stride) runs product by product,
    // and a product it declines alone (an operand it cannot read where it lies) by the backend's own kernel.
    for (int64_t i = 0; st != CUBLAS_STATUS_SUCCESS && i < p.count; ++i) {
      GemmProblem one = p;
      one.a = static_cast<const char*>(p.a) + i * p.a_stride * static_cast<int64_t>(eab);
      one.b = static_cast<const char*>(p.b) + i * p.b_stride * static_cast<int64_t>(eab);
      one.d = static_cast<char*>(p.d) + i * l.m * l.n * static_cast<int64_t>(ec);
      one.count = 1;
      if (run_block(one, state, bias_epilogue_ok, scratch) != CUBLAS_STATUS_SUCCESS) gemm_fallback(one);
    }
  }
  check_cuda(cudaGetLastError(), "bmm");
}

}  // namespace mixtrain::ops::cuda

namespace mixtrain::ops::cuda {

// A Dense layer's product and activation (linear_activation's kCuda kernel). ReLU without its pre-activation kept
// (what a training step asks for: relu's derivative is read from y) runs inside the product, as cuBLASLt's RELU or
// RELU_BIAS epilogue: max(product + bias, 0) in float32, then the one rounding into y, so the output is written once
// instead of written, read and written again. That is linear() then relu() on the same float32 value: rounding is
// monotonic and keeps signs, so it commutes with max(., 0), except that a negative value rounding to -0 comes out
// +0 (equal as numbers, and not > 0 for the backward pass either way), and a NaN product (only from a non-finite
// input: float32 sums of 16-bit products cannot overflow to infinities of both signs) may come out 0 where relu()
// passes it on; that input still makes this layer's weight gradient non-finite, so a loss-scaled step is skipped
// as before. GELU runs as the product then the activation kernel: cuBLASLt's GELU epilogue is the tanh
// approximation, and Keras' default (mixtrain's) is the exact erf form. So do products the epilogue does not serve
// (a batch of products, a 16-bit y of float32 inputs, a bias cuBLASLt cannot read in place, a combination its
// heuristic declines).
void linear_activation(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::BmmLayout& l,
                       Activation act, Tensor& y, Tensor& pre) {
  if (act == Activation::kRelu && !pre.defined() && l.batch.empty() && l.m > 0 && l.n > 0 && l.k > 0 &&
      writes_directly(a.dtype(), y.dtype()) && !gemm_fallback_only()) {
    const float* biasp = bias.defined() ? bias.data<float>() : nullptr;
    check_cuda(cudaSetDevice(y.device().index), "cudaSetDevice");
    Tensor rounded_bias;  // the bias in y's dtype, for the epilogue beside a 16-bit y
    const void* lt_bias = epilogue_bias_copy(bias, y.dtype(), rounded_bias);
    if (bias_readable_in_place(lt_bias ? lt_bias : biasp)) {
      GemmProblem p{&l, a.dtype(), a.raw(), b.raw(), 0, 0, 1, y.raw(), y.dtype(), biasp};
      p.relu = true;
      p.epilogue_bias = lt_bias;
      if (run(p, device_state(y.device().index)) == CUBLAS_STATUS_SUCCESS) {
        check_cuda(cudaGetLastError(), "linear_activation");
        return;
      }
    }
  }
  Tensor& z = pre.defined() ? pre : y;
  bmm(a, b, bias, l, z);
  activation(z, act, y);  // elementwise: y may be z
}

void register_matmul_kernels(Kernels& k) {
  k.set<Op::bmm>(&bmm);
  k.set<Op::linear_activation>(&linear_activation);
}

}  // namespace mixtrain::ops::cuda
