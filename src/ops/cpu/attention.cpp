// CPU kernels of scaled dot-product attention (ops/attention.h gives the computation and its dtypes).
// One (batch, head) pair at a time: its products run through kernels::gemm on the packed layout in place
// (head h of q is the (T, dk) matrix at column h * dk, its row stride q's; q, k, v and their gradients may
// be column slices of a wider buffer); its rows (scale, rounding, causal selection, softmax, dropout) are
// float32 loops over a per-pair float32 scratch, written so that they vectorize.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/attention.h"
#include "attention_heads.h"
#include "attention_lanes.h"
#include "../shared/attention_rows.h"
#include "float_lanes.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {

using namespace attention_heads;
using namespace attention_lanes;

// Row elements of one pair below which its row loop runs on the calling thread alone.
constexpr int64_t kParallelRowsMin = int64_t{1} << 14;
// Multiply-adds of a whole call below which it runs on the calling thread alone: waking a thread team
// costs more than such a call.
constexpr int64_t kParallelWorkMin = int64_t{1} << 17;
// Query rows a forward pass takes at once when the probabilities are not kept (see attention()).
constexpr int64_t kQueryRowsUnkept = 128;

// Softmax of x[0, n) in place, float32, n >= 1: the maximum and the sum are taken over kLanes interleaved
// partial results combined in a fixed order.
MIXTRAIN_CPU_BODY void softmax_row_body(float* x, int64_t n) {
  Lanes m, v;
  load_lanes(x, std::min<int64_t>(n, kLanes), -INFINITY, m);
  for (int64_t j = kLanes; j < n; j += kLanes) {
    load_lanes(x + j, std::min<int64_t>(n - j, kLanes), -INFINITY, v);
    m = v > m ? v : m;
  }
  // A NaN logit is skipped by the comparisons but reaches the sum below through its exponential.
  float mx = m[0];
  for (int l = 1; l < kLanes; ++l) mx = m[l] > mx ? m[l] : mx;
  Lanes s{}, e;
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t k = std::min<int64_t>(n - j, kLanes);
    load_lanes(x + j, k, -INFINITY, v);  // padding: e^-inf = 0 adds nothing
    exp_lanes(v - mx, e);
    store_lanes(e, k, x + j);
    s += e;
  }
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += s[l];
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) x[j] *= inv;
}
MIXTRAIN_CPU_VARIANTS(softmax_row)

// The softmax gradient of one row in place: g[j] <- p[j] * (g[j] - sum_l g[l] p[l]) * scale over [0, n).
MIXTRAIN_CPU_BODY void softmax_backward_row_body(float* g, const float* p, int64_t n, float scale) {
  float s[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) s[l] += g[j + l] * p[j + l];
  float dot = 0.0f;
  for (int l = 0; l < kLanes; ++l) dot += s[l];
  for (; j < n; ++j) dot += g[j] * p[j];
  for (j = 0; j < n; ++j) g[j] = p[j] * (g[j] - dot) * scale;
}
MIXTRAIN_CPU_VARIANTS(softmax_backward_row)

MIXTRAIN_CPU_BODY void scale_row_body(float* x, int64_t n, float s) {
  for (int64_t j = 0; j < n; ++j) x[j] *= s;
}
MIXTRAIN_CPU_VARIANTS(scale_row)

// Per-pair scratch, left uninitialised: every element is written before it is read.
template <typename T>
class Scratch {
 public:
  explicit Scratch(int64_t n) : p_(n > 0 ? new T[static_cast<size_t>(n)] : nullptr) {}
  T* data() { return p_.get(); }

 private:
  std::unique_ptr<T[]> p_;
};

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
  const Heads qh(q, g.h), kh(k, g.h), vh(v, g.h), oh(out, g.h);
  const int64_t ts = g.t * g.s;
  const int64_t logits_per_pair = g.causal ? shared::causal_logits_before(g.t, g.t, g.s) : ts;
  const bool dropout = g.rate > 0.0f;
  char* pp = probs.defined() ? static_cast<char*>(probs.raw()) : nullptr;
  float* lp = logits.defined() ? static_cast<float*>(logits.raw()) : nullptr;

  // Query rows a pass: all of them when the probabilities are kept (they are the (T, S) output), else blocks of
  // kQueryRowsUnkept, so an evaluation or a generation step holds (rows, S) scratch per running pair, linear in the
  // context, not (T, S). Each row's logits, softmax and output are the same arithmetic either way (a GEMM's element
  // does not depend on how many rows it is computed with), so the bits do not change.
  const int64_t block_rows = pp ? g.t : std::min(g.t, kQueryRowsUnkept);
  for_each_pair(g, [&](int64_t pair, bool inner) {
    const int64_t bs = block_rows * g.s;
    // (rows, S) float32 logits, then probabilities, of this pair's block of rows.
    Scratch<float> s32(bs);
    // The 16-bit probabilities when they are not kept, and the dropped ones when dropout is on.
    Scratch<char> p_own(pp ? 0 : bs * static_cast<int64_t>(g.es)), pd(dropout ? bs * static_cast<int64_t>(g.es) : 0);
    for (int64_t i0 = 0; i0 < g.t; i0 += block_rows) {
      const int64_t rows = std::min(block_rows, g.t - i0);
      char* p16 = pp ? pp + static_cast<size_t>(pair * ts) * g.es : p_own.data();
      const char* q_rows = qh.at(pair) + static_cast<size_t>(i0 * qh.row_stride) * qh.es;

      // s (rows, S) = q_h (rows, dk) x k_h^T (dk, S), float32 accumulation and result.
      kernels::gemm(false, true, rows, g.s, g.dk, g.dt, q_rows, qh.row_stride, kh.at(pair), kh.row_stride,
                    DType::kFloat32, s32.data(), g.s, false, nullptr);

#pragma omp parallel if (inner && rows * g.s > kParallelRowsMin)
      {
        std::vector<float> buf(dropout ? static_cast<size_t>(g.s) : 0);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;  // the row in the pair's (T, S)
          float* row = s32.data() + r * g.s;
          char* prow = p16 + static_cast<size_t>(r * g.s) * g.es;
          const int64_t end = g.row_end(i);
          scale_row(row, end, g.scale);
          if (lp) {
            float* dst = lp + pair * logits_per_pair + (g.causal ? shared::causal_logits_before(i, g.t, g.s) : i * g.s);
            std::copy(row, row + end, dst);
          }
          if (g.dt != DType::kFloat32) {
            // The logits as a 16-bit GEMM output holds them (prow serves as the 16-bit scratch).
            convert_elements(row, DType::kFloat32, prow, g.dt, end);
            convert_elements(prow, g.dt, row, DType::kFloat32, end);
          }
          // Softmax over the selected columns only: masked ones never enter the max or the sum.
          softmax_row(row, end);
          std::fill(row + end, row + g.s, 0.0f);
          convert_elements(row, DType::kFloat32, prow, g.dt, g.s);
          if (dropout)
            dropped_row(g, prow, pd.data() + static_cast<size_t>(r * g.s) * g.es,
                        static_cast<uint64_t>((pair * g.t + i) * g.s), buf.data());
        }
      }
      // o_h (rows, dv) = p_d (rows, S) x v_h (S, dv), rounded once into the output.
      kernels::gemm(false, false, rows, g.dv, g.s, g.dt, dropout ? pd.data() : p16, g.s, vh.at(pair), vh.row_stride,
                    g.dt, oh.at(pair) + static_cast<size_t>(i0 * oh.row_stride) * oh.es, oh.row_stride, false,
                    nullptr);
    }
  });
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                        const AttentionOptions& options, Tensor& dq, Tensor& dk, Tensor& dv) {
  const Geometry g = geometry(q, k, v, options);
  const Heads qh(q, g.h), kh(k, g.h), vh(v, g.h), doh(dout, g.h), dqh(dq, g.h), dkh(dk, g.h), dvh(dv, g.h);
  const int64_t ts = g.t * g.s;
  const bool dropout = g.rate > 0.0f;
  const bool widen = g.dt != DType::kFloat32;
  const char* pp = static_cast<const char*>(probs.raw());

  for_each_pair(g, [&](int64_t pair, bool inner) {
    Scratch<float> ds(ts);  // dp_d, then ds, in place
    Scratch<char> pd(dropout ? ts * static_cast<int64_t>(g.es) : 0);
    const char* p16 = pp + static_cast<size_t>(pair * ts) * g.es;

    // dp_d (T, S) = dout_h (T, dv) x v_h^T (dv, S), float32.
    kernels::gemm(false, true, g.t, g.s, g.dv, g.dt, doh.at(pair), doh.row_stride, vh.at(pair), vh.row_stride,
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
        softmax_backward_row(row, prow.data(), end, g.scale);
        std::fill(row + end, row + g.s, 0.0f);
      }
    }
    // dv_h (S, dv) = p_d^T (S, T) x dout_h (T, dv), with the 16-bit p_d the forward multiplied.
    kernels::gemm(true, false, g.s, g.dv, g.t, g.dt, dropout ? pd.data() : p16, g.s, doh.at(pair), doh.row_stride,
                  g.dt, dvh.at(pair), dvh.row_stride, false, nullptr);

    // dq_h = ds k_h and dk_h = ds^T q_h as float32 products: ds is never rounded to 16 bits.
    Scratch<float> k32(widen ? g.s * g.dk : 0), q32(widen ? g.t * g.dk : 0);
    const void* kf = kh.at(pair);
    const void* qf = qh.at(pair);
    int64_t ldkf = kh.row_stride, ldqf = qh.row_stride;
    if (widen) {
      widen_head(kh.at(pair), g.s, g.dk, kh.row_stride, g.dt, k32.data());
      widen_head(qh.at(pair), g.t, g.dk, qh.row_stride, g.dt, q32.data());
      kf = k32.data();
      qf = q32.data();
      ldkf = ldqf = g.dk;
    }
    kernels::gemm(false, false, g.t, g.dk, g.s, DType::kFloat32, ds.data(), g.s, kf, ldkf, g.dt, dqh.at(pair),
                  dqh.row_stride, false, nullptr);
    kernels::gemm(true, false, g.s, g.dk, g.t, DType::kFloat32, ds.data(), g.s, qf, ldqf, g.dt, dkh.at(pair),
                  dkh.row_stride, false, nullptr);
  });
}

void register_attention_kernels(Kernels& k) {
  k.set<Op::attention>(&attention);
  k.set<Op::attention_backward>(&attention_backward);
}

}  // namespace mixtrain::ops::cpu
