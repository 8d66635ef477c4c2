// GEMM driver: argument checks, choice of instruction-set path, Goto/BLIS cache blocking and threads.
// The per-ISA code (packing, micro-kernel) is behind cpu::GemmBackend.
//
// Each thread owns a rectangle of C and runs, for each column block jc (nc wide) and k block pc (kc deep):
//   pack op(B)[pc.., jc..] into (kc, nr) panels (the block lives in L3),
//   pack about mc rows of op(A)[.., pc..] into (kc, mr) panels (they live in L2),
//   and run the micro-kernel on every (mr, nr) tile, one B panel staying in cache across the rows.
// Each C element is the sum over k blocks in order, each block summed p = 0..kc-1 in float32 (one k at
// a time, or one pair at a time on the bfloat16 dot path), so the result is the same whatever the number
// of threads or the split of rows and columns among them.
#include "mixtrain/kernels/gemm.h"

#include <omp.h>
#include <xmmintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_backend.h"
#include "kernels/gemm_internal.h"
#include "mixtrain/core/environment.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/isa_level.h"
#include "mixtrain/kernels/cpu_features.h"

namespace mixtrain::kernels {
namespace {

using cpu::Epilogue;
using cpu::GemmBackend;
using cpu::PackSource;

// ---- path selection ----

enum Level : int { kLevelScalar = 0, kLevelAvx2 = 1, kLevelAvx512 = 2 };

const GemmBackend* const kBackends[] = {&cpu::kScalarBackend, &cpu::kAvx2Backend, &cpu::kAvx512Backend};

int best_level() {
  static const int level = [] {
    const CpuFeatures& f = cpu_features();
    if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c) return kLevelAvx512;
    if (f.avx2 && f.fma && f.f16c) return kLevelAvx2;
    return kLevelScalar;
  }();
  return level;
}

// The level every run-time-dispatched routine shares (core/isa_level.h: MIXTRAIN_ISA, the test override),
// capped by what the GEMM kernels need on top (best_level() also asks for FMA and F16C with AVX-512), and picked
// as every instruction-set choice is (pick_for_isa).
const GemmBackend& active_backend() {
  const auto level = static_cast<IsaLevel>(std::min(static_cast<int>(isa_level()), best_level()));
  return *pick_for_isa(level, kBackends[kLevelScalar], kBackends[kLevelAvx2], kBackends[kLevelAvx512]);
}

// ---- buffers ----

// Grows, never shrinks: GEMMs in a training loop repeat their shapes, and fresh pages cost a fault each.
struct AlignedBuffer {
  float* data = nullptr;
  size_t capacity = 0;  // floats
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data); }
  // nullptr when out of memory (callers inside a parallel region must not throw).
  float* get(size_t floats) {
    if (floats > capacity) {
      std::free(data);
      capacity = (floats + 15) / 16 * 16;  // aligned_alloc wants a multiple of the alignment
      data = static_cast<float*>(std::aligned_alloc(64, capacity * sizeof(float)));
      if (data == nullptr) capacity = 0;
    }
    return data;
  }
};

thread_local AlignedBuffer t_a_panels;  // (mc / mr) panels of (kc, mr), or a slab's whole packed A (keep_a)
thread_local AlignedBuffer t_b_panels;  // (nc / nr) panels of (kc, nr)
thread_local AlignedBuffer t_partial;   // (slab rows, nc) float32 partial sums when C is 16-bit
// Held by the thread that calls gemm: two packed B blocks the threads of its team share (SharedB).
thread_local AlignedBuffer t_shared_b_panels;

// Largest float32 scratch per thread for partial sums of a 16-bit C; wide C is then done in narrower
// column blocks.
constexpr int64_t kPartialFloats = int64_t{2} << 20;  // 8 MiB
// Below this many multiply-adds a second thread costs more to wake than it saves.
constexpr int64_t kMinParallelMacs = int64_t{64} * 64 * 64;
// Largest packed A a thread keeps across column blocks (run_slab's keep_a).
constexpr int64_t kKeptPackedABytes = int64_t{4} << 20;
// Packing one element (load, widen, store) costs about as much as this many multiply-adds.
constexpr int64_t kPackCostInMacs = 8;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Problem {
  bool trans_a, trans_b;
  int64_t m, n, k;
  DType ab_dtype;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  DType c_dtype;
  void* c;
  int64_t ldc;
  bool accumulate;
  const float* bias;
  GemmPostOp post;  // post.fn null: none
  float alpha = 1.0f;  // C = alpha op(A) op(B) + bias (scaled_gemm; never with accumulate)
};

void* c_at(const Problem& p, int64_t i, int64_t j) {
  return static_cast<char*>(p.c) + (i * p.ldc + j) * static_cast<int64_t>(dtype_size(p.c_dtype));
}

// k = 0: no products, C = [C] + [bias], rounded like any other result.
void gemm_no_products(const Problem& p) {
  constexpr int kChunk = 256;
  const float zeros[kChunk] = {};
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; j += kChunk) {
      Epilogue ep{};
      ep.add = p.accumulate ? c_at(p, i, j) : nullptr;
      ep.add_dtype = p.c_dtype;
      ep.ld_add = p.ldc;
      ep.out = c_at(p, i, j);
      ep.out_dtype = p.c_dtype;
      ep.ld_out = p.ldc;
      ep.bias = p.bias ? p.bias + j : nullptr;
      ep.alpha = p.alpha;
      cpu::scalar_epilogue(zeros, kChunk, 1, static_cast<int>(std::min<int64_t>(kChunk, p.n - j)), ep);
    }
    if (p.post.fn) p.post.fn(p.post.ctx, c_at(p, i, 0), p.ldc, i, 0, 1, p.n);  // the row just written
  }
}

// The rectangle of C one thread computes, start inclusive, end exclusive.
struct Slab {
  int64_t i0, i1, j0, j1;
};

// Threads split C into a tm x tn grid of slabs, each computed from start to finish by one thread with
// its own packed copies of A and B: no thread ever waits for another until the end. Picks the grid
// whose busiest thread has the least work, counting its packing (a row split packs all of B in every
// thread, a column split all of A); ties go to splitting rows.
void split_among_threads(int threads, int64_t m, int64_t n, const GemmBackend& be, int* tm, int* tn) {
  const int64_t row_panels = ceil_div(m, be.mr), col_panels = ceil_div(n, be.nr);
  int64_t best = -1;
  for (int rows = threads; rows >= 1; --rows) {
    if (threads % rows != 0) continue;
    const int cols = threads / rows;
    const int64_t slab_m = ceil_div(row_panels, rows) * be.mr, slab_n = ceil_div(col_panels, cols) * be.nr;
    const int64_t cost = slab_m * slab_n + kPackCostInMacs * (slab_m * ceil_div(slab_n, be.nc) + slab_n);
    if (best < 0 || cost < best) {
      best = cost;
      *tm = rows;
      *tn = cols;
    }
  }
}

// An AMX product whose column slabs, one per thread, are this wide (at least the first, at most the second) and
// whose A packed whole fits kKeptPackedABytes, and that has no more rows than columns, is split by columns, each
// slab one column block: see columns_alone.
constexpr int64_t kLoneSlabMinColumns = 256, kLoneSlabMaxColumns = 512;

// Whether the threads take column slabs of C, each packing all of A and its own B in one block, rather than the
// split_among_threads choice. Where that choice splits rows, the threads share every packed B block, which costs a
// barrier per block and brings half of each block from the other core's cache; measured on two AMX cores
// (Sapphire Rapids class), n = 1024 ran 2,250 GFLOP/s that way and 2,500-2,600 by columns alone, n = 512 and 768
// the same either way, while taller products (4096 x 784 x 256, A transposed, 25% slower) and wider slabs (n = 1536
// and 2048, where A is packed again for every column block) ran slower by columns.
// Only the AMX backends (the ones with a column kernel) were measured; the others keep the general choice.
bool columns_alone(const GemmBackend& be, int threads, int64_t m, int64_t n, int64_t k) {
  if (be.column_kernel == nullptr || threads < 2 || m > n) return false;
  const int64_t slab_n = ceil_div(ceil_div(n, be.nr), threads) * be.nr;
  const int64_t packed_a_bytes = m * k * 2 * be.k_copies;
  return slab_n >= kLoneSlabMinColumns && slab_n <= kLoneSlabMaxColumns && packed_a_bytes <= kKeptPackedABytes;
}

// A C of this many bytes or more is written, on its last k block, with non-temporal stores where a path can
// (Epilogue::stream_out): it is larger than a core's L2 and its share of the last-level cache, so it leaves the
// caches before its reader comes, and ordinary stores would read every line in before overwriting it. Measured on
// an AMX core, weight gradients (m, 4096) with k = 256: 4 MiB 1.12x, 8 MiB 1.18x, 64 MiB 2.3x faster streamed.
constexpr int64_t kStreamOutBytes = int64_t{4} << 20;

// Not with a post-op, which reads each block of C right after it is written.
bool streams_c(const Problem& p) {
  return p.post.fn == nullptr && p.m * p.n * static_cast<int64_t>(dtype_size(p.c_dtype)) >= kStreamOutBytes;
}

// Depth of the k blocks: at most the backend's kc, and all equal, so a k just past kc does not leave a
// thin last block that pays a full pass over C for a few products. Depends on k only, never on threads.
int64_t k_block(const GemmBackend& be, int64_t k) { return ceil_div(k, ceil_div(k, be.kc)); }

// Depth in 32-bit slots of a packed panel kc deep: k_per_slot values a slot, padded to k_align, k_copies times.
int64_t packed_slots(const GemmBackend& be, int64_t kc) {
  const int64_t align = std::max<int64_t>(be.k_per_slot, be.k_align);
  return be.k_copies * (ceil_div(kc, align) * align / be.k_per_slot);
}

std::atomic<bool> g_column_kernel{true};  // off only in tests (set_gemm_column_kernel_for_testing)

// Threads that split the rows of one column range need the same packed B blocks. Rather than each packing every
// block whole (with two threads on an AMX core that packing was about a quarter of the time), the team packs each
// block once: thread `part` of `parts` packs its share of the column panels into the shared buffer, a barrier,
// then every thread reads the whole block. Two buffers alternate, so one barrier per block suffices: a thread
// packing block s + 1 overwrites the buffer of block s - 1, which every thread finished before the barrier of
// block s. The packed bytes are the same, so C's bits are too.
struct SharedB {
  float* buffers[2];
  int part, parts;
  int64_t step = 0;  // blocks packed so far, the same count on every thread of the team
};

// Where the tiles of one k block of one column block of a slab add their products: what their epilogues need.
struct BlockTarget {
  int64_t i0, jc, nc;  // the slab's first row, the column block's first column, the partial sums' row stride
  float* partial;      // a 16-bit C's float32 partial sums (rows of the slab, ld nc); null: C itself holds the sum
  bool first, last;    // the first k block adds the old C (when accumulating), the last the bias, and writes C
  bool stream_c;       // the last k block writes C with non-temporal stores (streams_c)
};

// The epilogue of the tile at (i, j): the sum so far comes from the old C (first k block) or the partial sums, and
// the new one goes to the partial sums or, on the last k block, to C. Inlined: it runs for every tile.
[[gnu::always_inline]] inline void set_tile_epilogue(Epilogue& ep, const Problem& p, const BlockTarget& t, int64_t i,
                                                     int64_t j) {
  ep = Epilogue{};
  ep.bias = (t.last && p.bias) ? p.bias + j : nullptr;
  ep.alpha = t.last ? p.alpha : 1.0f;  // the whole sum is scaled once, as the bias is added once
  ep.stream_out = t.last && t.stream_c;
  void* c_tile = c_at(p, i, j);
  const void* old_c = (t.first && p.accumulate) ? c_tile : nullptr;
  if (t.partial == nullptr) {  // C is float32, or a single k block: C itself holds the sum
    ep.out = c_tile;
    ep.out_dtype = p.c_dtype;
    ep.ld_out = p.ldc;
    ep.add = t.first ? old_c : c_tile;
    ep.add_dtype = p.c_dtype;
    ep.ld_add = p.ldc;
  } else {
    float* part = t.partial + (i - t.i0) * t.nc + (j - t.jc);
    ep.out = t.last ? c_tile : part;
    ep.out_dtype = t.last ? p.c_dtype : DType::kFloat32;
    ep.ld_out = t.last ? p.ldc : t.nc;
    ep.add = t.first ? old_c : part;
    ep.add_dtype = t.first ? p.c_dtype : DType::kFloat32;
    ep.ld_add = t.first ? p.ldc : t.nc;
  }
}

// Packs op(B)[pc.., jc..] (kc_cur deep, nc_cur wide) into (kc, nr) panels and returns them: in b_panels, or, with
// a team sharing B (SharedB), in the team's next buffer, of which this thread packs its share of the column panels
// where the whole block's packing puts them, then waits at the barrier until the others have packed theirs.
[[gnu::always_inline]] inline const float* pack_b_block(const GemmBackend& be, const PackSource& src_b, int64_t jc,
                                                        int64_t nc_cur, int64_t pc, int64_t kc_cur, float* b_panels,
                                                        SharedB* shared) {
  const int64_t nr = be.nr;
  if (shared == nullptr) {
    be.pack(src_b, jc, nc_cur, pc, kc_cur, static_cast<int>(nr), b_panels);
    return b_panels;
  }
  float* b_block = shared->buffers[shared->step++ & 1];
  const int64_t col_panels = ceil_div(nc_cur, nr), slots = packed_slots(be, kc_cur);
  const int64_t q0 = col_panels * shared->part / shared->parts, q1 = col_panels * (shared->part + 1) / shared->parts;
  if (q1 > q0)
    be.pack(src_b, jc + q0 * nr, std::min(nc_cur, q1 * nr) - q0 * nr, pc, kc_cur, static_cast<int>(nr),
            b_block + q0 * slots * nr);
#pragma omp barrier
  return b_block;
}

// Single-threaded Goto loop nest over one slab. The epilogue of each tile adds the sum so far (the old C
// on the first k block when accumulating, the partial sum on later ones) and, on the last k block, the
// bias; a 16-bit C keeps its partial sums in float32 `partial` (rows of the slab, ld nc) so C is rounded
// only once. On the last k block, once every tile of a chunk of rows in the column block is written, that
// block of C is final and still in cache, and goes to the post-op.
//
// keep_a: a_panels holds the whole slab's packed A (every k block, every chunk of rows), packed for the first
// column block and read again for the others, rather than one chunk packed anew for each column block.
//
// shared: B's packed blocks are the team's (SharedB), and every thread of it calls run_slab with the same column
// range, nc and k blocks, so all meet the same barriers.
void run_slab(const GemmBackend& be, const Problem& p, const Slab& s, int64_t nc, float* a_panels, bool keep_a,
              float* b_panels, float* partial, SharedB* shared) {
  const int64_t mr = be.mr, nr = be.nr, kc = k_block(be, p.k);
  const PackSource src_a{p.a, p.lda, p.ab_dtype, !p.trans_a};
  const PackSource src_b{p.b, p.ldb, p.ab_dtype, p.trans_b};
  const int64_t row_panels = ceil_div(s.i1 - s.i0, mr);
  // Rows in chunks of at most mc, all about the same size so no chunk is a thin leftover.
  const int64_t chunks = ceil_div(row_panels, be.mc / mr);
  const bool by_column = be.column_kernel != nullptr && g_column_kernel.load(std::memory_order_relaxed);
  const bool stream_c = streams_c(p);
  std::vector<Epilogue> eps(static_cast<size_t>(be.mc / mr));  // one per row panel of a chunk
  std::vector<int> mr_used(eps.size());

  for (int64_t jc = s.j0; jc < s.j1; jc += nc) {
    const int64_t nc_cur = std::min(nc, s.j1 - jc);
    const int64_t col_panels = ceil_div(nc_cur, nr);
    for (int64_t pc = 0; pc < p.k; pc += kc) {
      const int64_t kc_cur = std::min(kc, p.k - pc);
      const int64_t slots = packed_slots(be, kc_cur);  // depth of a packed panel
      const bool first = pc == 0, last = pc + kc_cur == p.k;
      const float* b_block = pack_b_block(be, src_b, jc, nc_cur, pc, kc_cur, b_panels, shared);
      const BlockTarget target{s.i0, jc, nc, partial, first, last, stream_c};

      for (int64_t ch = 0; ch < chunks; ++ch) {
        const int64_t q0 = row_panels * ch / chunks, q1 = row_panels * (ch + 1) / chunks;
        const int64_t chunk_i0 = s.i0 + q0 * mr;
        float* chunk_a = keep_a ? a_panels + ((pc / kc) * row_panels + q0) * packed_slots(be, kc) * mr : a_panels;
        if (!keep_a || jc == s.j0) {
          (be.pack_a ? be.pack_a : be.pack)(src_a, chunk_i0, std::min(s.i0 + q1 * mr, s.i1) - chunk_i0, pc, kc_cur,
                                            static_cast<int>(mr), chunk_a);
        }
        // Column panel outer, row panel inner: the B panel stays in cache while A panels stream past.
        for (int64_t cq = 0; cq < col_panels; ++cq) {
          const int64_t j = jc + cq * nr;
          const int nr_used = static_cast<int>(std::min(nr, jc + nc_cur - j));
          for (int64_t rq = q0; rq < q1; ++rq) {
            const int64_t i = s.i0 + rq * mr;
            mr_used[rq - q0] = static_cast<int>(std::min(mr, s.i1 - i));
            set_tile_epilogue(eps[rq - q0], p, target, i, j);
          }
          const float* b_panel = b_block + cq * slots * nr;
          if (by_column) {
            be.column_kernel(kc_cur, chunk_a, slots * mr, static_cast<int>(q1 - q0), b_panel, mr_used.data(),
                             nr_used, eps.data());
          } else {
            for (int64_t rq = q0; rq < q1; ++rq)
              be.micro_kernel(kc_cur, chunk_a + (rq - q0) * slots * mr, b_panel, mr_used[rq - q0], nr_used,
                              eps[rq - q0]);
          }
        }
        if (last && p.post.fn) {
          const int64_t chunk_i1 = std::min(s.i0 + q1 * mr, s.i1);
          p.post.fn(p.post.ctx, c_at(p, chunk_i0, jc), p.ldc, chunk_i0, jc, chunk_i1 - chunk_i0, nc_cur);
        }
      }
    }
  }
}

// Runs on up to max_threads threads (omp_get_max_threads() when 0).
void gemm_blocked(const GemmBackend& be, const Problem& p, int max_threads = 0) {
  int threads = max_threads > 0 ? max_threads : omp_get_max_threads();
  if (p.m * p.n * p.k < kMinParallelMacs) threads = 1;
  int tm = 1, tn = 1;
  const bool alone = columns_alone(be, threads, p.m, p.n, p.k);
  if (alone) {
    tm = 1;
    tn = threads;
  } else {
    split_among_threads(threads, p.m, p.n, be, &tm, &tn);
  }
  // A 16-bit C cannot hold partial sums (that would round twice): they go to float32 scratch.
  const bool need_partial = p.c_dtype != DType::kFloat32 && p.k > be.kc;
  const int64_t row_panels = ceil_div(p.m, be.mr), col_panels = ceil_div(p.n, be.nr);
  const int64_t max_slots = packed_slots(be, be.kc);  // depth of the deepest packed panel
  // The column block width of a slab of `rows` rows and `cols` columns.
  const auto block_width = [&](int64_t rows, int64_t cols) {
    const int64_t nc = std::min(alone ? kLoneSlabMaxColumns : be.nc, ceil_div(cols, be.nr) * be.nr);
    return need_partial ? std::min(nc, std::max<int64_t>(be.nr, kPartialFloats / rows / be.nr * be.nr)) : nc;
  };
  // Row slabs of one column range share the packed B (SharedB), with one nc for all: the widest slab's.
  const bool share_b = tn == 1 && tm > 1 && row_panels >= tm;
  const int64_t shared_nc = block_width(ceil_div(row_panels, tm) * be.mr, p.n);
  float* shared_b = share_b ? t_shared_b_panels.get(static_cast<size_t>(2 * max_slots * shared_nc)) : nullptr;
  if (share_b && shared_b == nullptr)
    MIXTRAIN_FAIL(kInternal, "gemm: out of memory for packing buffers (m=" << p.m << ", n=" << p.n << ", k=" << p.k << ")",
                  "free memory or use smaller matrices");
  std::atomic<bool> out_of_memory{false};

#pragma omp parallel num_threads(threads)
  {
    // The runtime may give fewer threads than asked (nested regions); then threads take several slabs, and
    // each packs its own B (the team's barriers need one slab a thread).
    const bool sharing = share_b && omp_get_num_threads() == tm;
    for (int slab = omp_get_thread_num(); slab < tm * tn; slab += omp_get_num_threads()) {
      const int ti = slab / tn, tj = slab % tn;
      const Slab s{row_panels * ti / tm * be.mr, std::min(p.m, row_panels * (ti + 1) / tm * be.mr),
                   col_panels * tj / tn * be.nr, std::min(p.n, col_panels * (tj + 1) / tn * be.nr)};
      if (!sharing && (s.i0 >= s.i1 || s.j0 >= s.j1)) continue;  // sharing: row_panels >= tm, none is empty
      const int64_t nc = sharing ? shared_nc : block_width(s.i1 - s.i0, s.j1 - s.j0);
      // With several column blocks, a 16-bit product keeps the slab's packed A for all of them when it is small
      // enough: its tile products are so fast that packing A again for every column block costs 5% at
      // n = 1024 on an AMX core (float32 products were measured no faster keeping it).
      const int64_t a_kept = ceil_div(p.k, k_block(be, p.k)) * ceil_div(s.i1 - s.i0, be.mr) * max_slots * be.mr;
      const bool keep_a = be.k_per_slot == 2 && s.j1 - s.j0 > nc &&
                          a_kept * static_cast<int64_t>(sizeof(float)) <= kKeptPackedABytes;
      float* a_panels = t_a_panels.get(static_cast<size_t>(keep_a ? a_kept : be.mc * max_slots));
      float* b_panels = sharing ? shared_b : t_b_panels.get(static_cast<size_t>(max_slots * nc));
      float* partial = need_partial ? t_partial.get(static_cast<size_t>((s.i1 - s.i0) * nc)) : nullptr;
      if (a_panels == nullptr || b_panels == nullptr || (need_partial && partial == nullptr))
        out_of_memory = true;  // no exceptions out of a parallel region
      if (sharing) {
#pragma omp barrier
      }
      if (out_of_memory) continue;  // sharing: every thread sees it after the barrier, so none waits alone
      // The second buffer's address only when there is a shared buffer: an offset from a null pointer is undefined.
      SharedB team{{shared_b, sharing ? shared_b + max_slots * nc : nullptr}, ti, tm};
      if (be.thread_begin) be.thread_begin();
      run_slab(be, p, s, nc, a_panels, keep_a, b_panels, partial, sharing ? &team : nullptr);
      if (streams_c(p)) _mm_sfence();  // non-temporal stores are weakly ordered: done before C is read elsewhere
      if (be.thread_end) be.thread_end();
    }
  }
  if (out_of_memory)
    MIXTRAIN_FAIL(kInternal,
                  "gemm: out of memory for packing buffers (m=" << p.m << ", n=" << p.n << ", k=" << p.k << ")",
                  "free memory or use smaller matrices");
}

std::string shape_text(int64_t rows, int64_t cols) {
  std::ostringstream text;
  text << "(" << rows << ", " << cols << ")";
  return text.str();
}

void check_args(const Problem& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0)
    MIXTRAIN_FAIL(kInvalidInput, "gemm: negative size (m=" << p.m << ", n=" << p.n << ", k=" << p.k << ")",
                  "sizes are element counts and must be >= 0");
  if (!is_float(p.ab_dtype)) throw_unsupported_dtype("gemm (A and B)", p.ab_dtype);
  if (!is_float(p.c_dtype)) throw_unsupported_dtype("gemm (C)", p.c_dtype);
  if (p.m > 0 && p.k > 0) {
    const int64_t rows = p.trans_a ? p.k : p.m, cols = p.trans_a ? p.m : p.k;
    if (p.a == nullptr)
      MIXTRAIN_FAIL(kInvalidInput, "gemm: A is null", "pass A, stored " + shape_text(rows, cols));
    if (p.lda < cols)
      MIXTRAIN_FAIL(kInvalidInput, "gemm: lda=" << p.lda << " is shorter than a row of A, stored "
                                                << shape_text(rows, cols),
                    "lda is the distance between rows of A in elements, at least " + std::to_string(cols));
  }
  if (p.n > 0 && p.k > 0) {
    const int64_t rows = p.trans_b ? p.n : p.k, cols = p.trans_b ? p.k : p.n;
    if (p.b == nullptr)
      MIXTRAIN_FAIL(kInvalidInput, "gemm: B is null", "pass B, stored " + shape_text(rows, cols));
    if (p.ldb < cols)
      MIXTRAIN_FAIL(kInvalidInput, "gemm: ldb=" << p.ldb << " is shorter than a row of B, stored "
                                                << shape_text(rows, cols),
                    "ldb is the distance between rows of B in elements, at least " + std::to_string(cols));
  }
  if (p.m > 0 && p.n > 0) {
    if (p.c == nullptr)
      MIXTRAIN_FAIL(kInvalidInput, "gemm: C is null", "pass C, " + shape_text(p.m, p.n));
    if (p.ldc < p.n)
      MIXTRAIN_FAIL(kInvalidInput, "gemm: ldc=" << p.ldc << " is shorter than a row of C " << shape_text(p.m, p.n),
                    "ldc is the distance between rows of C in elements, at least " + std::to_string(p.n));
  }
}


// ---- bfloat16 method: widen to float32, vdpbf16ps on pairs, or AMX tiles ----

enum Bf16Method : int { kWiden = 0, kDot = 1, kAmx = 2, kAmxEmulated = 3, kNumBf16Methods = 4 };
constexpr const char* kBf16MethodNames[] = {"widen", "dot", "amx", "amx_emulated"};
static_assert(sizeof(kBf16MethodNames) / sizeof(kBf16MethodNames[0]) == kNumBf16Methods);

// ---- AMX tile state: Linux grants it per process on request ----

constexpr long kArchReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM (asm/prctl.h)
constexpr long kXfeatureXtiledata = 18;     // XFEATURE_XTILEDATA

struct AmxState {
  bool granted = false;
  std::string status;
};

// Asks once; the answer holds for every thread of the process.
const AmxState& amx_state() {
  static const AmxState state = [] {
    AmxState s;
    if (!cpu_features().amx_bf16) {
      s.status = "not available: this CPU (or the OS's XCR0) has no AMX-BF16";
      return s;
    }
#if defined(__linux__) && defined(SYS_arch_prctl)
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) {
      s.granted = true;
      s.status = "granted";
    } else {
      s.status = std::string("refused by the OS (arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA): ") +
                 std::strerror(errno) + "); bfloat16 GEMMs use the other methods";
    }
#else
    s.status = "not available: no way to ask this OS for the tile state";
#endif
    return s;
  }();
  return state;
}

// Whether this CPU and OS can run a method at all (with the best instruction-set path).
bool cpu_has_method(int method) {
  switch (method) {
    case kDot:
      return best_level() == kLevelAvx512 && cpu_features().avx512_bf16;
    case kAmx:  // its epilogue rounds to bfloat16 with vcvtne2ps2bf16
      return best_level() == kLevelAvx512 && cpu_features().avx512_bf16 && amx_state().granted;
    default:  // widening and the emulation run anywhere
      return true;
  }
}

// Whether a method can run now, on the instruction-set path in use: dot and AMX use the AVX-512 path's
// epilogue and blocking.
bool method_available(int method) {
  if (method == kDot || method == kAmx) return cpu_has_method(method) && &active_backend() == kBackends[kLevelAvx512];
  return true;
}

const GemmBackend& bf16_backend(int method) {
  switch (method) {
    case kDot:
      return cpu::kAvx512Bf16Backend;
    case kAmx:
      return cpu::kAmxBackend;
    case kAmxEmulated:
      return cpu::kAmxEmulatedBackend;
    default:
      return *kBackends[kLevelAvx512];
  }
}

int parse_bf16_method(const char* name) {
  for (int m = 0; m < kNumBf16Methods; ++m)
    if (std::strcmp(name, kBf16MethodNames[m]) == 0) return m;
  return -1;
}

// -1 when MIXTRAIN_BF16_GEMM is unset.
int env_bf16_method() {
  static const int method = [] {
    const std::optional<std::string> text = env::mixtrain_bf16_gemm();
    if (!text || text->empty()) return -1;
    const char* env = text->c_str();
    const int parsed = parse_bf16_method(env);
    if (parsed < 0)
      MIXTRAIN_FAIL(kInvalidInput, "MIXTRAIN_BF16_GEMM='" << env << "' names no bfloat16 GEMM method",
                    "set MIXTRAIN_BF16_GEMM to amx, dot, widen or amx_emulated, or unset it");
    return parsed;
  }();
  return method;
}

// Seconds of one single-threaded GEMM of `p` on `be`.
double seconds_of(const GemmBackend& be, const Problem& p) {
  const auto start = std::chrono::steady_clock::now();
  gemm_blocked(be, p, 1);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The fastest bfloat16 method on this CPU, by measurement: vdpbf16ps issues at twice the FMA rate on
// some CPUs and half on others (AMD Zen 5, Intel Sapphire Rapids), which cpuid does not say, and AMX
// tiles may be slower than either where the OS or hypervisor makes tile state expensive. Times every
// method this CPU can run, packing included, on a 192 x 256 x 512 product on one thread (about 50 MFLOP
// per run, a few ms in all), the best of five interleaved rounds after a warm-up. A method replaces the one chosen so far
// (starting from widening) only when 10% faster, so that a near tie, where timing noise could pick
// either from one run to the next, keeps the simpler one.
int calibrated_bf16_method() {
  constexpr int64_t kM = 192, kN = 256, kK = 512;
  std::vector<uint16_t> a(kM * kK), b(kK * kN);  // (m, k), (k, n): values in [1, 2)
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(0x3F80 + (i * 37) % 128);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(0x3F80 + (i * 53) % 128);
  std::vector<float> c(kM * kN);  // (m, n)
  const Problem p{false, false, kM, kN, kK, DType::kBFloat16, a.data(), kK, b.data(), kN, DType::kFloat32,
                  c.data(), kN, false, nullptr, {}};
  // The methods' runs interleave (round by round, each method's best kept), so a moment when other processes
  // take the core slows one run of one method, not all of a method's runs: on a loaded machine, back-to-back runs
  // had two processes of one test pick different methods, and so different bits.
  const std::vector<int> methods = [] {
    std::vector<int> m;
    for (int method : {kWiden, kDot, kAmx})
      if (cpu_has_method(method)) m.push_back(method);
    return m;
  }();
  std::vector<double> best(methods.size(), 1e30);
  for (int method : methods) gemm_blocked(bf16_backend(method), p, 1);  // warm-up: packing buffers, caches, clocks
  for (int round = 0; round < 5; ++round)
    for (size_t i = 0; i < methods.size(); ++i) best[i] = std::min(best[i], seconds_of(bf16_backend(methods[i]), p));
  int chosen = kWiden;
  double chosen_seconds = 0;
  for (size_t i = 0; i < methods.size(); ++i) {
    if (methods[i] == kWiden || best[i] * 1.1 < chosen_seconds) {
      chosen = methods[i];
      chosen_seconds = best[i];
    }
  }
  return chosen;
}

std::atomic<int> g_test_bf16_method{-1};

// The bfloat16 method in use now: the forced one (test hook, then MIXTRAIN_BF16_GEMM) where it can run
// on the path in use, else the calibrated one on the AVX-512 path, else widening.
int bf16_method() {
  int wanted = g_test_bf16_method.load(std::memory_order_relaxed);
  if (wanted < 0) wanted = env_bf16_method();
  if (wanted >= 0 && method_available(wanted)) return wanted;
  if (&active_backend() != kBackends[kLevelAvx512]) return kWiden;
  static const int calibrated = calibrated_bf16_method();
  return calibrated;
}

// ---- float16 method: widen to float32, or AVX512-FP16 FMAs on float16 partial sums ----

enum F16Method : int {
  kF16Widen = 0,
  kF16Fma = 1,
  kF16FmaEmulated = 2,
  kF16Amx = 3,          // each value split into two bfloat16 values, three AMX products (kAmxF16Backend)
  kF16AmxEmulated = 4,  // the same on the AMX kernel's portable emulation
  kNumF16Methods = 5
};
constexpr const char* kF16MethodNames[] = {"widen", "fp16", "fp16_emulated", "amx", "amx_emulated"};
static_assert(sizeof(kF16MethodNames) / sizeof(kF16MethodNames[0]) == kNumF16Methods);

constexpr int kDefaultF16Interval = 32;  // k values per float16 partial sum (16 products a lane)

int parse_f16_method(const char* name) {
  for (int m = 0; m < kNumF16Methods; ++m)
    if (std::strcmp(name, kF16MethodNames[m]) == 0) return m;
  return -1;
}

int env_f16_method() {
  static const int method = [] {
    const std::optional<std::string> text = env::mixtrain_f16_gemm();
    if (!text || text->empty()) return -1;
    const char* env = text->c_str();
    const int parsed = parse_f16_method(env);
    if (parsed < 0)
      MIXTRAIN_FAIL(kInvalidInput, "MIXTRAIN_F16_GEMM='" << env << "' names no float16 GEMM method",
                    "set MIXTRAIN_F16_GEMM to amx, fp16, widen, amx_emulated or fp16_emulated, or unset it");
    return parsed;
  }();
  return method;
}

bool valid_f16_interval(int64_t k) { return k >= 2 && k <= 1024 && k % 2 == 0; }

int env_f16_interval() {
  static const int interval = [] {
    const std::optional<std::string> text = env::mixtrain_f16_gemm_interval();
    if (!text || text->empty()) return kDefaultF16Interval;
    const char* env = text->c_str();
    char* end = nullptr;
    const long parsed = std::strtol(env, &end, 10);
    if (end == env || *end != '\0' || !valid_f16_interval(parsed))
      MIXTRAIN_FAIL(kInvalidInput, "MIXTRAIN_F16_GEMM_INTERVAL='" << env << "' is not an even number in [2, 1024]",
                    "the number of k values each float16 partial sum covers before it is added in float32; "
                    "default " + std::to_string(kDefaultF16Interval));
    return static_cast<int>(parsed);
  }();
  return interval;
}

std::atomic<int> g_test_f16_interval{0};
std::atomic<int> g_test_f16_method{-1};

bool cpu_has_f16_fma() { return best_level() == kLevelAvx512 && cpu_features().avx512_fp16; }

bool f16_method_available(int method) {
  if (method == kF16Fma) return cpu_has_f16_fma() && &active_backend() == kBackends[kLevelAvx512];
  if (method == kF16Amx) return method_available(kAmx);
  return true;
}

// Whether the calibrated split method serves a product of this shape: AMX tiles are 16 rows by 16 columns,
// and a thin product (a matrix-vector one, a small batch) would pack three pieces of each operand while using
// a sliver of each tile; widening serves those.
bool worth_splitting(const Problem& p) { return p.m >= 16 && p.n >= 16 && p.m * p.n * p.k >= kMinParallelMacs; }

// Widening or the AMX split, whichever is faster on this CPU, by measurement (as calibrated_bf16_method: the
// same shape with float16 values in [1, 2), one thread, best of five interleaved rounds after a warm-up; the split
// replaces widening only when 10% faster), the split included in the time. Both sum in float32. The AVX512-FP16 FMAs
// (about 1.7x float32 on one thread of an Intel Xeon without AMX) sum partly in float16, outside gemm()'s
// contract, so they are never chosen by themselves: MIXTRAIN_F16_GEMM=fp16 opts in.
int calibrated_f16_method() {
  if (!method_available(kAmx)) return kF16Widen;
  constexpr int64_t kM = 192, kN = 256, kK = 512;
  std::vector<uint16_t> a(kM * kK), b(kK * kN);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(0x3C00 + (i * 37) % 1024);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(0x3C00 + (i * 53) % 1024);
  std::vector<float> c(kM * kN);
  const Problem p{false, false, kM, kN, kK, DType::kFloat16, a.data(), kK, b.data(), kN, DType::kFloat32,
                  c.data(), kN, false, nullptr, {}};
  // Interleaved rounds, each method's best kept, as calibrated_bf16_method times them.
  gemm_blocked(active_backend(), p, 1);  // warm-up
  gemm_blocked(cpu::kAmxF16Backend, p, 1);
  double widen = 1e30, split = 1e30;
  for (int round = 0; round < 5; ++round) {
    widen = std::min(widen, seconds_of(active_backend(), p));
    split = std::min(split, seconds_of(cpu::kAmxF16Backend, p));
  }
  return split * 1.1 < widen ? kF16Amx : kF16Widen;
}

const GemmBackend& f16_backend(int method) {
  switch (method) {
    case kF16Fma:
      return cpu::kAvx512Fp16Backend;
    case kF16FmaEmulated:
      return cpu::kAvx512Fp16EmulatedBackend;
    case kF16Amx:
      return cpu::kAmxF16Backend;
    case kF16AmxEmulated:
      return cpu::kAmxF16EmulatedBackend;
    default:
      return *kBackends[kLevelAvx512];
  }
}

// The forced method (test hook, then MIXTRAIN_F16_GEMM) where it can run, or -1.
int forced_f16_method() {
  int wanted = g_test_f16_method.load(std::memory_order_relaxed);
  if (wanted < 0) wanted = env_f16_method();
  return wanted >= 0 && f16_method_available(wanted) ? wanted : -1;
}

// The forced method, else the calibrated one on the AVX-512 path, else widening.
int f16_method() {
  const int forced = forced_f16_method();
  if (forced >= 0) return forced;
  if (&active_backend() != kBackends[kLevelAvx512]) return kF16Widen;
  static const int calibrated = calibrated_f16_method();
  return calibrated;
}

// The path of a product: its inputs' dtype's method, and for the float16 split, unless forced, its shape.
const GemmBackend& backend_for(const Problem& p) {
  if (p.ab_dtype == DType::kBFloat16) {
    const int method = bf16_method();
    if (method != kWiden) return bf16_backend(method);
  }
  if (p.ab_dtype == DType::kFloat16) {
    const int method = f16_method();
    if (method == kF16Fma || method == kF16FmaEmulated) return f16_backend(method);
    const bool split = method == kF16Amx || method == kF16AmxEmulated;
    if (split && (forced_f16_method() >= 0 || worth_splitting(p))) return f16_backend(method);
  }
  return active_backend();
}

void run(const Problem& p) {
  check_args(p);
  if (p.m == 0 || p.n == 0) return;
  if (p.k == 0) return gemm_no_products(p);
  gemm_blocked(backend_for(p), p);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType ab_dtype, const void* a,
          int64_t lda, const void* b, int64_t ldb, DType c_dtype, void* c, int64_t ldc, bool accumulate,
          const float* bias) {
  gemm_with_post_op(trans_a, trans_b, m, n, k, ab_dtype, a, lda, b, ldb, c_dtype, c, ldc, accumulate, bias,
                    GemmPostOp{nullptr, nullptr});
}

void gemm_with_post_op(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType ab_dtype, const void* a,
                       int64_t lda, const void* b, int64_t ldb, DType c_dtype, void* c, int64_t ldc,
                       bool accumulate, const float* bias, const GemmPostOp& post_op) {
  run(Problem{trans_a, trans_b, m, n, k, ab_dtype, a, lda, b, ldb, c_dtype, c, ldc, accumulate, bias, post_op});
}

void scaled_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType ab_dtype, const void* a,
                 int64_t lda, const void* b, int64_t ldb, float alpha, const float* bias, DType c_dtype, void* c,
                 int64_t ldc) {
  run(Problem{trans_a, trans_b, m, n, k, ab_dtype, a, lda, b, ldb, c_dtype, c, ldc, /*accumulate=*/false, bias,
              GemmPostOp{nullptr, nullptr}, alpha});
}

const char* gemm_isa() { return active_backend().name; }

const char* gemm_bf16_method() { return kBf16MethodNames[bf16_method()]; }

const char* gemm_f16_method() { return kF16MethodNames[f16_method()]; }

int gemm_f16_promote_interval() {
  const int forced = g_test_f16_interval.load(std::memory_order_relaxed);
  return forced > 0 ? forced : env_f16_interval();
}

bool gemm_amx_granted() { return amx_state().granted; }

const char* gemm_amx_status() { return amx_state().status.c_str(); }

const char* set_gemm_isa_for_testing(const char* isa) {
  std::optional<IsaLevel> level;
  if (isa != nullptr) {
    level = parse_isa_level(isa);
    if (!level) MIXTRAIN_FAIL(kInvalidInput, "unknown GEMM path '" << isa << "'", "use scalar, avx2 or avx512");
  }
  set_isa_level_for_testing(level);
  return gemm_isa();
}

const char* set_gemm_bf16_method_for_testing(const char* method) {
  int wanted = -1;
  if (method != nullptr) {
    wanted = parse_bf16_method(method);
    if (wanted < 0)
      MIXTRAIN_FAIL(kInvalidInput, "unknown bfloat16 GEMM method '" << method << "'",
                    "use amx, dot, widen or amx_emulated");
  }
  g_test_bf16_method.store(wanted, std::memory_order_relaxed);
  return gemm_bf16_method();
}

const char* set_gemm_f16_method_for_testing(const char* method) {
  int wanted = -1;
  if (method != nullptr) {
    wanted = parse_f16_method(method);
    if (wanted < 0)
      MIXTRAIN_FAIL(kInvalidInput, "unknown float16 GEMM method '" << method << "'",
                    "use amx, fp16, widen, amx_emulated or fp16_emulated");
  }
  g_test_f16_method.store(wanted, std::memory_order_relaxed);
  return gemm_f16_method();
}

int set_gemm_f16_promote_interval_for_testing(int k_values) {
  if (k_values != 0 && !valid_f16_interval(k_values))
    MIXTRAIN_FAIL(kInvalidInput, "float16 promotion interval " << k_values << " is not an even number in [2, 1024]",
                  "pass 0 to return to the default");
  g_test_f16_interval.store(k_values, std::memory_order_relaxed);
  return gemm_f16_promote_interval();
}

bool set_gemm_column_kernel_for_testing(bool enabled) { return g_column_kernel.exchange(enabled); }

namespace cpu {
int64_t f16_promote_pairs() { return gemm_f16_promote_interval() / 2; }
}  // namespace cpu

}  // namespace mixtrain::kernels
