// Attention entries: validation of the packed layout, output allocation, dispatch (kernels in
// cpu/attention.cpp).
#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/dtype_check.h"
#include "mixtrain/ops/transfer.h"

#include <algorithm>
#include <cmath>

#include "attention_checks.h"
#include "shared/attention_rows.h"

namespace mixtrain::ops {

// splitmix64's finalizer over (seed, index): consecutive indices give independent-looking bits. The GPU kernel
// draws the same mask from the same function.
bool attention_dropout_keep(uint64_t seed, uint64_t index, float rate) {
  return shared::attention_dropout_keep(seed, index, rate);
}

namespace attention_checks {

std::string text(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

// Checks the packed layout and returns its dimensions.
Dims check_layout(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, const char* op) {
  for (const Tensor* x : {&q, &k, &v})
    MIXTRAIN_CHECK(x->defined() && is_float(x->dtype()) && x->rank() == 3,
                   op << ": q, k and v must be floating (batch, length, heads * head_dim) tensors, got "
                      << text(*x));
  check_same_dtype(op, "q", q, "k", k);
  check_same_dtype(op, "q", q, "v", v);
  MIXTRAIN_CHECK(o.num_heads > 0, op << ": num_heads must be positive, got " << o.num_heads);
  const int64_t h = o.num_heads;
  MIXTRAIN_CHECK(q.dim(2) % h == 0 && k.dim(2) % h == 0 && v.dim(2) % h == 0 && q.dim(2) > 0 && v.dim(2) > 0,
                 op << ": the last axes of q " << q.describe() << ", k " << k.describe() << " and v " << v.describe()
                    << " must be positive multiples of num_heads " << h);
  MIXTRAIN_CHECK(q.dim(2) == k.dim(2), op << ": q " << q.describe() << " and k " << k.describe()
                                          << " must have the same heads * key_dim");
  MIXTRAIN_CHECK(q.dim(0) == k.dim(0) && q.dim(0) == v.dim(0) && k.dim(1) == v.dim(1),
                 op << ": batch and key lengths differ: q " << q.describe() << ", k " << k.describe() << ", v "
                    << v.describe());
  MIXTRAIN_CHECK(!o.causal || q.dim(1) <= k.dim(1),
                 op << ": causal attention needs at most as many queries as keys (the queries are the last "
                       "positions), got q "
                    << q.describe() << " and k " << k.describe());
  MIXTRAIN_CHECK(k.dim(1) > 0, op << ": no keys to attend to in " << k.describe());
  MIXTRAIN_CHECK(o.dropout_rate >= 0.0f && o.dropout_rate < 1.0f,
                 op << ": dropout rate must be in [0, 1), got " << o.dropout_rate);
  MIXTRAIN_CHECK(std::isfinite(o.scale), op << ": scale must be finite, got " << o.scale);
  return Dims{q.dim(0), q.dim(1), k.dim(1), h, q.dim(2) / h, v.dim(2) / h};
}

// Whether the kernel can read (or write) t in place: (B, L, W) with dense rows (unit stride along W) that
// do not overlap (row stride >= W) and batches that do not overlap either.
bool rows_in_place(const Tensor& t) {
  const auto& st = t.strides();
  const int64_t b = t.dim(0), l = t.dim(1), w = t.dim(2);
  return (w <= 1 || st[2] == 1) && (l <= 1 || st[1] >= w) && (b <= 1 || st[0] >= std::max<int64_t>(l, 1) * std::max<int64_t>(st[1], w));
}

// t itself when the kernel reads it in place, else a contiguous copy.
Tensor readable(const Tensor& t) { return rows_in_place(t) ? t : t.contiguous(); }

void check_gradient_target(const Tensor& g, const Tensor& like, const char* what, const char* op) {
  MIXTRAIN_CHECK(g.defined() && g.dtype() == like.dtype() && g.shape() == like.shape() && rows_in_place(g),
                 op << ": " << what << " must be a " << like.describe()
                    << " tensor with dense rows (unit stride along the last axis), got " << text(g));
}

}  // namespace attention_checks

using namespace attention_checks;

AttentionOutput scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options, bool keep_probs, bool return_logits) {
  constexpr const char* op = "scaled_dot_product_attention";
  const Dims d = check_layout(q, k, v, options, op);
  const Device device = common_device(op, {&q, &k, &v});
  AttentionOutput r;
  r.out = Tensor::empty({d.b, d.t, d.h * d.dv}, q.dtype(), device);
  if (keep_probs) r.probs = Tensor::empty({d.b, d.h, d.t, d.s}, q.dtype(), device);
  if (return_logits) {
    const int64_t per_pair = options.causal ? shared::causal_logits_before(d.t, d.t, d.s) : d.t * d.s;
    r.logits = Tensor::empty({d.b * d.h * per_pair}, DType::kFloat32, device);
  }
  kernel_for<Op::attention>(device)(readable(q), readable(k), readable(v), options, r.out, r.probs, r.logits);
  return r;
}

void scaled_dot_product_attention_backward_into(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                                const Tensor& probs, const AttentionOptions& options, Tensor& dq,
                                                Tensor& dk, Tensor& dv) {
  constexpr const char* op = "scaled_dot_product_attention_backward";
  const Dims d = check_layout(q, k, v, options, op);
  const Shape out_shape{d.b, d.t, d.h * d.dv};
  MIXTRAIN_CHECK(dout.defined() && is_float(dout.dtype()) && dout.shape() == out_shape,
                 op << ": gradient " << text(dout) << " does not match the output shape " << out_shape);
  MIXTRAIN_CHECK(probs.defined() && probs.dtype() == q.dtype() && probs.shape() == Shape({d.b, d.h, d.t, d.s}),
                 op << ": probabilities " << text(probs) << " must be " << dtype_name(q.dtype()) << " "
                    << Shape({d.b, d.h, d.t, d.s}) << " (the forward's, kept with keep_probs)");
  check_gradient_target(dq, q, "dq", op);
  check_gradient_target(dk, k, "dk", op);
  check_gradient_target(dv, v, "dv", op);
  const Device device = common_device(op, {&dout, &q, &k, &v, &probs, &dq, &dk, &dv});
  kernel_for<Op::attention_backward>(device)(cast(dout, q.dtype()).contiguous(), readable(q), readable(k), readable(v),
                                             probs.contiguous(), options, dq, dk, dv);
}

AttentionGrads scaled_dot_product_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                     const Tensor& v, const Tensor& probs,
                                                     const AttentionOptions& options) {
  check_layout(q, k, v, options, "scaled_dot_product_attention_backward");
  const Device device = common_device("scaled_dot_product_attention_backward", {&q, &k, &v});
  AttentionGrads g{Tensor::empty(q.shape(), q.dtype(), device), Tensor::empty(k.shape(), k.dtype(), device),
                   Tensor::empty(v.shape(), v.dtype(), device)};
  scaled_dot_product_attention_backward_into(dout, q, k, v, probs, options, g.dq, g.dk, g.dv);
  return g;
}

}  // namespace mixtrain::ops
