// The square on the GPU: one thread per element, read as float32, the CPU kernel's products (no fused multiply-add),
// rounded once into the output's dtype, so it gives the CPU's bits.
#include <cuda_runtime.h>

#include <cstdint>

#include "../shared/elementwise_math.h"
#include "../shared/float16_convert.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/square.h"

namespace mixtrain::ops::cuda {

namespace {

using device::Floats;
using device::OutFloats;
using shared::load_as_float;
using shared::store_from_float;

__global__ void square_kernel(Floats x, OutFloats y, int64_t n) {
  device::for_each_index(n, [&](int64_t i) {
    const float v = load_as_float(x.p, x.code, i);
    store_from_float(y.p, y.code, i, shared::mul_rn(v, v));
  });
}

__global__ void square_backward_kernel(Floats dy, Floats x, OutFloats dx, int64_t n) {
  device::for_each_index(n, [&](int64_t i) {
    const float d = load_as_float(dy.p, dy.code, i), v = load_as_float(x.p, x.code, i);
    store_from_float(dx.p, dx.code, i, shared::mul_rn(d, shared::mul_rn(2.0f, v)));
  });
}

void square(const Tensor& x, Tensor& y) {
  const int64_t n = x.numel();
  if (!device::begin(x, n)) return;
  square_kernel<<<device::blocks_for(n), device::kThreads>>>(device::in(x), device::out(y), n);
  device::launched("square");
}

void square_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const int64_t n = x.numel();
  if (!device::begin(x, n)) return;
  square_backward_kernel<<<device::blocks_for(n), device::kThreads>>>(device::in(dy), device::in(x), device::out(dx),
                                                                      n);
  device::launched("square_backward");
}

}  // namespace

void register_square_kernels(Kernels& k) {
  k.set<Op::square>(&square);
  k.set<Op::square_backward>(&square_backward);
}

}  // namespace mixtrain::ops::cuda
