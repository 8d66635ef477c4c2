// The rotary embedding on the GPU: one thread per output element, read as float32, turned with its partner through
// shared/rotary_math.h on the host's float32 tables (the CPU kernel's arithmetic on the same cosines and sines),
// rounded once into the output's dtype, so it gives the CPU's bits.
#include <cuda_runtime.h>

#include <cstdint>

#include "../shared/float16_convert.h"
#include "../shared/rotary_math.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/rotary_embedding.h"

namespace mixtrain::ops::cuda {

namespace {

using device::Floats;
using device::OutFloats;
using shared::load_as_float;
using shared::store_from_float;

struct RotaryShape {
  int64_t length, cols, head_dim, rotated_width;
  bool inverse;
};

__global__ void rotary_kernel(Floats x, const float* cos, const float* sin, RotaryShape s, OutFloats y, int64_t n) {
  device::for_each_index(n, [&](int64_t i) {
    const int64_t col = i % s.cols, row = i / s.cols;
    const float own = load_as_float(x.p, x.code, i);
    if (col >= s.rotated_width) {
      store_from_float(y.p, y.code, i, own);
      return;
    }
    const shared::RotaryPlace p = shared::rotary_place(col, s.head_dim);
    const int64_t table = (row % s.length) * (s.head_dim / 2) + p.pair;
    const float partner = load_as_float(x.p, x.code, i - col + p.partner_col);
    store_from_float(y.p, y.code, i, shared::rotary_value(own, partner, cos[table], sin[table], p.first_half, s.inverse));
  });
}

void rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t head_dim, int64_t rotated_width,
                      bool inverse, Tensor& y) {
  const int64_t n = x.numel();
  if (!device::begin(x, n)) return;
  const RotaryShape s{x.dim(1), x.dim(2), head_dim, rotated_width, inverse};
  rotary_kernel<<<device::blocks_for(n), device::kThreads>>>(device::in(x), static_cast<const float*>(cos.raw()),
                                                             static_cast<const float*>(sin.raw()), s, device::out(y), n);
  device::launched("rotary_embedding");
}

}  // namespace

void register_rotary_embedding_kernels(Kernels& k) { k.set<Op::rotary_embedding>(&rotary_embedding); }

}  // namespace mixtrain::ops::cuda
