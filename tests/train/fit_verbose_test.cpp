// FitOptions::verbose, as Keras' fit(verbose=...): by default fit() reports every epoch (one line per epoch
// when the output is not a terminal), 2 always one line per epoch, 0 nothing; one voice under data parallelism,
// and no second bar when the caller already passes a ProgressBarLogger.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "mixtrain/distributed/communicator.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/train/callbacks.h"
#include "mixtrain/train/model.h"

#include "blobs.h"

namespace mixtrain {
namespace {

using train_test::blobs;

std::unique_ptr<Model> tiny_model() {
  auto m = std::make_unique<Model>("tiny", 3);
  m->emplace<Dense>(8, "relu");
  m->emplace<Dense>(3);
  m->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

FitOptions three_epochs() {
  FitOptions o;
  o.epochs = 3;
  o.batch_size = 16;
  o.validation_split = 0.25;
  return o;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The non-interactive epoch report: "Epoch 1/3", then "5/5 - 0s - 3ms/step - loss: ... - val_loss: ...".
void expect_one_line_per_epoch(const std::string& text, int epochs) {
  const std::vector<std::string> lines = lines_of(text);
  ASSERT_EQ(lines.size(), static_cast<size_t>(2 * epochs)) << text;
  for (int e = 0; e < epochs; ++e) {
    EXPECT_EQ(lines[static_cast<size_t>(2 * e)], "Epoch " + std::to_string(e + 1) + "/" + std::to_string(epochs));
    const std::string& summary = lines[static_cast<size_t>(2 * e + 1)];
    EXPECT_EQ(summary.rfind("5/5 - ", 0), 0u) << summary;  // 75 training rows in batches of 16
    for (const char* key : {"- loss: ", "- accuracy: ", "- val_loss: ", "- val_accuracy: "})
      EXPECT_NE(summary.find(key), std::string::npos) << key << " missing from: " << summary;
  }
  EXPECT_EQ(text.find('\r'), std::string::npos) << "a redrawn bar on a stream that is not a terminal";
}

TEST(FitVerbose, ByDefaultPrintsOneLinePerEpochToStandardOutputThatIsNotATerminal) {
  auto [x, y] = blobs(100, 1);
  auto m = tiny_model();
  testing::internal::CaptureStdout();  // a file, not a terminal
  m->fit(x, y, three_epochs());
  expect_one_line_per_epoch(testing::internal::GetCapturedStdout(), 3);
}

TEST(FitVerbose, OneOnACapturedStreamAndTwoPrintOneLinePerEpoch) {
  auto [x, y] = blobs(100, 1);
  for (int verbose : {1, 2}) {
    SCOPED_TRACE("verbose " + std::to_string(verbose));
    auto m = tiny_model();
    std::ostringstream out;
    FitOptions o = three_epochs();
    o.verbose = verbose;
    o.verbose_out = &out;
    testing::internal::CaptureStdout();
    m->fit(x, y, o);
    EXPECT_EQ(testing::internal::GetCapturedStdout(), "") << "verbose_out is where the progress goes";
    expect_one_line_per_epoch(out.str(), 3);
  }
}

TEST(FitVerbose, ZeroPrintsNothing) {
  auto [x, y] = blobs(100, 1);
  auto m = tiny_model();
  std::ostringstream out;
  FitOptions o = three_epochs();
  o.verbose = 0;
  testing::internal::CaptureStdout();
  m->fit(x, y, o);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  o.verbose_out = &out;
  m->fit(x, y, o);
  EXPECT_EQ(out.str(), "");
}

TEST(FitVerbose, ACallersProgressBarLoggerIsTheOnlyOne) {
  auto [x, y] = blobs(100, 1);
  auto m = tiny_model();
  std::ostringstream mine, fits;
  ProgressBarLogger bar(mine, /*interactive=*/false);
  FitOptions o = three_epochs();
  o.callbacks = {&bar};
  o.verbose_out = &fits;
  testing::internal::CaptureStdout();
  m->fit(x, y, o);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(fits.str(), "") << "a second progress report next to the caller's";
  expect_one_line_per_epoch(mine.str(), 3);
}

TEST(FitVerbose, RefusesValuesOtherThanZeroOneTwo) {
  auto [x, y] = blobs(100, 1);
  auto m = tiny_model();
  FitOptions o = three_epochs();
  for (int verbose : {-1, 3}) {
    o.verbose = verbose;
    try {
      m->fit(x, y, o);
      FAIL() << "verbose " << verbose << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("verbose must be 0"), std::string::npos) << e.what();
    }
  }
}

// Rank 1 of a two-rank job whose other rank holds the same data: sums double, the rest is left as it is.
class SecondOfTwoRanks : public Communicator {
 public:
  int rank() const override { return 1; }
  int size() const override { return 2; }
  std::string backend() const override { return "test"; }
  void all_reduce(float* data, int64_t n, ReduceOp op) override { reduce(data, n, op); }
  void all_reduce(double* data, int64_t n, ReduceOp op) override { reduce(data, n, op); }
  std::unique_ptr<Request> start_all_reduce(float* data, int64_t n, ReduceOp op) override {
    reduce(data, n, op);
    return std::make_unique<Done>();
  }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }

 private:
  struct Done : Request {
    void wait() override {}
    bool test() override { return true; }
  };
  template <typename T>
  static void reduce(T* data, int64_t n, ReduceOp op) {
    if (op == ReduceOp::kSum)
      for (int64_t i = 0; i < n; ++i) data[i] *= 2;
  }
};

TEST(FitVerbose, OnlyRankZeroOfADataParallelRunPrints) {
  auto [x, y] = blobs(100, 1);
  auto m = tiny_model();
  SecondOfTwoRanks comm;
  std::ostringstream out;
  FitOptions o = three_epochs();
  o.communicator = &comm;
  o.verbose_out = &out;
  testing::internal::CaptureStdout();
  const History h = m->fit(x, y, o);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(out.str(), "") << "rank 1 printed";
  EXPECT_EQ(h.epoch.size(), 3u);  // it trained
}

}  // namespace
}  // namespace mixtrain
