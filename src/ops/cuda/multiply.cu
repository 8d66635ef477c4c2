// The element-wise product on the GPU: one thread per element, read as float32, the CPU kernel's single product (no
// fused multiply-add), rounded once into the output's dtype, so it gives the CPU's bits.
#include <cuda_runtime.h>

#include <cstdint>

#include "../shared/elementwise_math.h"
#include "../shared/float16_convert.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/multiply.h"

namespace mixtrain::ops::cuda {

namespace {

using device::Floats;
using device::OutFloats;
using shared::load_as_float;
using shared::store_from_float;

__global__ void multiply_kernel(Floats a, Floats b, OutFloats y, int64_t n) {
  device::for_each_index(n, [&](int64_t i) {
    store_from_float(y.p, y.code, i, shared::mul_rn(load_as_float(a.p, a.code, i), load_as_float(b.p, b.code, i)));
  });
}

void multiply(const Tensor& a, const Tensor& b, Tensor& y) {
  const int64_t n = a.numel();
  if (!device::begin(a, n)) return;
  multiply_kernel<<<device::blocks_for(n), device::kThreads>>>(device::in(a), device::in(b), device::out(y), n);
  device::launched("multiply");
}

}  // namespace

void register_multiply_kernels(Kernels& k) { k.set<Op::multiply>(&multiply); }

}  // namespace mixtrain::ops::cuda
