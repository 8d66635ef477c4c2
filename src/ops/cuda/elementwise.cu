// The elementwise ops on the GPU (ops/elementwise.h's kernels): activations and their gradients, add, scale,
// bias_add and dropout. One thread per element (a grid-stride loop): each element is read as float32 from any
// floating dtype, goes through the CPU kernel's element step (ops/shared/elementwise_math.h, no fused
// multiply-add) and is rounded once into the output's dtype, so every op gives the CPU's bits except sigmoid
// and tanh, whose exp and tanh are CUDA's (within a few float32 units of glibc's).
#include <cuda_runtime.h>

#include <cstdint>

#include "../shared/dropout_keep.h"
#include "../shared/elementwise_math.h"
#include "../shared/float16_convert.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/elementwise.h"

namespace mixtrain::ops::cuda {

namespace {

using device::begin;
using device::Floats;
using device::in;
using device::out;
using device::OutFloats;
using shared::load_as_float;
using shared::store_from_float;

// The activation is a template argument so that each kernel holds only its own function.
template <Activation A>
__global__ void activation_kernel(Floats x, OutFloats y, int64_t n) {
  device::for_each_index(n, [&](int64_t i) {
    store_from_float(y.p, y.code, i, shared::activation_value(A, load_as_float(x.p, x.code, i)));
  });
}

template <Activation A>
__global__ void activation_backward_kernel(Floats dy, Floats saved, OutFloats dx, int64_t n) {
  device::for_each_index(n, [&](int64_t i) {
    const float d = load_as_float(dy.p, dy.code, i), s = load_as_float(saved.p, saved.code, i);
    store_from_float(dx.p, dx.code, i, shared::activation_grad(A, d, s));
  });
}

// y may be a (add_into): each element is read before it is written, by the same thread.
__global__ void add_kernel(Floats a, Floats b, OutFloats y, int64_t n) {
  device::for_each_index(n, [&](int64_t i) {
    store_from_float(y.p, y.code, i, shared::add_rn(load_as_float(a.p, a.code, i), load_as_float(b.p, b.code, i)));
  });
}

__global__ void scale_kernel(Floats x, float s, OutFloats y, int64_t n) {
  device::for_each_index(n, [&](int64_t i) {
    store_from_float(y.p, y.code, i, shared::mul_rn(load_as_float(x.p, x.code, i), s));
  });
}

// x, y (n / cols, cols); bias (cols,).
__global__ void bias_add_kernel(Floats x, Floats bias, OutFloats y, int64_t n, int64_t cols) {
  device::for_each_index(n, [&](int64_t i) {
    store_from_float(y.p, y.code, i,
                     shared::add_rn(load_as_float(x.p, x.code, i), load_as_float(bias.p, bias.code, i % cols)));
  });
}

__global__ void dropout_kernel(Floats x, const uint8_t* mask, float keep_scale, OutFloats y, int64_t n) {
  device::for_each_index(n, [&](int64_t i) {
    store_from_float(y.p, y.code, i, shared::dropout_value(load_as_float(x.p, x.code, i), mask[i], keep_scale));
  });
}

template <Activation A>
void launch_activation(const Tensor& x, Tensor& y, int64_t n) {
  activation_kernel<A><<<device::blocks_for(n), device::kThreads>>>(in(x), out(y), n);
}

template <Activation A>
void launch_activation_backward(const Tensor& dy, const Tensor& saved, Tensor& dx, int64_t n) {
  activation_backward_kernel<A><<<device::blocks_for(n), device::kThreads>>>(in(dy), in(saved), out(dx), n);
}

}  // namespace

void activation(const Tensor& x, Activation a, Tensor& y) {
  const int64_t n = x.numel();
  if (!begin(x, n)) return;
  switch (a) {
    case Activation::kLinear: launch_activation<Activation::kLinear>(x, y, n); break;
    case Activation::kRelu: launch_activation<Activation::kRelu>(x, y, n); break;
    case Activation::kGelu: launch_activation<Activation::kGelu>(x, y, n); break;
    case Activation::kSigmoid: launch_activation<Activation::kSigmoid>(x, y, n); break;
    case Activation::kTanh: launch_activation<Activation::kTanh>(x, y, n); break;
  }
  device::launched(activation_name(a));
}

void activation_backward(const Tensor& dy, const Tensor& saved, Activation a, Tensor& dx) {
  const int64_t n = dy.numel();
  if (!begin(dy, n)) return;
  switch (a) {
    case Activation::kLinear: launch_activation_backward<Activation::kLinear>(dy, saved, dx, n); break;
    case Activation::kRelu: launch_activation_backward<Activation::kRelu>(dy, saved, dx, n); break;
    case Activation::kGelu: launch_activation_backward<Activation::kGelu>(dy, saved, dx, n); break;
    case Activation::kSigmoid: launch_activation_backward<Activation::kSigmoid>(dy, saved, dx, n); break;
    case Activation::kTanh: launch_activation_backward<Activation::kTanh>(dy, saved, dx, n); break;
  }
  device::launched("activation_backward");
}

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  const int64_t n = a.numel();
  if (!begin(a, n)) return;
  add_kernel<<<device::blocks_for(n), device::kThreads>>>(in(a), in(b), out(y), n);
  device::launched("add");
}

void scale(const Tensor& x, float s, Tensor& y) {
  const int64_t n = x.numel();
  if (!begin(x, n)) return;
  scale_kernel<<<device::blocks_for(n), device::kThreads>>>(in(x), s, out(y), n);
  device::launched("scale");
}

void bias_add(const Tensor& x, const Tensor& bias, Tensor& y) {
  const int64_t n = x.numel(), cols = bias.numel();
  if (cols == 0 || !begin(x, n)) return;
  bias_add_kernel<<<device::blocks_for(n), device::kThreads>>>(in(x), in(bias), out(y), n, cols);
  device::launched("bias_add");
}

namespace {
__global__ void dropout_mask_kernel(float rate, uint64_t seed, uint8_t* mask, int64_t n) {
  device::for_each_index(n, [&](int64_t i) { mask[i] = shared::dropout_keep(seed, static_cast<uint64_t>(i), rate); });
}
}  // namespace

void dropout_mask(float rate, uint64_t seed, Tensor& mask) {
  const int64_t n = mask.numel();
  check_cuda(cudaSetDevice(mask.device().index), "cudaSetDevice");
  dropout_mask_kernel<<<device::blocks_for(n), device::kThreads>>>(rate, seed, mask.data<uint8_t>(), n);
  device::launched("dropout_mask");
}

void dropout(const Tensor& x, const Tensor& mask, float keep_scale, Tensor& y) {
  const int64_t n = x.numel();
  if (!begin(x, n)) return;
  dropout_kernel<<<device::blocks_for(n), device::kThreads>>>(in(x), mask.data<uint8_t>(), keep_scale, out(y), n);
  device::launched("dropout");
}

void register_elementwise_kernels(Kernels& k) {
  k.set<Op::activation>(&activation);
  k.set<Op::activation_backward>(&activation_backward);
  k.set<Op::add>(&add);
  k.set<Op::scale>(&scale);
  k.set<Op::bias_add>(&bias_add);
  k.set<Op::dropout>(&dropout);
  k.set<Op::dropout_mask>(&dropout_mask);
}

}  // namespace mixtrain::ops::cuda
