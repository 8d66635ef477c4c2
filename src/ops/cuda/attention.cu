// Scaled dot-product attention on the GPU (ops/attention.h), forward and backward, with the CPU kernel's plan and
// dtypes (cpu/attention.cpp): its products through the backend's batched GEMM (bmm, matmul.cpp, over cuBLASLt:
// float32 accumulation) and its rows through one warp per row, in float32.
//
// Forward, for all (batch, head) pairs at once:
//   s (B, H, T, S) = scale * q_h k_h^T                     one scaled_bmm over every (batch, head) pair (the float32
//                                                          sum times the scale, then one rounding into s), q and k
//                                                          copied into dense (B, H, L, d) heads first (one call);
//                                                          s in the compute dtype, float32 when the float32 logits
//                                                          are asked for (attention_plan.h)
//   rows: s (the float32 logits, when asked for), rounded into the compute dtype (a no-op on 16-bit scores), the
//         causal selection (masked columns never enter the max or the sum, and get probability 0), softmax with a
//         float32 max and sum (the CPU's polynomial exponential, shared/exp_poly.h, taken again for the store
//         rather than kept: s may be 16-bit), one rounding into probs; dropout on the rounded probabilities, by
//         the CPU's mask (shared/attention_rows.h)
//   o (B, H, T, dv) float32 = p_d v_h, then scattered into out (B, T, H * dv), rounded once.
// Backward:
//   dp (B, H, T, S) float32 = dout_h v_h^T; rows: the mask on dp, ds = p (dp - rowsum(dp p)) scale in float32,
//   rounded once into the compute dtype when that is 16-bit
//   dv = p_d^T dout_h; dq = ds k_h and dk = ds^T q_h, each scattered into its gradient (possibly a column slice of
//   a wider buffer), rounded once.
// Every product takes its operands in the compute dtype, so under a 16-bit policy all five run on the tensor cores
// with float32 accumulation. The score tensor s is 16-bit under a 16-bit policy: the CPU rounds fl32(q k^T) * scale
// once into the compute dtype, and the scale enters the product as its alpha, before the one rounding of its
// output, so the same float32 sum gives the CPU's bits (a plain 16-bit product would round before the scale).
//
// The row maximum is exact and the mask is the CPU's bit for bit; the row sums are combined across lanes in a
// fixed order and cuBLASLt sums each product in its own order, so results are deterministic and differ from the
// CPU's only by float32 rounding before the final rounding, except dq and dk under a 16-bit policy: the CPU
// multiplies the float32 ds (ops/attention.h), the GPU ds rounded to 16 bits, which moves dq_i by at most
// u * sum_j |ds_ij| |k_j| (u the compute dtype's unit roundoff) and dk_j likewise; tests/ops/cuda_attention_test.cpp
// holds them to that bound, computed in float64.
#include <cuda_runtime.h>

#include <cstdint>

#include "../shared/attention_rows.h"
#include "../shared/exp_poly.h"
#include "../shared/float16_convert.h"
#include "attention_plan.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/attention.h"

namespace mixtrain::ops::cuda {

namespace {

using shared::load_as_float;
using shared::store_from_float;

// A (B, L, H * d) tensor whose head h is the (L, d) matrix at column h * d: q, k, v, out and their gradients.
struct Heads {
  void* base;
  int code;
  int64_t batch_stride, row_stride, d;
};

Heads heads_of(const Tensor& t, int64_t h) {
  return Heads{const_cast<void*>(t.raw()), shared::float_code(t.dtype()), t.strides()[0], t.strides()[1],
               t.dim(2) / h};
}

// dst's heads = src (B, H, L, d) float32, rounded once.
__global__ void scatter_heads_kernel(const float* src, int64_t h, int64_t l, Heads dst, int64_t n) {
  device::for_each_index(n, [&](int64_t i) {
    const int64_t c = i % dst.d, r = (i / dst.d) % l, hh = (i / (dst.d * l)) % h, b = i / (dst.d * l * h);
    store_from_float(dst.base, dst.code, b * dst.batch_stride + r * dst.row_stride + hh * dst.d + c, src[i]);
  });
}

// What the row kernels read: rows = B * H * T rows of s columns, row r being row r % T of pair r / T.
struct Rows {
  float* s;  // (rows, s_len) float32: dp, then ds (backward)
  const void* scores;  // (rows, s_len) scaled scores (forward), of scores_code
  int scores_code;
  int64_t rows, t, s_len;
  bool causal;
  float scale;
  int code;        // the compute dtype
  void* probs;     // (rows, s_len) in the compute dtype: written by the forward, read by the backward
  void* dropped;   // (rows, s_len) in the compute dtype, the dropped probabilities; null without dropout
  float* logits;   // the float32 logits, or null (forward only)
  void* ds_out;    // (rows, s_len) in the compute dtype: ds rounded once (backward, 16-bit); null: ds stays in s
  int64_t logits_per_pair;
  uint64_t seed;
  float rate, inv_keep;
};

__device__ int64_t warp_row() {
  return blockIdx.x * static_cast<int64_t>(device::kRowsPerBlock) + threadIdx.x / device::kWarp;
}

// Columns of row i that take part: all, or j <= i + S - T when causal.
__device__ int64_t row_end(const Rows& a, int64_t i) {
  return a.causal ? shared::causal_row_end(i, a.t, a.s_len) : a.s_len;
}

// The dropped row p_d from the rounded probabilities of row `row` (every column: masked ones stay 0).
__device__ void drop_row(const Rows& a, int64_t row, int lane) {
  const int64_t base = row * a.s_len;
  for (int64_t j = lane; j < a.s_len; j += device::kWarp) {
    const bool keep = shared::attention_dropout_keep(a.seed, static_cast<uint64_t>(base + j), a.rate);
    store_from_float(a.dropped, a.code, base + j, shared::dropped(load_as_float(a.probs, a.code, base + j), keep,
                                                                  a.inv_keep));
  }
}

__global__ void forward_rows_kernel(Rows a) {
  const int64_t row = warp_row();
  if (row >= a.rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % device::kWarp;
  const int64_t pair = row / a.t, i = row % a.t, end = row_end(a, i), base = row * a.s_len;
  float* lp = a.logits ? a.logits + pair * a.logits_per_pair + (a.causal ? shared::causal_logits_before(i, a.t, a.s_len) : i * a.s_len) : nullptr;
  // The logit of column j as the CPU's softmax reads it: rounded into the compute dtype (the scores' own bits when
  // they are in it).
  const auto logit = [&](int64_t j) {
    return shared::through_dtype(load_as_float(a.scores, a.scores_code, base + j), a.code);
  };
  float mx = -INFINITY;
  for (int64_t j = lane; j < end; j += device::kWarp) {
    if (lp) lp[j] = load_as_float(a.scores, a.scores_code, base + j);  // float32 scores whenever logits are asked for
    mx = shared::max_f32(mx, logit(j));
  }
  mx = device::warp_max(mx);
  float sum = 0.0f;
  for (int64_t j = lane; j < end; j += device::kWarp)
    sum = shared::add_rn(sum, shared::expf_poly::exp(shared::sub_rn(logit(j), mx)));
  const float inv = shared::div_rn(1.0f, device::warp_sum(sum));
  for (int64_t j = lane; j < a.s_len; j += device::kWarp)
    store_from_float(a.probs, a.code, base + j,
                     j < end ? shared::mul_rn(shared::expf_poly::exp(shared::sub_rn(logit(j), mx)), inv) : 0.0f);
  if (a.dropped) {
    __syncwarp();  // each lane reads back the columns it stored itself, but keep the warp together
    drop_row(a, row, lane);
  }
}

__global__ void backward_rows_kernel(Rows a) {
  const int64_t row = warp_row();
  if (row >= a.rows) return;
  const int lane = threadIdx.x % device::kWarp;
  const int64_t i = row % a.t, end = row_end(a, i), base = row * a.s_len;
  if (a.dropped) drop_row(a, row, lane);
  float* g = a.s + base;
  float dot = 0.0f;
  for (int64_t j = lane; j < end; j += device::kWarp) {
    float d = g[j];
    if (a.dropped)
      d = shared::dropped(d, shared::attention_dropout_keep(a.seed, static_cast<uint64_t>(base + j), a.rate),
                          a.inv_keep);
    g[j] = d;
    dot = shared::add_rn(dot, shared::mul_rn(d, load_as_float(a.probs, a.code, base + j)));
  }
  dot = device::warp_sum(dot);
  for (int64_t j = lane; j < a.s_len; j += device::kWarp) {
    const float d =
        j < end ? shared::attention_score_grad(load_as_float(a.probs, a.code, base + j), g[j], dot, a.scale) : 0.0f;
    if (a.ds_out)
      store_from_float(a.ds_out, a.code, base + j, d);
    else
      g[j] = d;
  }
}

// A GEMM operand per (batch, head) pair: the tensor, its row stride and its steps between batches and heads.
struct Operand {
  const Tensor* t;
  int64_t ld, batch_stride, head_stride;
};

// q, k, v, dout in place: head h at column h * d of each row.
Operand heads_operand(const Tensor& t, int64_t h) {
  const int64_t d = t.dim(2) / h;
  // A single row has no meaningful stride; any ld >= d describes it.
  return Operand{&t, t.dim(1) > 1 ? t.strides()[1] : d, t.strides()[0], d};
}
// A dense (B, H, rows, cols) tensor.
Operand dense_operand(const Tensor& t) {
  const int64_t rows = t.dim(2), cols = t.dim(3);
  return Operand{&t, cols, t.dim(1) * rows * cols, rows * cols};
}

// dst (B, H, L, d), of src's dtype (T: its storage) = src's heads, bit for bit.
template <typename T>
__global__ void copy_heads_kernel(Heads src, int64_t h, int64_t l, T* dst, int64_t n) {
  const T* from = static_cast<const T*>(src.base);
  device::for_each_index(n, [&](int64_t i) {
    const int64_t c = i % src.d, r = (i / src.d) % l, hh = (i / (src.d * l)) % h, b = i / (src.d * l * h);
    dst[i] = from[b * src.batch_stride + r * src.row_stride + hh * src.d + c];
  });
}

// t's heads as a pair_products operand covering every (batch, head) pair in one strided cuBLASLt call. Read in
// place, the heads of a row sit d apart and the batches a whole sequence apart: the two strides do not merge, and
// bmm would make one cuBLASLt call per batch element, small products the GPU finishes faster than the host queues
// them. So with more than one batch element and head, the heads are first copied (one kernel) into a dense
// (B, H, L, d) tensor of t's dtype, kept in holder; the product's values are the same.
Operand batched_heads_operand(const Tensor& t, int64_t h, Tensor& holder) {
  const int64_t b = t.dim(0), l = t.dim(1), d = t.dim(2) / h;
  if (b <= 1 || h <= 1) return heads_operand(t, h);  // one batch dimension left: one call already
  holder = Tensor::empty({b, h, l, d}, t.dtype(), t.device());
  const int64_t n = holder.numel();
  if (n > 0) {
    if (dtype_size(t.dtype()) == 2)
      copy_heads_kernel<uint16_t><<<device::blocks_for(n), device::kThreads>>>(
          heads_of(t, h), h, l, static_cast<uint16_t*>(holder.raw()), n);
    else
      copy_heads_kernel<uint32_t><<<device::blocks_for(n), device::kThreads>>>(
          heads_of(t, h), h, l, static_cast<uint32_t*>(holder.raw()), n);
    device::launched("attention (heads)");
  }
  return dense_operand(holder);
}

// c (B, H, m, n) = alpha op(a) op(b) for every (batch, head) pair, through bmm's kernel (float32 sums, one rounding
// into c's dtype after the scale).
void pair_products(int64_t b, int64_t h, int64_t m, int64_t n, int64_t k, const Operand& a, bool trans_a,
                   const Operand& bo, bool trans_b, Tensor& c, float alpha = 1.0f) {
  const kernel::BmmLayout l{trans_a, trans_b, m, n, k, a.ld, bo.ld, {b, h}, {a.batch_stride, a.head_stride},
                            {bo.batch_stride, bo.head_stride}};
  scaled_bmm(*a.t, *bo.t, Tensor(), l, alpha, c);
}

void scatter_heads(const Tensor& src, int64_t h, int64_t l, Tensor& dst) {
  const int64_t n = src.numel();
  if (n == 0) return;
  scatter_heads_kernel<<<device::blocks_for(n), device::kThreads>>>(src.data<float>(), h, l, heads_of(dst, h), n);
  device::launched("attention (scatter)");
}

Rows rows_of(const AttentionOptions& o, int64_t b, int64_t t, int64_t s, DType dt) {
  Rows a{};
  a.rows = b * o.num_heads * t;
  a.t = t;
  a.s_len = s;
  a.causal = o.causal;
  a.scale = o.scale;
  a.code = shared::float_code(dt);
  a.logits_per_pair = o.causal ? shared::causal_logits_before(t, t, s) : t * s;
  a.seed = o.dropout_seed;
  a.rate = o.dropout_rate;
  a.inv_keep = 1.0f / (1.0f - o.dropout_rate);  // the CPU kernel's float32 factor
  return a;
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options, Tensor& out,
               Tensor& probs, Tensor& logits) {
  const int64_t b = q.dim(0), t = q.dim(1), s = k.dim(1), h = options.num_heads;
  const int64_t dk = q.dim(2) / h, dv = v.dim(2) / h;
  const DType dt = q.dtype();
  const Device device = q.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  const bool dropout = options.dropout_rate > 0.0f;

  Tensor scores = Tensor::empty({b, h, t, s}, attention_score_dtype(dt, logits.defined()), device);
  Tensor q_heads, k_heads, v_heads;  // dense copies, where batched_heads_operand makes them
  pair_products(b, h, t, s, dk, batched_heads_operand(q, h, q_heads), false, batched_heads_operand(k, h, k_heads), true,
                scores, options.scale);

  Tensor p = probs.defined() ? probs : Tensor::empty({b, h, t, s}, dt, device);
  Tensor pd = dropout ? Tensor::empty({b, h, t, s}, dt, device) : Tensor();
  Rows a = rows_of(options, b, t, s, dt);
  a.scores = scores.raw();
  a.scores_code = shared::float_code(scores.dtype());
  a.probs = p.raw();
  a.dropped = dropout ? pd.raw() : nullptr;
  a.logits = logits.defined() ? logits.data<float>() : nullptr;
  if (a.rows > 0) {
    forward_rows_kernel<<<device::row_blocks(a.rows), device::kThreads>>>(a);
    device::launched("scaled_dot_product_attention");
  }

  Tensor o = Tensor::empty({b, h, t, dv}, DType::kFloat32, device);
  pair_products(b, h, t, dv, s, dense_operand(dropout ? pd : p), false, batched_heads_operand(v, h, v_heads), false, o);
  scatter_heads(o, h, t, out);
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                        const AttentionOptions& options, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t b = q.dim(0), t = q.dim(1), s = k.dim(1), h = options.num_heads;
  const int64_t dkh = q.dim(2) / h, dvh = v.dim(2) / h;
  const DType dt = q.dtype();
  const Device device = q.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  const bool dropout = options.dropout_rate > 0.0f;

  // dp (B, H, T, S) = dout_h v_h^T, then ds in place.
  Tensor ds = Tensor::empty({b, h, t, s}, DType::kFloat32, device);
  Tensor dout_heads, v_heads, k_heads, q_heads;  // dense copies, where batched_heads_operand makes them
  const Operand douto = batched_heads_operand(dout, h, dout_heads);
  pair_products(b, h, t, s, dvh, douto, false, batched_heads_operand(v, h, v_heads), true, ds);
  Tensor pd = dropout ? Tensor::empty({b, h, t, s}, dt, device) : Tensor();
  // ds in the compute dtype: the operand of the dq and dk products on the tensor cores.
  Tensor ds16 = dt != DType::kFloat32 ? Tensor::empty({b, h, t, s}, dt, device) : Tensor();
  Rows a = rows_of(options, b, t, s, dt);
  a.s = ds.data<float>();
  a.probs = const_cast<void*>(probs.raw());
  a.dropped = dropout ? pd.raw() : nullptr;
  a.ds_out = ds16.defined() ? ds16.raw() : nullptr;
  if (a.rows > 0) {
    backward_rows_kernel<<<device::row_blocks(a.rows), device::kThreads>>>(a);
    device::launched("scaled_dot_product_attention_backward");
  }

  // dv_h (S, dv) = p_d^T dout_h, with the rounded p_d the forward multiplied.
  Tensor dv32 = Tensor::empty({b, h, s, dvh}, DType::kFloat32, device);
  pair_products(b, h, s, dvh, t, dense_operand(dropout ? pd : probs), true, douto, false, dv32);
  scatter_heads(dv32, h, s, dv);

  // dq_h = ds k_h and dk_h = ds^T q_h with every operand in the compute dtype (ds rounded once above, k and q as
  // they are, copied dense when there is more than one batch element and head), accumulated in float32.
  const Operand kf = batched_heads_operand(k, h, k_heads);
  const Operand qf = batched_heads_operand(q, h, q_heads);
  const Operand dso = dense_operand(ds16.defined() ? ds16 : ds);
  Tensor dq32 = Tensor::empty({b, h, t, dkh}, DType::kFloat32, device);
  pair_products(b, h, t, dkh, s, dso, false, kf, false, dq32);
  scatter_heads(dq32, h, t, dq);
  Tensor dk32 = Tensor::empty({b, h, s, dkh}, DType::kFloat32, device);
  pair_products(b, h, s, dkh, t, dso, true, qf, false, dk32);
  scatter_heads(dk32, h, s, dk);
}

void register_attention_kernels(Kernels& k) {
  k.set<Op::attention>(&attention);
  k.set<Op::attention_backward>(&attention_backward);
}

}  // namespace mixtrain::ops::cuda
