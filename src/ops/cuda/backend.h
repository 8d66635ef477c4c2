// The CUDA backend's pieces, private to the ops layer: the kernels (*.cu, matmul.cpp over cuBLASLt) and the installer
// (backend.cpp). No CUDA type appears here, so host code and tests include it freely.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/matmul.h"

namespace mixtrain::ops::cuda {

// Registers the CUDA backend (allocator, copies, kernels) when a GPU is present.
CudaBackendStatus install_backend();

// Each kernel file ends with `void register_<file>_kernels(Kernels& k)`, which sets its kernels' members; these
// lists are the one place that names the files. The GEMM's files multiply through cuBLASLt, so they register only
// when load_cublaslt succeeds.
#define MIXTRAIN_CUDA_KERNEL_FILES(X) \
  X(kernels)                          \
  X(elementwise)                      \
  X(reduce)                           \
  X(softmax)                          \
  X(losses)                           \
  X(crossentropy)                     \
  X(layer_norm)                       \
  X(rms_norm)                         \
  X(embedding)                        \
  X(fused_update)                     \
  X(pooling)                          \
  X(batch_norm)                       \
  X(convert)                          \
  X(fp8_quantize)                     \
  X(square)                           \
  X(multiply)                         \
  X(rotary_embedding)                 \
  X(flash_attention)
#define MIXTRAIN_CUDA_GEMM_KERNEL_FILES(X) \
  X(matmul)                               \
  X(fp8_matmul)                           \
  X(conv2d)                               \
  X(attention)                            \
  X(linear_cross_entropy)
#define MIXTRAIN_DECLARE_CUDA_REGISTRATION(file) void register_##file##_kernels(Kernels& k);
MIXTRAIN_CUDA_KERNEL_FILES(MIXTRAIN_DECLARE_CUDA_REGISTRATION)
MIXTRAIN_CUDA_GEMM_KERNEL_FILES(MIXTRAIN_DECLARE_CUDA_REGISTRATION)
#undef MIXTRAIN_DECLARE_CUDA_REGISTRATION
// Every CUDA kernel the build has, the GEMM's when with_gemm, registered into k: what install_backend installs, and
// what tests/ops/backend_coverage_test.cpp checks on any machine.
void register_kernels(Kernels& k, bool with_gemm);
// The ops this backend does not implement, by design (none now; an op left out later would be named here): on a GPU
// tensor their entries name the op and the device. tests/ops/backend_coverage_test.cpp holds the backend to every op outside this list.
std::vector<Op> unsupported_ops();
// Whether the CUDA cast (convert.cu) converts to and from dtype: float32, float16, bfloat16, float8_e4m3fn and
// float8_e5m2. The E8M0 block scale converts on the CPU only (docs/FP8.md): a GPU cast of one is refused, naming both tensors.
// tests/ops/backend_coverage_test.cpp holds this list against the CPU's.
bool cast_converts(DType dtype);

// The device services (kernels.cu), which the backend object calls; inputs on one CUDA device.
void device_copy(const Tensor& src, Tensor& dst);
void synchronize(int device_index);
void make_current(int device_index);
DeviceMemory device_memory(int device_index);
// Kernels other kernel files call (elementwise.cu, reduce.cu).
void activation(const Tensor& x, Activation a, Tensor& y);
// out (cols,) float32 = the column sums of dy read as contiguous (rows, cols), in shared::blocked_row_sum's order
// with blocks of per_block rows (sum_rows' and conv2d's dbias, each with its own block size).
void blocked_column_sums(const Tensor& dy, int64_t cols, int64_t per_block, Tensor& out);
// Raises (and clears) the first label error a cross-entropy or an accuracy, or id error an embedding, found on that
// GPU since the last call; device_copy's downloads and synchronize call it, so the error surfaces at the host's next
// read.
void check_label_errors(int device);
// The ops that index by device labels or ids, named in their errors: classes for the losses, the table's rows
// (input_dim) for the embedding.
// kFusedUpdateCounter: not a label but the same kind of finding, kept in the same record and raised the same way:
// the fused update met an iteration counter outside its window of rates (row: the window's first iteration,
// label: the counter, classes: the window's length).
enum class LabelOp : int {
  kCrossentropy = 0,
  kAccuracy = 1,
  kEmbedding = 2,
  kEmbeddingBackward = 3,
  kFusedUpdateCounter = 4
};
// A device's record of the first such finding since the host last read it (row kNoFinding: none). Kernels that
// find something write it directly when they are the only writer in their launch.
inline constexpr unsigned long long kNoFinding = ~0ull;
struct LabelError {
  unsigned long long row;
  long long label;
  long long classes;
  int op;  // LabelOp
};
// The record of a GPU (device memory), made on first use.
LabelError* label_error_record(int device);
// Queues the keeping of a kernel's finding in the device's label-error record (unless an earlier error is still
// unread): *bad_row (device memory) is the first row (the first position, for an embedding's ids) whose label lies
// outside [0, classes), or all ones for none. Reads nothing back.
void record_label_error(const unsigned long long* bad_row, const Tensor& labels, int64_t classes, LabelOp op);
// matmul.cpp (cuBLASLt): the product conv2d.cu and attention.cu run theirs through.
void bmm(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::BmmLayout& layout, Tensor& c);
// c = alpha op(a) op(b) [+ bias]: the float32 sum times alpha, then the bias, then one rounding into c's dtype
// (attention's scaled scores, written straight into the compute dtype).
void scaled_bmm(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::BmmLayout& layout, float alpha,
                Tensor& c);
// How bmm multiplies inputs of dtype: "cublaslt", or "cublaslt tf32" for float32 under MIXTRAIN_CUDA_TF32=1.
const char* gemm_method(DType dtype);

// dst = src converted between float32, float16 and bfloat16 (same shape, contiguous, one device), rounding as
// core's conversions do (convert.cu): the kernel of ops::cast, which the backward passes
// call on an incoming gradient of another dtype.
void cast(const Tensor& src, Tensor& dst);
// Tensor::copy_from between two tensors on one GPU (core's register_device_copy): any strides, a conversion between
// floating dtypes or a copy of any dtype to itself.
void strided_copy(const Tensor& src, Tensor& dst);
// dst (rows, n) of dst_dtype = src (rows, n) float32 [+ bias (n,) float32], rounded once; a null src reads as
// zeros. Device pointers, on the current device (convert.cu).
void round_rows_into(const float* src, const float* bias, int64_t rows, int64_t n, void* dst, DType dst_dtype);

// The allocator keeps the block holding device address p from being reused until the work queued on `stream` (a
// cudaStream_t other than the default one) so far is done, by an event recorded there (block_pool.h's hold). A p
// outside the allocator's blocks is left alone. For ops/side_stream.h's driver (side_stream_driver.cpp).
void hold_block(int device_index, const void* p, void* stream);

// Loads cuBLASLt at run time (cublaslt.cpp); false, with the reason in *why, when it cannot.
bool load_cublaslt(std::string* why);

// Throws Error (kInternal) naming what failed when err is not cudaSuccess (err is a cudaError_t).
void check_cuda(int err, const char* what);

}  // namespace mixtrain::ops::cuda
