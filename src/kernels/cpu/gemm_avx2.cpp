// AVX2 GEMM path: 6x16 float32 micro-kernel (12 ymm accumulators, two B vectors, one A broadcast),
// packing that widens float16 (F16C vcvtph2ps) and bfloat16 (shift left 16) to float32 once. Compiled
// with -mavx2 -mfma -mf16c; reached only when cpu_features() reports all three.
#include <immintrin.h>

#include "kernels/cpu/gemm_backend.h"

namespace mixtrain::kernels::cpu {
namespace {

constexpr int kMR = 6;
constexpr int kNR = 16;

// Local helpers rather than std::min: see gemm_backend.h on inline functions in ISA files.
inline int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

constexpr int64_t element_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// Lane i is all ones when i < n: the mask for vmaskmovps.
inline __m256i first_lanes(int64_t n) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n < 0 ? 0 : n)), lanes);
}

// Loads 8 consecutive elements of dtype D as float32.
template <DType D>
inline __m256 load8(const void* p) {
  if constexpr (D == DType::kFloat32) {
    return _mm256_loadu_ps(static_cast<const float*>(p));
  } else if constexpr (D == DType::kFloat16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  } else {  // bfloat16 is the top half of a float32
    const __m128i bits = _mm_loadu_si128(static_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
}

// Loads the first n (0..8) elements, zero in the other lanes, reading nothing past element n.
template <DType D>
inline __m256 load_first(const void* p, int64_t n) {
  if (n >= 8) return load8<D>(p);
  alignas(32) unsigned char tmp[32] = {};
  if (n > 0) __builtin_memcpy(tmp, p, static_cast<size_t>(n * element_size(D)));
  return load8<D>(tmp);
}

inline __m256 load8(const void* p, DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return load8<DType::kFloat16>(p);
    case DType::kBFloat16:
      return load8<DType::kBFloat16>(p);
    default:
      return load8<DType::kFloat32>(p);
  }
}

// float32 -> bfloat16, round to nearest even, NaN kept quiet; integer arithmetic like half.h.
inline __m128i to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));  // ties go to the even neighbour
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i magnitude = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i bits = _mm256_blendv_epi8(rounded, quiet, nan);  // 8 x 32-bit, each <= 0xFFFF
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08));
}

// Rounds once into dtype and stores 8 elements.
inline void store8(void* p, DType dtype, __m256 v) {
  switch (dtype) {
    case DType::kFloat16:
      _mm_storeu_si128(static_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    case DType::kBFloat16:
      _mm_storeu_si128(static_cast<__m128i*>(p), to_bf16(v));
      break;
    default:
      _mm256_storeu_ps(static_cast<float*>(p), v);
  }
}

// In-place transpose of an 8x8 float32 block (rows in, columns out).
inline void transpose8(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3, then rows 4-7: each 128-bit lane holds 4 rows of one column
    s[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    s[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    s[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    s[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x31);
  }
}

// Rows contiguous in memory (element (r, p) at data[p * ld + r]): each packed row is a straight copy. The panels
// of a group are filled side by side, one source row at a time (about 512 contiguous bytes of it), rather than one
// panel down all kc rows (a new page for every row of a wide matrix; gemm_avx512.cpp measures it).
template <DType D, int W>
void pack_rows_contiguous(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, float* dst) {
  constexpr int kGroups = (W + 7) / 8;
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
          const __m256 v = load_first<D>(s + (q * W + 8 * g) * size, min64(8, used - 8 * g));
          if (W - 8 * g >= 8) {
            _mm256_storeu_ps(row + 8 * g, v);
          } else {
            _mm256_maskstore_ps(row + 8 * g, first_lanes(W - 8 * g), v);
          }
        }
      }
    }
    dst += panels * kc * W;
  }
}

// k contiguous in memory (element (r, p) at data[r * ld + p]): 8x8 blocks transposed in registers.
template <DType D, int W>
void pack_k_contiguous(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, float* dst) {
  constexpr int kGroups = (W + 7) / 8;
  const int64_t size = element_size(D);
  const char* data = static_cast<const char*>(src.data);
  for (int64_t q0 = 0; q0 < rows; q0 += W) {
    const int64_t used = min64(W, rows - q0);
    for (int64_t pb = 0; pb < kc; pb += 8) {
      const int64_t kn = min64(8, kc - pb);
      for (int g = 0; g < kGroups; ++g) {
        __m256 t[8];  // (8 rows, 8 k), then (8 k, 8 rows)
        for (int r = 0; r < 8; ++r) {
          const int64_t row = 8 * g + r;
          t[r] = row < used ? load_first<D>(data + ((r0 + q0 + row) * src.ld + p0 + pb) * size, kn)
                            : _mm256_setzero_ps();
        }
        transpose8(t);
        const int64_t width = min64(8, W - 8 * g);
        for (int64_t c = 0; c < kn; ++c) {
          if (width == 8) {
            _mm256_storeu_ps(dst + (pb + c) * W + 8 * g, t[c]);
          } else {
            _mm256_maskstore_ps(dst + (pb + c) * W + 8 * g, first_lanes(width), t[c]);
          }
        }
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
  __m256 c[kMR][2];  // (6, 16) tile of C in registers
  // Every loop over c is unrolled so the compiler keeps c in registers (an array it cannot fully
  // unroll stays on the stack, with a store per FMA).
#pragma GCC unroll 6
  for (int i = 0; i < kMR; ++i) c[i][0] = c[i][1] = _mm256_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_load_ps(b);
    const __m256 b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kMR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i);
      c[i][0] = _mm256_fmadd_ps(ai, b0, c[i][0]);
      c[i][1] = _mm256_fmadd_ps(ai, b1, c[i][1]);
    }
    a += kMR;
    b += kNR;
  }

  // The epilogue reads the tile from L1 rather than registers: indexing the accumulators by the
  // run-time row count would make the compiler keep them on the stack inside the k loop.
  alignas(32) float tile[kMR * kNR];  // (MR, NR)
#pragma GCC unroll 6
  for (int i = 0; i < kMR; ++i) {
    _mm256_store_ps(tile + i * kNR, c[i][0]);
    _mm256_store_ps(tile + i * kNR + 8, c[i][1]);
  }
  if (nr_used < kNR) return scalar_epilogue(tile, kNR, mr_used, nr_used, ep);  // right edge of C

  // Epilogue: out = alpha (tile + add) + bias, rounded once into out's dtype.
  const int64_t add_size = element_size(ep.add_dtype), out_size = element_size(ep.out_dtype);
  const __m256 alpha = _mm256_set1_ps(ep.alpha);
  for (int i = 0; i < mr_used; ++i) {
    __m256 v0 = _mm256_load_ps(tile + i * kNR), v1 = _mm256_load_ps(tile + i * kNR + 8);
    if (ep.add) {
      const char* row = static_cast<const char*>(ep.add) + i * ep.ld_add * add_size;
      v0 = _mm256_add_ps(v0, load8(row, ep.add_dtype));
      v1 = _mm256_add_ps(v1, load8(row + 8 * add_size, ep.add_dtype));
    }
    if (ep.alpha != 1.0f) {
      v0 = _mm256_mul_ps(v0, alpha);
      v1 = _mm256_mul_ps(v1, alpha);
    }
    if (ep.bias) {
      v0 = _mm256_add_ps(v0, _mm256_loadu_ps(ep.bias));
      v1 = _mm256_add_ps(v1, _mm256_loadu_ps(ep.bias + 8));
    }
    char* out = static_cast<char*>(ep.out) + i * ep.ld_out * out_size;
    store8(out, ep.out_dtype, v0);
    store8(out + 8 * out_size, ep.out_dtype, v1);
  }
}

}  // namespace

// The B panel in use (kc * 16 floats, 32 KiB) fits L1, the A chunk (mc * kc floats, 144 KiB) a 256 KiB
// L2, the B block (kc * nc floats, 4 MiB) L3: sizes that suit AVX2 CPUs with small caches.
const GemmBackend kAvx2Backend = {"avx2", kMR, kNR, 72, 512, 2048, pack, micro_kernel, 1};

}  // namespace mixtrain::kernels::cpu
