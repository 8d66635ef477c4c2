// What the GPU tests share: skipping (or failing, under MIXTRAIN_REQUIRE_GPU=1) without the CUDA backend, and a
// byte-for-byte comparison of tensors on any device.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/dispatch.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops {

inline bool gpu_required() {
  const char* v = std::getenv("MIXTRAIN_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

// Skips (or fails, when a GPU is required) unless the backend is loaded.
#define REQUIRE_CUDA_BACKEND()                                                   \
  do {                                                                           \
    const CudaBackendStatus s_ = load_cuda_backend();                            \
    if (!s_.loaded) {                                                            \
      if (gpu_required()) FAIL() << "MIXTRAIN_REQUIRE_GPU=1 but: " << s_.detail; \
      GTEST_SKIP() << s_.detail;                                                 \
    }                                                                            \
  } while (0)

// Skips (or fails) unless the backend is loaded with its GEMM (cuBLASLt found): the GEMM, conv2d and attention.
#define REQUIRE_CUDA_GEMM()                                                                       \
  do {                                                                                            \
    REQUIRE_CUDA_BACKEND();                                                                       \
    if (!ops::supports<ops::Op::bmm>(DeviceType::kCuda)) {                                       \
      if (gpu_required()) FAIL() << "MIXTRAIN_REQUIRE_GPU=1 but: " << load_cuda_backend().detail; \
      GTEST_SKIP() << load_cuda_backend().detail;                                                 \
    }                                                                                             \
  } while (0)

inline const Device kGpu = Device::cuda(0);

// The compute capability of the first GPU, as major * 10 + minor, from the backend's description (0 if it gives none).
inline int first_gpu_capability() {
  const std::string& d = load_cuda_backend().devices.at(0);
  int major = 0, minor = 0;
  const size_t at = d.find("compute capability ");
  if (at == std::string::npos || std::sscanf(d.c_str() + at + 19, "%d.%d", &major, &minor) != 2) return 0;
  return major * 10 + minor;
}

// t on the first GPU (an undefined tensor stays undefined).
inline Tensor gpu(const Tensor& t) { return t.defined() ? to_device(t, kGpu) : t; }

// Same dtype, shape and bytes (two undefined tensors are equal), read back to the host.
inline bool bit_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  const Tensor ha = to_device(a, Device::cpu()), hb = to_device(b, Device::cpu());
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

}  // namespace mixtrain::ops
