// The CPU's cast: core's conversion (round to nearest even), which Tensor::to uses too.
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {
void cast(const Tensor& src, Tensor& dst) { dst.copy_from(src); }
}  // namespace

void register_cast_kernels(Kernels& k) { k.cast = &cast; }

}  // namespace mixtrain::ops::cpu
