// Keras' metric names beyond "accuracy" (sparse_categorical_accuracy, sparse_top_k_categorical_accuracy), compile()
// without an optimizer for evaluation only, and evaluate()'s verbose summary line.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "blobs.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/report/progress_bar.h"
#include "mixtrain/train/model.h"

namespace mixtrain {
namespace {

using train_test::blobs;

// Dense(classes) over the blobs' 8 features; labels spread over all classes so top-5 of 8 is not trivially 1.
std::unique_ptr<Model> linear_model(int64_t classes, uint64_t seed) {
  auto m = std::make_unique<Model>("linear", seed);
  m->emplace<Dense>(classes);
  m->build_for(Shape{8});
  return m;
}

Tensor spread_labels(int64_t n, int64_t classes) {
  std::vector<int32_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[static_cast<size_t>(i)] = static_cast<int32_t>((i * 5 + i / 3) % classes);
  return Tensor::from_ints({n}, y);
}

// The share of rows whose label's score has fewer than k strictly greater scores (ties count), read from predict().
double host_top_k(const Tensor& scores, const Tensor& labels, int64_t k) {
  const std::vector<float> s = scores.to_floats();
  const std::vector<int64_t> l = labels.to_int64s();
  const int64_t c = scores.dim(1), n = scores.dim(0);
  double in_top = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float mine = s[static_cast<size_t>(i * c + l[static_cast<size_t>(i)])];
    in_top += std::count_if(s.begin() + i * c, s.begin() + (i + 1) * c, [&](float v) { return v > mine; }) < k;
  }
  return in_top / static_cast<double>(n);
}

TEST(Metrics, SparseCategoricalAccuracyLogsUnderItsOwnName) {
  auto [x, y] = blobs(300, 1);
  History h[2];
  const char* names[2] = {"accuracy", "sparse_categorical_accuracy"};
  EvaluateResult r[2];
  for (int i = 0; i < 2; ++i) {
    auto m = std::make_unique<Model>("mlp", 3);
    m->emplace<Dense>(3);
    m->compile(make_optimizer("sgd", 0.05f), Loss("sparse_categorical_crossentropy", true), {names[i]});
    FitOptions o;
    o.epochs = 2;
    o.validation_split = 0.2;
    o.verbose = 0;
    h[i] = m->fit(x, y, o);
    r[i] = m->evaluate(x, y);
  }
  // Keras logs a metric under the name it was given; the count is the same as "accuracy"'s.
  ASSERT_EQ(h[1].history.count("accuracy"), 0u);
  ASSERT_EQ(h[1].history.count("val_accuracy"), 0u);
  EXPECT_EQ(h[1].history["sparse_categorical_accuracy"], h[0].history["accuracy"]);
  EXPECT_EQ(h[1].history["val_sparse_categorical_accuracy"], h[0].history["val_accuracy"]);
  ASSERT_EQ(r[1].metrics.size(), 1u);
  EXPECT_EQ(r[1].metrics[0].first, "sparse_categorical_accuracy");
  EXPECT_EQ(r[1].metrics[0].second, r[0].accuracy);
  EXPECT_EQ(r[1].accuracy, r[0].accuracy);  // .accuracy stays the accuracy, whatever its name
  EXPECT_GT(r[0].accuracy, 0.5);
}

TEST(Metrics, TopKAccuracyCountsLabelsAmongTheFiveLargestScores) {
  const int64_t classes = 8, n = 97;
  auto [x, unused] = blobs(n, 4);
  const Tensor y = spread_labels(n, classes);
  auto m = linear_model(classes, 9);
  m->compile(make_optimizer("sgd", 0.1f), Loss("sparse_categorical_crossentropy", true),
             {"sparse_top_k_categorical_accuracy", "accuracy"});
  // Exact: counts of float32 comparisons of the same scores; the shares are divided in double on both sides.
  const Tensor before = m->predict(x);
  const double want = host_top_k(before, y, 5);
  ASSERT_GT(want, 0.0);
  ASSERT_LT(want, 1.0);  // the test can tell a wrong k from the right one
  const EvaluateResult r = m->evaluate(x, y, 32);
  ASSERT_EQ(r.metrics.size(), 2u);
  EXPECT_EQ(r.metrics[0].first, "sparse_top_k_categorical_accuracy");
  EXPECT_NEAR(r.metrics[0].second, want, 1e-12);
  EXPECT_NEAR(r.metrics[1].second, host_top_k(before, y, 1) /* no ties in random scores */, 1e-12);
  // Training logs the step's count before its update: one step over all rows sees the scores predict() saw.
  FitOptions o;
  o.epochs = 1;
  o.batch_size = n;
  o.shuffle = false;
  o.verbose = 0;
  o.validation_data = std::make_pair(x, y);
  History h = m->fit(x, y, o);
  EXPECT_NEAR(h.history["sparse_top_k_categorical_accuracy"].at(0), want, 1e-12);
  EXPECT_NEAR(h.history["val_sparse_top_k_categorical_accuracy"].at(0), host_top_k(m->predict(x), y, 5), 1e-12);
}

TEST(Metrics, UnknownAndRepeatedMetricsAreErrors) {
  auto m = linear_model(3, 1);
  const Loss loss("sparse_categorical_crossentropy", true);
  try {
    m->compile(make_optimizer("sgd", 0.1f), loss, {"top5"});
    ADD_FAILURE() << "an unknown metric was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sparse_top_k_categorical_accuracy"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m->compile(make_optimizer("sgd", 0.1f), loss, {"acc", "sparse_categorical_accuracy"}), Error);
  EXPECT_THROW(m->compile(make_optimizer("sgd", 0.1f), Loss("mse"), {"sparse_top_k_categorical_accuracy"}), Error);
}

TEST(Metrics, CompileWithoutAnOptimizerEvaluatesAndPredictsButDoesNotTrain) {
  auto [x, y] = blobs(120, 2);
  auto trained = linear_model(3, 5);
  trained->compile(make_optimizer("sgd", 0.1f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  auto eval_only = linear_model(3, 5);  // same seed: same weights
  eval_only->compile(Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  EXPECT_FALSE(eval_only->compiled());
  EXPECT_TRUE(eval_only->compiled_for_evaluation());
  const EvaluateResult want = trained->evaluate(x, y), got = eval_only->evaluate(x, y);
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.accuracy, want.accuracy);
  EXPECT_EQ(eval_only->predict(x).to_floats(), trained->predict(x).to_floats());
  for (int i = 0; i < 2; ++i) {
    try {
      FitOptions o;
      o.verbose = 0;
      if (i == 0) (void)eval_only->fit(x, y, o);
      else (void)eval_only->train_step(x, y);
      ADD_FAILURE() << "a model compiled without an optimizer trained";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("compile it with an optimizer"), std::string::npos) << e.what();
    }
  }
  // Not compiled at all: evaluate still says to compile.
  auto bare = linear_model(3, 5);
  EXPECT_THROW((void)bare->evaluate(x, y), Error);
}

TEST(Metrics, EvaluatePrintsKerasSummaryLineWhenVerbose) {
  auto [x, y] = blobs(90, 3);
  auto m = linear_model(8, 2);
  m->compile(make_optimizer("sgd", 0.1f), Loss("sparse_categorical_crossentropy", true),
             {"accuracy", "sparse_top_k_categorical_accuracy"});
  std::ostringstream out;
  EvaluateOptions eo;
  eo.batch_size = 32;
  eo.verbose_out = &out;
  const EvaluateResult r = m->evaluate(x, y, eo);
  EXPECT_EQ(out.str(), "loss: " + format_metric_value(r.loss) + " - accuracy: " + format_metric_value(r.accuracy) +
                           " - sparse_top_k_categorical_accuracy: " + format_metric_value(r.metrics[1].second) +
                           "\n");
  const EvaluateResult silent = m->evaluate(x, y, 32);  // the overload without options prints nothing
  EXPECT_EQ(silent.loss, r.loss);
  std::ostringstream quiet;
  eo.verbose = 0;
  eo.verbose_out = &quiet;
  testing::internal::CaptureStdout();
  (void)m->evaluate(x, y, eo);
  (void)m->evaluate(x, y, 32);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(quiet.str(), "");
  eo.verbose = 2;
  EXPECT_THROW((void)m->evaluate(x, y, eo), Error);
}

}  // namespace
}  // namespace mixtrain
