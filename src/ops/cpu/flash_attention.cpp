// CPU kernels of the tiled attention (ops/flash_attention.h gives the computation and its dtypes). Tile products run
// through kernels::gemm on the packed layout in place (head h of q is the (T, dk) matrix at column h * dk, its row
// stride q's), each single-threaded inside the parallel loop over tiles; the row steps (scale, rounding, causal
// selection, online softmax, dropout, the score gradient) are float32 loops on lane vectors over one tile.
#include "flash_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>

#include "mixtrain/kernels/gemm.h"
#include "../shared/attention_rows.h"
#include "attention_heads.h"
#include "attention_lanes.h"
#include "cpu_backend.h"
#include "float_lanes.h"

namespace mixtrain::ops::cpu {

namespace {

using namespace attention_heads;
using namespace attention_lanes;

constexpr int64_t kRows = kFlashRows, kCols = kFlashColumns;
// Multiply-adds of a whole call below which it runs on the calling thread alone.
constexpr int64_t kParallelWorkMin = int64_t{1} << 17;

// Runs fn(task, scratch) for tasks [0, n), across threads when the call is large enough, each thread with its own
// Scratch. A task's result depends on its inputs alone, so the split does not change a bit. An exception must not
// leave an OpenMP region: the first is carried out and rethrown.
template <typename Scratch, typename Make, typename Fn>
void run_tasks(int64_t n, bool parallel, const Make& make, const Fn& fn) {
  std::exception_ptr error;
#pragma omp parallel if (parallel && n > 1)
  {
    Scratch w = make();
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < n; ++task) {
      try {
        fn(task, w);
      } catch (...) {
#pragma omp critical(mixtrain_flash_attention_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

// Vectors of kWide floats for the AVX-512 variant of the backward's element-wise row loop (no sum runs across its
// lanes, so its width changes no bit); bfloat16 bit patterns as wide as each vector.
constexpr int kWide = 16;
using WideLanes = float __attribute__((vector_size(kWide * sizeof(float))));
using WideBits = uint32_t __attribute__((vector_size(kWide * sizeof(float))));
using HalfBits = uint16_t __attribute__((vector_size(kLanes * sizeof(uint16_t))));
using WideHalfBits = uint16_t __attribute__((vector_size(kWide * sizeof(uint16_t))));

template <typename V>
constexpr int64_t kWidth = static_cast<int64_t>(sizeof(V) / sizeof(float));

// x[0, n) (n <= V's width) into v, the missing lanes set to fill; and back.
template <typename V>
inline void load_vector(const float* x, int64_t n, float fill, V& v) {
  if (n == kWidth<V>) {
    std::memcpy(&v, x, sizeof v);
    return;
  }
  v = V{} + fill;
  for (int64_t l = 0; l < n; ++l) v[l] = x[l];
}
template <typename V>
inline void store_vector(const V& v, int64_t n, float* x) {
  if (n == kWidth<V>)
    std::memcpy(x, &v, sizeof v);
  else
    for (int64_t l = 0; l < n; ++l) x[l] = v[l];
}

// v rounded to bfloat16 and back, in the lanes: round to nearest even, NaN kept quiet, as convert_elements does. u
// gets the rounded value's bits (its upper 16 are the bfloat16).
template <typename V, typename B>
inline void round_bf16_vector(V& v, B& u) {
  std::memcpy(&u, &v, sizeof u);
  const auto nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  u = nan ? (u | 0x00400000u) & 0xFFFF0000u : (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&v, &u, sizeof v);
}

// x[0, n) * scale, then rounded into dt as a 16-bit GEMM output would hold the logits: bfloat16 in the lanes,
// float16 through convert_elements with tmp (n elements).
MIXTRAIN_CPU_BODY void logits_lanes(float* x, int64_t n, float scale, DType dt, char* tmp) {
  if (dt == DType::kBFloat16) {
    Lanes v;
    LaneBits u;
    for (int64_t j = 0; j < n; j += kLanes) {
      const int64_t k = std::min<int64_t>(n - j, kLanes);
      load_lanes(x + j, k, 0.0f, v);
      v *= scale;
      round_bf16_vector(v, u);
      store_lanes(v, k, x + j);
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) x[j] *= scale;
  if (dt == DType::kFloat16) {
    convert_elements(x, DType::kFloat32, tmp, dt, n);
    convert_elements(tmp, dt, x, DType::kFloat32, n);
  }
}

// Columns [0, ends[r]) of each row of a (rows, cols) tile (row stride cols) that its row attends to.
void tile_ends(const Geometry& g, int64_t i0, int64_t rows, int64_t j0, int64_t cols, int64_t* ends) {
  for (int64_t r = 0; r < rows; ++r) ends[r] = g.tile_end(i0 + r, j0, cols);
}

// kWidth<V> lanes of e added into sum kLanes at a time, in the order kLanes-wide chunks of the row would be: the
// row's exponentials may run as wide as the registers while its sum keeps the bits of kLanes partial sums.
template <typename V>
inline void add_in_chunks(const V& e, Lanes& sum) {
  Lanes chunk;
  for (int64_t h = 0; h < kWidth<V>; h += kLanes) {
    std::memcpy(&chunk, reinterpret_cast<const float*>(&e) + h, sizeof chunk);
    sum += chunk;
  }
}

// One key tile of the online softmax over the rows of a query tile: each row's logits s[0, end) (scaled and rounded
// here) become p = e^(s - m_new), [end, cols) zero; the running maximum m and sum l move on; alpha[r] = e^(m_old -
// m_new), the factor for the row's accumulator (1 for a row with no column here). A NaN logit is skipped by the
// maximum but reaches the sum, so it poisons its row as in attention.h's softmax. V (B its bits): the exponentials'
// vector, as wide as the variant's registers; lanes past end are e^-inf = 0 and add nothing to the kLanes sums.
template <typename V, typename B>
MIXTRAIN_CPU_BODY void online_tile_body(float* s, const int64_t* ends, int64_t rows, int64_t cols, float scale, DType dt,
                                        char* tmp, float* m, float* l, float* alpha) {
  constexpr int64_t w = kWidth<V>;
  for (int64_t r = 0; r < rows; ++r) {
    float* x = s + r * cols;
    const int64_t end = ends[r];
    alpha[r] = 1.0f;
    std::fill(x + end, x + cols, 0.0f);
    if (end == 0) continue;
    logits_lanes(x, end, scale, dt, tmp);
    Lanes mx, v;
    load_lanes(x, std::min<int64_t>(end, kLanes), -INFINITY, mx);
    for (int64_t j = kLanes; j < end; j += kLanes) {
      load_lanes(x + j, std::min<int64_t>(end - j, kLanes), -INFINITY, v);
      mx = v > mx ? v : mx;
    }
    float tile_max = mx[0];
    for (int i = 1; i < kLanes; ++i) tile_max = mx[i] > tile_max ? mx[i] : tile_max;
    const float m_new = tile_max > m[r] ? tile_max : m[r];
    alpha[r] = std::exp(m[r] - m_new);
    Lanes sum{};
    V x_wide, e;
    for (int64_t j = 0; j < end; j += w) {
      const int64_t k = std::min<int64_t>(end - j, w);
      load_vector(x + j, k, -INFINITY, x_wide);  // padding: e^-inf = 0 adds nothing
      expf_poly::exp<V, B>(x_wide - m_new, e);
      store_vector(e, k, x + j);
      add_in_chunks(e, sum);
    }
    float total = 0.0f;
    for (int i = 0; i < kLanes; ++i) total += sum[i];
    l[r] = l[r] * alpha[r] + total;
    m[r] = m_new;
  }
}
template <class... Args>
void online_tile_baseline(Args&&... args) {
  online_tile_body<Lanes, LaneBits>(std::forward<Args>(args)...);
}
template <class... Args>
__attribute__((target("avx2"))) void online_tile_avx2(Args&&... args) {
  online_tile_body<Lanes, LaneBits>(std::forward<Args>(args)...);
}
template <class... Args>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void online_tile_avx512(Args&&... args) {
  online_tile_body<WideLanes, WideBits>(std::forward<Args>(args)...);
}
template <class... Args>
void online_tile(Args&&... args) {
  ::mixtrain::for_isa_level(&online_tile_baseline<Args...>, &online_tile_avx2<Args...>,
                            &online_tile_avx512<Args...>)(std::forward<Args>(args)...);
}

// Backward's rows of one block: p = e^(s - lse) from the logits s (scaled and rounded here) over [0, end), zero
// beyond; ds = p (dp - D) * scale from dp (already dropped) in place, zero beyond. lse and d are the rows' own. p goes
// over s, or, given pd (bfloat16 without dropout), rounded straight into pd, the product's operand: one pass over the
// row, the float32 p never stored. bfloat16 logits are scaled and rounded in the same pass. V: the float vector (B its
// bits, H as many bfloat16), as wide as the variant's registers.
template <typename V, typename B, typename H>
MIXTRAIN_CPU_BODY void score_grads_tile_body(float* p, float* dp, const int64_t* ends, int64_t rows, int64_t cols,
                                             float scale, DType dt, char* tmp, const float* lse, const float* d,
                                             uint16_t* pd) {
  constexpr int64_t w = kWidth<V>;
  const bool bf16 = dt == DType::kBFloat16;
  for (int64_t r = 0; r < rows; ++r) {
    float* x = p + r * cols;
    float* g = dp + r * cols;
    uint16_t* out = pd ? pd + r * cols : nullptr;
    const int64_t end = ends[r];
    if (!bf16) logits_lanes(x, end, scale, dt, tmp);
    V v, e, dv;
    B u;
    for (int64_t j = 0; j < end; j += w) {
      const int64_t k = std::min<int64_t>(end - j, w);
      load_vector(x + j, k, -INFINITY, v);
      if (bf16) {  // logits_lanes' steps, lane by lane
        v *= scale;
        round_bf16_vector(v, u);
      }
      expf_poly::exp<V, B>(v - lse[r], e);
      if (out) {
        v = e;
        round_bf16_vector(v, u);
        const H h = __builtin_convertvector(u >> 16, H);
        if (k == w)
          std::memcpy(out + j, &h, sizeof h);
        else
          for (int64_t l = 0; l < k; ++l) out[j + l] = h[l];
      } else {
        store_vector(e, k, x + j);
      }
      load_vector(g + j, k, 0.0f, dv);
      dv = e * (dv - d[r]) * scale;  // shared::attention_score_grad's order
      store_vector(dv, k, g + j);
    }
    if (out)
      std::fill(out + end, out + cols, uint16_t{0});
    else
      std::fill(x + end, x + cols, 0.0f);
    std::fill(g + end, g + cols, 0.0f);
  }
}
template <class... Args>
void score_grads_tile_baseline(Args&&... args) {
  score_grads_tile_body<Lanes, LaneBits, HalfBits>(std::forward<Args>(args)...);
}
template <class... Args>
__attribute__((target("avx2"))) void score_grads_tile_avx2(Args&&... args) {
  score_grads_tile_body<Lanes, LaneBits, HalfBits>(std::forward<Args>(args)...);
}
template <class... Args>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void score_grads_tile_avx512(Args&&... args) {
  score_grads_tile_body<WideLanes, WideBits, WideHalfBits>(std::forward<Args>(args)...);
}
template <class... Args>
void score_grads_tile(Args&&... args) {
  ::mixtrain::for_isa_level(&score_grads_tile_baseline<Args...>, &score_grads_tile_avx2<Args...>,
                            &score_grads_tile_avx512<Args...>)(std::forward<Args>(args)...);
}

// p * keep / (1 - rate) over [0, end) of row i at key column j0 (in place): dropout on probabilities or their
// gradients.
void drop_row(const Geometry& g, int64_t pair, int64_t i, int64_t j0, float* x, int64_t end) {
  for (int64_t j = 0; j < end; ++j)
    x[j] = shared::dropped(x[j], shared::attention_dropout_keep(g.seed, g.index(pair, i, j0 + j), g.rate), g.inv_keep);
}

// rows x width float32 (dense) rounded once into dst rows of dtype dt at row stride ld.
void store_rows(const float* src, int64_t rows, int64_t width, DType dt, char* dst, int64_t ld) {
  narrow_head(src, rows, width, dt, dst, ld);
}

// A scratch array left uninitialised (every element is written before it is read), sized once per thread and call.
template <typename T>
class Buffer {
 public:
  explicit Buffer(size_t n) : p_(n > 0 ? new T[n] : nullptr), n_(n) {}
  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  void fill(T v) { std::fill_n(p_.get(), n_, v); }

 private:
  std::unique_ptr<T[]> p_;
  size_t n_;
};

// ---- forward ----

struct ForwardScratch {
  Buffer<float> s, acc, m, l;  // (kRows, kCols) logits then p; (kRows, dv) output; (kRows) running max, sum
  Buffer<char> p;              // (kRows, kCols) p in the compute dtype (16-bit), or the logits' rounding
};

struct Forward {
  Geometry g;
  Heads qh, kh, vh, oh;
  float* lse;
};

// The online-softmax steps of one key tile over the rows of a query tile (s holds their float32 q k^T), then p (dropped)
// into the product's operand: in place for float32, else rounded into w.p.
void forward_rows(const Forward& f, int64_t pair, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                  ForwardScratch& w) {
  const Geometry& g = f.g;
  int64_t ends[kRows];
  float alpha[kRows];
  tile_ends(g, i0, rows, j0, cols, ends);
  online_tile(w.s.data(), ends, rows, cols, g.scale, g.dt, w.p.data(), w.m.data(), w.l.data(), alpha);
  for (int64_t r = 0; r < rows; ++r) {
    if (alpha[r] != 1.0f)
      for (int64_t e = 0; e < g.dv; ++e) w.acc[static_cast<size_t>(r * g.dv + e)] *= alpha[r];
    if (g.rate > 0.0f) drop_row(g, pair, i0 + r, j0, w.s.data() + r * cols, ends[r]);
  }
  if (g.dt != DType::kFloat32) convert_elements(w.s.data(), DType::kFloat32, w.p.data(), g.dt, rows * cols);
}

// One (pair, query tile): key tiles in order up to the last column a row of the tile attends to.
void forward_tile(const Forward& f, int64_t pair, int64_t i0, ForwardScratch& w) {
  const Geometry& g = f.g;
  const int64_t rows = std::min(kRows, g.t - i0);
  const int64_t key_end = g.causal ? shared::causal_row_end(i0 + rows - 1, g.t, g.s) : g.s;
  w.m.fill(-INFINITY);
  w.l.fill(0.0f);
  w.acc.fill(0.0f);
  const char* q = f.qh.at(pair) + static_cast<size_t>(i0 * f.qh.row_stride) * g.es;
  for (int64_t j0 = 0; j0 < key_end; j0 += kCols) {
    const int64_t cols = std::min(kCols, key_end - j0);
    const char* k = f.kh.at(pair) + static_cast<size_t>(j0 * f.kh.row_stride) * g.es;
    const char* v = f.vh.at(pair) + static_cast<size_t>(j0 * f.vh.row_stride) * g.es;
    // s (rows, cols) = q_tile (rows, dk) x k_tile^T (dk, cols), float32.
    kernels::gemm(false, true, rows, cols, g.dk, g.dt, q, f.qh.row_stride, k, f.kh.row_stride, DType::kFloat32,
                  w.s.data(), cols, false, nullptr);
    forward_rows(f, pair, i0, rows, j0, cols, w);
    // acc (rows, dv) += p (rows, cols) x v_tile (cols, dv), in the compute dtype with float32 sums.
    const void* p = g.dt == DType::kFloat32 ? static_cast<const void*>(w.s.data()) : w.p.data();
    kernels::gemm(false, false, rows, g.dv, cols, g.dt, p, cols, v, f.vh.row_stride, DType::kFloat32, w.acc.data(),
                  g.dv, true, nullptr);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float l = w.l[static_cast<size_t>(r)], inv = 1.0f / l;
    for (int64_t e = 0; e < g.dv; ++e) w.acc[static_cast<size_t>(r * g.dv + e)] *= inv;
    f.lse[pair * g.t + i0 + r] = w.m[static_cast<size_t>(r)] + std::log(l);
  }
  store_rows(w.acc.data(), rows, g.dv, g.dt, f.oh.at(pair) + static_cast<size_t>(i0 * f.oh.row_stride) * g.es,
             f.oh.row_stride);
}

// ---- backward ----

struct Backward {
  Geometry g;
  Heads qh, kh, vh, doh, oh, dqh, dkh, dvh;
  const float* lse;
};

struct BackwardScratch {
  Buffer<float> s, dp;          // (kRows, kCols): p, and dp then ds
  Buffer<char> pd;              // (kRows, kCols) p_d in the compute dtype; the logits' rounding first
  Buffer<float> dk, dv;         // (kCols, dk), (kCols, dv) float32 sums of one key tile
  Buffer<float> d, dq, q, k;    // (T) rowsum(dout * out); (T, dk) dq sums; q, k widened (16-bit only)
  Buffer<float> row_a, row_b;   // (kRows, dv) rows of dout and of out as float32
};

// D[i] = rowsum(dout_i * out_i) in float32, for every row of the pair (widened kRows rows at a time).
void row_dots(const Backward& f, int64_t pair, BackwardScratch& w) {
  const Geometry& g = f.g;
  for (int64_t i0 = 0; i0 < g.t; i0 += kRows) {
    const int64_t rows = std::min(kRows, g.t - i0);
    widen_head(f.doh.at(pair) + static_cast<size_t>(i0 * f.doh.row_stride) * g.es, rows, g.dv, f.doh.row_stride, g.dt,
               w.row_a.data());
    widen_head(f.oh.at(pair) + static_cast<size_t>(i0 * f.oh.row_stride) * g.es, rows, g.dv, f.oh.row_stride, g.dt,
               w.row_b.data());
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = w.row_a.data() + r * g.dv;
      const float* b = w.row_b.data() + r * g.dv;
      float acc[kLanes] = {};
      int64_t e = 0;
      for (; e + kLanes <= g.dv; e += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += a[e + l] * b[e + l];
      float dot = 0.0f;
      for (int l = 0; l < kLanes; ++l) dot += acc[l];
      for (; e < g.dv; ++e) dot += a[e] * b[e];
      w.d[static_cast<size_t>(i0 + r)] = dot;
    }
  }
}

// The rows of one (query tile, key tile) block: s -> p, dp -> ds, then p_d (as forward multiplied it) into pd (in s
// for float32).
void backward_rows(const Backward& f, int64_t pair, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                   BackwardScratch& w) {
  const Geometry& g = f.g;
  int64_t ends[kRows];
  tile_ends(g, i0, rows, j0, cols, ends);
  const bool dropout = g.rate > 0.0f;
  if (dropout)
    for (int64_t r = 0; r < rows; ++r) drop_row(g, pair, i0 + r, j0, w.dp.data() + r * cols, ends[r]);
  // bfloat16 without dropout: p_d is p, rounded into pd as it is computed.
  uint16_t* direct = g.dt == DType::kBFloat16 && !dropout ? reinterpret_cast<uint16_t*>(w.pd.data()) : nullptr;
  score_grads_tile(w.s.data(), w.dp.data(), ends, rows, cols, g.scale, g.dt, w.pd.data(), f.lse + pair * g.t + i0,
                   w.d.data() + i0, direct);
  if (dropout)
    for (int64_t r = 0; r < rows; ++r) drop_row(g, pair, i0 + r, j0, w.s.data() + r * cols, ends[r]);
  if (!direct && g.dt != DType::kFloat32) convert_elements(w.s.data(), DType::kFloat32, w.pd.data(), g.dt, rows * cols);
}

// One key tile of a pair against every query tile that sees it: dk, dv of the tile, and the tile's share of dq.
void backward_key_tile(const Backward& f, int64_t pair, int64_t j0, const float* q32, int64_t ldq, const float* k32,
                       int64_t ldk, BackwardScratch& w) {
  const Geometry& g = f.g;
  const int64_t cols = std::min(kCols, g.s - j0);
  w.dk.fill(0.0f);
  w.dv.fill(0.0f);
  // The first query row that attends to column j0: row_end(i) > j0.
  const int64_t first = g.causal ? std::max<int64_t>(0, j0 - (g.s - g.t)) : 0;
  const char* k = f.kh.at(pair) + static_cast<size_t>(j0 * f.kh.row_stride) * g.es;
  const char* v = f.vh.at(pair) + static_cast<size_t>(j0 * f.vh.row_stride) * g.es;
  for (int64_t i0 = first / kRows * kRows; i0 < g.t; i0 += kRows) {
    const int64_t rows = std::min(kRows, g.t - i0);
    const char* q = f.qh.at(pair) + static_cast<size_t>(i0 * f.qh.row_stride) * g.es;
    const char* dout = f.doh.at(pair) + static_cast<size_t>(i0 * f.doh.row_stride) * g.es;
    kernels::gemm(false, true, rows, cols, g.dk, g.dt, q, f.qh.row_stride, k, f.kh.row_stride, DType::kFloat32,
                  w.s.data(), cols, false, nullptr);
    // dp_d (rows, cols) = dout_tile (rows, dv) x v_tile^T (dv, cols).
    kernels::gemm(false, true, rows, cols, g.dv, g.dt, dout, f.doh.row_stride, v, f.vh.row_stride, DType::kFloat32,
                  w.dp.data(), cols, false, nullptr);
    backward_rows(f, pair, i0, rows, j0, cols, w);
    // dv_tile += p_d^T dout_tile; dq_rows += ds k_tile; dk_tile += ds^T q_rows (ds float32, never rounded).
    const void* pd = g.dt == DType::kFloat32 ? static_cast<const void*>(w.s.data()) : w.pd.data();
    kernels::gemm(true, false, cols, g.dv, rows, g.dt, pd, cols, dout, f.doh.row_stride, DType::kFloat32, w.dv.data(),
                  g.dv, true, nullptr);
    kernels::gemm(false, false, rows, g.dk, cols, DType::kFloat32, w.dp.data(), cols, k32 + j0 * ldk, ldk,
                  DType::kFloat32, w.dq.data() + i0 * g.dk, g.dk, true, nullptr);
    kernels::gemm(true, false, cols, g.dk, rows, DType::kFloat32, w.dp.data(), cols, q32 + i0 * ldq, ldq,
                  DType::kFloat32, w.dk.data(), g.dk, true, nullptr);
  }
  store_rows(w.dk.data(), cols, g.dk, g.dt, f.dkh.at(pair) + static_cast<size_t>(j0 * f.dkh.row_stride) * g.es,
             f.dkh.row_stride);
  store_rows(w.dv.data(), cols, g.dv, g.dt, f.dvh.at(pair) + static_cast<size_t>(j0 * f.dvh.row_stride) * g.es,
             f.dvh.row_stride);
}

void backward_pair(const Backward& f, int64_t pair, BackwardScratch& w) {
  const Geometry& g = f.g;
  row_dots(f, pair, w);
  w.dq.fill(0.0f);
  // q and k as float32 operands of the ds products: in place for float32, else widened once per pair.
  const float* q32 = reinterpret_cast<const float*>(f.qh.at(pair));
  const float* k32 = reinterpret_cast<const float*>(f.kh.at(pair));
  int64_t ldq = f.qh.row_stride, ldk = f.kh.row_stride;
  if (g.dt != DType::kFloat32) {
    widen_head(f.qh.at(pair), g.t, g.dk, f.qh.row_stride, g.dt, w.q.data());
    widen_head(f.kh.at(pair), g.s, g.dk, f.kh.row_stride, g.dt, w.k.data());
    q32 = w.q.data();
    k32 = w.k.data();
    ldq = ldk = g.dk;
  }
  for (int64_t j0 = 0; j0 < g.s; j0 += kCols) backward_key_tile(f, pair, j0, q32, ldq, k32, ldk, w);
  store_rows(w.dq.data(), g.t, g.dk, g.dt, f.dqh.at(pair), f.dqh.row_stride);
}

size_t sz(int64_t n) { return static_cast<size_t>(n); }

}  // namespace

void flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options, Tensor& out,
                     Tensor& lse) {
  const Geometry g = geometry(q, k, v, options);
  const Forward f{g, Heads(q, g.h), Heads(k, g.h), Heads(v, g.h), Heads(out, g.h), static_cast<float*>(lse.raw())};
  const int64_t tiles = (g.t + kRows - 1) / kRows;
  const bool parallel = g.pairs() * g.t * g.s * (g.dk + g.dv) >= kParallelWorkMin;
  run_tasks<ForwardScratch>(
      g.pairs() * tiles, parallel,
      [&] {
        return ForwardScratch{Buffer<float>(sz(kRows * kCols)), Buffer<float>(sz(kRows * g.dv)),
                              Buffer<float>(sz(kRows)), Buffer<float>(sz(kRows)),
                              Buffer<char>(sz(kRows * kCols) * g.es)};
      },
      [&](int64_t task, ForwardScratch& w) { forward_tile(f, task / tiles, task % tiles * kRows, w); });
}

void flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const AttentionOptions& options, Tensor& dq, Tensor& dk, Tensor& dv) {
  const Geometry g = geometry(q, k, v, options);
  const Backward f{g,
                   Heads(q, g.h),
                   Heads(k, g.h),
                   Heads(v, g.h),
                   Heads(dout, g.h),
                   Heads(out, g.h),
                   Heads(dq, g.h),
                   Heads(dk, g.h),
                   Heads(dv, g.h),
                   static_cast<const float*>(lse.raw())};
  const bool parallel = g.pairs() * g.t * g.s * (g.dk + g.dv) >= kParallelWorkMin;
  const bool widen = g.dt != DType::kFloat32;
  run_tasks<BackwardScratch>(
      g.pairs(), parallel,
      [&] {
        const size_t tile = sz(kRows * kCols);
        return BackwardScratch{Buffer<float>(tile),           Buffer<float>(tile),
                               Buffer<char>(tile * g.es),     Buffer<float>(sz(kCols * g.dk)),
                               Buffer<float>(sz(kCols * g.dv)), Buffer<float>(sz(g.t)),
                               Buffer<float>(sz(g.t * g.dk)), Buffer<float>(widen ? sz(g.t * g.dk) : 0),
                               Buffer<float>(widen ? sz(g.s * g.dk) : 0), Buffer<float>(sz(kRows * g.dv)),
                               Buffer<float>(sz(kRows * g.dv))};
      },
      [&](int64_t pair, BackwardScratch& w) { backward_pair(f, pair, w); });
}

void register_flash_attention_kernels(Kernels& k) {
  k.set<Op::flash_attention>(&flash_attention);
  k.set<Op::flash_attention_backward>(&flash_attention_backward);
}

}  // namespace mixtrain::ops::cpu
