// The float64 reference of scaled dot-product attention (ops/attention.h), forward and backward, and its error
// bound, shared by the attention tests (attention_test.cpp, the flash_attention tests), with the tiled-attention
// tests' cases.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mixtrain/ops/attention.h"

#include "op_test_util.h"

namespace mixtrain::ops::attention_reference {

using testing::subnormal_step;
using testing::unit;

struct Geo {
  int64_t b, t, s, h, dk, dv;
};

// A case of the tiled-attention tests: a shape, the causal mask and a dropout rate.
struct Case {
  Geo g;
  bool causal;
  float dropout;
};

// The case's options: its heads and mask, the scale 1 / sqrt(dk), dropout drawn from dropout_seed.
inline AttentionOptions options_of(const Case& c, uint64_t dropout_seed) {
  AttentionOptions o;
  o.num_heads = c.g.h;
  o.causal = c.causal;
  o.scale = 1.0f / std::sqrt(static_cast<float>(c.g.dk));
  o.dropout_rate = c.dropout;
  o.dropout_seed = dropout_seed;
  return o;
}

// The case and dtype in a failure message.
inline std::string name_of(DType dt, const Case& c) {
  const Geo& g = c.g;
  return std::string(dtype_name(dt)) + " B" + std::to_string(g.b) + " T" + std::to_string(g.t) + " S" +
         std::to_string(g.s) + " H" + std::to_string(g.h) + " dk" + std::to_string(g.dk) + " dv" +
         std::to_string(g.dv) + (c.causal ? " causal" : "") + (c.dropout > 0 ? " dropout" : "");
}

// The float64 attention of the (already rounded) inputs, with no intermediate rounding, and beside each
// result the sum of the magnitudes of its terms: the scale its rounding errors are measured against.
struct Reference {
  std::vector<double> out, out_mag;               // (B, T, H * dv)
  std::vector<double> probs;                      // (B, H, T, S), before dropout
  std::vector<double> dq, dq_mag, dk, dk_mag, dv, dv_mag;
  double max_logit = 0;
};

inline Reference reference(const Geo& g, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                    const std::vector<float>& dout, const AttentionOptions& o) {
  Reference r;
  const size_t nq = static_cast<size_t>(g.b * g.t * g.h * g.dk), nk = static_cast<size_t>(g.b * g.s * g.h * g.dk);
  const size_t nv = static_cast<size_t>(g.b * g.s * g.h * g.dv), no = static_cast<size_t>(g.b * g.t * g.h * g.dv);
  r.out.assign(no, 0), r.out_mag.assign(no, 0), r.probs.assign(static_cast<size_t>(g.b * g.h * g.t * g.s), 0);
  r.dq.assign(nq, 0), r.dq_mag.assign(nq, 0), r.dk.assign(nk, 0), r.dk_mag.assign(nk, 0);
  r.dv.assign(nv, 0), r.dv_mag.assign(nv, 0);
  const double inv_keep = 1.0 / (1.0 - static_cast<double>(o.dropout_rate));
  auto qi = [&](int64_t b, int64_t i, int64_t h, int64_t d) { return static_cast<size_t>((b * g.t + i) * g.h * g.dk + h * g.dk + d); };
  auto ki = [&](int64_t b, int64_t j, int64_t h, int64_t d) { return static_cast<size_t>((b * g.s + j) * g.h * g.dk + h * g.dk + d); };
  auto vi = [&](int64_t b, int64_t j, int64_t h, int64_t e) { return static_cast<size_t>((b * g.s + j) * g.h * g.dv + h * g.dv + e); };
  auto oi = [&](int64_t b, int64_t i, int64_t h, int64_t e) { return static_cast<size_t>((b * g.t + i) * g.h * g.dv + h * g.dv + e); };
  for (int64_t b = 0; b < g.b; ++b)
    for (int64_t h = 0; h < g.h; ++h)
      for (int64_t i = 0; i < g.t; ++i) {
        const int64_t end = o.causal ? i + 1 + (g.s - g.t) : g.s;  // the queries are the last T positions
        std::vector<double> p(static_cast<size_t>(g.s), 0.0), pd(p.size(), 0.0), keep(p.size(), 0.0);
        double mx = -INFINITY;
        for (int64_t j = 0; j < end; ++j) {
          double s = 0;
          for (int64_t d = 0; d < g.dk; ++d) s += static_cast<double>(q[qi(b, i, h, d)]) * k[ki(b, j, h, d)];
          p[static_cast<size_t>(j)] = s * o.scale;
          r.max_logit = std::max(r.max_logit, std::fabs(s * o.scale));
          mx = std::max(mx, s * o.scale);
        }
        double sum = 0;
        for (int64_t j = 0; j < end; ++j) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
        const uint64_t first = static_cast<uint64_t>(((b * g.h + h) * g.t + i) * g.s);
        for (int64_t j = 0; j < end; ++j) {
          const size_t jj = static_cast<size_t>(j);
          p[jj] /= sum;
          if (o.dropout_rate == 0.0f)
            keep[jj] = 1.0;
          else
            keep[jj] = attention_dropout_keep(o.dropout_seed, first + jj, o.dropout_rate) ? inv_keep : 0.0;
          pd[jj] = p[jj] * keep[jj];
          r.probs[static_cast<size_t>(first) + jj] = p[jj];
        }
        // Forward output and the backward of this row.
        std::vector<double> dp(p.size(), 0.0);
        for (int64_t j = 0; j < end; ++j)
          for (int64_t e = 0; e < g.dv; ++e) {
            const size_t jj = static_cast<size_t>(j);
            r.out[oi(b, i, h, e)] += pd[jj] * v[vi(b, j, h, e)];
            r.out_mag[oi(b, i, h, e)] += std::fabs(pd[jj] * v[vi(b, j, h, e)]);
            dp[jj] += dout[oi(b, i, h, e)] * static_cast<double>(v[vi(b, j, h, e)]) * keep[jj];
            r.dv[vi(b, j, h, e)] += pd[jj] * dout[oi(b, i, h, e)];
            r.dv_mag[vi(b, j, h, e)] += std::fabs(pd[jj] * dout[oi(b, i, h, e)]);
          }
        double dot = 0, dot_mag = 0;
        for (size_t j = 0; j < p.size(); ++j) {
          dot += dp[j] * p[j];
          dot_mag += std::fabs(dp[j]) * p[j];
        }
        for (int64_t j = 0; j < end; ++j) {
          const size_t jj = static_cast<size_t>(j);
          const double ds = p[jj] * (dp[jj] - dot) * o.scale;
          const double ds_mag = p[jj] * (std::fabs(dp[jj]) + dot_mag) * o.scale;
          for (int64_t d = 0; d < g.dk; ++d) {
            r.dq[qi(b, i, h, d)] += ds * k[ki(b, j, h, d)];
            r.dq_mag[qi(b, i, h, d)] += ds_mag * std::fabs(k[ki(b, j, h, d)]);
            r.dk[ki(b, j, h, d)] += ds * q[qi(b, i, h, d)];
            r.dk_mag[ki(b, j, h, d)] += ds_mag * std::fabs(q[qi(b, i, h, d)]);
          }
        }
      }
  return r;
}

// Error bound of a result whose terms sum to `mag` in magnitude. A 16-bit run rounds the logits (relative
// error u moves each probability by up to about 2 u max|logit| relatively) and the probabilities (u), and
// rounds the result once; float32 adds sums over dk and S terms. Four times that leaves margin; a wrong
// formula, mask or scale is off by O(1) of mag.
inline double tolerance(DType d, const Geo& g, double max_logit, double mag, double want) {
  const double u = unit(d) + static_cast<double>(g.dk + g.s + g.dv + 8) * 0x1p-24;
  return 4 * u * (2 * max_logit + 2) * mag + unit(d) * std::fabs(want) + subnormal_step(d);
}

inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& mag, DType d,
                  const Geo& g, double max_logit, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tolerance(d, g, max_logit, mag[i], want[i])) << what << " element " << i;
}

// The dropout mask seen in an output: with q = 0 every probability of a row is 1 / S and with v the (S, S) identity
// the output row is the row's dropped probabilities (dropout_mask_inputs makes q, k and v so, k from `k_seed`).
struct DropoutMaskInputs {
  Tensor q, k, v;
};
inline DropoutMaskInputs dropout_mask_inputs(int64_t t, int64_t s, int64_t dk, uint64_t k_seed) {
  std::vector<float> eye(static_cast<size_t>(s * s), 0.0f);
  for (int64_t j = 0; j < s; ++j) eye[static_cast<size_t>(j * s + j)] = 1.0f;
  return {Tensor::from_floats({1, t, dk}, std::vector<float>(static_cast<size_t>(t * dk), 0.0f)),
          testing::random_tensor({1, s, dk}, k_seed, DType::kFloat32), Tensor::from_floats({1, s, s}, eye)};
}

// Each output (1, t, s) of those inputs is zero exactly where attention_dropout_keep drops (i, j) at the flat index
// i * s + j, and 1 / (s (1 - rate)) elsewhere; the share dropped is within share_tolerance of the rate.
inline void expect_the_dropout_mask(const std::vector<std::vector<float>>& outputs, int64_t t, int64_t s,
                                    uint64_t seed, float rate, double share_tolerance) {
  int64_t dropped = 0;
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < s; ++j) {
      const size_t at = static_cast<size_t>(i * s + j);
      const bool keep = attention_dropout_keep(seed, static_cast<uint64_t>(i * s + j), rate);
      for (const std::vector<float>& out : outputs) {
        ASSERT_EQ(out[at] != 0.0f, keep) << i << "," << j;
        if (keep) {
          ASSERT_NEAR(out[at], 1.0 / (s * (1.0 - rate)), 1e-6) << i << "," << j;
        }
      }
      dropped += !keep;
    }
  EXPECT_NEAR(static_cast<double>(dropped) / (t * s), rate, share_tolerance);
}

}  // namespace mixtrain::ops::attention_reference
