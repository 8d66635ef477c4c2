#include "mixtrain/autograd/transformer_functions.h"

#include "mixtrain/autograd/autocast.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/flash_attention.h"
#include "mixtrain/ops/matmul.h"

namespace mixtrain {

namespace {
// A new Var for an op's output; it requires grad when the op is recorded.
Var output(Tensor value, bool recorded) { return Var(std::move(value), recorded); }

// For a gradient freshly computed by the backward op and shared with nothing: the first one is kept as
// the Var's gradient without a copy.
void give_fresh(Var input, Tensor g) {
  if (input.defined() && input.requires_grad() && g.defined()) input.accumulate_grad_owned(std::move(g));
}
}  // namespace

Var embedding(const Tensor& ids, const Var& table, DType out_dtype) {
  const bool rec = should_record({&table});
  Var out = output(ops::embedding(ids, table.value(), out_dtype), rec);
  if (rec) {
    const int64_t input_dim = table.shape()[0];
    record_backward(out, [ids, table, out, input_dim]() {
      Var t = table;
      // Into the table's own gradient buffer (an arena's view) when free, touching only rows: this batch's, and
      // the ones the previous call there wrote (cleared), so the buffer still holds the dense gradient.
      Tensor into = t.requires_grad() ? t.fresh_gradient_destination(DType::kFloat32) : Tensor();
      if (into.defined() && into.device().is_cpu() && out.grad().device().is_cpu()) {
        std::vector<int64_t> rows = ops::embedding_backward_into(out.grad(), ids, into, t.gradient_buffer_rows());
        give_fresh(t, into);  // adopted as the gradient, without a copy
        t.set_gradient_buffer_rows(std::move(rows));
        return;
      }
      give_fresh(table, ops::embedding_backward(out.grad(), ids, input_dim));
    });
  }
  return out;
}

Var add_position_embedding(const Var& x, const Var& table, int64_t offset) {
  MIXTRAIN_CHECK(x.defined() && x.value().rank() == 3,
                 "add_position_embedding: input must be (batch, T, D), got "
                     << (x.defined() ? x.value().describe() : std::string("undefined")));
  MIXTRAIN_CHECK(table.defined() && table.value().rank() == 2 && table.shape()[1] == x.shape()[2],
                 "add_position_embedding: table must be (sequence_length, " << x.shape()[2] << "), got "
                                                                             << table.value().describe());
  const int64_t b = x.shape()[0], t = x.shape()[1], d = x.shape()[2], s = table.shape()[0];
  MIXTRAIN_CHECK(offset >= 0 && offset + t <= s, "add_position_embedding: positions [" << offset << ", " << offset + t
                                                                                      << ") are beyond the " << s
                                                                                      << " positions of the table");
  // x read as (batch, T * D) plus rows [offset, offset + T) of the table as one (T * D,) bias: bias_add adds in
  // float32 and rounds once, whatever the table's dtype.
  const Tensor positions = table.value().slice(0, offset, offset + t).reshape({t * d});
  const bool rec = should_record({&x, &table});
  Var out = output(ops::bias_add(x.value().reshape({b, t * d}), positions).reshape(x.shape()), rec);
  if (rec) {
    record_backward(out, [x, table, out, b, t, d, s, offset]() {
      if (x.requires_grad()) Var(x).accumulate_grad(out.grad());
      if (!table.requires_grad()) return;
      Tensor g = ops::full({s, d}, DType::kFloat32, 0.0f, table.value().device());
      g.slice(0, offset, offset + t).copy_from(ops::sum_rows(out.grad().reshape({b, t * d})).reshape({t, d}));
      give_fresh(table, g);
    });
  }
  return out;
}

Var layer_norm(const Var& x, const Var& gamma, const Var& beta, float epsilon) {
  ops::LayerNormOutput r = ops::layer_norm(x.value(), gamma.value(), beta.value(), epsilon);
  const bool rec = should_record({&x, &gamma, &beta});
  Var out = output(r.y, rec);
  if (rec) {
    const Tensor mean = r.mean, rstd = r.rstd;
    record_backward(out, [x, gamma, beta, mean, rstd, out]() {
      auto g = ops::layer_norm_backward(out.grad(), x.value(), mean, rstd, gamma.value(), x.requires_grad());
      give_fresh(x, g.dx);
      give_fresh(gamma, g.dgamma);
      give_fresh(beta, g.dbeta);
    });
  }
  return out;
}

Var rms_norm(const Var& x, const Var& scale, float epsilon) {
  ops::RmsNormOutput r = ops::rms_norm(x.value(), scale.value(), epsilon);
  const bool rec = should_record({&x, &scale});
  Var out = output(r.y, rec);
  if (rec) {
    const Tensor rstd = r.rstd;
    record_backward(out, [x, scale, rstd, out]() {
      auto g = ops::rms_norm_backward(out.grad(), x.value(), rstd, scale.value(), x.requires_grad());
      give_fresh(x, g.dx);
      give_fresh(scale, g.dscale);
    });
  }
  return out;
}

Var rotary_embedding(const Var& x_arg, const ops::RotaryOptions& options) {
  const Var x = autocast_operand(x_arg);
  const bool rec = should_record({&x});
  Var out = output(ops::rotary_embedding(x.value(), options), rec);
  if (rec) {
    record_backward(out, [x, options, out]() { give_fresh(x, ops::rotary_embedding_backward(out.grad(), options)); });
  }
  return out;
}

Var fused_projection(const Var& x, const std::vector<Var>& kernels, const std::vector<Tensor>& kernel_computes,
                     const std::vector<Var>& biases) {
  MIXTRAIN_CHECK(x.defined() && x.value().rank() >= 1, "fused_projection: input is undefined or a scalar");
  MIXTRAIN_CHECK(!kernels.empty() && kernels.size() == kernel_computes.size() && kernels.size() == biases.size(),
                 "fused_projection: needs as many kernels, kernel casts and biases (" << kernels.size() << ", "
                                                                                    << kernel_computes.size() << ", "
                                                                                    << biases.size() << ")");
  const int64_t in = x.shape()[-1];
  const DType dt = x.dtype();
  std::vector<int64_t> widths;
  int64_t total = 0;
  bool any_bias = false;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const Tensor& kc = kernel_computes[i];
    // The leading dimensions of the kernel must multiply to the input width: (in, ...) or, for an output
    // projection from heads, (heads, key_dim, out).
    int64_t lead = 1;
    for (int d = 0; kc.defined() && d < kc.rank() - 1 && lead < in; ++d) lead *= kc.dim(d);
    MIXTRAIN_CHECK(kernels[i].defined() && kc.defined() && kc.shape() == kernels[i].shape() && kc.dtype() == dt &&
                       kc.rank() >= 2 && lead == in,
                   "fused_projection: kernel " << i << " must have leading dimensions multiplying to the input width "
                                               << in << ", with a cast in " << dtype_name(dt)
                                               << " of its shape, got "
                                               << (kc.defined() ? kc.describe() : std::string("undefined")));
    widths.push_back(kc.numel() / in);
    if (biases[i].defined()) {
      MIXTRAIN_CHECK(biases[i].value().numel() == widths.back(),
                     "fused_projection: bias " << i << " " << biases[i].value().describe() << " does not have "
                                               << widths.back() << " elements");
      any_bias = true;
    }
    total += widths.back();
  }
  // The kernels side by side in one (in, total) matrix, and the biases in one float32 vector (a missing one
  // is zero): one GEMM with its bias epilogue instead of one per projection.
  const Device device = x.value().device();
  Tensor w = Tensor::empty({in, total}, dt, device);
  Tensor b = any_bias ? ops::full({total}, DType::kFloat32, 0.0f, device) : Tensor();
  int64_t at = 0;
  for (size_t i = 0; i < kernels.size(); ++i) {
    w.slice(1, at, at + widths[i]).copy_from(kernel_computes[i].reshape({in, widths[i]}));
    if (biases[i].defined()) b.slice(0, at, at + widths[i]).copy_from(biases[i].value().reshape({widths[i]}));
    at += widths[i];
  }
  bool rec = should_record({&x});
  for (size_t i = 0; i < kernels.size(); ++i) rec = rec || should_record({&kernels[i], &biases[i]});
  Var out = output(ops::linear(x.value(), w, b), rec);
  if (rec) {
    record_backward(out, [x, kernels, biases, w, widths, any_bias, out]() {
      auto g = ops::linear_backward(out.grad(), x.value(), w, x.requires_grad(), any_bias);
      give_fresh(x, g.dx);
      int64_t at = 0;
      for (size_t i = 0; i < kernels.size(); ++i) {
        const int64_t wi = widths[i];
        if (kernels[i].requires_grad())
          give_fresh(kernels[i], g.dw.slice(1, at, at + wi).contiguous().reshape(kernels[i].shape()));
        if (biases[i].defined() && biases[i].requires_grad())
          give_fresh(biases[i], g.dbias.slice(0, at, at + wi).contiguous().reshape(biases[i].shape()));
        at += wi;
      }
    });
  }
  return out;
}

Var packed_self_attention(const Var& qkv_arg, const ops::AttentionOptions& options, Tensor* logits) {
  const Var qkv = autocast_operand(qkv_arg);
  MIXTRAIN_CHECK(qkv.defined() && qkv.value().rank() == 3 && qkv.shape()[2] % 3 == 0,
                 "packed_self_attention: expected (batch, T, 3 * heads * key_dim), got "
                     << (qkv.defined() ? qkv.value().describe() : std::string("undefined")));
  const int64_t w = qkv.shape()[2] / 3;
  const Tensor& all = qkv.value();
  const Tensor q = all.slice(2, 0, w), k = all.slice(2, w, 2 * w), v = all.slice(2, 2 * w, 3 * w);
  const bool rec = should_record({&qkv});
  ops::AttentionOutput r = ops::scaled_dot_product_attention(q, k, v, options, /*keep_probs=*/rec, logits != nullptr);
  if (logits) *logits = r.logits;
  Var out = output(r.out, rec);
  if (rec) {
    const Tensor probs = r.probs;
    record_backward(out, [qkv, probs, options, out, w]() {
      const Tensor& all = qkv.value();
      Tensor g = Tensor::empty(all.shape(), all.dtype(), all.device());
      Tensor dq = g.slice(2, 0, w), dk = g.slice(2, w, 2 * w), dv = g.slice(2, 2 * w, 3 * w);
      ops::scaled_dot_product_attention_backward_into(out.grad(), all.slice(2, 0, w), all.slice(2, w, 2 * w),
                                                      all.slice(2, 2 * w, 3 * w), probs, options, dq, dk, dv);
      give_fresh(qkv, g);
    });
  }
  return out;
}

Var packed_flash_attention(const Var& qkv_arg, const ops::AttentionOptions& options) {
  const Var qkv = autocast_operand(qkv_arg);
  MIXTRAIN_CHECK(qkv.defined() && qkv.value().rank() == 3 && qkv.shape()[2] % 3 == 0,
                 "packed_flash_attention: expected (batch, T, 3 * heads * key_dim), got "
                     << (qkv.defined() ? qkv.value().describe() : std::string("undefined")));
  const int64_t w = qkv.shape()[2] / 3;
  const Tensor& all = qkv.value();
  ops::FlashAttentionOutput r =
      ops::flash_attention(all.slice(2, 0, w), all.slice(2, w, 2 * w), all.slice(2, 2 * w, 3 * w), options);
  const bool rec = should_record({&qkv});
  Var out = output(r.out, rec);
  if (rec) {
    // (B, H, T) float32 beside the output: all that backward keeps beyond q, k and v.
    const Tensor lse = r.lse;
    record_backward(out, [qkv, lse, options, out, w]() {
      const Tensor& all = qkv.value();
      Tensor g = Tensor::empty(all.shape(), all.dtype(), all.device());
      Tensor dq = g.slice(2, 0, w), dk = g.slice(2, w, 2 * w), dv = g.slice(2, 2 * w, 3 * w);
      ops::flash_attention_backward_into(out.grad(), all.slice(2, 0, w), all.slice(2, w, 2 * w),
                                         all.slice(2, 2 * w, 3 * w), out.value(), lse, options, dq, dk, dv);
      give_fresh(qkv, g);
    });
  }
  return out;
}

Var scaled_dot_product_attention(const Var& q_arg, const Var& k_arg, const Var& v_arg,
                                 const ops::AttentionOptions& options, Tensor* logits) {
  const Var q = autocast_operand(q_arg), k = autocast_operand(k_arg), v = autocast_operand(v_arg);
  const bool rec = should_record({&q, &k, &v});
  ops::AttentionOutput r =
      ops::scaled_dot_product_attention(q.value(), k.value(), v.value(), options, /*keep_probs=*/rec, logits != nullptr);
  if (logits) *logits = r.logits;
  Var out = output(r.out, rec);
  if (rec) {
    const Tensor probs = r.probs;
    record_backward(out, [q, k, v, probs, options, out]() {
      auto g = ops::scaled_dot_product_attention_backward(out.grad(), q.value(), k.value(), v.value(), probs, options);
      give_fresh(q, g.dq);
      give_fresh(k, g.dk);
      give_fresh(v, g.dv);
    });
  }
  return out;
}

}  // namespace mixtrain
