// The CPU backend's loader and the registration functions of its kernel files, private to the ops layer. Each file
// in src/ops/cpu/ that defines kernels ends with `void register_<file>_kernels(Kernels& k)`, which sets the members
// of its kernels; the list below is the one place that names the files, and the loader calls each.
#pragma once

#include "mixtrain/ops/backend.h"

// One entry per kernel file of src/ops/cpu/ (adding a kernel file adds its name here).
#define MIXTRAIN_CPU_KERNEL_FILES(X) \
  X(attention)                       \
  X(batch_norm)                      \
  X(cast)                            \
  X(conv2d)                          \
  X(elementwise)                     \
  X(fp8_gemm)                        \
  X(embedding)                       \
  X(fused_update)                    \
  X(flash_attention)                 \
  X(mx_block_quantize)               \
  X(global_norm)                     \
  X(layer_norm)                      \
  X(linear_activation)               \
  X(linear_cross_entropy)            \
  X(loss_scale)                      \
  X(losses)                          \
  X(matmul)                          \
  X(pooling)                         \
  X(reduce)                          \
  X(rms_norm)                        \
  X(softmax)                         \
  X(square)                          \
  X(multiply)                        \
  X(rotary_embedding)

namespace mixtrain::ops::cpu {

#define MIXTRAIN_DECLARE_CPU_REGISTRATION(file) void register_##file##_kernels(Kernels& k);
MIXTRAIN_CPU_KERNEL_FILES(MIXTRAIN_DECLARE_CPU_REGISTRATION)
#undef MIXTRAIN_DECLARE_CPU_REGISTRATION

}  // namespace mixtrain::ops::cpu
