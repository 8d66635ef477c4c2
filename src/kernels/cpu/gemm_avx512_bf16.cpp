// AVX-512 bfloat16 dot-product GEMM path: both operands stay bfloat16 in the packed panels, two
// consecutive k values per 32-bit slot, and the 12x32 micro-kernel does one vdpbf16ps per A pair and
// B vector (a pair broadcast from A times 16 column pairs of B: two products and two adds per lane).
// Half the packed bytes of the widening path and, where vdpbf16ps issues as fast as an FMA, twice the
// multiply-adds per instruction. Compiled with -mavx512f/bw/vl/dq -mavx512bf16 -mfma -mf16c; reached
// only for bfloat16 inputs when cpu_features() reports all of them (and the driver chose this method).
//
// Numerics: a product of two bfloat16 values is exact in float32. vdpbf16ps reads bfloat16 subnormal
// inputs as zero, flushes subnormal float32 results to zero and rounds to nearest even, whatever MXCSR
// says; each instruction adds the two products of a pair to the accumulator, so the sum still runs over
// p = 0, 1, ..., kc - 1 in pairs, in an order fixed by k alone.
#include <immintrin.h>

#include "kernels/cpu/gemm_avx512_common.h"

namespace mixtrain::kernels::cpu {
namespace {

constexpr int kMR = kAvx512MR;
constexpr int kNR = kAvx512NR;

// Mask of the first n of 32 16-bit lanes (n may be <= 0 or > 32).
inline __mmask32 first_lanes32(int64_t n) {
  if (n <= 0) return 0;
  if (n >= 32) return 0xFFFFFFFFu;
  return static_cast<__mmask32>((1u << n) - 1u);
}

// Panels of 32 packed side by side in one pass over the source rows (8 x 32 bfloat16 = 512 contiguous bytes a
// row), rather than one panel after another down all kc rows: one panel alone reads 64 bytes from each of kc rows
// a row stride apart, a new page for every row of a wide matrix, and measured at a quarter of the speed (a 4096 x
// 4096 weight on a Zen 5 core: 10 ms one panel at a time, 2.5 ms eight at a time).
constexpr int kPanelsPerPass = 8;

// kPanelsPerPass whole panels of 32 from rows contiguous in memory (see pack_rows_contiguous): each pair of source
// rows, 32 columns at a time, interleaved by two word permutes into the slots of one panel.
void pack_panels_rows_contiguous32(const uint16_t* base, int64_t ld, int64_t kc, float* dst) {
  alignas(64) static constexpr uint16_t kLowHalf[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHighHalf[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                         24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i low = _mm512_load_si512(kLowHalf), high = _mm512_load_si512(kHighHalf);
  const int64_t pairs = (kc + 1) / 2, panel = pairs * 32;
  for (int64_t s = 0; s < pairs; ++s) {
    const uint16_t* even = base + 2 * s * ld;
    const bool has_odd = 2 * s + 1 < kc;
    for (int q = 0; q < kPanelsPerPass; ++q) {
      const __m512i e = _mm512_loadu_si512(even + 32 * q);
      const __m512i o = has_odd ? _mm512_loadu_si512(even + ld + 32 * q) : _mm512_setzero_si512();
      float* slot = dst + q * panel + s * 32;
      _mm512_storeu_si512(slot, _mm512_permutex2var_epi16(e, low, o));
      _mm512_storeu_si512(slot + 16, _mm512_permutex2var_epi16(e, high, o));
    }
  }
}

// Rows contiguous in memory (element (r, p) at data[p * ld + r]): slot (s, r) takes its low half from
// source row 2s and its high half from source row 2s + 1 (zero past kc).
template <int W>
void pack_rows_contiguous(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, float* dst) {
  constexpr int kGroups = (W + 15) / 16;
  const int64_t pairs = (kc + 1) / 2;
  const uint16_t* data = static_cast<const uint16_t*>(src.data);
  int64_t q0 = 0;
  if constexpr (W == 32) {
    for (; q0 + kPanelsPerPass * W <= rows; q0 += kPanelsPerPass * W) {
      pack_panels_rows_contiguous32(data + p0 * src.ld + r0 + q0, src.ld, kc, dst);
      dst += kPanelsPerPass * pairs * W;
    }
  }
  for (; q0 < rows; q0 += W) {
    const int64_t used = min64(W, rows - q0);
    const uint16_t* base = data + p0 * src.ld + r0 + q0;
    for (int64_t s = 0; s < pairs; ++s) {
      const uint16_t* even = base + 2 * s * src.ld;
      const bool has_odd = 2 * s + 1 < kc;
      for (int g = 0; g < kGroups; ++g) {
        const __mmask16 store_mask = first_lanes(W - 16 * g);
        const __mmask16 load_mask = store_mask & first_lanes(used - 16 * g);
        const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(load_mask, even + 16 * g));
        __m512i v = lo;
        if (has_odd) {
          const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(load_mask, even + src.ld + 16 * g));
          v = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
        }
        _mm512_mask_storeu_epi32(dst + s * W + 16 * g, store_mask, v);
      }
    }
    dst += pairs * W;
  }
}

// k contiguous in memory (element (r, p) at data[r * ld + p]): a pair of bfloat16 is already one 32-bit
// slot, so 16 rows x 32 k are loaded as 16 x 16 slots and transposed in registers like float32.
template <int W>
void pack_k_contiguous(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, float* dst) {
  constexpr int kGroups = (W + 15) / 16;
  const int64_t pairs = (kc + 1) / 2;
  const uint16_t* data = static_cast<const uint16_t*>(src.data);
  for (int64_t q0 = 0; q0 < rows; q0 += W) {
    const int64_t used = min64(W, rows - q0);
    for (int64_t pb = 0; pb < kc; pb += 32) {
      const int64_t kn = min64(32, kc - pb);
      const __mmask32 k_mask = first_lanes32(kn);  // an odd kn leaves the last high half zero
      const int64_t slots = (kn + 1) / 2;
      for (int g = 0; g < kGroups; ++g) {
        __m512 t[16];  // (16 rows, 16 slots), then (16 slots, 16 rows)
        for (int r = 0; r < 16; ++r) {
          const int64_t row = 16 * g + r;
          t[r] = row < used ? _mm512_castsi512_ps(
                                  _mm512_maskz_loadu_epi16(k_mask, data + (r0 + q0 + row) * src.ld + p0 + pb))
                            : _mm512_setzero_ps();
        }
        transpose16(t);
        const __mmask16 store_mask = first_lanes(W - 16 * g);
        for (int64_t c = 0; c < slots; ++c) _mm512_mask_storeu_ps(dst + (pb / 2 + c) * W + 16 * g, store_mask, t[c]);
      }
    }
    dst += pairs * W;
  }
}

void pack(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, int width, float* dst) {
  if (width == kMR) {
    return src.k_contiguous ? pack_k_contiguous<kMR>(src, r0, rows, p0, kc, dst)
                            : pack_rows_contiguous<kMR>(src, r0, rows, p0, kc, dst);
  }
  return src.k_contiguous ? pack_k_contiguous<kNR>(src, r0, rows, p0, kc, dst)
                          : pack_rows_contiguous<kNR>(src, r0, rows, p0, kc, dst);
}

inline __m512bh as_bf16_pairs(__m512 v) { return (__m512bh)v; }  // same 64 bytes, new type

void micro_kernel(int64_t kc, const float* a, const float* b, int mr_used, int nr_used, const Epilogue& ep) {
  prefetch_c_tile(mr_used, ep);

  __m512 c[kMR][2];  // (12, 32) tile of C in registers
  // Every loop over c is unrolled so the compiler keeps c in registers.
#pragma GCC unroll 12
  for (int i = 0; i < kMR; ++i) c[i][0] = c[i][1] = _mm512_setzero_ps();
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t s = 0; s < pairs; ++s) {
    const __m512bh b0 = as_bf16_pairs(_mm512_load_ps(b));
    const __m512bh b1 = as_bf16_pairs(_mm512_load_ps(b + 16));
#pragma GCC unroll 12
    for (int i = 0; i < kMR; ++i) {
      // Broadcasting the slot's bits as a float32 moves them unchanged (no arithmetic on them).
      const __m512bh ai = as_bf16_pairs(_mm512_set1_ps(a[i]));
      c[i][0] = _mm512_dpbf16_ps(c[i][0], ai, b0);
      c[i][1] = _mm512_dpbf16_ps(c[i][1], ai, b1);
    }
    a += kMR;
    b += kNR;
  }

  finish_tile(c, mr_used, nr_used, ep);
}

}  // namespace

// k blocks twice as deep as the float32 path's in k, the same bytes: the A chunk (mc * kc bfloat16,
// 480 KiB) and the B panel in use (kc * 32 bfloat16, 128 KiB) share L2.
const GemmBackend kAvx512Bf16Backend = {"avx512_bf16", kMR, kNR, 120, 2048, 2048, pack, micro_kernel, 2};

}  // namespace mixtrain::kernels::cpu
