// The elementwise ops on the GPU (ops/elementwise.h's kernels): activations and their gradients, add, scale,
// bias_add and dropout. Each element is read as float32 from any floating dtype, goes through the CPU kernel's
// element step (ops/shared/elementwise_math.h, no fused multiply-add) and is rounded once into the output's dtype,
// so every op gives the CPU's bits except sigmoid and tanh, whose exp and tanh are CUDA's (within a few float32
// units of glibc's). Where the operands share one dtype (what a training step runs), activations, their gradients,
// add and scale are kernels templated on it that read 16 bytes at a time, one thread per vector
// (vector_map.cuh); other combinations, bias_add and dropout run one thread per element with the dtype read at
// run time. Both on a grid as large as the tensor asks for.
#include <cuda_runtime.h>

#include <cstdint>

#include "../shared/dropout_keep.h"
#include "../shared/elementwise_math.h"
#include "../shared/float16_convert.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/elementwise.h"
#include "vector_map.cuh"

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

// The element steps as functors, for the templated kernels (vector_map.cuh).
template <Activation A>
struct ActivationFn {
  MIXTRAIN_HOST_DEVICE float operator()(float v) const { return shared::activation_value(A, v); }
};
template <Activation A>
struct ActivationGradFn {
  MIXTRAIN_HOST_DEVICE float operator()(float d, float s) const { return shared::activation_grad(A, d, s); }
};
struct AddFn {
  MIXTRAIN_HOST_DEVICE float operator()(float a, float b) const { return shared::add_rn(a, b); }
};
struct ScaleFn {
  float s;
  MIXTRAIN_HOST_DEVICE float operator()(float v) const { return shared::mul_rn(v, s); }
};

// y = f(x) through the kernel templated on their one dtype; false when their dtypes differ.
template <typename Fn>
bool map_same_dtype(const Tensor& x, Tensor& y, int64_t n, const Fn& f) {
  if (x.dtype() != y.dtype()) return false;
  device::with_float_code(in(x).code, [&](auto code) {
    constexpr int C = decltype(code)::value;
    device::launch_map<C, C>(x.raw(), y.raw(), n, f);
  });
  return true;
}
// y = f(x1, x2) likewise, all three of one dtype.
template <typename Fn>
bool map2_same_dtype(const Tensor& x1, const Tensor& x2, Tensor& y, int64_t n, const Fn& f) {
  if (x1.dtype() != y.dtype() || x2.dtype() != y.dtype()) return false;
  device::with_float_code(in(y).code, [&](auto code) {
    constexpr int C = decltype(code)::value;
    device::launch_map2<C, C>(x1.raw(), x2.raw(), y.raw(), n, f);
  });
  return true;
}

template <Activation A>
void launch_activation(const Tensor& x, Tensor& y, int64_t n) {
  if (map_same_dtype(x, y, n, ActivationFn<A>{})) return;
  activation_kernel<A><<<device::blocks_uncapped(n), device::kThreads>>>(in(x), out(y), n);
}

template <Activation A>
void launch_activation_backward(const Tensor& dy, const Tensor& saved, Tensor& dx, int64_t n) {
  if (map2_same_dtype(dy, saved, dx, n, ActivationGradFn<A>{})) return;
  activation_backward_kernel<A><<<device::blocks_uncapped(n), device::kThreads>>>(in(dy), in(saved), out(dx), n);
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
  if (!map2_same_dtype(a, b, y, n, AddFn{}))
    add_kernel<<<device::blocks_uncapped(n), device::kThreads>>>(in(a), in(b), out(y), n);
  device::launched("add");
}

void scale(const Tensor& x, float s, Tensor& y) {
  const int64_t n = x.numel();
  if (!begin(x, n)) return;
  if (!map_same_dtype(x, y, n, ScaleFn{s}))
    scale_kernel<<<device::blocks_uncapped(n), device::kThreads>>>(in(x), s, out(y), n);
  device::launched("scale");
}

void bias_add(const Tensor& x, const Tensor& bias, Tensor& y) {
  const int64_t n = x.numel(), cols = bias.numel();
  if (cols == 0 || !begin(x, n)) return;
  bias_add_kernel<<<device::blocks_uncapped(n), device::kThreads>>>(in(x), in(bias), out(y), n, cols);
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
  dropout_mask_kernel<<<device::blocks_uncapped(n), device::kThreads>>>(rate, seed, mask.data<uint8_t>(), n);
  device::launched("dropout_mask");
}

void dropout(const Tensor& x, const Tensor& mask, float keep_scale, Tensor& y) {
  const int64_t n = x.numel();
  if (!begin(x, n)) return;
  dropout_kernel<<<device::blocks_uncapped(n), device::kThreads>>>(in(x), mask.data<uint8_t>(), keep_scale, out(y), n);
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
