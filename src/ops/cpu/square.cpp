// CPU kernels of the square: float32 products through the elementwise loops (elementwise_map.h), one rounding into
// the output's dtype. dx = dy * (2 x): doubling is exact, so the GPU's two multiplications give the same bits.
#include "mixtrain/ops/square.h"
#include "cpu_backend.h"
#include "elementwise_map.h"

namespace mixtrain::ops::cpu {

namespace {
void square(const Tensor& x, Tensor& y) {
  elementwise_map::map_unary(x, y, [](int64_t, float v) { return v * v; });
}

void square_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  elementwise_map::map_binary(dy, x, dx, [](float d, float v) { return d * (2.0f * v); });
}
}  // namespace

void register_square_kernels(Kernels& k) {
  k.set<Op::square>(&square);
  k.set<Op::square_backward>(&square_backward);
}

}  // namespace mixtrain::ops::cpu
