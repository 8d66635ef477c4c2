// Forward values of the ops against float64 references, in every floating dtype, on odd shapes.
#include <gtest/gtest.h>

#include <cmath>

#include "mixtrain/core/random.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/softmax.h"

namespace mixtrain::ops {
namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype, float lo = -1.0f, float hi = 1.0f) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = r.uniform(lo, hi);
  return Tensor::from_floats(shape, v, dtype);
}

// Relative rounding unit of each dtype's one final rounding: float32 2^-24, float16 2^-11, bfloat16 2^-8.
// Ops compute in float32 and round once, so results lie within a few units of the float64 value.
double unit(DType d) { return d == DType::kFloat16 ? 0x1p-11 : d == DType::kBFloat16 ? 0x1p-8 : 0x1p-24; }

const DType kFloatDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

TEST(Softmax, MatchesFloat64InEveryDType) {
  for (DType d : kFloatDTypes)
    for (int64_t cols : {1, 7, 31, 129}) {
      Tensor x = random_tensor({3, cols}, 1, d, -8, 8);
      const std::vector<float> in = x.to_floats();
      const std::vector<float> sm = softmax(x).to_floats(), ls = log_softmax(x).to_floats();
      EXPECT_EQ(softmax(x).dtype(), d);
      for (int64_t r = 0; r < 3; ++r) {
        double mx = -1e300, s = 0;
        for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, static_cast<double>(in[r * cols + j]));
        for (int64_t j = 0; j < cols; ++j) s += std::exp(in[r * cols + j] - mx);
        for (int64_t j = 0; j < cols; ++j) {
          const double p = std::exp(in[r * cols + j] - mx) / s, lp = in[r * cols + j] - mx - std::log(s);
          // float32 internals add ~cols * 2^-24 relative error before the final rounding.
          EXPECT_NEAR(sm[r * cols + j], p, 2 * unit(d) * p + 1e-6) << dtype_name(d) << " cols " << cols;
          EXPECT_NEAR(ls[r * cols + j], lp, 2 * unit(d) * std::fabs(lp) + 1e-5) << dtype_name(d);
        }
      }
    }
}

TEST(Softmax, LargeLogitsDoNotOverflow) {
  Tensor x = Tensor::from_floats({1, 3}, {1000.0f, 1001.0f, 0.0f}, DType::kFloat16);
  const std::vector<float> p = softmax(x).to_floats();
  EXPECT_NEAR(p[0], 1 / (1 + std::exp(1.0)), 1e-3);
  EXPECT_NEAR(p[1], 1 / (1 + std::exp(-1.0)), 1e-3);
  EXPECT_EQ(p[2], 0.0f);
}

TEST(Activations, NanPropagatesThroughRelu) {
  Tensor x = Tensor::from_floats({3}, {NAN, -1.0f, 2.0f});
  const std::vector<float> y = activation(x, Activation::kRelu).to_floats();
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 2.0f);
}

TEST(Activations, MatchFloat64InEveryDType) {
  for (DType d : kFloatDTypes) {
    Tensor x = random_tensor({17, 3}, 2, d, -4, 4);
    const std::vector<float> in = x.to_floats();
    for (auto a : {Activation::kRelu, Activation::kGelu, Activation::kSigmoid, Activation::kTanh}) {
      const std::vector<float> out = activation(x, a).to_floats();
      for (size_t i = 0; i < in.size(); ++i) {
        const double v = in[i];
        double want = 0;
        switch (a) {
          case Activation::kRelu: want = v > 0 ? v : 0; break;
          case Activation::kGelu: want = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); break;
          case Activation::kSigmoid: want = 1 / (1 + std::exp(-v)); break;
          case Activation::kTanh: want = std::tanh(v); break;
          default: break;
        }
        EXPECT_NEAR(out[i], want, unit(d) * std::fabs(want) + 4e-7) << activation_name(a) << " " << dtype_name(d) << " x=" << v;
      }
    }
  }
}

TEST(Losses, SparseCrossEntropyByHand) {
  // Row 0: logits (0, ln 3) label 1 -> -log(3/4); row 1: label 0 -> -log(1/4); mean = (log(4/3) + log 4) / 2.
  Tensor logits = Tensor::from_floats({2, 2}, {0.0f, std::log(3.0f), 0.0f, std::log(3.0f)});
  Tensor labels = Tensor::from_ints({2}, {1, 0});
  const double want = (std::log(4.0 / 3.0) + std::log(4.0)) / 2;
  EXPECT_NEAR(sparse_categorical_crossentropy(logits, labels, true).item(), want, 1e-6);
  Tensor probs = softmax(logits);
  EXPECT_NEAR(sparse_categorical_crossentropy(probs, labels, false).item(), want, 1e-6);
  // The gradient from logits is (softmax - onehot) / batch.
  const std::vector<float> g = sparse_categorical_crossentropy_backward(logits, labels, true, 1.0f).to_floats();
  EXPECT_NEAR(g[0], 0.25 / 2, 1e-7);
  EXPECT_NEAR(g[1], (0.75 - 1) / 2, 1e-7);
  EXPECT_NEAR(g[2], (0.25 - 1) / 2, 1e-7);
  EXPECT_THROW(sparse_categorical_crossentropy(logits, Tensor::from_ints({2}, {2, 0}), true), Error);
  EXPECT_EQ(sparse_categorical_accuracy(logits, labels), 0.5);
}

TEST(Losses, FloatSixteenLogitsGiveAFloat32Loss) {
  Tensor logits = random_tensor({64, 10}, 3, DType::kFloat16, -5, 5);
  Tensor labels = Tensor::from_ints({64}, std::vector<int32_t>(64, 7));
  Tensor l16 = sparse_categorical_crossentropy(logits, labels, true);
  Tensor l32 = sparse_categorical_crossentropy(logits.to(DType::kFloat32), labels, true);
  EXPECT_EQ(l16.dtype(), DType::kFloat32);
  EXPECT_EQ(l16.item(), l32.item());  // same float16 values, same float32 arithmetic
  EXPECT_EQ(sparse_categorical_crossentropy_backward(logits, labels, true, 1.0f).dtype(), DType::kFloat16);
}

TEST(Losses, MseSumMean) {
  Tensor p = Tensor::from_floats({2, 2}, {1, 2, 3, 4}), t = Tensor::from_floats({2, 2}, {1, 1, 1, 1});
  EXPECT_FLOAT_EQ(mean_squared_error(p, t).item(), (0 + 1 + 4 + 9) / 4.0f);
  EXPECT_FLOAT_EQ(sum(p).item(), 10.0f);
  EXPECT_FLOAT_EQ(mean(p).item(), 2.5f);
  // A float16 sum that would overflow float16 stays finite in float32.
  Tensor big = Tensor::full({8}, DType::kFloat16, 60000.0f);
  EXPECT_FLOAT_EQ(sum(big).item(), 480000.0f);
}

TEST(Linear, FloatSixteenForwardAndFloat32KernelGradient) {
  for (DType d : kFloatDTypes) {
    const int64_t b = 17, in = 31, out = 7;
    Tensor x = random_tensor({b, in}, 4, d), w = random_tensor({in, out}, 5, d), bias = random_tensor({out}, 6, DType::kFloat32);
    const std::vector<float> xv = x.to_floats(), wv = w.to_floats(), bv = bias.to_floats();
    Tensor y = linear(x, w, bias);
    EXPECT_EQ(y.dtype(), d);
    const std::vector<float> yv = y.to_floats();
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < out; ++j) {
        double s = bv[j], sabs = std::fabs(bv[j]);
        for (int64_t k = 0; k < in; ++k) {
          s += static_cast<double>(xv[i * in + k]) * wv[k * out + j];
          sabs += std::fabs(static_cast<double>(xv[i * in + k]) * wv[k * out + j]);
        }
        // float32 accumulation (in * 2^-24 * sum|xw|) plus one rounding into d.
        EXPECT_NEAR(yv[i * out + j], s, in * 0x1p-24 * sabs + unit(d) * std::fabs(s) + 1e-7) << dtype_name(d);
      }
    Tensor dy = random_tensor({b, out}, 7, d);
    LinearGrads g = linear_backward(dy, x, w, true, true);
    EXPECT_EQ(g.dw.dtype(), DType::kFloat32);
    EXPECT_EQ(g.dx.dtype(), d);
    const std::vector<float> dyv = dy.to_floats(), dwv = g.dw.to_floats(), dbv = g.dbias.to_floats();
    for (int64_t k = 0; k < in; ++k)
      for (int64_t j = 0; j < out; ++j) {
        double s = 0, sabs = 0;
        for (int64_t i = 0; i < b; ++i) {
          s += static_cast<double>(xv[i * in + k]) * dyv[i * out + j];
          sabs += std::fabs(static_cast<double>(xv[i * in + k]) * dyv[i * out + j]);
        }
        EXPECT_NEAR(dwv[k * out + j], s, b * 0x1p-24 * sabs + 1e-7);  // no 16-bit rounding of dW
      }
    for (int64_t j = 0; j < out; ++j) {
      double s = 0;
      for (int64_t i = 0; i < b; ++i) s += dyv[i * out + j];
      EXPECT_NEAR(dbv[j], s, 1e-5);
    }
  }
}

TEST(Matmul, ShapeErrorsNameBothOperands) {
  Tensor a = Tensor::zeros({2, 3}, DType::kFloat32), b = Tensor::zeros({4, 5}, DType::kFloat32);
  try {
    matmul(a, b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float32 (2, 3) x float32 (4, 5)"), std::string::npos) << e.what();
  }
}

TEST(Dropout, KeepsExpectedFractionAndScales) {
  Tensor x = Tensor::full({1000}, DType::kFloat16, 1.0f);
  Tensor mask = Tensor::empty({1000}, DType::kUInt8);
  for (int64_t i = 0; i < 1000; ++i) mask.data<uint8_t>()[i] = i % 4 != 0;
  const std::vector<float> y = dropout(x, mask, 0.25f).to_floats();
  const float kept = half_bits_to_float(float_to_half_bits(1.0f / 0.75f));  // rounded once into float16
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(y[i], i % 4 ? kept : 0.0f) << i;
}

}  // namespace
}  // namespace mixtrain::ops
