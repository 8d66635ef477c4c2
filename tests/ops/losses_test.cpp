// Losses and reductions against float64 references and hand-computed values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/softmax.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::kOddSizes;
using testing::random_tensor;
using testing::to_doubles;
using testing::unit;

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

TEST(Losses, Int64LabelsGiveTheSameResults) {
  Tensor logits = random_tensor({17, 7}, 1, DType::kBFloat16, -3, 3);
  std::vector<int32_t> l32(17);
  std::vector<int64_t> l64(17);
  for (int i = 0; i < 17; ++i) l64[i] = l32[i] = (i * 5) % 7;
  Tensor a = Tensor::from_ints({17}, l32), b = Tensor::from_int64s({17}, l64);
  EXPECT_EQ(sparse_categorical_crossentropy(logits, a, true).item(), sparse_categorical_crossentropy(logits, b, true).item());
  EXPECT_EQ(sparse_categorical_crossentropy_backward(logits, a, true, 1.0f).to_floats(),
            sparse_categorical_crossentropy_backward(logits, b, true, 1.0f).to_floats());
  EXPECT_EQ(sparse_categorical_accuracy(logits, a), sparse_categorical_accuracy(logits, b));
  EXPECT_THROW(sparse_categorical_crossentropy(logits, Tensor::from_int64s({17}, std::vector<int64_t>(17, 7)), true),
               Error);
  EXPECT_THROW(sparse_categorical_crossentropy(logits, Tensor::zeros({17}, DType::kFloat32), true), Error);
}

// Cross-entropy of every row against targets t (B, C), and its gradient, in float64.
void crossentropy_ref(const std::vector<double>& x, const std::vector<double>& t, int64_t rows, int64_t cols,
                      bool from_logits, double* loss, std::vector<double>* grad) {
  *loss = 0;
  grad->assign(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * cols;
    double mx = -1e300, s = 0, tsum = 0;
    for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < cols; ++j) s += std::exp(row[j] - mx);
    for (int64_t j = 0; j < cols; ++j) tsum += t[r * cols + j];
    for (int64_t j = 0; j < cols; ++j) {
      const double tj = t[r * cols + j];
      if (from_logits) {
        *loss -= tj * (row[j] - mx - std::log(s));
        (*grad)[r * cols + j] = (std::exp(row[j] - mx) / s * tsum - tj) / rows;
      } else {
        // Probabilities are clipped to [1e-7, 1 - 1e-7] as Keras does; clipped ones pass no gradient.
        const double lo = 1e-7f, hi = 1 - 1e-7f;  // the float32 bounds the op uses
        *loss -= tj * std::log(std::clamp(row[j], lo, hi));
        (*grad)[r * cols + j] = row[j] < lo || row[j] > hi ? 0.0 : -tj / row[j] / rows;
      }
    }
  }
  *loss /= rows;
}

TEST(Losses, CrossEntropiesMatchFloat64InEveryDType) {
  for (DType d : kFloatDTypes)
    for (int64_t cols : kOddSizes)
      for (bool from_logits : {true, false}) {
        const int64_t rows = 7;
        Tensor x = from_logits ? random_tensor({rows, cols}, 2 + cols, d, -4, 4)
                               : softmax(random_tensor({rows, cols}, 2 + cols, DType::kFloat32, -2, 2)).to(d);
        std::vector<int32_t> labels(static_cast<size_t>(rows));
        std::vector<double> onehot(static_cast<size_t>(rows * cols), 0.0);
        for (int64_t r = 0; r < rows; ++r) {
          labels[r] = static_cast<int32_t>((r * 3) % cols);
          onehot[r * cols + labels[r]] = 1;
        }
        Tensor soft = softmax(random_tensor({rows, cols}, 3 + cols, DType::kFloat32));
        const std::vector<double> xv = to_doubles(x), sv = to_doubles(soft);
        double want = 0;
        std::vector<double> gwant;
        // Sparse labels against their one-hot rows.
        crossentropy_ref(xv, onehot, rows, cols, from_logits, &want, &gwant);
        Tensor lt = Tensor::from_ints({rows}, labels);
        const double got = sparse_categorical_crossentropy(x, lt, from_logits).item();
        // float32 log-softmax per row (~cols units), float64 batch sum: a float32 loss.
        EXPECT_NEAR(got, want, 1e-5 * (1 + std::fabs(want))) << dtype_name(d) << " cols " << cols;
        const std::vector<double> g = to_doubles(sparse_categorical_crossentropy_backward(x, lt, from_logits, 1.0f));
        for (size_t i = 0; i < g.size(); ++i)
          EXPECT_NEAR(g[i], gwant[i], 2 * unit(d) * std::fabs(gwant[i]) + 1e-6) << dtype_name(d) << " cols " << cols;
        // Soft targets.
        crossentropy_ref(xv, sv, rows, cols, from_logits, &want, &gwant);
        EXPECT_NEAR(categorical_crossentropy(x, soft, from_logits).item(), want, 1e-5 * (1 + std::fabs(want)))
            << dtype_name(d) << " cols " << cols;
        const std::vector<double> gs = to_doubles(categorical_crossentropy_backward(x, soft, from_logits, 2.0f));
        for (size_t i = 0; i < gs.size(); ++i)
          EXPECT_NEAR(gs[i], 2 * gwant[i], 4 * unit(d) * std::fabs(gwant[i]) + 1e-6) << dtype_name(d);
      }
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

TEST(Losses, MseAndReductionsMatchFloat64OnAnyRank) {
  for (DType d : kFloatDTypes)
    for (int64_t n : kOddSizes) {
      Tensor p = random_tensor({2, n, 3}, 4 + n, d), t = random_tensor({2, n, 3}, 5 + n, DType::kFloat32);
      const std::vector<double> pv = to_doubles(p), tv = to_doubles(t);
      double mse = 0, s = 0;
      for (size_t i = 0; i < pv.size(); ++i) {
        mse += (pv[i] - tv[i]) * (pv[i] - tv[i]);
        s += pv[i];
      }
      const double count = static_cast<double>(pv.size());
      mse /= count;
      // Double accumulation, one rounding into float32.
      EXPECT_NEAR(mean_squared_error(p, t).item(), mse, 0x1p-23 * mse) << dtype_name(d);
      EXPECT_NEAR(sum(p).item(), s, 0x1p-23 * std::fabs(s) + 1e-6);
      EXPECT_NEAR(mean(p).item(), s / count, 0x1p-23 * std::fabs(s / count) + 1e-7);
      const std::vector<double> g = to_doubles(mean_squared_error_backward(p, t, 3.0f));
      for (size_t i = 0; i < g.size(); ++i) {
        const double want = 6.0 * (pv[i] - tv[i]) / count;
        // k = 2 dloss / n rounded into float32, then two float32 operations and one rounding into d.
        EXPECT_NEAR(g[i], want, (unit(d) + 4 * 0x1p-24) * std::fabs(want) + testing::subnormal_step(d)) << dtype_name(d);
      }
      Tensor sb = sum_backward(p, 0.5f), mb = mean_backward(p, 0.5f);
      EXPECT_EQ(sb.shape(), p.shape());
      EXPECT_EQ(sb.dtype(), d);
      for (float v : sb.to_floats()) EXPECT_EQ(v, 0.5f);
      const float each = Tensor::from_floats({}, {0.5f / static_cast<float>(count)}, d).item();
      for (float v : mb.to_floats()) EXPECT_EQ(v, each);
    }
}

// The kernel regularizer's penalty and its gradient, on weights of every dtype with zeros among them (sign 0).
TEST(Losses, RegularizationPenaltyMatchesFloat64) {
  for (DType d : kFloatDTypes)
    for (int64_t n : kOddSizes) {
      std::vector<float> v = random_tensor({n, 3}, 21 + n, DType::kFloat32, -3, 3).to_floats();
      for (size_t i = 0; i < v.size(); i += 5) v[i] = 0.0f;
      const Tensor w = Tensor::from_floats({n, 3}, v, d);
      const std::vector<double> wv = to_doubles(w);
      const float l1 = 0.1f, l2 = 0.03f;
      double want = 0;
      for (double x : wv) want += static_cast<double>(l1) * std::fabs(x) + static_cast<double>(l2) * x * x;
      const Tensor p = regularization_penalty(w, l1, l2);
      EXPECT_EQ(p.dtype(), DType::kFloat32);
      EXPECT_EQ(p.numel(), 1);
      // Double terms and sum, one rounding into float32.
      EXPECT_NEAR(p.item(), want, 0x1p-23 * want) << dtype_name(d) << " n=" << n;
      const Tensor g = regularization_penalty_backward(w, l1, l2, Tensor::from_floats({1}, {-2.0f}));
      EXPECT_EQ(g.dtype(), DType::kFloat32);
      EXPECT_EQ(g.shape(), w.shape());
      const std::vector<float> gv = g.to_floats();
      for (size_t i = 0; i < wv.size(); ++i) {
        const double sign = (wv[i] > 0) - (wv[i] < 0);
        const double gw = -2.0 * (static_cast<double>(l1) * sign + 2.0 * static_cast<double>(l2) * wv[i]);
        // Four float32 operations, each rounded (2 l2 is exact).
        EXPECT_NEAR(gv[i], gw, 4 * 0x1p-24 * (std::fabs(gw) + static_cast<double>(l1) * 2)) << dtype_name(d);
      }
    }
  const Tensor w = random_tensor({4}, 3, DType::kFloat32);
  EXPECT_THROW(regularization_penalty(w, -0.1f, 0.0f), Error);
  EXPECT_THROW(regularization_penalty(w, 0.0f, std::nanf("")), Error);
  EXPECT_THROW(regularization_penalty(Tensor::from_ints({2}, {1, 2}), 0.1f, 0.0f), Error);
  EXPECT_THROW(regularization_penalty_backward(w, 0.1f, 0.0f, Tensor::from_floats({2}, {1, 1})), Error);
}

TEST(Losses, AccuracyTakesTheFirstArgMax) {
  Tensor scores = Tensor::from_floats({3, 3}, {1, 1, 0, 0, 2, 2, 5, 0, 5}, DType::kFloat16);
  EXPECT_EQ(sparse_categorical_accuracy(scores, Tensor::from_int64s({3}, {0, 1, 2})), 2.0 / 3.0);
}

// A sequence model's logits (B, T, C) with labels (B, T): the same numbers as the (B*T, C) rows, so the loss
// is the mean per position; a label shape that is not the logits' minus the last axis is refused.
TEST(Losses, SequenceLogitsAreRowsPerPosition) {
  for (DType d : kFloatDTypes) {
    Tensor logits = random_tensor({3, 5, 7}, 11, d, -4, 4);
    std::vector<int32_t> ids(15);
    for (int i = 0; i < 15; ++i) ids[i] = (i * 3 + 1) % 7;
    Tensor labels = Tensor::from_ints({3, 5}, ids);
    Tensor flat = logits.reshape({15, 7}), flat_labels = Tensor::from_ints({15}, ids);
    EXPECT_EQ(sparse_categorical_crossentropy(logits, labels, true).item(),
              sparse_categorical_crossentropy(flat, flat_labels, true).item());
    Tensor g = sparse_categorical_crossentropy_backward(logits, labels, true, 1.0f);
    EXPECT_EQ(g.shape(), logits.shape());
    EXPECT_EQ(g.to_floats(), sparse_categorical_crossentropy_backward(flat, flat_labels, true, 1.0f).to_floats());
    EXPECT_EQ(sparse_categorical_accuracy(logits, labels), sparse_categorical_accuracy(flat, flat_labels));
    // A transposed view of the logits is read through its strides.
    Tensor tv = logits.transpose(0, 1).contiguous().transpose(0, 1);
    EXPECT_EQ(sparse_categorical_crossentropy(tv, labels, true).item(),
              sparse_categorical_crossentropy(logits, labels, true).item());
  }
  Tensor logits = random_tensor({3, 5, 7}, 12, DType::kFloat32, -1, 1);
  EXPECT_THROW(sparse_categorical_crossentropy(logits, Tensor::from_ints({15}, std::vector<int32_t>(15, 0)), true),
               Error);
  EXPECT_THROW(sparse_categorical_crossentropy(logits, Tensor::from_ints({3, 5}, std::vector<int32_t>(15, 7)), true),
               Error);
}

}  // namespace
}  // namespace mixtrain::ops
