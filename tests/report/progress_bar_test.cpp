#include "mixtrain/report/progress_bar.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <thread>

namespace mixtrain {
namespace {

const MetricValues kValues = {{"loss", 0.51234}, {"accuracy", 0.812}};

void sleep_past_redraw_interval() {
  std::this_thread::sleep_for(std::chrono::duration<double>(ProgressBar::kRedrawIntervalSeconds * 1.5));
}

TEST(FormatMetricValue, FourDecimalsOrSignificantDigits) {
  EXPECT_EQ(format_metric_value(0.51234), "0.5123");
  EXPECT_EQ(format_metric_value(0.812), "0.8120");
  EXPECT_EQ(format_metric_value(0.0), "0.0000");
  EXPECT_EQ(format_metric_value(-0.5), "-0.5000");
  EXPECT_EQ(format_metric_value(9999.99), "9999.9900");
  EXPECT_EQ(format_metric_value(0.001), "0.0010");
  EXPECT_EQ(format_metric_value(12346.0), "1.235e+04");
  EXPECT_EQ(format_metric_value(-2.5e6), "-2.5e+06");
  EXPECT_EQ(format_metric_value(0.0001234), "0.0001234");
  EXPECT_EQ(format_metric_value(1e-5), "1e-05");
  EXPECT_EQ(format_metric_value(-3.21e-7), "-3.21e-07");
  EXPECT_EQ(format_metric_value(std::nan("")), "nan");
  EXPECT_EQ(format_metric_value(INFINITY), "inf");
}

TEST(FormatEta, KerasStyle) {
  EXPECT_EQ(format_eta(0.2), "0s");
  EXPECT_EQ(format_eta(12.4), "12s");
  EXPECT_EQ(format_eta(60), "60s");
  EXPECT_EQ(format_eta(65), "1:05");
  EXPECT_EQ(format_eta(3665), "1:01:05");
  EXPECT_EQ(format_eta(-3), "0s");
}

TEST(ProgressBar, NonInteractivePrintsOnlyTheSummary) {
  std::ostringstream out;
  ProgressBar bar(469, out, /*interactive=*/false);
  for (int64_t step = 1; step <= 469; ++step) bar.update(step, kValues);
  EXPECT_EQ(out.str(), "");
  bar.finish(kValues, 4.0);
  EXPECT_EQ(out.str(), "469/469 - 4s - 9ms/step - loss: 0.5123 - accuracy: 0.8120\n");
}

TEST(ProgressBar, NonInteractiveSummaryVariants) {
  const auto summary = [](int64_t total, int64_t steps, double seconds, const MetricValues& values) {
    std::ostringstream out;
    ProgressBar bar(total, out, false);
    for (int64_t step = 1; step <= steps; ++step) bar.update(step, values);
    bar.finish(values, seconds);
    return out.str();
  };
  // Stopped early: the summary reports the steps actually run.
  EXPECT_EQ(summary(469, 100, 2.0, {{"loss", 2.0}}), "100/469 - 2s - 20ms/step - loss: 2.0000\n");
  EXPECT_EQ(summary(469, 5, 0.5, {{"loss", 1.0}}), "5/469 - 0s - 100ms/step - loss: 1.0000\n");
  EXPECT_EQ(summary(0, 50, 1.0, {}), "50/Unknown - 1s - 20ms/step\n");
  EXPECT_EQ(summary(3, 3, 6.0, {{"val_loss", 12346.0}}), "3/3 - 6s - 2s/step - val_loss: 1.235e+04\n");
  EXPECT_EQ(summary(1000, 1000, 0.05, {{"lr", 1e-5}}), "1000/1000 - 0s - 50us/step - lr: 1e-05\n");
  // No update at all: the total is assumed.
  EXPECT_EQ(summary(10, 0, 1.0, {}), "10/10 - 1s - 100ms/step\n");
}

TEST(ProgressBar, InteractiveFrameLayout) {
  std::ostringstream out;
  ProgressBar bar(10, out, /*interactive=*/true);
  bar.update(5, {{"loss", 0.5}});
  EXPECT_EQ(out.str(), "\r 5/10 [==============>...............] - ETA: 0s - loss: 0.5000");
}

TEST(ProgressBar, InteractiveRedrawsAreThrottledAndEndWithTheSummary) {
  std::ostringstream out;
  ProgressBar bar(469, out, /*interactive=*/true);
  for (int64_t step = 1; step <= 469; ++step) bar.update(step, kValues);
  const std::string frames = out.str();
  const auto count = std::count(frames.begin(), frames.end(), '\r');
  // The first and last steps always draw; the steps in between run far faster than 10 per second.
  EXPECT_GE(count, 2);
  EXPECT_LT(count, 20);
  EXPECT_EQ(frames.find("\r  1/469 [..............................] - ETA: "), 0u);
  EXPECT_NE(frames.find("\r469/469 [==============================] - 0s - "), std::string::npos);
  EXPECT_EQ(frames.find('\n'), std::string::npos);

  bar.finish(kValues, 4.0);
  const std::string all = out.str();
  const std::string last_frame = all.substr(all.rfind('\r'));
  const std::string expected = "\r469/469 [==============================] - 4s - 9ms/step - loss: 0.5123 - accuracy: 0.8120";
  ASSERT_EQ(last_frame.substr(0, expected.size()), expected);
  // Whatever follows is padding over a longer previous frame, then the newline.
  EXPECT_EQ(last_frame.find_first_not_of(' ', expected.size()), last_frame.size() - 1);
  EXPECT_EQ(all.back(), '\n');
}

TEST(ProgressBar, InteractiveRedrawsAfterTheIntervalAndPadsShorterFrames) {
  std::ostringstream out;
  ProgressBar bar(100, out, /*interactive=*/true);
  bar.update(1, {{"loss", 123.4567}, {"accuracy", 0.5}});
  const size_t first_width = out.str().size() - 1;  // without the '\r'
  bar.update(2, {});  // within the interval: skipped
  const std::string after_skip = out.str();
  EXPECT_EQ(std::count(after_skip.begin(), after_skip.end(), '\r'), 1);
  sleep_past_redraw_interval();
  bar.update(3, {});
  const std::string all = out.str();
  ASSERT_EQ(std::count(all.begin(), all.end(), '\r'), 2);
  const std::string second = all.substr(all.rfind('\r') + 1);
  EXPECT_EQ(second.find("  3/100 [..."), 0u);
  EXPECT_EQ(second.size(), first_width);  // padded with spaces over the longer first frame
  EXPECT_EQ(second.back(), ' ');
}

TEST(ProgressBar, InteractiveUnknownTotal) {
  std::ostringstream out;
  ProgressBar bar(-1, out, /*interactive=*/true);
  bar.update(7, {{"loss", 1.0}});
  EXPECT_EQ(out.str(), "\r7/Unknown - 0s - loss: 1.0000");
  bar.finish({{"loss", 1.0}}, 1.4);
  EXPECT_EQ(out.str().substr(out.str().rfind('\r')), "\r7/Unknown - 1s - 200ms/step - loss: 1.0000\n");
}

TEST(ProgressBar, StdoutIsTerminalMatchesIsatty) {
  // The answer must follow what file descriptor 1 is: a pipe is not a terminal, and the original comes back.
  const int saved = ::dup(STDOUT_FILENO);
  ASSERT_GE(saved, 0);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::fflush(stdout);
  ASSERT_GE(::dup2(fds[1], STDOUT_FILENO), 0);
  const bool piped = stdout_is_terminal();
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_FALSE(piped);
  EXPECT_EQ(stdout_is_terminal(), ::isatty(STDOUT_FILENO) == 1);
}

}  // namespace
}  // namespace mixtrain
