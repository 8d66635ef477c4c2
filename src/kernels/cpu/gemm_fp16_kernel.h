// The AVX512-FP16 GEMM kernel for float16 inputs: packing and the 12x32 micro-kernel, written against
// the instruction shim (namespace shim: fp16_shim_native.h or fp16_shim_emulated.h, included before
// this file). gemm_fp16.cpp compiles it with the real instructions, gemm_fp16_emulated.cpp with the
// portable emulation, so the tests run this very code on every CPU.
//
// Layout: like the bfloat16 dot path, both operands are packed as 32-bit slots holding a pair of
// consecutive k values (k = 2s low, 2s + 1 high; an odd kc pads the last pair with +0): A panels
// (ceil(kc / 2), 12) and B panels (ceil(kc / 2), 32). A slot broadcast to a whole vector times a vector
// of 16 B slots is 32 float16 products at once: lane 2c takes the even k of column c, lane 2c + 1 the
// odd k. vbroadcastss loads the pair, so no 16-bit broadcast (a shuffle) sits in the loop.
//
// Numerics, the one place where mixtrain does not sum in float32: vfmadd231ph rounds every partial sum to
// float16. Each lane sums at most f16_promote_pairs() products in float16 (one every two k values), then
// the partial sum is converted (exactly) and added to a float32 sum held in L1, and the lane starts
// again from zero; at the end of the k block the even and odd lanes of each column are added in float32
// and the epilogue runs as on every path. So the error is the float32 path's plus that of short float16
// sums, which the promotion interval bounds (gemm.h: gemm_f16_promote_interval()). The order depends on k
// alone, so the bits do not depend on the thread count.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm_backend.h"

namespace mixtrain::kernels::cpu {
namespace {
namespace fp16 {

constexpr int kMR = 12;
constexpr int kNR = 32;  // two vectors of 16 column pairs

inline int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }
inline int clamp16(int64_t n) { return n <= 0 ? 0 : (n >= 16 ? 16 : static_cast<int>(n)); }

// Rows contiguous in memory (element (r, p) at data[p * ld + r]): slot (s, r) takes its low half from
// source row 2s and its high half from source row 2s + 1 (zero past kc). The panels of a group are filled side by
// side, a pair of source rows at a time (about 512 contiguous bytes of each), rather than one panel down all kc
// rows, which reads a cache line or two from each of kc rows a row stride apart: a new page for every row of a
// wide matrix, several times slower (gemm_avx512_bf16.cpp, the same packing for vdpbf16ps).
template <int W>
void pack_rows_contiguous(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, uint32_t* dst) {
  constexpr int64_t kPanelsPerPass = (256 + W - 1) / W;  // 256 16-bit values a row
  const uint16_t* data = static_cast<const uint16_t*>(src.data);
  const int64_t pairs = (kc + 1) / 2;
  alignas(64) uint32_t group[16];
  for (int64_t g0 = 0; g0 < rows; g0 += kPanelsPerPass * W) {
    const int64_t panels = min64(kPanelsPerPass, (rows - g0 + W - 1) / W);
    for (int64_t s = 0; s < pairs; ++s) {
      const bool has_odd = 2 * s + 1 < kc;
      for (int64_t q = 0; q < panels; ++q) {
        const int64_t q0 = g0 + q * W, used = min64(W, rows - q0);
        const uint16_t* even = data + (p0 + 2 * s) * src.ld + r0 + q0;
        uint32_t* slot = dst + (q * pairs + s) * W;
        for (int g = 0; 16 * g < W; ++g) {
          const int n = clamp16(used - 16 * g), width = clamp16(W - 16 * g);
          shim::interleave_pairs(even + 16 * g, has_odd ? even + src.ld + 16 * g : nullptr, n, group);
          std::memcpy(slot + 16 * g, group, static_cast<size_t>(width) * 4);
        }
      }
    }
    dst += panels * pairs * W;
  }
}

// k contiguous in memory (element (r, p) at data[r * ld + p]): a pair is already one 32-bit slot, so
// blocks of 16 rows x 16 pairs are transposed.
template <int W>
void pack_k_contiguous(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, uint32_t* dst) {
  const uint16_t* data = static_cast<const uint16_t*>(src.data);
  const int64_t pairs = (kc + 1) / 2;
  alignas(64) uint32_t block[16 * 16];  // (16 pairs, 16 rows)
  for (int64_t q0 = 0; q0 < rows; q0 += W) {
    const int64_t used = min64(W, rows - q0);
    for (int64_t pb = 0; pb < kc; pb += 32) {
      const int kn = static_cast<int>(min64(32, kc - pb));
      const int slots = (kn + 1) / 2;
      for (int g = 0; 16 * g < W; ++g) {
        const int n = clamp16(used - 16 * g), width = clamp16(W - 16 * g);
        shim::transpose16_u32(data + (r0 + q0 + 16 * g) * src.ld + p0 + pb, src.ld * 2, n, kn, block, 16);
        for (int j = 0; j < slots; ++j)
          std::memcpy(dst + (pb / 2 + j) * W + 16 * g, block + j * 16, static_cast<size_t>(width) * 4);
      }
    }
    dst += pairs * W;
  }
}

void pack(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, int width, float* dst) {
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  if (width == kMR) {
    return src.k_contiguous ? pack_k_contiguous<kMR>(src, r0, rows, p0, kc, out)
                            : pack_rows_contiguous<kMR>(src, r0, rows, p0, kc, out);
  }
  return src.k_contiguous ? pack_k_contiguous<kNR>(src, r0, rows, p0, kc, out)
                          : pack_rows_contiguous<kNR>(src, r0, rows, p0, kc, out);
}

void micro_kernel(int64_t kc, const float* a, const float* b, int mr_used, int nr_used, const Epilogue& ep) {
  shim::prefetch_c(mr_used, ep);
  const int64_t pairs = (kc + 1) / 2, interval = f16_promote_pairs();
  alignas(64) float sum[kMR][2][32] = {};  // float32 sums per row and vector, lanes (column, k parity)
  for (int64_t s = 0; s < pairs;) {
    const int64_t end = min64(pairs, s + interval);
    shim::VecH c[kMR][2];  // float16 partial sums, in registers
#pragma GCC unroll 12
    for (int i = 0; i < kMR; ++i) c[i][0] = c[i][1] = shim::zero_h();
    for (; s < end; ++s) {
      const shim::VecH b0 = shim::load_h(b), b1 = shim::load_h(b + 16);
#pragma GCC unroll 12
      for (int i = 0; i < kMR; ++i) {
        const shim::VecH ai = shim::broadcast_pair(a + i);
        c[i][0] = shim::fma_h(ai, b0, c[i][0]);
        c[i][1] = shim::fma_h(ai, b1, c[i][1]);
      }
      a += kMR;
      b += kNR;
    }
#pragma GCC unroll 12
    for (int i = 0; i < kMR; ++i) {
      shim::accumulate_f32(c[i][0], sum[i][0]);
      shim::accumulate_f32(c[i][1], sum[i][1]);
    }
  }
  alignas(64) float tile[kMR * kNR];  // (12, 32): even plus odd lanes of each column
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < 2; ++v)
      for (int col = 0; col < 16; ++col) tile[i * kNR + 16 * v + col] = sum[i][v][2 * col] + sum[i][v][2 * col + 1];
  shim::finish(tile, mr_used, nr_used, ep);
}

}  // namespace fp16
}  // namespace
}  // namespace mixtrain::kernels::cpu
