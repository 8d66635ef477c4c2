#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "mixtrain/nn/layers.h"
#include "mixtrain/train/callbacks.h"
#include "mixtrain/train/model.h"

#include "blobs.h"

namespace mixtrain {
namespace {

using train_test::blobs;

std::unique_ptr<Model> small_mlp(uint64_t seed, float dropout = 0.0f) {
  auto m = std::make_unique<Model>("mlp", seed);
  m->emplace<Dense>(16, "relu");
  if (dropout > 0) m->emplace<Dropout>(dropout);
  m->emplace<Dense>(3);
  m->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

TEST(Model, FitLearnsSeparableBlobs) {
  auto [x, y] = blobs(600, 1);
  auto [tx, ty] = blobs(300, 2);
  auto m = small_mlp(7);
  FitOptions o;
  o.epochs = 5;
  o.batch_size = 32;
  o.validation_split = 0.2;
  History h = m->fit(x, y, o);
  ASSERT_EQ(h.history["loss"].size(), 5u);
  ASSERT_EQ(h.history["val_accuracy"].size(), 5u);
  EXPECT_LT(h.history["loss"].back(), h.history["loss"].front());
  EXPECT_EQ(h.steps, 5 * 15);  // 480 training rows in batches of 32
  EXPECT_EQ(h.step_loss.size(), 75u);
  EvaluateResult r = m->evaluate(tx, ty);
  EXPECT_GT(r.accuracy, 0.95);
  Tensor p = m->predict(tx);
  EXPECT_EQ(p.shape(), (Shape{300, 3}));
}

// A kernel regularizer set on a layer acts in fit(): its penalty joins the loss (and its gradient the update).
TEST(Model, FitAddsKernelRegularizerPenalties) {
  // Variables, not a structured binding: the lambda below captures them, which clang 14 (the sanitizer build's
  // compiler) does not allow for bindings.
  Tensor x, y;
  std::tie(x, y) = blobs(600, 1);
  auto kernel_norm = [&](float l2) {
    auto m = std::make_unique<Model>("mlp", 7);
    m->emplace<Dense>(16, "relu")->set_kernel_regularizer(L2(l2));
    m->emplace<Dense>(3);
    m->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true));
    FitOptions o;
    o.epochs = 3;
    History h = m->fit(x, y, o);
    const Tensor k = m->layers().front()->weights().front().value();
    double sq = 0;
    for (int64_t i = 0; i < k.numel(); ++i) sq += double(k.data<float>()[i]) * k.data<float>()[i];
    return std::make_pair(sq, h.history["loss"].back());
  };
  const auto [plain_sq, plain_loss] = kernel_norm(0.0f);
  const auto [reg_sq, reg_loss] = kernel_norm(0.1f);
  EXPECT_LT(reg_sq, 0.5 * plain_sq) << "an L2 penalty of 0.1 must shrink the kernel";
  EXPECT_GT(reg_loss, plain_loss) << "the logged loss includes the penalty";
}

TEST(Model, SameSeedGivesBitIdenticalWeightsOtherSeedDoesNot) {
  // Variables, not a structured binding: the lambda below captures them, which clang 14 (the sanitizer build's
  // compiler) does not allow for bindings.
  Tensor x, y;
  std::tie(x, y) = blobs(300, 3);
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 16;
  auto run = [&](uint64_t seed) {
    auto m = small_mlp(seed, 0.3f);
    m->fit(x, y, o);
    std::vector<float> all;
    for (const Var& w : m->weights()) {
      auto v = w.value().to_floats();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const auto a = run(11), b = run(11), c = run(12);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// steps_per_epoch: epochs of exactly that many full batches drawn at random with replacement (so an epoch
// may be longer than the data set), reproducible from the seed, validating at the end of each.
TEST(Model, StepsPerEpochDrawsThatManyRandomBatches) {
  Tensor x, y;  // captured below: not a structured binding (clang 14)
  std::tie(x, y) = blobs(50, 5);
  auto [vx, vy] = blobs(30, 6);
  FitOptions o;
  o.epochs = 3;
  o.batch_size = 8;
  o.steps_per_epoch = 10;  // 80 rows an epoch from 50
  o.validation_data = std::make_pair(vx, vy);
  auto run = [&](uint64_t seed) {
    auto m = small_mlp(seed);
    History h = m->fit(x, y, o);
    EXPECT_EQ(h.steps, 30);
    EXPECT_EQ(h.samples, 240);
    EXPECT_EQ(h.history["val_loss"].size(), 3u);
    return m->weights()[0].value().to_floats();
  };
  EXPECT_EQ(run(3), run(3));
  EXPECT_NE(run(3), run(4));
  o.steps_per_epoch = -1;
  EXPECT_THROW(small_mlp(3)->fit(x, y, o), Error);
}

TEST(Model, EarlyStoppingStopsAndRestoresBestWeights) {
  auto [x, y] = blobs(300, 4);
  auto m = small_mlp(5);
  // min_delta so large that no epoch after the first counts as an improvement.
  EarlyStopping es("val_loss", /*patience=*/1, /*min_delta=*/1e9, /*restore_best_weights=*/true);
  FitOptions o;
  o.epochs = 10;
  o.validation_split = 0.2;
  o.callbacks = {&es};
  History h = m->fit(x, y, o);
  EXPECT_EQ(h.epoch.size(), 2u);  // epoch 0 best, epoch 1 the one epoch of patience: stop after it, as Keras
  EXPECT_EQ(es.stopped_epoch(), 1);
}

TEST(Model, TerminateOnNaNStopsAtTheFirstBadStep) {
  auto [x, y] = blobs(64, 5);
  x.data<float>()[3] = NAN;  // in the first row, which the unshuffled first batch holds
  auto m = small_mlp(6);
  TerminateOnNaN guard;
  FitOptions o;
  o.epochs = 3;
  o.shuffle = false;
  o.callbacks = {&guard};
  History h = m->fit(x, y, o);
  EXPECT_TRUE(guard.terminated());
  EXPECT_EQ(h.steps, 1);
}

TEST(Model, CsvLoggerWritesOneRowPerEpoch) {
  auto [x, y] = blobs(90, 6);
  auto m = small_mlp(7);
  const std::string path = (std::filesystem::temp_directory_path() / "mixtrain_csvlogger_test.csv").string();
  CSVLogger log(path);
  FitOptions o;
  o.epochs = 2;
  o.validation_split = 0.1;
  o.callbacks = {&log};
  m->fit(x, y, o);
  std::ifstream f(path);
  std::string header, row1, row2, extra;
  std::getline(f, header);
  std::getline(f, row1);
  std::getline(f, row2);
  for (std::string* line : {&header, &row1, &row2})
    if (!line->empty() && line->back() == '\r') line->pop_back();  // rows end in CRLF, as RFC 4180
  EXPECT_EQ(header, "epoch,loss,accuracy,val_loss,val_accuracy");
  EXPECT_EQ(row1.rfind("0,", 0), 0u);
  EXPECT_EQ(row2.rfind("1,", 0), 0u);
  EXPECT_FALSE(std::getline(f, extra));
  std::filesystem::remove(path);
}

TEST(Model, BadArgumentsAreErrors) {
  auto [x, y] = blobs(30, 8);
  auto m = small_mlp(1);
  FitOptions o;
  o.epochs = 0;
  EXPECT_THROW(m->fit(x, y, o), Error);
  o.epochs = 1;
  o.batch_size = 0;
  EXPECT_THROW(m->fit(x, y, o), Error);
  EXPECT_THROW(m->fit(x, y.slice_rows(0, 10), FitOptions{}), Error);
  Model uncompiled;
  uncompiled.emplace<Dense>(2);
  EXPECT_THROW(uncompiled.fit(x, y, FitOptions{}), Error);
  EXPECT_THROW(Loss("hinge"), Error);
}

}  // namespace
}  // namespace mixtrain
