// The mean squared error and its gradient, sum / mean of all elements, a kernel regularizer's penalty and its
// gradient, and the sparse categorical accuracy on the GPU (ops/losses.h's mse, mse_backward, sum_all, penalty and
// accuracy kernels), and ops/global_norm.h's norm. The element and row steps are the CPU's
// (ops/shared/loss_terms.h).
//
// The totals add double terms, as the CPU does, in a fixed order that depends only on the element count: each
// thread of a grid of blocks_for(n) blocks adds its grid-stride elements in index order, each block adds its
// threads' sums in a fixed tree, and one block adds the blocks' sums the same way and rounds once into the float32
// result. So a result never depends on the run; it may differ from the CPU's sequential double sum in the double's
// last places, which reaches the float32 result only at a rounding boundary (one unit). The gradient is elementwise
// and gives the CPU's bits; so does the accuracy, an integer count: one warp per row merges the lanes' arg-max
// states (ties to the first index, NaN as std::max_element treats it) and counts the row with one integer atomic.
// A label outside the classes is not counted; the first such row goes to the device's label-error record, as the
// cross-entropy's does (crossentropy.cu), and is raised as "accuracy: label L at row R ..." at the host's next read
// (at once by sparse_categorical_accuracy, which reads its count).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "../shared/float16_convert.h"
#include "../shared/loss_terms.h"
#include "../device_wait.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/global_norm.h"
#include "mixtrain/ops/losses.h"

namespace mixtrain::ops::cuda {

namespace {

using shared::load_as_float;

// partial[blockIdx.x] = this block's sum of term(i) over its grid-stride share of [0, n).
template <typename Term>
__device__ void block_sum(int64_t n, const Term& term, double* partial) {
  __shared__ double s[device::kThreads];
  double acc = 0.0;
  device::for_each_index(n, [&](int64_t i) { acc = shared::dadd_rn(acc, term(i)); });
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int width = device::kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) s[threadIdx.x] = shared::dadd_rn(s[threadIdx.x], s[threadIdx.x + width]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

__global__ void mse_partial_kernel(const void* p, int p_code, const void* t, int t_code, int64_t n,
                                   double* partial) {
  block_sum(
      n, [&](int64_t i) { return shared::mse_term(load_as_float(p, p_code, i), load_as_float(t, t_code, i)); },
      partial);
}

__global__ void sum_partial_kernel(const void* x, int x_code, int64_t n, double* partial) {
  block_sum(n, [&](int64_t i) { return static_cast<double>(load_as_float(x, x_code, i)); }, partial);
}

__global__ void penalty_partial_kernel(const void* w, int w_code, float l1, float l2, int64_t n, double* partial) {
  block_sum(n, [&](int64_t i) { return shared::penalty_term(load_as_float(w, w_code, i), l1, l2); }, partial);
}

__global__ void squares_partial_kernel(const void* x, int x_code, int64_t n, double* partial) {
  block_sum(
      n,
      [&](int64_t i) {
        const double v = static_cast<double>(load_as_float(x, x_code, i));
        return shared::dmul_rn(v, v);
      },
      partial);
}

// How total_kernel rounds the double total into its float32 result.
enum class Finish { kSum, kMean, kSquareRoot };

// One block: out = the blocks' partial sums added in a fixed tree, as a sum, a mean over n or the square root of
// the sum, rounded once.
__global__ void total_kernel(const double* partial, int blocks, int64_t n, Finish finish, float* out) {
  __shared__ double s[device::kThreads];
  double acc = 0.0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) acc = shared::dadd_rn(acc, partial[i]);
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int width = device::kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) s[threadIdx.x] = shared::dadd_rn(s[threadIdx.x], s[threadIdx.x + width]);
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  *out = finish == Finish::kSquareRoot ? static_cast<float>(__dsqrt_rn(s[0]))
                                       : shared::float_total(s[0], n, finish == Finish::kMean);
}

// dloss is read on the device (see crossentropy.cu's row_grad_kernel).
__global__ void mse_backward_kernel(const void* p, int p_code, const void* t, int t_code, const float* dloss, void* dx,
                                    int dx_code, int64_t n) {
  const float k = shared::mse_grad_scale(*dloss, n);
  device::for_each_index(n, [&](int64_t i) {
    shared::store_from_float(dx, dx_code, i,
                             shared::mse_grad(k, load_as_float(p, p_code, i), load_as_float(t, t_code, i)));
  });
}

// The seed is read on the device, as mse_backward_kernel's dloss.
__global__ void penalty_backward_kernel(const void* w, int w_code, float l1, float l2, const float* seed, float* dw,
                                        int64_t n) {
  const float k = *seed;
  device::for_each_index(n, [&](int64_t i) { dw[i] = shared::penalty_grad(k, load_as_float(w, w_code, i), l1, l2); });
}

// *correct += the rows of scores (rows, n) whose arg-max equals their label (int32, or int64 when labels64);
// *bad_row = the first row whose label lies outside [0, n), if any (record_label_error keeps it).
__global__ void accuracy_kernel(const void* scores, int code, const void* labels, bool labels64, int64_t rows,
                                int64_t n, unsigned long long* correct, unsigned long long* bad_row) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(device::kRowsPerBlock) + threadIdx.x / device::kWarp;
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % device::kWarp;
  const int64_t base = row * n;
  shared::ArgMax a = shared::kNoArgMax;
  for (int64_t j = lane; j < n; j += device::kWarp) a = shared::argmax_take(a, load_as_float(scores, code, base + j), j);
  for (int o = device::kWarp / 2; o > 0; o /= 2) {
    const shared::ArgMax other{__shfl_xor_sync(0xFFFFFFFFu, a.value, o),
                               static_cast<int64_t>(__shfl_xor_sync(0xFFFFFFFFu, static_cast<long long>(a.index), o))};
    a = shared::argmax_merge(a, other);
  }
  if (lane != 0) return;
  const int64_t label =
      labels64 ? static_cast<const int64_t*>(labels)[row] : static_cast<const int32_t*>(labels)[row];
  if (label < 0 || label >= n) {
    atomicMin(bad_row, static_cast<unsigned long long>(row));
    return;
  }
  const int64_t best = shared::argmax_index(a, n > 0 ? load_as_float(scores, code, base) : 0.0f);
  if (best == label) atomicAdd(correct, 1ull);
}

// Scratch words of one accuracy count on the current device: the count (zeroed) and the first bad row (all ones:
// none), from the caching allocator.
struct AccuracyScratch {
  Tensor words;
  unsigned long long* correct;
  unsigned long long* bad_row;
  explicit AccuracyScratch(const Device& device) : words(Tensor::empty({2}, DType::kInt64, device)) {
    correct = static_cast<unsigned long long*>(words.raw());
    bad_row = correct + 1;
    check_cuda(cudaMemsetAsync(correct, 0, sizeof *correct), "cudaMemsetAsync");
    check_cuda(cudaMemsetAsync(bad_row, 0xFF, sizeof *bad_row), "cudaMemsetAsync");
  }
};

// The accuracy kernel over scores (rows, n) into the scratch words, and its label check queued after it.
void launch_accuracy(const Tensor& scores, const Tensor& labels, AccuracyScratch& w, const char* what) {
  const int64_t rows = scores.dim(0), n = scores.dim(1);
  accuracy_kernel<<<device::row_blocks(rows), device::kThreads>>>(scores.raw(), shared::float_code(scores.dtype()),
                                                                  labels.raw(), labels.dtype() == DType::kInt64,
                                                                  rows, n, w.correct, w.bad_row);
  device::launched(what);
  record_label_error(w.bad_row, labels, n, LabelOp::kAccuracy);
}

// The float32 total of term over n elements into out (a float32 scalar on the current device).
template <typename Launch>
void total(int64_t n, bool mean, Tensor& out, const Launch& launch_partials, const char* what) {
  const Device device = out.device();
  const int blocks = device::blocks_for(n);
  // The blocks' double sums (DType has no float64: int64 storage of the same size).
  Tensor partial = Tensor::empty({blocks}, DType::kInt64, device);
  double* partials = static_cast<double*>(partial.raw());
  if (n > 0) {
    launch_partials(blocks, partials);
    device::launched(what);
  } else {
    check_cuda(cudaMemsetAsync(partials, 0, sizeof(double) * static_cast<size_t>(blocks)), "cudaMemsetAsync");
  }
  total_kernel<<<1, device::kThreads>>>(partials, blocks, n, mean ? Finish::kMean : Finish::kSum, out.data<float>());
  device::launched(what);
}

}  // namespace

void mse(const Tensor& pred, const Tensor& target, Tensor& loss) {
  const int64_t n = pred.numel();
  check_cuda(cudaSetDevice(pred.device().index), "cudaSetDevice");
  total(
      n, true, loss,
      [&](int blocks, double* partials) {
        mse_partial_kernel<<<blocks, device::kThreads>>>(pred.raw(), shared::float_code(pred.dtype()), target.raw(),
                                                         shared::float_code(target.dtype()), n, partials);
      },
      "mean_squared_error");
}

void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dx) {
  const int64_t n = pred.numel();
  if (n == 0) return;
  check_cuda(cudaSetDevice(pred.device().index), "cudaSetDevice");
  mse_backward_kernel<<<device::blocks_for(n), device::kThreads>>>(
      pred.raw(), shared::float_code(pred.dtype()), target.raw(), shared::float_code(target.dtype()),
      static_cast<const float*>(dloss.raw()), dx.raw(), shared::float_code(dx.dtype()), n);
  device::launched("mean_squared_error_backward");
}

void penalty(const Tensor& w, float l1, float l2, Tensor& out) {
  const int64_t n = w.numel();
  check_cuda(cudaSetDevice(w.device().index), "cudaSetDevice");
  total(
      n, false, out,
      [&](int blocks, double* partials) {
        penalty_partial_kernel<<<blocks, device::kThreads>>>(w.raw(), shared::float_code(w.dtype()), l1, l2, n,
                                                             partials);
      },
      "regularization_penalty");
}

void penalty_backward(const Tensor& w, float l1, float l2, const Tensor& dpenalty, Tensor& dw) {
  const int64_t n = w.numel();
  if (n == 0) return;
  check_cuda(cudaSetDevice(w.device().index), "cudaSetDevice");
  penalty_backward_kernel<<<device::blocks_for(n), device::kThreads>>>(
      w.raw(), shared::float_code(w.dtype()), l1, l2, static_cast<const float*>(dpenalty.raw()), dw.data<float>(), n);
  device::launched("regularization_penalty_backward");
}

void global_norm(const std::vector<Tensor>& xs, Tensor& out) {
  check_cuda(cudaSetDevice(out.device().index), "cudaSetDevice");
  // Tensors that follow each other in memory with one dtype (an arena's gradients) are summed as one span: a few
  // launches per step, not one per variable.
  struct Span {
    const char* begin;
    int64_t n;
    DType dtype;
  };
  std::vector<Span> spans;
  for (const Tensor& x : xs) {
    if (x.numel() == 0) continue;
    const char* p = static_cast<const char*>(x.raw());
    if (!spans.empty() && spans.back().dtype == x.dtype() &&
        spans.back().begin + spans.back().n * static_cast<int64_t>(dtype_size(x.dtype())) == p) {
      spans.back().n += x.numel();
    } else {
      spans.push_back({p, x.numel(), x.dtype()});
    }
  }
  int blocks = 0;
  for (const Span& s : spans) blocks += device::blocks_for(s.n);
  Tensor partial = Tensor::empty({blocks > 0 ? blocks : 1}, DType::kInt64, out.device());  // doubles
  double* partials = static_cast<double*>(partial.raw());
  if (spans.empty()) {
    check_cuda(cudaMemsetAsync(partials, 0, sizeof(double)), "cudaMemsetAsync");
    blocks = 1;
  }
  int at = 0;
  for (const Span& s : spans) {
    const int b = device::blocks_for(s.n);
    squares_partial_kernel<<<b, device::kThreads>>>(s.begin, shared::float_code(s.dtype), s.n, partials + at);
    device::launched("global_norm");
    at += b;
  }
  total_kernel<<<1, device::kThreads>>>(partials, blocks, 0, Finish::kSquareRoot, out.data<float>());
  device::launched("global_norm (total)");
}

void sum_all(const Tensor& x, bool mean, Tensor& out) {
  // The kernel reads float16, bfloat16 or float32 elements: an integer tensor's would be read as floats (a uint8
  // one past its end). Such a sum is for the CPU, or for a cast first.
  MIXTRAIN_CHECK(is_float(x.dtype()), (mean ? "mean" : "sum")
                                          << " on a GPU: a floating tensor is expected, got " << x.describe()
                                          << "; cast it to float32 first");
  const int64_t n = x.numel();
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  total(
      n, mean, out,
      [&](int blocks, double* partials) {
        sum_partial_kernel<<<blocks, device::kThreads>>>(x.raw(), shared::float_code(x.dtype()), n, partials);
      },
      mean ? "mean" : "sum");
}

namespace {
__global__ void count_to_float_kernel(const unsigned long long* count, float* out) {
  *out = static_cast<float>(*count);
}

// *in_top += the rows of scores (rows, n) with fewer than k scores strictly greater than their label's (the CPU's
// rule: ties count for the label, a NaN label score or a label outside [0, n) does not). A thread per row; the count
// is an integer, so the order of the atomics does not matter.
__global__ void in_top_k_kernel(const void* scores, int code, const void* labels, bool labels64, int64_t rows,
                                int64_t n, int64_t k, unsigned long long* in_top) {
  device::for_each_index(rows, [&](int64_t row) {
    const int64_t label =
        labels64 ? static_cast<const int64_t*>(labels)[row] : static_cast<const int32_t*>(labels)[row];
    if (label < 0 || label >= n) return;
    const int64_t base = row * n;
    const float mine = load_as_float(scores, code, base + label);
    if (mine != mine) return;  // NaN
    int64_t greater = 0;
    for (int64_t j = 0; j < n; ++j) greater += load_as_float(scores, code, base + j) > mine;
    if (greater < k) atomicAdd(in_top, 1ull);
  });
}
}  // namespace

void count_in_top_k(const Tensor& scores, const Tensor& labels, int64_t k, Tensor& count) {
  const Device device = scores.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  AccuracyScratch w(device);
  const int64_t rows = scores.dim(0);
  in_top_k_kernel<<<device::blocks_for(rows), device::kThreads>>>(scores.raw(), shared::float_code(scores.dtype()),
                                                                  labels.raw(), labels.dtype() == DType::kInt64,
                                                                  rows, scores.dim(1), k, w.correct);
  device::launched("count_in_top_k");
  count_to_float_kernel<<<1, 1>>>(w.correct, count.data<float>());
  device::launched("count_in_top_k (to float)");
}

void count_correct(const Tensor& scores, const Tensor& labels, Tensor& count) {
  const Device device = scores.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  // Counted in an integer scratch word as accuracy() does, then written as float32 where the count lives: no read.
  AccuracyScratch w(device);
  if (scores.dim(0) > 0) launch_accuracy(scores, labels, w, "count_correct");
  count_to_float_kernel<<<1, 1>>>(w.correct, count.data<float>());
  device::launched("count_correct (to float)");
}

int64_t accuracy(const Tensor& scores, const Tensor& labels) {
  if (scores.dim(0) == 0) return 0;
  const Device device = scores.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  // The count lands in a scratch word; the op returns it on the host, so this synchronizes, and raises a label
  // error at once.
  AccuracyScratch w(device);
  launch_accuracy(scores, labels, w, "sparse_categorical_accuracy");
  unsigned long long host = 0;
  checked_wait([&] { check_cuda(cudaMemcpy(&host, w.correct, sizeof host, cudaMemcpyDeviceToHost), "cudaMemcpy"); });
  check_label_errors(device.index);
  return static_cast<int64_t>(host);
}

void register_losses_kernels(Kernels& k) {
  k.set<Op::mse>(&mse);
  k.set<Op::mse_backward>(&mse_backward);
  k.set<Op::sum_all>(&sum_all);
  k.set<Op::accuracy>(&accuracy);
  k.set<Op::count_correct>(&count_correct);
  k.set<Op::count_in_top_k>(&count_in_top_k);
  k.set<Op::penalty>(&penalty);
  k.set<Op::penalty_backward>(&penalty_backward);
  k.set<Op::global_norm>(&global_norm);
}

}  // namespace mixtrain::ops::cuda
