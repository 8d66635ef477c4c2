// Tiled attention entries: the packed layout's checks (attention_checks.h), output allocation on the inputs' device,
// then that device's kernel from the backend table: the CPU's (cpu/flash_attention.cpp) or the CUDA backend's
// (cuda/flash_attention.cu). A device without them is refused by name (MultiHeadAttention keeps
// scaled_dot_product_attention there).
#include "mixtrain/ops/flash_attention.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/dispatch.h"
#include "mixtrain/ops/transfer.h"

#include "attention_checks.h"

namespace mixtrain::ops {

using namespace attention_checks;

bool flash_attention_supported(const Device& device) {
  return supports<Op::flash_attention>(device.type) && supports<Op::flash_attention_backward>(device.type);
}

bool flash_attention_preferred(const Device& device, int64_t keys) {
  return flash_attention_supported(device) && keys > kFlashAttentionKeyTile;
}

namespace {
// The tensors' one device, where the kernel runs.
Device check_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Device device = common_device(op, tensors);
  MIXTRAIN_CHECK(flash_attention_supported(device),
                 op << ": no kernel for tensors on " << device.str()
                    << " (it runs on the CPU and on CUDA GPUs; use scaled_dot_product_attention there)");
  return device;
}
}  // namespace

FlashAttentionOutput flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  constexpr const char* op = "flash_attention";
  const Dims d = check_layout(q, k, v, options, op);
  const Device device = check_device(op, {&q, &k, &v});
  FlashAttentionOutput r;
  r.out = Tensor::empty({d.b, d.t, d.h * d.dv}, q.dtype(), device);
  r.lse = Tensor::empty({d.b, d.h, d.t}, DType::kFloat32, device);
  kernel_for<Op::flash_attention>(device)(readable(q), readable(k), readable(v), options, r.out, r.lse);
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
  const Device device = check_device(op, {&dout, &q, &k, &v, &out, &lse, &dq, &dk, &dv});
  kernel_for<Op::flash_attention_backward>(device)(cast(dout, q.dtype()).contiguous(), readable(q), readable(k),
                                                   readable(v), out.contiguous(), lse.contiguous(), options, dq, dk,
                                                   dv);
}

AttentionGrads flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& out, const Tensor& lse, const AttentionOptions& options) {
  check_layout(q, k, v, options, "flash_attention_backward");
  AttentionGrads g{Tensor::empty(q.shape(), q.dtype(), q.device()), Tensor::empty(k.shape(), k.dtype(), k.device()),
                   Tensor::empty(v.shape(), v.dtype(), v.device())};
  flash_attention_backward_into(dout, q, k, v, out, lse, options, g.dq, g.dk, g.dv);
  return g;
}

}  // namespace mixtrain::ops
