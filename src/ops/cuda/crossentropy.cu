// Cross-entropy on the GPU (ops/losses.h's crossentropy kernels): sparse labels or dense targets, from logits or
// from probabilities, forward and backward. One warp per row computes that row's loss term in double; one block
// then sums the rows in a fixed order (deterministic, and in double as the CPU does) and writes the float32 mean.
// The element steps are the CPU's (ops/shared/crossentropy_row.h).
//
// Labels live on the device, where the op's entry cannot read them: the forward kernel finds the first row whose
// label is outside [0, classes), and a one-thread kernel keeps that row, its label and the class count in a small
// record on the device (the first such error since the last check). Nothing is read back then: a training step
// does not wait for the host. The host reads the record the next time it reads anything from that device (a
// download, ops::synchronize: check_label_errors), and raises the CPU's error there, naming the label and row; the
// loss is NaN meanwhile (the row's term), and the backward marks such a row's gradient NaN.
#include <cstddef>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "../shared/crossentropy_row.h"
#include "../shared/float16_convert.h"
#include "../device_wait.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/embedding.h"
#include "mixtrain/ops/losses.h"

namespace mixtrain::ops::cuda {

namespace {

using shared::load_as_float;

// What a row kernel reads: predictions x (rows, n) and either labels (rows,) or dense targets (rows, n).
struct RowArgs {
  const void* x;
  int x_code;
  const void* target;
  int target_code;  // dense targets' dtype code
  bool sparse;
  bool labels64;  // int64 labels (else int32)
  bool from_logits;
  int64_t rows, n;
};

__device__ int64_t label_of(const RowArgs& a, int64_t row) {
  return a.labels64 ? static_cast<const int64_t*>(a.target)[row] : static_cast<const int32_t*>(a.target)[row];
}

__device__ float weight_of(const RowArgs& a, int64_t row, int64_t j, int64_t label) {
  return a.sparse ? (j == label ? 1.0f : 0.0f) : load_as_float(a.target, a.target_code, row * a.n + j);
}

// logsumexp of row `row`, the same value on every lane.
__device__ float row_lse(const RowArgs& a, int64_t row, int lane) {
  const int64_t base = row * a.n;
  float mx = -INFINITY;
  for (int64_t j = lane; j < a.n; j += device::kWarp) mx = shared::max_f32(mx, load_as_float(a.x, a.x_code, base + j));
  mx = device::warp_max(mx);
  float sum = 0.0f;
  for (int64_t j = lane; j < a.n; j += device::kWarp)
    sum = shared::add_rn(sum, shared::softmax_term(load_as_float(a.x, a.x_code, base + j), mx));
  return shared::log_sum_exp(mx, device::warp_sum(sum));
}

__device__ float log_prob(const RowArgs& a, int64_t i, float lse) {
  const float v = load_as_float(a.x, a.x_code, i);
  return a.from_logits ? shared::log_softmax_value(v, lse) : shared::clipped_log_prob(v);
}

__global__ void row_loss_kernel(RowArgs a, double* row_loss, unsigned long long* first_bad_row) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(device::kRowsPerBlock) + threadIdx.x / device::kWarp;
  if (row >= a.rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % device::kWarp;
  const int64_t label = a.sparse ? label_of(a, row) : 0;
  if (a.sparse && (label < 0 || label >= a.n)) {
    if (lane == 0) {
      atomicMin(first_bad_row, static_cast<unsigned long long>(row));
      row_loss[row] = __longlong_as_double(0x7FF8000000000000ll);  // NaN: never a silent number
    }
    return;
  }
  const float lse = a.from_logits ? row_lse(a, row, lane) : 0.0f;
  double term = 0.0;
  if (a.sparse) {
    if (lane == 0) term = shared::crossentropy_term(1.0f, log_prob(a, row * a.n + label, lse));
  } else {
    for (int64_t j = lane; j < a.n; j += device::kWarp) {
      const float w = weight_of(a, row, j, 0);
      if (w != 0.0f) term = __dadd_rn(term, shared::crossentropy_term(w, log_prob(a, row * a.n + j, lse)));
    }
    term = device::warp_sum(term);
  }
  if (lane == 0) row_loss[row] = term;
}

// One block: loss = sum(row_loss) / rows, rounded once to float32.
__global__ void mean_kernel(const double* row_loss, int64_t rows, float* loss) {
  __shared__ double partial[device::kThreads];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) s = __dadd_rn(s, row_loss[i]);
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int width = device::kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width)
      partial[threadIdx.x] = __dadd_rn(partial[threadIdx.x], partial[threadIdx.x + width]);
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = rows ? static_cast<float>(partial[0] / static_cast<double>(rows)) : 0.0f;
}

// dloss is read here, on the device, so that a backward pass seeded on the GPU never waits for the host.
__global__ void row_grad_kernel(RowArgs a, const float* dloss, void* dx, int dx_code) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(device::kRowsPerBlock) + threadIdx.x / device::kWarp;
  if (row >= a.rows) return;
  const float k = shared::crossentropy_grad_scale(*dloss, a.rows);
  const int lane = threadIdx.x % device::kWarp;
  const int64_t base = row * a.n;
  const int64_t label = a.sparse ? label_of(a, row) : 0;
  if (a.sparse && (label < 0 || label >= a.n)) {
    for (int64_t j = lane; j < a.n; j += device::kWarp) shared::store_from_float(dx, dx_code, base + j, NAN);
    return;
  }
  float lse = 0.0f, tsum = 1.0f;  // a label's weights sum to 1
  if (a.from_logits) {
    lse = row_lse(a, row, lane);
    if (!a.sparse) {
      tsum = 0.0f;
      for (int64_t j = lane; j < a.n; j += device::kWarp) tsum = shared::add_rn(tsum, weight_of(a, row, j, 0));
      tsum = device::warp_sum(tsum);
    }
  }
  for (int64_t j = lane; j < a.n; j += device::kWarp) {
    const float w = weight_of(a, row, j, label);
    const float g = a.from_logits ? shared::crossentropy_logits_grad(log_prob(a, base + j, lse), w, tsum, k)
                                  : shared::crossentropy_probs_grad(load_as_float(a.x, a.x_code, base + j), w, k);
    shared::store_from_float(dx, dx_code, base + j, g);
  }
}

RowArgs row_args(const Tensor& x, const Tensor& target, bool sparse, bool from_logits) {
  RowArgs a{};
  a.x = x.raw();
  a.x_code = shared::float_code(x.dtype());
  a.target = target.raw();
  a.target_code = sparse ? 0 : shared::float_code(target.dtype());
  a.sparse = sparse;
  a.labels64 = sparse && target.dtype() == DType::kInt64;
  a.from_logits = from_logits;
  a.rows = x.dim(0);
  a.n = x.dim(1);
  return a;
}

}  // namespace

namespace {

constexpr int kMaxDevices = 64;
// Per device: the record, allocated on the first op that may write it and never freed (static destruction may still
// check).
LabelError* g_label_errors[kMaxDevices] = {};
std::mutex g_label_errors_mutex;

// No finding: cleared in the stream's order, without waiting for it (a collective may be queued before).
void clear_record(LabelError* record) {
  static_assert(sizeof(LabelError::row) == 8 && offsetof(LabelError, row) == 0);
  check_cuda(cudaMemsetAsync(record, 0, sizeof(LabelError)), "cudaMemsetAsync");
  check_cuda(cudaMemsetAsync(record, 0xFF, sizeof(LabelError::row)), "cudaMemsetAsync");  // row kNoFinding
}

}  // namespace

LabelError* label_error_record(int device) {
  MIXTRAIN_CHECK(device >= 0 && device < kMaxDevices, "label check: GPU index " << device << " is out of range");
  std::lock_guard<std::mutex> lock(g_label_errors_mutex);
  if (g_label_errors[device] == nullptr) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, sizeof(LabelError)), "cudaMalloc");
    clear_record(static_cast<LabelError*>(p));
    g_label_errors[device] = static_cast<LabelError*>(p);
  }
  return g_label_errors[device];
}

namespace {

// Keeps this loss's first bad row in the device's record unless an earlier error is still unread.
__global__ void record_label_error_kernel(const unsigned long long* bad_row, const void* labels, bool labels64,
                                          long long classes, int op, LabelError* record) {
  const unsigned long long row = *bad_row;
  if (row == kNoFinding || record->row != kNoFinding) return;
  record->row = row;
  record->label = labels64 ? static_cast<const int64_t*>(labels)[row] : static_cast<const int32_t*>(labels)[row];
  record->classes = classes;
  record->op = op;
}

const char* label_op_name(int op) {
  switch (static_cast<LabelOp>(op)) {
    case LabelOp::kAccuracy: return "accuracy";
    case LabelOp::kEmbedding: return "embedding";
    case LabelOp::kEmbeddingBackward: return "embedding_backward";
    case LabelOp::kFusedUpdateCounter: return "fused_update";
    default: return "crossentropy";
  }
}

}  // namespace

void record_label_error(const unsigned long long* bad_row, const Tensor& labels, int64_t classes, LabelOp op) {
  record_label_error_kernel<<<1, 1>>>(bad_row, labels.raw(), labels.dtype() == DType::kInt64,
                                      static_cast<long long>(classes), static_cast<int>(op),
                                      label_error_record(labels.device().index));
  device::launched("label check");
}

void check_label_errors(int device) {
  LabelError* record = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_label_errors_mutex);
    if (device < 0 || device >= kMaxDevices || g_label_errors[device] == nullptr) return;
    record = g_label_errors[device];
  }
  LabelError seen{};
  checked_wait([&] { check_cuda(cudaMemcpy(&seen, record, sizeof seen, cudaMemcpyDeviceToHost), "cudaMemcpy"); });
  if (seen.row == kNoFinding) return;
  clear_record(record);
  if (seen.op == static_cast<int>(LabelOp::kFusedUpdateCounter))
    MIXTRAIN_FAIL(kInvalidInput,  // the kind the CPU's check raises
                  "fused_update: the counter holds " << seen.label << " iterations, outside the " << seen.classes
                                                     << " rates from " << seen.row,
                  "found on cuda:" + std::to_string(device) +
                      " by an optimizer update computed before this read; that update changed no weight");
  if (seen.op == static_cast<int>(LabelOp::kEmbedding) || seen.op == static_cast<int>(LabelOp::kEmbeddingBackward))
    kernel::fail_id_out_of_range(label_op_name(seen.op), seen.label, static_cast<int64_t>(seen.row), seen.classes,
                                 "found on cuda:" + std::to_string(device) + " by an embedding computed before this read");
  MIXTRAIN_FAIL(kInvalidInput,
                label_op_name(seen.op) << ": label " << seen.label << " at row " << seen.row << " is outside [0, " << seen.classes
                                       << ")",
                "labels index the classes of the last axis; check the dataset's labels and the model's output width "
                "(found on cuda:" + std::to_string(device) + " by a loss computed before this read)");
}

void crossentropy(const Tensor& x, const Tensor& target, bool sparse, bool from_logits, Tensor& loss) {
  const RowArgs a = row_args(x, target, sparse, from_logits);
  MIXTRAIN_CHECK(!(sparse && a.n == 0 && a.rows > 0),
                 "crossentropy: " << a.rows << " labels for predictions with no classes " << x.describe());
  const Device device = x.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  // Scratch from the caching allocator: the rows' double terms (DType has no float64: int64 storage of the same
  // size), and the first bad row.
  Tensor row_loss = Tensor::empty({a.rows > 0 ? a.rows : 1}, DType::kInt64, device);
  Tensor bad = Tensor::empty({1}, DType::kInt64, device);
  unsigned long long* bad_row = static_cast<unsigned long long*>(bad.raw());
  check_cuda(cudaMemsetAsync(bad_row, 0xFF, sizeof(unsigned long long)), "cudaMemsetAsync");
  double* terms = static_cast<double*>(row_loss.raw());
  if (a.rows > 0 && a.n > 0) {
    row_loss_kernel<<<device::row_blocks(a.rows), device::kThreads>>>(a, terms, bad_row);
    device::launched("crossentropy");
  } else if (a.rows > 0) {
    check_cuda(cudaMemsetAsync(terms, 0, static_cast<size_t>(a.rows) * sizeof(double)), "cudaMemsetAsync");
  }
  mean_kernel<<<1, device::kThreads>>>(terms, a.rows, loss.data<float>());
  device::launched("crossentropy mean");
  if (!sparse || a.rows == 0) return;
  record_label_error(bad_row, target, a.n, LabelOp::kCrossentropy);
}

void crossentropy_backward(const Tensor& x, const Tensor& target, bool sparse, bool from_logits,
                           const Tensor& dloss, Tensor& dx) {
  const RowArgs a = row_args(x, target, sparse, from_logits);
  if (a.rows == 0 || a.n == 0) return;
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  row_grad_kernel<<<device::row_blocks(a.rows), device::kThreads>>>(a, static_cast<const float*>(dloss.raw()), dx.raw(),
                                                                     shared::float_code(dx.dtype()));
  device::launched("crossentropy_backward");
}

void register_crossentropy_kernels(Kernels& k) {
  k.set<Op::crossentropy>(&crossentropy);
  k.set<Op::crossentropy_backward>(&crossentropy_backward);
}

}  // namespace mixtrain::ops::cuda
