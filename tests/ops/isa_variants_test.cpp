// The CPU kernels' block functions (elementwise, pooling, batch normalization, attention's softmax rows and the tiled
// kernel's online softmax, loss scaling's unscale) at every instruction-set level the CPU can run
// (core/isa_level.h): forcing a level selects their baseline, AVX2 or AVX-512 variant, and every level gives the bits
// of the baseline, in every floating dtype.
#include <gtest/gtest.h>

#include <cstdint>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "mixtrain/core/isa_level.h"
#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/batch_norm.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/flash_attention.h"
#include "mixtrain/ops/loss_scale.h"
#include "mixtrain/ops/pooling.h"

namespace mixtrain {
namespace {

struct ResetIsa {
  ~ResetIsa() { set_isa_level_for_testing(std::nullopt); }
};

Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed, float scale = 2.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = dist(rng);
  return Tensor::from_floats(shape, v).to(dtype);
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

// Every output of one pass over the kernels, as bytes, under the level in force.
std::vector<std::vector<uint8_t>> run_kernels(DType dtype) {
  std::vector<std::vector<uint8_t>> out;
  // Elementwise: long enough for several blocks and the thread team, with a ragged tail.
  const Tensor x = random_tensor({70001}, dtype, 1), other = random_tensor({70001}, dtype, 2);
  for (ops::Activation a : {ops::Activation::kRelu, ops::Activation::kGelu, ops::Activation::kSigmoid,
                            ops::Activation::kTanh}) {
    const Tensor y = ops::activation(x, a);
    out.push_back(bytes_of(y));
    out.push_back(bytes_of(ops::activation_backward(other, x, y, a)));
  }
  out.push_back(bytes_of(ops::add(x, other)));
  out.push_back(bytes_of(ops::scale(x, 0.37f)));

  // Pooling, max and average, forward and backward, "same" padding with odd sizes.
  const Tensor images = random_tensor({3, 9, 11, 5}, dtype, 3);
  ops::Pool2dOptions pool;
  pool.pool_size = 3;
  pool.strides = 2;
  pool.padding = ops::Padding::kSame;
  const Tensor mp = ops::max_pool2d(images, pool), ap = ops::avg_pool2d(images, pool);
  const Tensor dpool = random_tensor(mp.shape(), dtype, 4);
  out.push_back(bytes_of(mp));
  out.push_back(bytes_of(ap));
  out.push_back(bytes_of(ops::max_pool2d_backward(dpool, images, pool)));
  out.push_back(bytes_of(ops::avg_pool2d_backward(dpool, images.shape(), dtype, pool)));

  // Batch normalization with its batch statistics, forward and backward.
  const Tensor rows = random_tensor({37, 6, 6, 13}, dtype, 5);
  const ops::BatchNormStats st = ops::batch_moments(rows);
  const Tensor gamma = random_tensor({13}, DType::kFloat32, 6), beta = random_tensor({13}, DType::kFloat32, 7);
  out.push_back(bytes_of(st.mean));
  out.push_back(bytes_of(st.variance));
  out.push_back(bytes_of(ops::batch_norm(rows, st.mean, st.variance, gamma, beta, 1e-3f)));
  const ops::BatchNormGrads g = ops::batch_norm_backward(random_tensor(rows.shape(), dtype, 8), rows, st.mean,
                                                         st.variance, gamma, 1e-3f, true, true);
  out.push_back(bytes_of(g.dx));
  out.push_back(bytes_of(g.dgamma));
  out.push_back(bytes_of(g.dbeta));

  // Attention's scaling and softmax rows, causal, with row lengths no vector width divides. One dimension per
  // head makes each logit a single product, exact on every GEMM path (the GEMM itself sums in a different order
  // at each level), so the probabilities show the row functions alone.
  const Tensor q = random_tensor({2, 19, 2}, dtype, 9, 1.0f), k = random_tensor({2, 19, 2}, dtype, 10, 1.0f),
               v = random_tensor({2, 19, 2}, dtype, 11, 1.0f);
  ops::AttentionOptions att;
  att.num_heads = 2;
  att.causal = true;
  att.scale = 0.35f;
  out.push_back(bytes_of(ops::scaled_dot_product_attention(q, k, v, att).probs));
  // The tiled kernel's online softmax (its exponentials 16 lanes wide on AVX-512, 8 below): each row's log-sum-exp
  // over two key tiles (128 + 23 keys), the same single-product logits, rows of every length mod 16.
  const Tensor tq = random_tensor({2, 151, 2}, dtype, 12, 1.0f), tk = random_tensor({2, 151, 2}, dtype, 13, 1.0f),
               tv = random_tensor({2, 151, 2}, dtype, 14, 1.0f);
  out.push_back(bytes_of(ops::flash_attention(tq, tk, tv, att).lse));

  // Loss scaling's unscale and count, with an overflow to infinity in the tail and a NaN.
  Tensor unscaled = Tensor::empty({70001}, DType::kFloat32);
  Tensor scaled = x.to(DType::kFloat32).contiguous();
  scaled.data<float>()[70000] = 3.0e38f;
  scaled.data<float>()[12345] = std::nanf("");
  const int64_t bad = ops::unscale_and_count_nonfinite(scaled, 4.0f, unscaled);
  out.push_back(bytes_of(unscaled));
  out.push_back(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(&bad),
                                     reinterpret_cast<const uint8_t*>(&bad) + sizeof(bad)));
  return out;
}

class OpsIsaVariants : public ::testing::TestWithParam<DType> {};

TEST_P(OpsIsaVariants, EveryLevelGivesTheBaselineBits) {
  ResetIsa reset;
  ASSERT_EQ(set_isa_level_for_testing(IsaLevel::kScalar), IsaLevel::kScalar);
  const std::vector<std::vector<uint8_t>> baseline = run_kernels(GetParam());
  int levels_run = 0;
  for (IsaLevel level : {IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(supported_isa_level())) continue;
    ASSERT_EQ(set_isa_level_for_testing(level), level);
    const std::vector<std::vector<uint8_t>> got = run_kernels(GetParam());
    ASSERT_EQ(got.size(), baseline.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(got[i] == baseline[i]) << "output " << i << " differs at level " << isa_level_name(level)
                                         << " in " << dtype_name(GetParam());
    ++levels_run;
  }
  if (levels_run == 0) GTEST_SKIP() << "this CPU runs the baseline level only";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OpsIsaVariants,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace mixtrain
