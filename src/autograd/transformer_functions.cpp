#include "mixtrain/autograd/transformer_functions.h"

#include "mixtrain/ops/elementwise.h"

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
      give_fresh(table, ops::embedding_backward(out.grad(), ids, input_dim));
    });
  }
  return out;
}

Var add_position_embedding(const Var& x, const Var& table) {
  MIXTRAIN_CHECK(x.defined() && x.value().rank() == 3,
                 "add_position_embedding: input must be (batch, T, D), got "
                     << (x.defined() ? x.value().describe() : std::string("undefined")));
  MIXTRAIN_CHECK(table.defined() && table.value().rank() == 2 && table.shape()[1] == x.shape()[2],
                 "add_position_embedding: table must be (sequence_length, " << x.shape()[2] << "), got "
                                                                             << table.value().describe());
  const int64_t b = x.shape()[0], t = x.shape()[1], d = x.shape()[2], s = table.shape()[0];
  MIXTRAIN_CHECK(t <= s, "add_position_embedding: sequence of length " << t << " is longer than the " << s
                                                                       << " positions of the table");
  // x read as (batch, T * D) plus the first T rows of the table as one (T * D,) bias: bias_add adds in
  // float32 and rounds once, whatever the table's dtype.
  const Tensor positions = table.value().slice(0, 0, t).reshape({t * d});
  const bool rec = should_record({&x, &table});
  Var out = output(ops::bias_add(x.value().reshape({b, t * d}), positions).reshape(x.shape()), rec);
  if (rec) {
    record_backward(out, [x, table, out, b, t, d, s]() {
      if (x.requires_grad()) Var(x).accumulate_grad(out.grad());
      if (!table.requires_grad()) return;
      Tensor g = Tensor::zeros({s, d}, DType::kFloat32);
      g.slice(0, 0, t).copy_from(ops::sum_rows(out.grad().reshape({b, t * d})).reshape({t, d}));
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

Var scaled_dot_product_attention(const Var& q, const Var& k, const Var& v, const ops::AttentionOptions& options,
                                 Tensor* logits) {
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
