// CPU kernels of scaled dot-product attention (ops/attention.h gives the computation and its dtypes).
// One (batch, head) pair at a time: its products run through kernels::gemm on the packed layout in place
// (head h of q is the (T, dk) matrix at column h * dk with row stride H * dk); its rows (scale, rounding,
// causal selection, softmax, dropout) are float32 loops over a per-pair float32 scratch.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <vector>

#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/attention.h"

namespace mixtrain::ops::cpu {

namespace {

// Row elements of one pair below which its row loop runs on the calling thread alone.
constexpr int64_t kParallelRowsMin = int64_t{1} << 14;

struct Geometry {
  int64_t b, t, s, h, dk, dv;
  DType dt;
  size_t es;  // bytes per element of dt
  bool causal;
  float scale, rate, inv_keep;
  uint64_t seed;

  int64_t pairs() const { return b * h; }
  // Columns of row i that take part: all, or j <= i when causal.
  int64_t row_end(int64_t i) const { return causal ? i + 1 : s; }
  // Head h of batch b in a packed (B, L, H * width) tensor: byte offset of its first element.
  size_t head_offset(int64_t pair, int64_t len, int64_t width) const {
    const int64_t bi = pair / h, hi = pair % h;
    return static_cast<size_t>(bi * len * h * width + hi * width) * es;
  }
};

Geometry geometry(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  Geometry g{};
  g.b = q.dim(0);
  g.t = q.dim(1);
  g.s = k.dim(1);
  g.h = o.num_heads;
  g.dk = q.dim(2) / g.h;
  g.dv = v.dim(2) / g.h;
  g.dt = q.dtype();
  g.es = dtype_size(g.dt);
  g.causal = o.causal;
  g.scale = o.scale;
  g.rate = o.dropout_rate;
  g.inv_keep = 1.0f / (1.0f - o.dropout_rate);
  g.seed = o.dropout_seed;
  return g;
}

// Multiply-adds of a whole call below which it runs on the calling thread alone: waking a thread team
// costs more than such a call.
constexpr int64_t kParallelWorkMin = int64_t{1} << 17;

// Runs fn(pair, inner_parallel) for every pair: across threads when there are at least as many pairs as
// threads (fn then runs single-threaded), else one after another with fn free to use the threads. An
// exception (gemm refuses only arguments the entry has checked) must not leave an OpenMP region, so the
// first one is carried out and rethrown.
template <typename Fn>
void for_each_pair(const Geometry& g, const Fn& fn) {
  const int64_t pairs = g.pairs();
  if (pairs * g.t * g.s * (g.dk + g.dv) < kParallelWorkMin) {
    for (int64_t p = 0; p < pairs; ++p) fn(p, false);
    return;
  }
  const bool across = pairs > 1 && pairs >= omp_get_max_threads();
  if (!across) {
    for (int64_t p = 0; p < pairs; ++p) fn(p, true);
    return;
  }
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t p = 0; p < pairs; ++p) {
    try {
      fn(p, false);
    } catch (...) {
#pragma omp critical(mixtrain_attention_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// p_d row (16-bit or float32, at dst) = p row (at src, same dtype) * keep / (1 - rate), rounded once;
// `buf` holds s floats. `first` is the flat index of the row's element 0 in the (B, H, T, S) tensor.
void dropped_row(const Geometry& g, const char* src, char* dst, uint64_t first, float* buf) {
  convert_elements(src, g.dt, buf, DType::kFloat32, g.s);
  for (int64_t j = 0; j < g.s; ++j)
    buf[j] = attention_dropout_keep(g.seed, first + static_cast<uint64_t>(j), g.rate) ? buf[j] * g.inv_keep : 0.0f;
  convert_elements(buf, DType::kFloat32, dst, g.dt, g.s);
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options, Tensor& out,
               Tensor& probs, Tensor& logits) {
  const Geometry g = geometry(q, k, v, options);
  const int64_t ts = g.t * g.s;
  const int64_t logits_per_pair = g.causal ? g.t * (g.t + 1) / 2 : ts;
  const bool dropout = g.rate > 0.0f;
  const char* qp = static_cast<const char*>(q.raw());
  const char* kp = static_cast<const char*>(k.raw());
  const char* vp = static_cast<const char*>(v.raw());
  char* op = static_cast<char*>(out.raw());
  char* pp = probs.defined() ? static_cast<char*>(probs.raw()) : nullptr;
  float* lp = logits.defined() ? static_cast<float*>(logits.raw()) : nullptr;

  for_each_pair(g, [&](int64_t pair, bool inner) {
    // (T, S) float32 logits, then probabilities, of this pair.
    std::vector<float> s32(static_cast<size_t>(ts));
    // The 16-bit probabilities when they are not kept, and the dropped ones when dropout is on.
    std::vector<char> p_own(pp ? 0 : static_cast<size_t>(ts) * g.es), pd(dropout ? static_cast<size_t>(ts) * g.es : 0);
    char* p16 = pp ? pp + static_cast<size_t>(pair * ts) * g.es : p_own.data();
    const int64_t ldk = g.h * g.dk, ldv = g.h * g.dv;

    // s (T, S) = q_h (T, dk) x k_h^T (dk, S), float32 accumulation and result.
    kernels::gemm(false, true, g.t, g.s, g.dk, g.dt, qp + g.head_offset(pair, g.t, g.dk), ldk,
                  kp + g.head_offset(pair, g.s, g.dk), ldk, DType::kFloat32, s32.data(), g.s, false, nullptr);

#pragma omp parallel if (inner && ts > kParallelRowsMin)
    {
      std::vector<float> buf(dropout ? static_cast<size_t>(g.s) : 0);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < g.t; ++i) {
        float* row = s32.data() + i * g.s;
        char* prow = p16 + static_cast<size_t>(i * g.s) * g.es;
        const int64_t end = g.row_end(i);
        for (int64_t j = 0; j < end; ++j) row[j] *= g.scale;
        if (lp) {
          float* dst = lp + pair * logits_per_pair + (g.causal ? i * (i + 1) / 2 : i * g.s);
          std::copy(row, row + end, dst);
        }
        if (g.dt != DType::kFloat32) {
          // The logits as a 16-bit GEMM output holds them (prow serves as the 16-bit scratch).
          convert_elements(row, DType::kFloat32, prow, g.dt, end);
          convert_elements(prow, g.dt, row, DType::kFloat32, end);
        }
        // Softmax over the selected columns only: masked ones never enter the max or the sum.
        float mx = -INFINITY;
        for (int64_t j = 0; j < end; ++j) mx = std::max(mx, row[j]);
        float sum = 0.0f;
        for (int64_t j = 0; j < end; ++j) sum += (row[j] = std::exp(row[j] - mx));
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < end; ++j) row[j] *= inv;
        std::fill(row + end, row + g.s, 0.0f);
        convert_elements(row, DType::kFloat32, prow, g.dt, g.s);
        if (dropout)
          dropped_row(g, prow, pd.data() + static_cast<size_t>(i * g.s) * g.es,
                      static_cast<uint64_t>((pair * g.t + i) * g.s), buf.data());
      }
    }
    // o_h (T, dv) = p_d (T, S) x v_h (S, dv), rounded once into the output.
    kernels::gemm(false, false, g.t, g.dv, g.s, g.dt, dropout ? pd.data() : p16, g.s,
                  vp + g.head_offset(pair, g.s, g.dv), ldv, g.dt, op + g.head_offset(pair, g.t, g.dv), ldv, false,
                  nullptr);
  });
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                        const AttentionOptions& options, Tensor& dq, Tensor& dk, Tensor& dv) {
  const Geometry g = geometry(q, k, v, options);
  const int64_t ts = g.t * g.s;
  const bool dropout = g.rate > 0.0f;
  const bool widen = g.dt != DType::kFloat32;
  const char* qp = static_cast<const char*>(q.raw());
  const char* kp = static_cast<const char*>(k.raw());
  const char* vp = static_cast<const char*>(v.raw());
  const char* dop = static_cast<const char*>(dout.raw());
  const char* pp = static_cast<const char*>(probs.raw());
  char* dqp = static_cast<char*>(dq.raw());
  char* dkp = static_cast<char*>(dk.raw());
  char* dvp = static_cast<char*>(dv.raw());

  for_each_pair(g, [&](int64_t pair, bool inner) {
    std::vector<float> ds(static_cast<size_t>(ts));  // dp_d, then ds, in place
    std::vector<char> pd(dropout ? static_cast<size_t>(ts) * g.es : 0);
    const char* p16 = pp + static_cast<size_t>(pair * ts) * g.es;
    const int64_t ldk = g.h * g.dk, ldv = g.h * g.dv;
    const char* q_h = qp + g.head_offset(pair, g.t, g.dk);
    const char* k_h = kp + g.head_offset(pair, g.s, g.dk);
    const char* do_h = dop + g.head_offset(pair, g.t, g.dv);

    // dp_d (T, S) = dout_h (T, dv) x v_h^T (dv, S), float32.
    kernels::gemm(false, true, g.t, g.s, g.dv, g.dt, do_h, ldv, vp + g.head_offset(pair, g.s, g.dv), ldv,
                  DType::kFloat32, ds.data(), g.s, false, nullptr);

#pragma omp parallel if (inner && ts > kParallelRowsMin)
    {
      std::vector<float> prow(static_cast<size_t>(g.s));
#pragma omp for schedule(static)
      for (int64_t i = 0; i < g.t; ++i) {
        const uint64_t first = static_cast<uint64_t>((pair * g.t + i) * g.s);
        const char* src = p16 + static_cast<size_t>(i * g.s) * g.es;
        if (dropout) dropped_row(g, src, pd.data() + static_cast<size_t>(i * g.s) * g.es, first, prow.data());
        convert_elements(src, g.dt, prow.data(), DType::kFloat32, g.s);
        float* row = ds.data() + i * g.s;
        const int64_t end = g.row_end(i);
        if (dropout)
          for (int64_t j = 0; j < end; ++j)
            row[j] = attention_dropout_keep(g.seed, first + static_cast<uint64_t>(j), g.rate) ? row[j] * g.inv_keep
                                                                                               : 0.0f;
        float dot = 0.0f;
        for (int64_t j = 0; j < end; ++j) dot += row[j] * prow[static_cast<size_t>(j)];
        for (int64_t j = 0; j < end; ++j) row[j] = prow[static_cast<size_t>(j)] * (row[j] - dot) * g.scale;
        std::fill(row + end, row + g.s, 0.0f);
      }
    }
    // dv_h (S, dv) = p_d^T (S, T) x dout_h (T, dv), with the 16-bit p_d the forward multiplied.
    kernels::gemm(true, false, g.s, g.dv, g.t, g.dt, dropout ? pd.data() : p16, g.s, do_h, ldv, g.dt,
                  dvp + g.head_offset(pair, g.s, g.dv), ldv, false, nullptr);

    // dq_h = ds k_h and dk_h = ds^T q_h as float32 products: ds is never rounded to 16 bits.
    std::vector<float> k32(widen ? static_cast<size_t>(g.s * g.dk) : 0), q32(widen ? static_cast<size_t>(g.t * g.dk) : 0);
    const void* kf = k_h;
    const void* qf = q_h;
    int64_t ldkf = ldk, ldqf = ldk;
    if (widen) {
      for (int64_t r = 0; r < g.s; ++r)
        convert_elements(k_h + static_cast<size_t>(r * ldk) * g.es, g.dt, k32.data() + r * g.dk, DType::kFloat32, g.dk);
      for (int64_t r = 0; r < g.t; ++r)
        convert_elements(q_h + static_cast<size_t>(r * ldk) * g.es, g.dt, q32.data() + r * g.dk, DType::kFloat32, g.dk);
      kf = k32.data();
      qf = q32.data();
      ldkf = ldqf = g.dk;
    }
    kernels::gemm(false, false, g.t, g.dk, g.s, DType::kFloat32, ds.data(), g.s, kf, ldkf, g.dt,
                  dqp + g.head_offset(pair, g.t, g.dk), ldk, false, nullptr);
    kernels::gemm(true, false, g.s, g.dk, g.t, DType::kFloat32, ds.data(), g.s, qf, ldqf, g.dt,
                  dkp + g.head_offset(pair, g.s, g.dk), ldk, false, nullptr);
  });
}

}  // namespace mixtrain::ops::cpu
