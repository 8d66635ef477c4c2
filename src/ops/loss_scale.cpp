#include "mixtrain/ops/loss_scale.h"

namespace mixtrain::ops {

namespace cpu {
int64_t unscale_and_count_nonfinite(const Tensor& scaled, float inv_scale, Tensor& out);
}  // namespace cpu

namespace kernel {
KernelTable<UnscaleFn>& unscale_table() {
  static KernelTable<UnscaleFn> t("unscale_and_count_nonfinite", &cpu::unscale_and_count_nonfinite);
  return t;
}
}  // namespace kernel

int64_t unscale_and_count_nonfinite(const Tensor& scaled, float inv_scale, Tensor& out) {
  constexpr const char* op = "unscale_and_count_nonfinite";
  MIXTRAIN_CHECK(scaled.defined() && is_float(scaled.dtype()),
                 op << ": the gradients must be a floating tensor, got "
                    << (scaled.defined() ? scaled.describe() : std::string("an undefined tensor")));
  MIXTRAIN_CHECK(out.defined() && out.dtype() == DType::kFloat32 && out.is_contiguous() &&
                     out.numel() == scaled.numel(),
                 op << ": the output " << (out.defined() ? out.describe() : std::string("(undefined)"))
                    << " must be contiguous float32 with the element count of " << scaled.describe());
  const Device device = common_device(op, {&scaled, &out});
  if (scaled.numel() == 0) return 0;
  const Tensor sc = scaled.contiguous();
  return kernel::unscale_table()(device)(sc, inv_scale, out);
}

int64_t unscale_and_count_nonfinite(Tensor& grads, float inv_scale) {
  MIXTRAIN_CHECK(grads.defined() && grads.dtype() == DType::kFloat32 && grads.is_contiguous(),
                 "unscale_and_count_nonfinite: in place needs a contiguous float32 tensor, got "
                     << (grads.defined() ? grads.describe() : std::string("an undefined tensor"))
                     << "; pass a float32 output for 16-bit gradients");
  return unscale_and_count_nonfinite(grads, inv_scale, grads);
}

}  // namespace mixtrain::ops
