#include "mixtrain/autograd/linear_cross_entropy.h"

#include "mixtrain/ops/linear_cross_entropy.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

namespace {

void give_fresh(Var input, Tensor g) {
  if (input.defined() && input.requires_grad() && g.defined()) input.accumulate_grad_owned(std::move(g));
}

// The backward pass hands out gradients made for `seed`: on the CPU, where reading costs nothing, a different
// upstream gradient is refused rather than silently ignored.
void check_seed(const Tensor& upstream, const Tensor& seed) {
  if (!upstream.device().is_cpu() || !seed.device().is_cpu()) return;
  const float got = ops::cast(upstream, DType::kFloat32).contiguous().item();
  const float want = ops::cast(seed, DType::kFloat32).contiguous().item();
  MIXTRAIN_CHECK(got == want, "linear_cross_entropy: the backward pass was seeded with "
                                  << got << ", but the gradients were made in the forward pass for " << want
                                  << "; seed backward() with the seed given to the forward call");
}

}  // namespace

Var linear_cross_entropy(const Var& x, const Var& kernel, const Tensor& kernel_compute, const Var& bias,
                         const Tensor& labels, const Tensor& seed, int64_t chunk_rows, Tensor* correct) {
  const bool rec = should_record({&x, &kernel, &bias}) && seed.defined();
  const Tensor x2 = x.value().contiguous().reshape({-1, x.value().dim(-1)});  // (N, D)
  const Tensor labels1 = labels.contiguous().reshape({-1});                      // (N,)
  ops::LinearCrossEntropy r = ops::linear_cross_entropy(x2, kernel_compute, bias.defined() ? bias.value() : Tensor(),
                                                        labels1, rec ? seed : Tensor(), chunk_rows);
  if (correct) *correct = r.correct;
  Var out(std::move(r.loss), rec);
  if (rec) {
    record_backward(out, [x, kernel, bias, out, seed, dx = r.dx.reshape(x.shape()), dw = std::move(r.dw),
                          dbias = std::move(r.dbias)]() mutable {
      check_seed(out.grad(), seed);
      give_fresh(x, std::move(dx));
      give_fresh(kernel, std::move(dw));
      give_fresh(bias, std::move(dbias));
    });
  }
  return out;
}

}  // namespace mixtrain
