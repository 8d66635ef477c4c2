// The interface between the portable GEMM driver (gemm.cpp: checks, blocking, threads) and the code for
// one instruction set (packing and the register-blocked micro-kernel).
//
// Each instruction set lives in its own translation unit compiled with its own flags. Those files must not
// call inline functions from shared headers (half.h, <algorithm>, ...): the linker keeps one copy of an
// inline function, and if it kept one compiled for AVX-512 the scalar path would crash on an older CPU.
// They use intrinsics (always inlined) and their own internal helpers only; this header holds plain data.
#pragma once

#include <cstdint>

#include "mixtrain/core/dtype.h"

namespace mixtrain::kernels::cpu {

// One operand as stored in memory, seen as the matrix X (rows, k) the GEMM needs: op(A) with rows = m,
// or op(B) transposed with rows = n. Element (r, p) is at data[r * ld + p] when k_contiguous,
// otherwise at data[p * ld + r].
struct PackSource {
  const void* data;
  int64_t ld;
  DType dtype;  // float32, float16 or bfloat16
  bool k_contiguous;
};

// What happens to a finished float32 tile T (mr, nr): out = alpha (T + add) + bias, rounded to out_dtype, each
// operation rounded to float32 on its own (no fused multiply-add). Pointers are already offset to the tile's first
// element; add and bias are optional (nullptr); alpha 1 multiplies by nothing.
struct Epilogue {
  const void* add;  // (mr, nr) with row stride ld_add: the partial sum so far, or the old C
  DType add_dtype;
  int64_t ld_add;
  void* out;  // (mr, nr) with row stride ld_out
  DType out_dtype;
  int64_t ld_out;
  const float* bias;  // (nr), added to every row
  float alpha = 1.0f;  // the sum's scale, before the bias (only on a product's last k block)
  // out is a large C (gemm.cpp: kStreamOutBytes) that leaves the caches before anything reads it again: a path may
  // write whole 64-byte-aligned lines of it with non-temporal stores, which skip reading each line in first. The
  // driver fences after the slab.
  bool stream_out = false;
};

struct GemmBackend {
  const char* name;
  int mr, nr;          // micro-tile: C rows x C columns held in registers
  int64_t mc, kc, nc;  // cache blocks: mc, nc multiples of mr, nr

  // Packs rows [r0, r0 + rows) and k range [p0, p0 + kc) of src into panels of `width` rows (width is
  // mr for A, nr for B) made of 32-bit slots, each holding k_per_slot consecutive k values of one row.
  // k_per_slot = 1: float32 slots; panel q is (kc, width) at dst + q * kc * width, element (p, r) at
  // [p * width + r]. k_per_slot = 2: bfloat16 pairs, (k = 2s in the low half, 2s + 1 in the high half);
  // panel q is (ceil(kc / 2), width) at dst + q * ceil(kc / 2) * width, and an odd kc pads the last
  // pair with +0. Rows past the end of the last panel are zero. dst is 64-byte aligned.
  void (*pack)(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, int width, float* dst);

  // a: packed A panel; b: packed B panel, both kc deep. Computes the float32 tile a^T b in the order
  // p = 0, 1, ..., kc - 1 (one slot at a time) and hands its top-left (mr_used, nr_used) corner to the
  // epilogue.
  void (*micro_kernel)(int64_t kc, const float* a, const float* b, int mr_used, int nr_used, const Epilogue& ep);

  int k_per_slot;  // 1, or 2 for the bfloat16 dot-product and AMX paths (which pack only bfloat16 inputs)

  // Optional, zero/null for the register-blocked paths:
  // Packed panels hold k padded with zeros to a multiple of k_align (0: no padding beyond k_per_slot),
  // so a panel is ceil(kc / k_align) * k_align / k_per_slot slots deep.
  int k_align = 0;
  // Packs A when A's panels differ from B's (the AMX path: A rows with k contiguous, B in pairs).
  void (*pack_a)(const PackSource& src, int64_t r0, int64_t rows, int64_t p0, int64_t kc, int width,
                 float* dst) = nullptr;
  // Called by each thread before its first micro-kernel of a GEMM and after its last (AMX tile
  // configuration and release).
  void (*thread_begin)() = nullptr;
  void (*thread_end)() = nullptr;
  // Packed steps per step of source k: 2 where each float16 input is packed as two bfloat16 pieces, hi and lo (the
  // AMX float16 split), so a panel of source depth kc is k_copies times as deep.
  int k_copies = 1;
  // Optional: micro_kernel for `count` A panels of one chunk (at most mc / mr; panel r at a + r * a_stride
  // floats, tile r has mr_used[r] rows and takes eps[r]) against one B panel, with the same bits, in an order
  // that keeps the B panel in L1.
  void (*column_kernel)(int64_t kc, const float* a, int64_t a_stride, int count, const float* b, const int* mr_used,
                        int nr_used, const Epilogue* eps) = nullptr;
};

// Plain data, so selecting a path never runs code compiled for an instruction set the CPU lacks.
extern const GemmBackend kScalarBackend;
extern const GemmBackend kAvx2Backend;
extern const GemmBackend kAvx512Backend;
// bfloat16 inputs only, with vdpbf16ps; needs the AVX-512 path's features plus AVX512_BF16.
extern const GemmBackend kAvx512Bf16Backend;
// bfloat16 inputs only, with AMX tiles (tdpbf16ps); needs the AVX-512 path's features, AMX-BF16 and the
// tile state granted by the OS (request_amx_permission()).
extern const GemmBackend kAmxBackend;
// The same AMX kernel source on the portable emulation of its instructions (amx_shim_emulated.h): runs
// on any CPU, slowly; for the tests.
extern const GemmBackend kAmxEmulatedBackend;

// float16 inputs only, on the AMX kernel: each value packed as two bfloat16 pieces, three tile products per
// step (gemm_amx_kernel.h), float32 sums throughout. Same requirements as kAmxBackend.
extern const GemmBackend kAmxF16Backend;
// The same on the portable emulation; for the tests.
extern const GemmBackend kAmxF16EmulatedBackend;

// float16 inputs only, with AVX512-FP16 FMAs on float16 partial sums promoted to float32 every
// f16_promote_pairs() products per lane; needs the AVX-512 path's features plus AVX512-FP16.
extern const GemmBackend kAvx512Fp16Backend;
// The same float16 kernel source on the portable emulation of its instructions; for the tests.
extern const GemmBackend kAvx512Fp16EmulatedBackend;

// How many products (pairs of k values) a float16 partial sum of the AVX512-FP16 path holds before it
// is promoted to float32: gemm_f16_promote_interval() / 2. Defined by the driver (gemm.cpp).
int64_t f16_promote_pairs();

// The epilogue for a tile held in memory (mr, nr) with row stride ld_tile; the vector paths use it for
// tiles cut by the right edge of C. Same arithmetic as theirs: (tile + add) + bias, then one rounding.
void scalar_epilogue(const float* tile, int64_t ld_tile, int mr, int nr, const Epilogue& ep);

}  // namespace mixtrain::kernels::cpu
