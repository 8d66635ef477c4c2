// The CUDA backend's pieces, private to the ops layer: the kernels (kernels.cu) and the installer (backend.cpp).
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/loss_scale.h"

namespace mixtrain::ops::cuda {

// Registers the allocator and fills the op tables' kCuda entries when a GPU is present.
CudaBackendStatus install_backend();

// Kernels, with the CPU kernels' signatures (ops/*.h, namespace kernel); inputs on one CUDA device.
void fill(Tensor& y, float value);
void unscale_and_check(const Tensor& scaled, const Tensor& scale_state, Tensor& found_inf, Tensor& out);
void update_loss_scale(Tensor& scale_state, Tensor& counters, const Tensor& found_inf, const LossScaleRule& rule);
void apply_loss_scale(const Tensor& loss, const Tensor& scale_state, Tensor& out);
void device_copy(const Tensor& src, Tensor& dst);

// Throws Error (kInternal) naming what failed when err is not cudaSuccess (err is a cudaError_t).
void check_cuda(int err, const char* what);

}  // namespace mixtrain::ops::cuda
