// CPU kernel of linear_activation: one GEMM whose post-op activates each block of the product as the GEMM
// finishes it, while the block is still in cache, instead of a second pass over the output in memory. The block
// holds the bits linear() would return, and activation_span is the activation kernel's own code, so y has the
// bits of the two ops run in turn.
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/matmul.h"
#include "activation_span.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {

// Where the activated values go: y (rows, n), contiguous.
struct ActivationTarget {
  Activation act;
  DType dtype;
  char* y;
  int64_t n;
};

// The post-op: each row of the finished block, read from C, activated into y (in place when C is y).
void activate_block(void* ctx, void* c, int64_t ldc, int64_t row, int64_t col, int64_t rows, int64_t cols) {
  const ActivationTarget& t = *static_cast<const ActivationTarget*>(ctx);
  const int64_t e = static_cast<int64_t>(dtype_size(t.dtype));
  for (int64_t i = 0; i < rows; ++i)
    activation_span(static_cast<const char*>(c) + i * ldc * e, t.y + ((row + i) * t.n + col) * e, t.dtype, cols,
                    t.act);
}

}  // namespace

void linear_activation(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::BmmLayout& l,
                       Activation act, Tensor& y, Tensor& pre) {
  // With a pre-activation to keep, the product goes there and each block is read from it into y; otherwise it
  // goes to y and is activated in place. Either way the block is read once, from cache.
  Tensor& c = pre.defined() ? pre : y;
  ActivationTarget target{act, y.dtype(), static_cast<char*>(y.raw()), l.n};
  kernels::gemm_with_post_op(l.trans_a, l.trans_b, l.m, l.n, l.k, a.dtype(), a.raw(), l.lda, b.raw(), l.ldb,
                             c.dtype(), c.raw(), l.n, /*accumulate=*/false,
                             bias.defined() ? bias.data<float>() : nullptr,
                             kernels::GemmPostOp{&activate_block, &target});
}

void register_linear_activation_kernels(Kernels& k) {
  k.set<Op::linear_activation>(&linear_activation);
}

}  // namespace mixtrain::ops::cpu
