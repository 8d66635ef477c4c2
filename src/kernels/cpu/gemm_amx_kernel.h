// The AMX-BF16 GEMM kernel: packing and the 32x32 micro-kernel, written against the instruction shim
// (namespace shim: amx_shim_native.h or amx_shim_emulated.h, included before this file). gemm_amx.cpp
// compiles it with the real instructions, gemm_amx_emulated.cpp with the portable emulation, so the tests
// run this very code on every CPU.
//
// Micro-tile: 32 rows x 32 columns of C in four 16x16 float32 accumulator tiles (tmm0..3); each step of
// 32 k values loads two A tiles (tmm4, 5: 16 rows x 32 bfloat16) and two B tiles (tmm6, 7: 16 pair-rows
// x 16 columns, pairs interleaved, the "VNNI" layout tdpbf16ps reads) and issues four tdpbf16ps, each
// operand tile used twice. k is padded with zeros to a multiple of 32 in both packed operands.
//
// Packed layouts (32-bit slots, k_per_slot = 2; a panel is ceil(kc / 32) steps):
//   A panel (32 rows): step t is a (32 rows, 32 k) bfloat16 block, row r at slot (t * 32 + r) * 16: a
//     tile is 16 consecutive 64-byte rows (1 KiB contiguous, stride 64).
//   B panel (32 columns): step t holds two (16 pairs, 16 columns) blocks of slots, column group g at
//     slot (t * 2 + g) * 256, pair s and column c at + s * 16 + c: each tile is 1 KiB contiguous.
// Contiguous tiles keep every tile load within 16 cache lines and away from 4 KiB-stride set conflicts.
//
// Numerics: products of two bfloat16 values are exact in float32 and the sums run in float32 tiles over
// k in an order fixed by k alone (step by step, pair by pair), so the result does not depend on threads.
// tdpbf16ps reads bfloat16 subnormals as zero and flushes subnormal float32 sums to zero, like vdpbf16ps.
#pragma once

#include <cstdint>

#include "kernels/cpu/gemm_backend.h"

namespace mixtrain::kernels::cpu {
namespace {
namespace amx {

constexpr int kMR = 32;
constexpr int kNR = 32;
constexpr int kStep = 32;  // k values per tile product

inline int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }
// Tile steps in a panel kc deep (k padded with zeros to a multiple of kStep).
constexpr int64_t steps_of(int64_t kc) { return (kc + kStep - 1) / kStep; }

// A: rows with k contiguous (element (r, p) at data[r * ld + p]): each tile row is a 64-byte copy. A row is read
// from start to end (its 64-byte pieces go to consecutive steps), so the hardware prefetcher sees a few long
// streams rather than 32 rows read a line at a time.
void pack_a_k_contiguous(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, uint16_t* dst) {
  const uint16_t* data = static_cast<const uint16_t*>(src.data);
  const int64_t steps = steps_of(kc);
  for (int64_t q0 = 0; q0 < rows; q0 += kMR) {
    const int64_t used = min64(kMR, rows - q0);
    for (int r = 0; r < kMR; ++r) {
      const uint16_t* row = data + (r0 + q0 + r) * src.ld + p0;
      for (int64_t t = 0; t < steps; ++t) {
        const int kn = static_cast<int>(min64(kStep, kc - t * kStep));
        shim::copy_row32(row + t * kStep, r < used ? kn : 0, dst + t * kMR * kStep + r * kStep);
      }
    }
    dst += steps * kMR * kStep;
  }
}

// A: k strided (element (r, p) at data[p * ld + r], A transposed): k pairs are interleaved into slots
// (pair, row), then a 16x16 slot transpose turns them into rows of k.
void pack_a_rows_contiguous(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc,
                            uint16_t* dst) {
  const uint16_t* data = static_cast<const uint16_t*>(src.data);
  const int64_t steps = steps_of(kc);
  alignas(64) uint32_t pairs[16 * 16];  // (16 pairs, 16 rows)
  for (int64_t q0 = 0; q0 < rows; q0 += kMR) {
    const int64_t used = min64(kMR, rows - q0);
    for (int64_t t = 0; t < steps; ++t) {
      const int64_t kn = min64(kStep, kc - t * kStep);
      uint16_t* block = dst + t * kMR * kStep;  // (32 rows, 32 k)
      for (int g = 0; g < kMR / 16; ++g) {
        const int n = static_cast<int>(min64(16, used - 16 * g));
        for (int s = 0; s < 16; ++s) {
          const uint16_t* even = data + (p0 + t * kStep + 2 * s) * src.ld + r0 + q0 + 16 * g;
          if (n <= 0 || 2 * s >= kn) {
            shim::interleave_pairs(even, nullptr, 0, pairs + s * 16);  // zeros; reads nothing
          } else {
            shim::interleave_pairs(even, 2 * s + 1 < kn ? even + src.ld : nullptr, n, pairs + s * 16);
          }
        }
        // (16 pairs, 16 rows) -> rows 16g.. of the block, 16 slots (32 k) each
        shim::transpose16_u32(pairs, 64, 16, 32, reinterpret_cast<uint32_t*>(block + 16 * g * kStep), kStep / 2);
      }
    }
    dst += steps * kMR * kStep;
  }
}

// B (seen as rows = columns of op(B)) with k strided: element (c, p) at data[p * ld + c], B as stored
// (k, n): each tile row interleaves two source rows. A pair of source rows is read across every panel before
// the next pair, so the reads run along the rows (the prefetcher's streams) and the 64-byte writes scatter
// over the panels, which stay in cache.
void pack_b_rows_contiguous(const PackSource& src, int64_t r0, int64_t cols, int64_t p0, int64_t kc, uint32_t* dst) {
  const uint16_t* data = static_cast<const uint16_t*>(src.data);
  const int64_t steps = steps_of(kc);
  const int64_t panel_slots = steps * kMR * kStep / 2;
  for (int64_t t = 0; t < steps; ++t) {
    const int64_t kn = min64(kStep, kc - t * kStep);
    for (int s = 0; s < 16; ++s) {
      const uint16_t* even = data + (p0 + t * kStep + 2 * s) * src.ld + r0;
      const uint16_t* odd = 2 * s + 1 < kn ? even + src.ld : nullptr;
      uint32_t* block = dst + t * 2 * 256 + s * 16;  // two (16 pairs, 16 columns) blocks of each panel
      for (int64_t q0 = 0; q0 < cols; q0 += kNR, block += panel_slots) {
        if (2 * s >= kn) {
          shim::interleave_pairs32(even, nullptr, 0, block, block + 256);  // zeros; reads nothing
        } else {
          shim::interleave_pairs32(even + q0, odd ? odd + q0 : nullptr, static_cast<int>(min64(kNR, cols - q0)),
                                   block, block + 256);
        }
      }
    }
  }
}

// B with k contiguous (element (c, p) at data[c * ld + p], B transposed): a k pair is already one 32-bit
// slot, so (16 columns, 16 pairs) blocks are transposed.
void pack_b_k_contiguous(const PackSource& src, int64_t r0, int64_t cols, int64_t p0, int64_t kc, uint32_t* dst) {
  const uint16_t* data = static_cast<const uint16_t*>(src.data);
  const int64_t steps = steps_of(kc);
  for (int64_t q0 = 0; q0 < cols; q0 += kNR) {
    const int64_t used = min64(kNR, cols - q0);
    for (int64_t t = 0; t < steps; ++t) {
      const int kn = static_cast<int>(min64(kStep, kc - t * kStep));
      for (int g = 0; g < kNR / 16; ++g) {
        const int n = static_cast<int>(min64(16, used - 16 * g));
        const uint16_t* first = data + (r0 + q0 + 16 * g) * src.ld + p0 + t * kStep;
        shim::transpose16_u32(first, src.ld * 2, n > 0 ? n : 0, kn, dst + (t * 2 + g) * 256, 16);
      }
    }
    dst += steps * kMR * kStep / 2;
  }
}

void pack(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, int /*width*/, float* dst) {
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  if (src.k_contiguous) return pack_b_k_contiguous(src, r0, rows, p0, kc, out);
  return pack_b_rows_contiguous(src, r0, rows, p0, kc, out);
}

void pack_a(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, int /*width*/, float* dst) {
  uint16_t* out = reinterpret_cast<uint16_t*>(dst);
  if (src.k_contiguous) return pack_a_k_contiguous(src, r0, rows, p0, kc, out);
  return pack_a_rows_contiguous(src, r0, rows, p0, kc, out);
}

// The running sum a full tile starts from and ends in: when the sum so far (ep.add) is float32, the
// accumulator tiles load it and keep adding to it, and when nothing else is left to do (float32 out, no
// bias, no scale), they store straight into ep.out. So k blocks after the first cost a tile load and store rather
// than a pass of the epilogue, and k blocks can be shallow enough for a B panel to stay in L1. Tiles cut
// by C's edges (never full whatever the thread count) take the epilogue.
struct TilePlan {
  bool start_from_add, store_to_out;
};

TilePlan plan_tile(int mr_used, int nr_used, const Epilogue& ep) {
  const bool full = mr_used == kMR && nr_used == kNR;
  const bool start_from_add = full && ep.add != nullptr && ep.add_dtype == DType::kFloat32;
  const bool store_to_out = full && ep.out_dtype == DType::kFloat32 && ep.bias == nullptr && ep.alpha == 1.0f &&
                            (ep.add == nullptr || start_from_add);
  return {start_from_add, store_to_out};
}

// Accumulators 0..3 = the (32, 32) float32 tile at `base` with row stride `stride` bytes.
void load_accumulators(const void* base, int64_t stride) {
  const char* p = static_cast<const char*>(base);
  shim::tile_load<0>(p, stride);
  shim::tile_load<1>(p + 64, stride);
  shim::tile_load<2>(p + 16 * stride, stride);
  shim::tile_load<3>(p + 16 * stride + 64, stride);
}

void store_accumulators(void* base, int64_t stride) {
  char* p = static_cast<char*>(base);
  shim::tile_store<0>(p, stride);
  shim::tile_store<1>(p + 64, stride);
  shim::tile_store<2>(p + 16 * stride, stride);
  shim::tile_store<3>(p + 16 * stride + 64, stride);
}

// Accumulators = the sum the tile starts from: ep.add when the plan reads it in, else zero.
void start_accumulators(const TilePlan& plan, int mr_used, const Epilogue& ep) {
  if (!plan.store_to_out) shim::prefetch_c(mr_used, ep);
  if (plan.start_from_add) return load_accumulators(ep.add, ep.ld_add * 4);
  shim::tile_zero<0>();
  shim::tile_zero<1>();
  shim::tile_zero<2>();
  shim::tile_zero<3>();
}

// Accumulators += `steps` steps of the packed panels a and b, in order.
void accumulate_steps(int64_t steps, const char* a, const char* b) {
  // Tile registers are not renamed: a load into a tile waits until the products reading its old value
  // are done. So each operand of the next step is loaded right after the last product that reads this
  // step's, and its load overlaps the products still running. A is streamed from L2 past L1 (run_column keeps B
  // there).
  shim::tile_stream_load<4>(a, 64);         // rows 0..15
  shim::tile_load<6>(b, 64);                // columns 0..15
  shim::tile_stream_load<5>(a + 1024, 64);  // rows 16..31
  shim::tile_load<7>(b + 1024, 64);         // columns 16..31
  for (int64_t t = 1; t < steps; ++t) {
    a += 2048;
    b += 2048;
    shim::tile_dpbf16ps<0, 4, 6>();
    shim::tile_dpbf16ps<1, 4, 7>();
    shim::tile_stream_load<4>(a, 64);
    shim::tile_dpbf16ps<2, 5, 6>();
    shim::tile_load<6>(b, 64);
    shim::tile_dpbf16ps<3, 5, 7>();
    shim::tile_stream_load<5>(a + 1024, 64);
    shim::tile_load<7>(b + 1024, 64);
  }
  shim::tile_dpbf16ps<0, 4, 6>();
  shim::tile_dpbf16ps<1, 4, 7>();
  shim::tile_dpbf16ps<2, 5, 6>();
  shim::tile_dpbf16ps<3, 5, 7>();
}

// Accumulators += `steps` steps of float16 split panels a and b (gemm_amx_kernel.h's float16 section: each step is
// its hi block, then its lo block, 2 KiB each), three products a step in the order a_hi b_hi, a_hi b_lo, a_lo b_hi.
// The hi A tiles serve the first two products, so a step loads ten tiles for twelve products.
void accumulate_split_steps(int64_t steps, const char* a, const char* b) {
  shim::tile_stream_load<4>(a, 64);         // A hi, rows 0..15
  shim::tile_load<6>(b, 64);                // B hi, columns 0..15
  shim::tile_stream_load<5>(a + 1024, 64);  // A hi, rows 16..31
  shim::tile_load<7>(b + 1024, 64);         // B hi, columns 16..31
  for (int64_t t = 0; t < steps; ++t) {
    // a_hi b_hi, then B's lo tiles come in
    shim::tile_dpbf16ps<0, 4, 6>();
    shim::tile_dpbf16ps<1, 4, 7>();
    shim::tile_dpbf16ps<2, 5, 6>();
    shim::tile_load<6>(b + 2048, 64);
    shim::tile_dpbf16ps<3, 5, 7>();
    shim::tile_load<7>(b + 3072, 64);
    // a_hi b_lo, then A's lo tiles and B's hi tiles again
    shim::tile_dpbf16ps<0, 4, 6>();
    shim::tile_dpbf16ps<1, 4, 7>();
    shim::tile_stream_load<4>(a + 2048, 64);
    shim::tile_dpbf16ps<2, 5, 6>();
    shim::tile_load<6>(b, 64);
    shim::tile_dpbf16ps<3, 5, 7>();
    shim::tile_stream_load<5>(a + 3072, 64);
    shim::tile_load<7>(b + 1024, 64);
    // a_lo b_hi, then the next step's hi tiles
    a += 4096;
    b += 4096;
    const bool more = t + 1 < steps;
    shim::tile_dpbf16ps<0, 4, 6>();
    shim::tile_dpbf16ps<1, 4, 7>();
    if (more) shim::tile_stream_load<4>(a, 64);
    shim::tile_dpbf16ps<2, 5, 6>();
    if (more) shim::tile_load<6>(b, 64);
    shim::tile_dpbf16ps<3, 5, 7>();
    if (more) {
      shim::tile_stream_load<5>(a + 1024, 64);
      shim::tile_load<7>(b + 1024, 64);
    }
  }
}

// How the panels of one kernel instance are laid out: bfloat16 panels (a step is 2 KiB, one product) or float16
// split panels (a step is 4 KiB, hi and lo, three products).
template <bool Split>
struct Steps {
  static constexpr int64_t kBytes = Split ? 4096 : 2048;
  static void accumulate(int64_t steps, const char* a, const char* b) {
    if constexpr (Split) {
      accumulate_split_steps(steps, a, b);
    } else {
      accumulate_steps(steps, a, b);
    }
  }
};

// The finished accumulators to C: stored straight into ep.out, or through the epilogue.
void finish_accumulators(const TilePlan& plan, int mr_used, int nr_used, const Epilogue& ep) {
  alignas(64) float tile[kMR * kNR];  // (32, 32)
  if (plan.store_to_out && !ep.stream_out) return store_accumulators(ep.out, ep.ld_out * 4);
  store_accumulators(tile, kNR * 4);
  if (plan.store_to_out) return shim::stream_tile(tile, ep.out, ep.ld_out);
  Epilogue rest = ep;
  if (plan.start_from_add) rest.add = nullptr;  // already in the sum
  shim::finish(tile, mr_used, nr_used, rest);
}

template <bool Split>
void run_tiles(int64_t steps, const float* a_panel, const float* b_panel, int mr_used, int nr_used,
               const Epilogue& ep) {
  const TilePlan plan = plan_tile(mr_used, nr_used, ep);
  start_accumulators(plan, mr_used, ep);
  Steps<Split>::accumulate(steps, reinterpret_cast<const char*>(a_panel), reinterpret_cast<const char*>(b_panel));
  finish_accumulators(plan, mr_used, nr_used, ep);
}

// A column of micro-tiles: `count` (<= kMaxColumnTiles) A panels, each `a_stride` floats after the one before,
// against one B panel, `steps` deep, tile r finishing with eps[r]. A tile streams both of its operand panels
// from L2 at about half the tile units' rate, so the steps are taken in slices of kSliceSteps, every tile of
// the column through a slice before the next: the B panel's slice (32 KiB) then stays in L1 across the column
// while the A slices stream past with tileloaddt1 (which leaves L1 to B and the sums), and each tile's running
// sum waits in L1 between slices, as exact float32. Measured on one Sapphire Rapids class core: with A loaded
// into L1 like B, slices of 8 steps were best (16 KiB of B); streaming A past L1, slices of 16 steps ran
// n = 512 16% and n = 1024 5% faster. (A loop of tile products alone ran at about 3.4 TFLOP/s a core with both
// operands in L1: the tile units wait on L2, not on arithmetic.)
// Every element still sums its products step by step in the same order, so the bits are micro_kernel's.
// A float16 split step is twice the bytes and three times the products, so its slices are half as many steps.
// (The emulation takes slices of 2 steps, or 1 split step, so that the tests' small shapes cross slices too.)
constexpr int kMaxColumnTiles = 4;
template <bool Split>
constexpr int64_t kSliceSteps = (shim::kEmulated ? 2 : 16) / (Split ? 2 : 1);

template <bool Split>
void run_column(int64_t steps, const float* a_panels, int64_t a_stride, int count, const float* b_panel,
                const int* mr_used, int nr_used, const Epilogue* eps) {
  if (count > kMaxColumnTiles) {  // never with the backends' blocks; kept correct anyway
    for (int r0 = 0; r0 < count; r0 += kMaxColumnTiles) {
      const int n = count - r0 < kMaxColumnTiles ? count - r0 : kMaxColumnTiles;
      run_column<Split>(steps, a_panels + r0 * a_stride, a_stride, n, b_panel, mr_used + r0, nr_used, eps + r0);
    }
    return;
  }
  if (count == 1 || steps <= kSliceSteps<Split>) {
    for (int r = 0; r < count; ++r)
      run_tiles<Split>(steps, a_panels + r * a_stride, b_panel, mr_used[r], nr_used, eps[r]);
    return;
  }
  alignas(64) float sums[kMaxColumnTiles][kMR * kNR];  // (32, 32) running sums between slices
  TilePlan plans[kMaxColumnTiles];
  for (int r = 0; r < count && r < kMaxColumnTiles; ++r) plans[r] = plan_tile(mr_used[r], nr_used, eps[r]);
  const char* b = reinterpret_cast<const char*>(b_panel);
  for (int64_t s0 = 0; s0 < steps; s0 += kSliceSteps<Split>) {
    const int64_t slice = min64(kSliceSteps<Split>, steps - s0);
    const bool first = s0 == 0, last = s0 + slice == steps;
    for (int r = 0; r < count; ++r) {
      if (first) {
        start_accumulators(plans[r], mr_used[r], eps[r]);
      } else {
        load_accumulators(sums[r], kNR * 4);
      }
      const char* a = reinterpret_cast<const char*>(a_panels + r * a_stride);
      Steps<Split>::accumulate(slice, a + s0 * Steps<Split>::kBytes, b + s0 * Steps<Split>::kBytes);
      if (last) {
        finish_accumulators(plans[r], mr_used[r], nr_used, eps[r]);
      } else {
        store_accumulators(sums[r], kNR * 4);
      }
    }
  }
}

// ---- float16 inputs as three bfloat16 products, packed on the fly (the "amx" method for float16) ----
//
// Every float16 value x is the exact sum of two bfloat16 values: hi, x rounded to nearest (8 significant
// bits), and lo = x - hi (at most 4 significant bits, |lo| <= 2^-8 |x|; float16's exponent range lies well
// inside bfloat16's, so neither is ever subnormal). Then a b = a_hi b_hi + a_hi b_lo + a_lo b_hi + a_lo b_lo,
// each product exact in float32. The first three terms summed in float32 give a product of float16 matrices
// whose error is float32 accumulation's plus at most 2^-16 |a||b| per product (the dropped a_lo b_lo): 32x
// below the rounding of a float16 result. An infinite or NaN x gets hi = x and lo = 0 (so a product with one
// reads NaN where widening could give an infinity; either way the result is not finite).
//
// A step of 32 k values is packed as two blocks of the layout above, its hi values then its lo values, and the
// micro-kernel takes three products from them (accumulate_split_steps): a_hi b_hi + a_hi b_lo + a_lo b_hi, step
// by step, all in float32, in an order fixed by k alone. The packers above move 16-bit values without looking at
// them, so a panel of float16 bits is packed by them into L1-sized scratch, and each of its steps is then split
// into the two blocks of the panel the micro-kernel reads (twice as deep).
constexpr int kSplitCopies = 2;
constexpr int64_t kSplitMaxSteps = 32;                 // source k per call <= 1024: the scratch is 64 KiB
constexpr int64_t kStepHalves = kMR * kStep;           // 16-bit values per step of a panel, A or B (2 KiB)
static_assert(kMR * kStep == kNR * kStep, "A and B steps are the same size");

// One panel of float16 bits, per thread (64 KiB: kept off the stacks of OpenMP's threads).
struct alignas(64) SplitScratch {
  uint16_t halves[kSplitMaxSteps * kStepHalves];
};
thread_local SplitScratch t_split_scratch;

using PackPanels = void (*)(const PackSource&, int64_t, int64_t, int64_t, int64_t, int, float*);
void pack_split(PackPanels pack16, const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc,
                float* dst) {
  const int64_t steps = steps_of(kc);
  uint16_t* scratch = t_split_scratch.halves;
  uint16_t* out = reinterpret_cast<uint16_t*>(dst);
  for (int64_t q0 = 0; q0 < rows; q0 += kMR) {
    pack16(src, r0 + q0, min64(kMR, rows - q0), p0, kc, kMR, reinterpret_cast<float*>(scratch));
    for (int64_t t = 0; t < steps; ++t) {
      uint16_t* hi = out + t * kSplitCopies * kStepHalves;
      shim::split_f16_to_bf16(scratch + t * kStepHalves, kStepHalves, hi, hi + kStepHalves);
    }
    out += steps * kSplitCopies * kStepHalves;
  }
}

void pack_a_split(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, int /*width*/,
                  float* dst) {
  pack_split(pack_a, src, r0, rows, p0, kc, dst);
}

void pack_b_split(const PackSource& src, int64_t r0, int64_t cols, int64_t p0, int64_t kc, int /*width*/,
                  float* dst) {
  pack_split(pack, src, r0, cols, p0, kc, dst);
}

// The panels hold steps_of(kc) steps, bfloat16 or float16 split (Steps<Split>).
template <bool Split>
void micro_kernel(int64_t kc, const float* a_panel, const float* b_panel, int mr_used, int nr_used,
                  const Epilogue& ep) {
  run_tiles<Split>(steps_of(kc), a_panel, b_panel, mr_used, nr_used, ep);
}

template <bool Split>
void column_kernel(int64_t kc, const float* a_panels, int64_t a_stride, int count, const float* b_panel,
                   const int* mr_used, int nr_used, const Epilogue* eps) {
  run_column<Split>(steps_of(kc), a_panels, a_stride, count, b_panel, mr_used, nr_used, eps);
}

void thread_begin() { shim::configure_tiles(); }
void thread_end() { shim::release_tiles(); }

// This kernel's backend table on the shim it was compiled with, for bfloat16 inputs or the float16 split, with
// its cache blocks: Mc rows a chunk (one column of tiles, so at most kMaxColumnTiles of them), kc, nc.
enum class Inputs { kBFloat16, kFloat16Split };
template <int64_t Mc>
constexpr GemmBackend make_backend(const char* name, Inputs inputs, int64_t kc, int64_t nc) {
  static_assert(Mc % kMR == 0 && Mc / kMR <= kMaxColumnTiles, "a chunk of rows is one column of tiles");
  const bool split = inputs == Inputs::kFloat16Split;
  return {name,
          kMR,
          kNR,
          Mc,
          kc,
          nc,
          split ? pack_b_split : pack,
          split ? micro_kernel<true> : micro_kernel<false>,
          2,
          kStep,
          split ? pack_a_split : pack_a,
          thread_begin,
          thread_end,
          split ? kSplitCopies : 1,
          split ? column_kernel<true> : column_kernel<false>};
}

}  // namespace amx
}  // namespace
}  // namespace mixtrain::kernels::cpu
