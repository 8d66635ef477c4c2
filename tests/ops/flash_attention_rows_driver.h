// The GPU tiled attention's kernels (src/ops/cuda/flash_attention.cu) driven on the host: the same row functions
// (src/ops/shared/flash_attention_rows.h) over every (pair, row) in a plain loop, where the kernels run one thread per
// row. Gives the kernels' bits on any machine, the log of each row's log-sum-exp aside (the host's logf), so the
// GPU test compares the GPU with it bit for bit where no logarithm enters.
#pragma once

#include <cmath>
#include <vector>

#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/flash_attention.h"
#include "ops/cuda/flash_attention_plan.h"
#include "op_test_util.h"

namespace mixtrain::ops::flash_rows_driver {

// out (B, T, H * dv) in q's dtype, lse (B, H, T) float32, on the CPU.
inline FlashAttentionOutput forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  const shared::FlashProblem p = cuda::flash_problem(q, k, v, o);
  const int64_t pairs = q.dim(0) * o.num_heads;
  FlashAttentionOutput r{Tensor::empty({q.dim(0), p.t, o.num_heads * p.dv}, q.dtype()),
                         Tensor::empty({q.dim(0), o.num_heads, p.t}, DType::kFloat32)};
  const shared::FlashHeads out = cuda::flash_heads(r.out, o.num_heads);
  std::vector<float> acc(static_cast<size_t>(p.dv));
  float* lse = r.lse.data<float>();
  for (int64_t pair = 0; pair < pairs; ++pair)
    for (int64_t i = 0; i < p.t; ++i) lse[pair * p.t + i] = shared::flash_forward_row(p, out, pair, i, acc.data());
  return r;
}

// dq, dk, dv from dout (q's dtype) and the forward's out and lse, on the CPU.
inline AttentionGrads backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& lse, const AttentionOptions& o) {
  const shared::FlashProblem p = cuda::flash_problem(q, k, v, o);
  const int64_t h = o.num_heads, pairs = q.dim(0) * h;
  AttentionGrads g{Tensor::empty(q.shape(), q.dtype()), Tensor::empty(k.shape(), k.dtype()),
                   Tensor::empty(v.shape(), v.dtype())};
  const shared::FlashHeads douth = cuda::flash_heads(dout, h), outh = cuda::flash_heads(out, h);
  const Tensor lse_c = lse.contiguous();
  const float* l = lse_c.data<float>();
  std::vector<float> d(static_cast<size_t>(pairs * p.t)), acc_k(static_cast<size_t>(p.dk)),
      acc_v(static_cast<size_t>(p.dv));
  for (int64_t r = 0; r < pairs * p.t; ++r) d[static_cast<size_t>(r)] = shared::flash_row_dot(douth, outh, r / p.t, r % p.t, p.dv);
  const shared::FlashHeads dq = cuda::flash_heads(g.dq, h), dk = cuda::flash_heads(g.dk, h),
                           dv = cuda::flash_heads(g.dv, h);
  for (int64_t pair = 0; pair < pairs; ++pair) {
    for (int64_t i = 0; i < p.t; ++i)
      shared::flash_dq_row(p, douth, dq, pair, i, l[pair * p.t + i], d[static_cast<size_t>(pair * p.t + i)],
                           acc_k.data());
    for (int64_t j = 0; j < p.s; ++j)
      shared::flash_dkdv_row(p, douth, dk, dv, pair, j, l + pair * p.t, d.data() + pair * p.t, acc_k.data(),
                             acc_v.data());
  }
  return g;
}

// Random multiples of 1/4 in [-1.5, 1.5] in dtype dt: their products' float32 sums (head sizes up to 64) are exact in
// any order, so two kernels that sum in other orders still see the same logits and the same dout . v, and round them
// alike into a 16-bit dtype (one logit on either side of a rounding boundary would move its probability by a whole
// unit of that dtype, beyond what the comparisons hold the kernels to).
inline Tensor quarter_tensor(const Shape& shape, uint64_t seed, DType dt) {
  std::vector<float> v = testing::random_tensor(shape, seed, DType::kFloat32, -1.5f, 1.5f).to_floats();
  for (float& x : v) x = std::round(x * 4.0f) / 4.0f;
  return Tensor::from_floats(shape, v, dt);
}

}  // namespace mixtrain::ops::flash_rows_driver
