// scaled_matmul on the GPU (ops/fp8_gemm.h): c = alpha * op(a) op(b) + bias, the float32 sum times alpha, then the
// bias, then one rounding into c's dtype, as on the CPU. fp8_gemm_route.h says which products run on cuBLASLt's FP8
// GEMM and why the others take the backend's 16-bit GEMM (matmul.cpp's scaled_bmm), which reads the same values.
//
// On the FP8 GEMM the operands are first read back as codes: one pass per operand asks which float8 formats hold
// all its values (a flags word each, read back to the host: the op's entry reads its result back anyway), a second
// writes the codes of op(a) as (m, k) and of op(b)^T as (n, k), both rows along k, transposing where the operand
// lies the other way: cuBLASLt's FP8 kernels take only the "TN" layout. As in matmul.cpp, cuBLASLt computes the
// column-major C^T = op(b)^T op(a)^T: its A is b's codes (k, n) column-major, transposed; its B is a's codes (k, m),
// not transposed; its D (n, m) column-major is C's row-major memory. alpha reaches the product as cuBLASLt's A scale
// (a device float, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER; the B scale is 1 and cuBLASLt's own alpha 1), so D =
// alpha * sum in float32 (compute type 32F, no fast accumulation), the inverse scales applied to the accumulator as
// the CPU's epilogue applies them. The bias is added by round_rows_into (convert.cu) to a float32 D before the one
// rounding into a 16-bit c; without a bias cuBLASLt writes a 16-bit c itself (reducing split sums in float32).
// Descriptors are built on each call (no plan cache yet).
#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <string>

#include "../device_wait.h"
#include "../shared/fp8_element.h"
#include "backend.h"
#include "cublaslt_api.h"
#include "device_util.cuh"
#include "fp8_gemm_route.h"
#include "mixtrain/ops/fp8_gemm.h"

namespace mixtrain::ops::cuda {

namespace {

std::atomic<int64_t> tensor_core_products{0}, wide_products{0};

// Bits of an operand's flags word: some element is not a value of E4M3 / of E5M2.
constexpr uint32_t kNotE4M3 = 1u, kNotE5M2 = 2u;

__global__ void classify_kernel(const void* x, int x_code, int64_t n, uint32_t* flags) {
  uint32_t f = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = shared::load_as_float(x, x_code, i);
    if (!shared::is_float8_value(v, false)) f |= kNotE4M3;
    if (!shared::is_float8_value(v, true)) f |= kNotE5M2;
  }
  for (int o = device::kWarp / 2; o > 0; o /= 2) f |= __shfl_xor_sync(0xFFFFFFFFu, f, o);
  if (threadIdx.x % device::kWarp == 0 && f != 0) atomicOr(flags, f);
}

// codes (rows, k) row-major = the codes of the (rows, k) matrix x reads as: x itself, or (transposed) the (k, rows)
// row-major x read down its columns. Exact: the operand was classified as values of the format.
__global__ void encode_kernel(const void* x, int x_code, int64_t rows, int64_t k, bool transposed, bool e5m2,
                              uint8_t* codes) {
  const int64_t n = rows * k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = shared::load_as_float(x, x_code, shared::tn_source_index(i, rows, k, transposed));
    codes[i] = shared::float8_code(v, e5m2, Float8Overflow::kNonSaturating);
  }
}

Fp8Exactness exactness_of(uint32_t flags) { return {(flags & kNotE4M3) == 0, (flags & kNotE5M2) == 0}; }

// Which formats hold all of a's and all of b's values (two launches, one read back).
void classify(const Tensor& a, const Tensor& b, Fp8Exactness* ea, Fp8Exactness* eb) {
  Tensor words = Tensor::empty({2}, DType::kFloat32, a.device());  // two uint32 flags words
  uint32_t* flags = static_cast<uint32_t*>(words.raw());
  check_cuda(cudaMemsetAsync(flags, 0, 2 * sizeof *flags), "cudaMemsetAsync");
  classify_kernel<<<device::blocks_for(a.numel()), device::kThreads>>>(a.raw(), shared::float_code(a.dtype()),
                                                                        a.numel(), flags);
  classify_kernel<<<device::blocks_for(b.numel()), device::kThreads>>>(b.raw(), shared::float_code(b.dtype()),
                                                                        b.numel(), flags + 1);
  device::launched("scaled_matmul (classify)");
  uint32_t host[2] = {0, 0};
  checked_wait([&] { check_cuda(cudaMemcpy(host, flags, sizeof host, cudaMemcpyDeviceToHost), "cudaMemcpy"); });
  *ea = exactness_of(host[0]);
  *eb = exactness_of(host[1]);
}

Tensor encode(const Tensor& x, int64_t rows, int64_t k, bool transposed, bool e5m2) {
  Tensor codes = Tensor::empty({rows, k}, DType::kUInt8, x.device());
  encode_kernel<<<device::blocks_for(rows * k), device::kThreads>>>(
      x.raw(), shared::float_code(x.dtype()), rows, k, transposed, e5m2, static_cast<uint8_t*>(codes.raw()));
  device::launched("scaled_matmul (encode)");
  return codes;
}

void require_capability(int device) {
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
  if (major * 10 + minor >= kFp8MinComputeCapability) return;
  cudaDeviceProp prop{};
  const std::string name = cudaGetDeviceProperties(&prop, device) == cudaSuccess ? prop.name : "this GPU";
  require_fp8_capability(major, minor, "cuda:" + std::to_string(device) + " (" + name + ")");
}

cudaDataType_t lt_type(DType dt) {
  return dt == DType::kFloat16 ? CUDA_R_16F : dt == DType::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
}
cudaDataType_t lt_float8(bool e5m2) { return e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublaslt().desc_destroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* d) const { cublaslt().layout_destroy(d); }
};
struct PrefDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* d) const { cublaslt().pref_destroy(d); }
};
using Desc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Pref = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PrefDeleter>;

// A column-major (rows, cols) layout with leading dimension rows; null when cuBLASLt refuses it.
Layout make_layout(cudaDataType_t type, int64_t rows, int64_t cols) {
  cublasLtMatrixLayout_t l = nullptr;
  if (cublaslt().layout_create(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), rows) !=
      CUBLAS_STATUS_SUCCESS)
    return Layout();
  return Layout(l);
}

// The FP8 operands and output of one product: a_codes (m, k), b_codes (n, k), d (m, n) row-major of d_dtype,
// scales {alpha, 1} (device floats).
struct Fp8Problem {
  const Fp8GemmRoute* route;
  int64_t m, n, k;
  const void *a_codes, *b_codes;
  void* d;
  DType d_dtype;
  const float* scales;
};

// The largest power of two up to 256 that divides p's address: the alignment the heuristic is told (it assumes 256
// bytes otherwise, and c may be a view into a larger buffer).
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// Sets an attribute of the descriptor; false when cuBLASLt refuses it.
template <typename T>
bool set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  return cublaslt().desc_set(d, attr, &v, sizeof v) == CUBLAS_STATUS_SUCCESS;
}

// Runs p on cuBLASLt's FP8 GEMM; the status of the step that refused it otherwise (nothing written then).
cublasStatus_t run_fp8(const Fp8Problem& p, int device) {
  const CublasLtContext ctx = cublaslt_context(device);
  cublasLtMatmulDesc_t raw_desc = nullptr;
  cublasStatus_t st = cublaslt().desc_create(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const Desc desc(raw_desc);
  const void* a_scale = p.scales;      // cuBLASLt's A: b's codes; the scale products are alpha * 1 either way
  const void* b_scale = p.scales + 1;
  if (!set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(CUBLAS_OP_T)) ||
      !set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(CUBLAS_OP_N)) ||
      !set(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale) ||
      !set(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const Layout first = make_layout(lt_float8(p.route->b_e5m2), p.k, p.n);
  const Layout second = make_layout(lt_float8(p.route->a_e5m2), p.k, p.m);
  const Layout out = make_layout(lt_type(p.d_dtype), p.n, p.m);
  if (!first || !second || !out) return CUBLAS_STATUS_NOT_SUPPORTED;
  cublasLtMatmulPreference_t raw_pref = nullptr;
  st = cublaslt().pref_create(&raw_pref);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const Pref pref(raw_pref);
  const uint64_t workspace = ctx.workspace_bytes;
  cublaslt().pref_set(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
  const uint32_t align_first = alignment_of(p.b_codes), align_second = alignment_of(p.a_codes),
                 align_d = alignment_of(p.d);
  cublaslt().pref_set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_first, sizeof align_first);
  cublaslt().pref_set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_second, sizeof align_second);
  cublaslt().pref_set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof align_d);
  cublaslt().pref_set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d);
  // Split sums reduced in float32 only, so a 16-bit D is rounded once (as matmul.cpp asks).
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  if (p.d_dtype != DType::kFloat32)
    cublaslt().pref_set(raw_pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof reduction);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  st = cublaslt().heuristic(ctx.handle, raw_desc, first.get(), second.get(), out.get(), out.get(), raw_pref, 1,
                            &result, &found);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  const float one = 1.0f, zero = 0.0f;
  return cublaslt().matmul(ctx.handle, raw_desc, &one, p.b_codes, first.get(), p.a_codes, second.get(), &zero, p.d,
                           out.get(), p.d, out.get(), &result.algo, ctx.workspace, ctx.workspace_bytes,
                           /*stream=*/nullptr);
}

// The product on the FP8 GEMM; false (nothing written) when cuBLASLt declines it.
bool fp8_product(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::ScaledMatmulLayout& l,
                 const Fp8GemmRoute& route, float alpha, Tensor& c) {
  const int device = c.device().index;
  const TnSources tn = tn_sources(l.trans_a, l.trans_b);
  const Tensor a_codes = encode(a, l.m, l.k, tn.a_transposed, route.a_e5m2);
  const Tensor b_codes = encode(b, l.n, l.k, tn.b_transposed, route.b_e5m2);
  Tensor scales = Tensor::empty({2}, DType::kFloat32, c.device());
  const float host_scales[2] = {alpha, 1.0f};
  check_cuda(cudaMemcpy(scales.raw(), host_scales, sizeof host_scales, cudaMemcpyHostToDevice), "cudaMemcpy");
  // D: c itself when float32, or when no bias is left to add; else a float32 scratch.
  const bool direct = c.dtype() == DType::kFloat32 || !bias.defined();
  Tensor scratch = direct ? Tensor() : Tensor::empty({l.m, l.n}, DType::kFloat32, c.device());
  Tensor& d = direct ? c : scratch;
  const Fp8Problem p{&route, l.m, l.n, l.k, a_codes.raw(), b_codes.raw(), d.raw(), d.dtype(),
                     scales.data<float>()};
  const cublasStatus_t st = run_fp8(p, device);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) return false;
  if (st != CUBLAS_STATUS_SUCCESS)
    MIXTRAIN_FAIL(kInternal, "cuBLASLt: the FP8 matmul failed: " << cublaslt().status_string(st),
                  "check the GPU with nvidia-smi; cpu tensors avoid the GPU GEMM");
  if (bias.defined()) round_rows_into(d.data<float>(), bias.data<float>(), l.m, l.n, c.raw(), c.dtype());
  return true;
}

void scaled_matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::ScaledMatmulLayout& l,
                   float alpha, Tensor& c) {
  const int device = c.device().index;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  require_capability(device);
  Fp8Exactness ea, eb;  // asked of the operands only when the shape fits
  if (fp8_gemm_shape_fits(l.m, l.n, l.k)) classify(a, b, &ea, &eb);
  const Fp8GemmRoute route = choose_fp8_gemm_route(l.m, l.n, l.k, ea, eb);
  if (route.tensor_cores && fp8_product(a, b, bias, l, route, alpha, c)) {
    tensor_core_products.fetch_add(1, std::memory_order_relaxed);
    check_cuda(cudaGetLastError(), "scaled_matmul");
    return;
  }
  kernel::BmmLayout wide{l.trans_a, l.trans_b, l.m, l.n, l.k, l.trans_a ? l.m : l.k, l.trans_b ? l.k : l.n, {}, {}, {}};
  scaled_bmm(a, b, bias, wide, alpha, c);
  wide_products.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

int64_t fp8_gemm_count(bool tensor_cores) {
  return (tensor_cores ? tensor_core_products : wide_products).load(std::memory_order_relaxed);
}

void register_fp8_matmul_kernels(Kernels& k) { k.set<Op::scaled_matmul>(&scaled_matmul); }

}  // namespace mixtrain::ops::cuda
