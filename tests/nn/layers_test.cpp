#include <gtest/gtest.h>

#include <cmath>

#include <sstream>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/sequential.h"

namespace mixtrain {
namespace {

// Restores the global policy after each test.
class PolicyTest : public ::testing::Test {
 protected:
  void TearDown() override { set_global_policy("float32"); }
};

TEST_F(PolicyTest, LayersTakeTheGlobalPolicyAtConstructionAndDtypeOverrides) {
  Dense before(4);
  set_global_policy("mixed_float16");
  Dense mixed(4);
  Dense pinned(4, "linear", dtype_arg("float32"));
  EXPECT_EQ(before.compute_dtype(), DType::kFloat32);
  EXPECT_EQ(mixed.compute_dtype(), DType::kFloat16);
  EXPECT_EQ(mixed.variable_dtype(), DType::kFloat32);
  EXPECT_EQ(pinned.compute_dtype(), DType::kFloat32);
  EXPECT_EQ(mixed.dtype_policy().name(), "mixed_float16");
  EXPECT_THROW(dtype_arg("mixed_float4"), Error);
}

TEST_F(PolicyTest, MixedDenseComputesInFloat16WithFloat32Variables) {
  set_global_policy("mixed_float16");
  Dense d(3, "relu");
  Rng rng(1);
  d.build({5}, rng);
  EXPECT_EQ(d.kernel().dtype(), DType::kFloat32);
  Var x(Tensor::from_floats({2, 5}, {1, 2, 3, 4, 5, -1, -2, -3, -4, -5}));  // float32 input is autocast
  Var y = d(x);
  EXPECT_EQ(y.dtype(), DType::kFloat16);
  // Same math in float32 on the float16-rounded weights and inputs, rounded to float16 once.
  const std::vector<float> w = d.kernel().value().to(DType::kFloat16).to_floats();
  const std::vector<float> xv = x.value().to_floats();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      float s = 0;
      for (int64_t k = 0; k < 5; ++k) s += xv[i * 5 + k] * w[k * 3 + j];
      EXPECT_NEAR(y.value().at(i * 3 + j), std::max(s, 0.0f), std::fabs(s) * 0x1p-10 + 1e-6);
    }
  // The kernel's gradient reaches the float32 variable in float32.
  backward(sum(cast(y, DType::kFloat32)));
  ASSERT_TRUE(d.kernel().has_grad());
  EXPECT_EQ(d.kernel().grad().dtype(), DType::kFloat32);
  EXPECT_EQ(d.bias().grad().dtype(), DType::kFloat32);
}

TEST_F(PolicyTest, CachedWeightCastRefreshesAfterAnUpdate) {
  set_global_policy("mixed_bfloat16");
  Dense d(1, "linear", std::nullopt, /*use_bias=*/false);
  Rng rng(2);
  d.build({1}, rng);
  Var x(Tensor::from_floats({1, 1}, {1.0f}));
  NoGradGuard ng;
  Var k = d.kernel();
  k.mutable_value().data<float>()[0] = 2.0f;
  k.bump_version();
  EXPECT_EQ(d(x).value().at(0), 2.0f);
  k.mutable_value().data<float>()[0] = 3.0f;
  EXPECT_EQ(d(x).value().at(0), 2.0f);  // not bumped: the cached bfloat16 copy is still used
  k.bump_version();
  EXPECT_EQ(d(x).value().at(0), 3.0f);
}

TEST_F(PolicyTest, SummaryShowsShapesParamsAndDtypes) {
  set_global_policy("mixed_float16");
  Sequential m("mlp");
  m.emplace<Dense>(256, "relu");
  m.emplace<Dropout>(0.2f);
  m.emplace<Dense>(10, "linear", dtype_arg("float32"));
  Rng rng(3);
  m.build({784}, rng);
  std::ostringstream s;
  m.summary(s);
  const std::string t = s.str();
  EXPECT_NE(t.find("(None, 256)"), std::string::npos) << t;
  EXPECT_NE(t.find("200,960"), std::string::npos) << t;  // 784 * 256 + 256
  EXPECT_NE(t.find("2,570"), std::string::npos) << t;    // 256 * 10 + 10
  EXPECT_NE(t.find("Total params: 203,530"), std::string::npos) << t;
  EXPECT_NE(t.find("float16   float32"), std::string::npos) << t;
  EXPECT_NE(t.find("float32   float32"), std::string::npos) << t;
  EXPECT_EQ(m.count_params(), 203530);
}

TEST_F(PolicyTest, DropoutOnlyInTrainingAndFlattenAndSoftmax) {
  Dropout drop(0.5f);
  Var x(Tensor::full({4, 100}, DType::kFloat32, 1.0f));
  EXPECT_EQ(drop(x).value().to_floats(), x.value().to_floats());
  Rng rng(4);
  const std::vector<float> y = drop(x, CallContext{true, &rng}).value().to_floats();
  int zeros = 0;
  for (float v : y) {
    EXPECT_TRUE(v == 0.0f || v == 2.0f);
    zeros += v == 0.0f;
  }
  EXPECT_GT(zeros, 150);
  EXPECT_LT(zeros, 250);
  Flatten f;
  EXPECT_EQ(f(Var(Tensor::zeros({2, 3, 4}, DType::kFloat32))).shape(), (Shape{2, 12}));
  set_global_policy("mixed_float16");
  Softmax s16, s32(dtype_arg("float32"));
  Var logits(Tensor::from_floats({1, 2}, {0.0f, 0.0f}));
  EXPECT_EQ(s16(logits).dtype(), DType::kFloat16);
  EXPECT_EQ(s32(logits).dtype(), DType::kFloat32);
  EXPECT_EQ(s32(logits).value().at(0), 0.5f);
}

TEST_F(PolicyTest, DenseRejectsWrongInputWidth) {
  Dense d(2);
  Rng rng(5);
  d.build({3}, rng);
  EXPECT_THROW(d(Var(Tensor::zeros({1, 4}, DType::kFloat32))), Error);
  EXPECT_THROW(Dense(0), Error);
  EXPECT_THROW(Dense(2, "swish"), Error);
}

}  // namespace
}  // namespace mixtrain
