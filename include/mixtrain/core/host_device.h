// MIXTRAIN_HOST_DEVICE marks an inline function that CUDA device code calls too (the 16-bit conversions of
// half.h, the CUDA backend's shared arithmetic), so one definition gives the same bits on the CPU and the GPU.
// It names no CUDA header: outside nvcc it is empty.
#pragma once

#if defined(__CUDACC__)
#define MIXTRAIN_HOST_DEVICE __host__ __device__
#else
#define MIXTRAIN_HOST_DEVICE
#endif
