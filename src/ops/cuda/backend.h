// The CUDA backend's pieces, private to the ops layer: the kernels (*.cu, matmul.cpp over cuBLASLt) and the installer
// (backend.cpp). No CUDA type appears here, so host code and tests include it freely.
#pragma once

#include <string>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/conv2d.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/fused_update.h"
#include "mixtrain/ops/loss_scale.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/pooling.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops::cuda {

// Registers the allocator and fills the op tables' kCuda entries when a GPU is present.
CudaBackendStatus install_backend();

// Kernels, with the CPU kernels' signatures (ops/*.h, namespace kernel); inputs on one CUDA device.
// kernels.cu
void fill(Tensor& y, float value);
void unscale_and_check(const Tensor& scaled, const Tensor& scale_state, Tensor& found_inf, Tensor& out);
int64_t unscale_and_count_nonfinite(const Tensor& scaled, float inv_scale, Tensor& out);
void update_loss_scale(Tensor& scale_state, Tensor& counters, const Tensor& found_inf, const LossScaleRule& rule);
void apply_loss_scale(const Tensor& loss, const Tensor& scale_state, Tensor& out);
void device_copy(const Tensor& src, Tensor& dst);
void synchronize(int device_index);
void make_current(int device_index);
DeviceMemory device_memory(int device_index);
// elementwise.cu
void activation(const Tensor& x, Activation a, Tensor& y);
void activation_backward(const Tensor& dy, const Tensor& saved, Activation a, Tensor& dx);
void add(const Tensor& a, const Tensor& b, Tensor& y);
void scale(const Tensor& x, float s, Tensor& y);
void bias_add(const Tensor& x, const Tensor& bias, Tensor& y);
void dropout(const Tensor& x, const Tensor& mask, float keep_scale, Tensor& y);
void dropout_mask(float rate, uint64_t seed, Tensor& mask);
// reduce.cu
void sum_rows(const Tensor& dy, Tensor& out);
// out (cols,) float32 = the column sums of dy read as contiguous (rows, cols), in shared::blocked_row_sum's order
// with blocks of per_block rows (sum_rows' and conv2d's dbias, each with its own block size).
void blocked_column_sums(const Tensor& dy, int64_t cols, int64_t per_block, Tensor& out);
int64_t count_nonfinite(const Tensor& x);
void reduce_sum(const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& y);
void reduce_sum_backward(const Tensor& dy, int64_t outer, int64_t n, int64_t inner, Tensor& dx);
// softmax.cu
void softmax(const Tensor& x, bool log, Tensor& y);
void softmax_backward(const Tensor& dy, const Tensor& y, bool log, Tensor& dx);
// losses.cu
void mse(const Tensor& pred, const Tensor& target, Tensor& loss);
void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dx);
void sum_all(const Tensor& x, bool mean, Tensor& out);
int64_t accuracy(const Tensor& scores, const Tensor& labels);
void count_correct(const Tensor& scores, const Tensor& labels, Tensor& count);
void penalty(const Tensor& w, float l1, float l2, Tensor& out);
void penalty_backward(const Tensor& w, float l1, float l2, const Tensor& dpenalty, Tensor& dw);
// crossentropy.cu
void crossentropy(const Tensor& x, const Tensor& target, bool sparse, bool from_logits, Tensor& loss);
void crossentropy_backward(const Tensor& x, const Tensor& target, bool sparse, bool from_logits,
                           const Tensor& dloss, Tensor& dx);
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
// layer_norm.cu
void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, Tensor& y, Tensor& mean,
                Tensor& rstd);
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta);
// embedding.cu
void embedding(const Tensor& ids, const Tensor& table, Tensor& y);
void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor& dtable);
// fused_update.cu
void fused_update(std::vector<FusedUpdateGroup>& groups, const FusedUpdateStep& step, const Tensor* found_inf,
                  Tensor& iterations, const Tensor* global_norm);
void global_norm(const std::vector<Tensor>& xs, Tensor& out);
// pooling.cu
void pool2d(const Tensor& x, PoolKind kind, const Window2d& g, Tensor& y);
void pool2d_backward(const Tensor& dy, const Tensor& x, PoolKind kind, const Window2d& g, Tensor& dx);
void global_average_pool2d(const Tensor& x, Tensor& y);
void global_average_pool2d_backward(const Tensor& dy, Tensor& dx);
// batch_norm.cu
void moving_statistics(const Tensor& moving_mean, const Tensor& moving_variance, const Tensor& mean,
                       const Tensor& variance, float momentum, Tensor& next_mean, Tensor& next_variance,
                       Tensor& skipped);
void batch_moments(const Tensor& x, Tensor& mean, Tensor& variance);
void batch_norm(const Tensor& x, const Tensor& mean, const Tensor& variance, const Tensor& gamma, const Tensor& beta,
                float epsilon, Tensor& y);
void batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                         const Tensor& gamma, float epsilon, bool batch_statistics, Tensor& dx, Tensor& dgamma,
                         Tensor& dbeta);
void batch_channel_sums(const Tensor& x, const Tensor& center, Tensor& sums);
void batch_norm_input_grad(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                           const Tensor& gamma, float epsilon, const Tensor& sum_dy, const Tensor& sum_dy_xhat,
                           Tensor& dx);
// conv2d.cu (its GEMM is bmm's: installed with it, only when load_cublaslt succeeds)
void conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias, const Window2d& g, Tensor& y);
void conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& kernel, const Window2d& g, Tensor& dx,
                     Tensor& dkernel, Tensor& dbias);
// attention.cu (its products are bmm's: installed with it, only when load_cublaslt succeeds)
void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options, Tensor& out,
               Tensor& probs, Tensor& logits);
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                        const AttentionOptions& options, Tensor& dq, Tensor& dk, Tensor& dv);
// matmul.cpp (cuBLASLt; installed only when load_cublaslt succeeds)
void bmm(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::BmmLayout& layout, Tensor& c);
// A Dense layer's product and activation: relu inside the product (cuBLASLt's RELU / RELU_BIAS epilogue) where it
// serves, else bmm then the activation kernel.
void linear_activation(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::BmmLayout& layout,
                       Activation act, Tensor& y, Tensor& pre);
// How bmm multiplies inputs of dtype: "cublaslt", or "cublaslt tf32" for float32 under MIXTRAIN_CUDA_TF32=1.
const char* gemm_method(DType dtype);

// dst = src converted between float32, float16 and bfloat16 (same shape, contiguous, one device), rounding as
// core's conversions do (convert.cu): the kernel of ops::cast (kernel::cast_table), which the backward passes
// call on an incoming gradient of another dtype.
void cast(const Tensor& src, Tensor& dst);
// Tensor::copy_from between two tensors on one GPU (core's register_device_copy): any strides, a conversion between
// floating dtypes or a copy of any dtype to itself.
void strided_copy(const Tensor& src, Tensor& dst);
// dst (rows, n) of dst_dtype = src (rows, n) float32 [+ bias (n,) float32], rounded once; a null src reads as
// zeros. Device pointers, on the current device (convert.cu).
void round_rows_into(const float* src, const float* bias, int64_t rows, int64_t n, void* dst, DType dst_dtype);

// Loads cuBLASLt at run time (cublaslt.cpp); false, with the reason in *why, when it cannot.
bool load_cublaslt(std::string* why);

// Throws Error (kInternal) naming what failed when err is not cudaSuccess (err is a cudaError_t).
void check_cuda(int err, const char* what);

}  // namespace mixtrain::ops::cuda
