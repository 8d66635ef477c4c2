// AVX-512 GEMM path: 12x32 float32 micro-kernel (24 zmm accumulators, two B vectors, A broadcast from
// memory), packing that widens float16 (vcvtph2ps) and bfloat16 (shift left 16) to float32 once, and an
// epilogue with masked stores for any tile width (gemm_avx512_common.h). Compiled with -mavx512f/bw/vl/dq
// -mfma -mf16c; reached only when cpu_features() reports all of them.
#include <immintrin.h>

#include "kernels/cpu/gemm_avx512_common.h"

namespace mixtrain::kernels::cpu {
namespace {

constexpr int kMR = kAvx512MR;
constexpr int kNR = kAvx512NR;

// Rows contiguous in memory (element (r, p) at data[p * ld + r]): each packed row is a straight copy. The panels
// of a group are filled side by side, one source row at a time (about 512 contiguous bytes of it), rather than one
// panel down all kc rows: one panel alone reads a few cache lines from each of kc rows a row stride apart, a new
// page for every row of a wide matrix (a 4096 x 4096 float32 weight on a Zen 5 core: about 3x slower).
template <DType D, int W>
void pack_rows_contiguous(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, float* dst) {
  constexpr int kGroups = (W + 15) / 16;
  constexpr int64_t kPanelsPerPass = (512 + W * element_size(D) - 1) / (W * element_size(D));
  const int64_t size = element_size(D);
  for (int64_t g0 = 0; g0 < rows; g0 += kPanelsPerPass * W) {
    const int64_t panels = min64(kPanelsPerPass, (rows - g0 + W - 1) / W);
    const char* base = static_cast<const char*>(src.data) + (p0 * src.ld + r0 + g0) * size;
    for (int64_t p = 0; p < kc; ++p) {
      const char* s = base + p * src.ld * size;
      for (int64_t q = 0; q < panels; ++q) {
        const int64_t used = min64(W, rows - g0 - q * W);
        float* row = dst + (q * kc + p) * W;
        for (int g = 0; g < kGroups; ++g) {
          const __mmask16 store_mask = first_lanes(W - 16 * g);
          const __m512 v = load16<D>(s + (q * W + 16 * g) * size, store_mask & first_lanes(used - 16 * g));
          _mm512_mask_storeu_ps(row + 16 * g, store_mask, v);
        }
      }
    }
    dst += panels * kc * W;
  }
}

// k contiguous in memory (element (r, p) at data[r * ld + p]): 16x16 blocks are loaded along k and
// transposed in registers.
template <DType D, int W>
void pack_k_contiguous(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, float* dst) {
  constexpr int kGroups = (W + 15) / 16;
  const int64_t size = element_size(D);
  const char* data = static_cast<const char*>(src.data);
  for (int64_t q0 = 0; q0 < rows; q0 += W) {
    const int64_t used = min64(W, rows - q0);
    for (int64_t pb = 0; pb < kc; pb += 16) {
      const int64_t kn = min64(16, kc - pb);
      const __mmask16 k_mask = first_lanes(kn);
      for (int g = 0; g < kGroups; ++g) {
        __m512 t[16];  // (16 rows, 16 k), then (16 k, 16 rows)
        for (int r = 0; r < 16; ++r) {
          const int64_t row = 16 * g + r;
          t[r] = row < used ? load16<D>(data + ((r0 + q0 + row) * src.ld + p0 + pb) * size, k_mask)
                            : _mm512_setzero_ps();
        }
        transpose16(t);
        const __mmask16 store_mask = first_lanes(W - 16 * g);
        for (int64_t c = 0; c < kn; ++c) _mm512_mask_storeu_ps(dst + (pb + c) * W + 16 * g, store_mask, t[c]);
      }
    }
    dst += kc * W;
  }
}

template <int W>
void pack_width(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, float* dst) {
  switch (src.dtype) {
    case DType::kFloat16:
      return src.k_contiguous ? pack_k_contiguous<DType::kFloat16, W>(src, r0, rows, p0, kc, dst)
                              : pack_rows_contiguous<DType::kFloat16, W>(src, r0, rows, p0, kc, dst);
    case DType::kBFloat16:
      return src.k_contiguous ? pack_k_contiguous<DType::kBFloat16, W>(src, r0, rows, p0, kc, dst)
                              : pack_rows_contiguous<DType::kBFloat16, W>(src, r0, rows, p0, kc, dst);
    default:
      return src.k_contiguous ? pack_k_contiguous<DType::kFloat32, W>(src, r0, rows, p0, kc, dst)
                              : pack_rows_contiguous<DType::kFloat32, W>(src, r0, rows, p0, kc, dst);
  }
}

void pack(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, int width, float* dst) {
  if (width == kMR) return pack_width<kMR>(src, r0, rows, p0, kc, dst);
  return pack_width<kNR>(src, r0, rows, p0, kc, dst);
}

void micro_kernel(int64_t kc, const float* a, const float* b, int mr_used, int nr_used, const Epilogue& ep) {
  prefetch_c_tile(mr_used, ep);

  __m512 c[kMR][2];  // (12, 32) tile of C in registers
  // Every loop over c is unrolled so the compiler keeps c in registers (an array it cannot fully
  // unroll stays on the stack, with a store per FMA).
#pragma GCC unroll 12
  for (int i = 0; i < kMR; ++i) c[i][0] = c[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    const __m512 b0 = _mm512_load_ps(b);
    const __m512 b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
    for (int i = 0; i < kMR; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i]);
      c[i][0] = _mm512_fmadd_ps(ai, b0, c[i][0]);
      c[i][1] = _mm512_fmadd_ps(ai, b1, c[i][1]);
    }
    a += kMR;
    b += kNR;
  }

  finish_tile(c, mr_used, nr_used, ep);
}

}  // namespace

// Deep k blocks: the A chunk (mc * kc floats, 480 KiB) and the B panel in use (kc * 32 floats, 128 KiB)
// share a 1 MiB L2, which feeds two B vectors per 24 FMAs easily; the B block (kc * nc, 8 MiB) sits in
// L3. Measured on a Zen 5 core, kc = 1024 beats an L1-sized kc = 256 by about 15%: a quarter of the
// passes over C, each of which loads and stores every C tile.
const GemmBackend kAvx512Backend = {"avx512", kMR, kNR, 120, 1024, 2048, pack, micro_kernel, 1};

}  // namespace mixtrain::kernels::cpu
