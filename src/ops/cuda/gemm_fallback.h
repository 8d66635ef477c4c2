// The GPU's own GEMM, for the products cuBLASLt offers no algorithm for (matmul.cpp): its heuristic answers per
// GPU and library version for each layout, alignment and dtype combination, and a product it declines runs here
// instead of failing. A tiled kernel over any strides and alignments, float32 accumulation
// (ops/shared/gemm_element.h), far slower than cuBLASLt's tensor cores: the count of products it ran says whether
// a model's step ever needed it.
//
// Plain C++ (no CUDA type), for host code of the backend and its GPU tests; defined in gemm_fallback.cu.
#pragma once

#include <cstdint>

#include "gemm_plan_cache.h"

namespace mixtrain::ops::cuda {

// p's count products into p.d by the tiled kernel (p.relu is not served: linear_activation's fused ReLU is
// cuBLASLt's epilogue or nothing). Device pointers, on the current device; launches only.
void gemm_fallback(const GemmProblem& p);

// Products gemm_fallback has run in this process.
int64_t gemm_fallback_products();

// While on, bmm sends every product to gemm_fallback and linear_activation keeps ReLU out of the product, so tests
// check the kernel on any GPU (cuBLASLt declines nothing they can name in advance). Off by default.
void set_gemm_fallback_only(bool on);
bool gemm_fallback_only();

}  // namespace mixtrain::ops::cuda
