// Autocast of variables in a custom layer: inside call(), float32 variables read in the compute dtype through
// the layer's cached cast, with their gradients reaching the float32 variables; and the error that names
// autocast when a custom layer forgets it.
#include <gtest/gtest.h>

#include <cmath>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/layer.h"
#include "mixtrain/precision/hardware_check.h"

namespace mixtrain {
namespace {

// y = x kernel + bias, written as a Keras user writes a custom layer.
class MyLinear : public Layer {
 public:
  explicit MyLinear(int64_t units, bool use_autocast = true) : Layer("my_linear", std::nullopt), units_(units),
                                                                 use_autocast_(use_autocast) {}
  std::string class_name() const override { return "MyLinear"; }
  Shape compute_output_shape(const Shape& s) const override { return Shape{s[-1] == 0 ? 0 : units_}; }
  Var kernel, bias;
  Var read(const Var& w) { return autocast(w); }

 protected:
  void build_impl(const Shape& in, Rng& rng) override {
    kernel = add_weight("kernel", {in[-1], units_}, Initializer::kGlorotUniform, rng);
    bias = add_weight("bias", {units_}, Initializer::kOnes, rng);
  }
  Var call(const Var& x, const CallContext&) override {
    if (!use_autocast_) return matmul(x, kernel);  // the mistake: a float32 variable meets float16 x
    return bias_add(matmul(x, autocast(kernel)), autocast(bias));
  }

 private:
  int64_t units_;
  bool use_autocast_;
};

class Autocast : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { set_precision_warning_sink([](const std::string&) {}); }
  void TearDown() override {
    set_global_policy("float32");
    set_precision_warning_sink(nullptr);
  }
};

TEST_P(Autocast, CustomLayerReadsVariablesInTheComputeDtypeAndTrainsThem) {
  set_global_policy(GetParam());
  const DType compute = global_policy().compute_dtype();
  MyLinear layer(3);
  const int64_t b = 7, in = 17;
  std::vector<float> xv(static_cast<size_t>(b * in));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.37f * static_cast<float>(i)) * 2.0f;
  Var x(Tensor::from_floats({b, in}, xv));
  Var y = layer(x);  // builds, autocasts x, runs call()
  EXPECT_EQ(y.dtype(), compute);
  EXPECT_EQ(layer.kernel.dtype(), DType::kFloat32);
  backward(sum(y));  // d/dkernel[i][j] = sum_b x[b][i] (x as rounded to the compute dtype)
  ASSERT_TRUE(layer.kernel.has_grad());
  ASSERT_TRUE(layer.bias.has_grad());
  EXPECT_EQ(layer.kernel.grad().dtype(), DType::kFloat32);
  const Tensor xr = x.value().to(compute).to(DType::kFloat32);
  // The gradient is a float32-accumulated sum rounded once into the compute dtype: half a unit in the last
  // place of that dtype (2^-11 float16, 2^-8 bfloat16) relative to the sum of |x|, plus margin.
  const double ulp = compute == DType::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  for (int64_t i = 0; i < in; ++i) {
    double ref = 0, mag = 0;
    for (int64_t r = 0; r < b; ++r) {
      ref += xr.at(r * in + i);
      mag += std::fabs(xr.at(r * in + i));
    }
    for (int64_t j = 0; j < 3; ++j) EXPECT_NEAR(layer.kernel.grad().at(i * 3 + j), ref, 2 * ulp * mag + 1e-6) << i;
  }
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(layer.bias.grad().at(j), static_cast<float>(b));

  // The cached cast: one conversion per variable version, refreshed when the variable changes.
  const Tensor first = layer.read(layer.kernel).value();
  EXPECT_EQ(first.dtype(), compute);
  EXPECT_EQ(layer.read(layer.kernel).value().raw(), first.raw());
  layer.kernel.set_value(Tensor::full(layer.kernel.shape(), DType::kFloat32, 0.5f));
  EXPECT_EQ(layer.read(layer.kernel).value().at(0), 0.5f);
  EXPECT_NE(layer.read(layer.kernel).value().raw(), first.raw());
}

TEST_P(Autocast, ForgettingItGivesAnErrorThatSaysHow) {
  set_global_policy(GetParam());
  MyLinear layer(3, /*use_autocast=*/false);
  try {
    layer(Var(Tensor::full({2, 4}, DType::kFloat32, 1.0f)));
    FAIL() << "a float32 variable met a 16-bit input without an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("differ in dtype"), std::string::npos) << msg;
    EXPECT_NE(msg.find("float32"), std::string::npos) << msg;
    EXPECT_NE(e.hint().find("autocast(variable)"), std::string::npos) << e.hint();
    EXPECT_NE(e.hint().find("cast("), std::string::npos) << e.hint();
  }
  clear_tape();
}

INSTANTIATE_TEST_SUITE_P(MixedPolicies, Autocast, ::testing::Values("mixed_float16", "mixed_bfloat16"));

TEST(AutocastFloat32, IsTheVariableItself) {
  MyLinear layer(2);
  layer(Var(Tensor::full({1, 3}, DType::kFloat32, 1.0f)));
  EXPECT_TRUE(layer.read(layer.kernel).same(layer.kernel));
}

}  // namespace
}  // namespace mixtrain
