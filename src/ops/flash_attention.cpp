// Tiled attention entries: the packed layout's checks (attention_checks.h), output allocation, then the CPU kernel
// (cpu/flash_attention.cpp). Not yet a kernel of the backend table: it has no CUDA kernel, so the entries run it on
// the CPU only and refuse other devices by name (MultiHeadAttention keeps scaled_dot_product_attention there).
#include "mixtrain/ops/flash_attention.h"
#include "mixtrain/ops/dispatch.h"
#include "mixtrain/ops/transfer.h"

#include "attention_checks.h"
#include "cpu/flash_attention.h"

namespace mixtrain::ops {

using namespace attention_checks;

bool flash_attention_supported(const Device& device) { return device.type == DeviceType::kCpu; }

bool flash_attention_preferred(const Device& device, int64_t keys) {
  return flash_attention_supported(device) && keys > cpu::kFlashColumns;
}

namespace {
void check_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Device device = common_device(op, tensors);
  MIXTRAIN_CHECK(flash_attention_supported(device),
                 op << ": runs on the CPU only, got tensors on " << device.str()
                    << " (use scaled_dot_product_attention there)");
}
}  // namespace

FlashAttentionOutput flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  constexpr const char* op = "flash_attention";
  const Dims d = check_layout(q, k, v, options, op);
  check_device(op, {&q, &k, &v});
  FlashAttentionOutput r;
  r.out = Tensor::empty({d.b, d.t, d.h * d.dv}, q.dtype());
  r.lse = Tensor::empty({d.b, d.h, d.t}, DType::kFloat32);
  cpu::flash_attention(readable(q), readable(k), readable(v), options, r.out, r.lse);
  return r;
}

void flash_attention_backward_into(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, const AttentionOptions& options, Tensor& dq,
                                   Tensor& dk, Tensor& dv) {
  constexpr const char* op = "flash_attention_backward";
  const Dims d = check_layout(q, k, v, options, op);
  const Shape out_shape{d.b, d.t, d.h * d.dv};
  MIXTRAIN_CHECK(dout.defined() && is_float(dout.dtype()) && dout.shape() == out_shape,
                 op << ": gradient " << text(dout) << " does not match the output shape " << out_shape);
  MIXTRAIN_CHECK(out.defined() && out.dtype() == q.dtype() && out.shape() == out_shape,
                 op << ": output " << text(out) << " must be the forward's " << dtype_name(q.dtype()) << " "
                    << out_shape);
  MIXTRAIN_CHECK(lse.defined() && lse.dtype() == DType::kFloat32 && lse.shape() == Shape({d.b, d.h, d.t}),
                 op << ": log-sum-exp " << text(lse) << " must be the forward's float32 " << Shape({d.b, d.h, d.t}));
  check_gradient_target(dq, q, "dq", op);
  check_gradient_target(dk, k, "dk", op);
  check_gradient_target(dv, v, "dv", op);
  check_device(op, {&dout, &q, &k, &v, &out, &lse, &dq, &dk, &dv});
  cpu::flash_attention_backward(cast(dout, q.dtype()).contiguous(), readable(q), readable(k), readable(v),
                                out.contiguous(), lse.contiguous(), options, dq, dk, dv);
}

AttentionGrads flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& out, const Tensor& lse, const AttentionOptions& options) {
  check_layout(q, k, v, options, "flash_attention_backward");
  AttentionGrads g{Tensor::empty(q.shape(), q.dtype()), Tensor::empty(k.shape(), k.dtype()),
                   Tensor::empty(v.shape(), v.dtype())};
  flash_attention_backward_into(dout, q, k, v, out, lse, options, g.dq, g.dk, g.dv);
  return g;
}

}  // namespace mixtrain::ops
