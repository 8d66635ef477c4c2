// CPU kernel of the element-wise product: one float32 product through the elementwise loops (elementwise_map.h),
// one rounding into the output's dtype; the GPU's single multiplication gives the same bits.
#include "mixtrain/ops/multiply.h"
#include "cpu_backend.h"
#include "elementwise_map.h"

namespace mixtrain::ops::cpu {

namespace {
void multiply(const Tensor& a, const Tensor& b, Tensor& y) {
  elementwise_map::map_binary(a, b, y, [](float u, float v) { return u * v; });
}
}  // namespace

void register_multiply_kernels(Kernels& k) { k.set<Op::multiply>(&multiply); }

}  // namespace mixtrain::ops::cpu
