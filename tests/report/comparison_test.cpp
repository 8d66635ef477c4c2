#include "mixtrain/report/comparison.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + needle.size())) ++n;
  return n;
}

PolicyRun baseline_run() {
  PolicyRun run;
  run.policy = "float32";
  for (int i = 0; i < 90; ++i) run.step_loss.push_back(2.0 * std::exp(-i / 30.0) + 0.1);
  run.epoch_loss = {1.0, 0.5, 0.4};
  run.epoch_val_loss = {1.1, 0.6, 0.45};
  run.test_loss = 0.42;
  run.test_accuracy = 0.90;
  run.steps_per_second = 100;
  run.peak_memory_bytes = 8 * 1024 * 1024;
  return run;
}

// A run identical to the baseline except for its policy and a 1.5x speedup: it tracks.
PolicyRun tracking_run() {
  PolicyRun run = baseline_run();
  run.policy = "mixed_float16";
  run.steps_per_second = 150;
  run.peak_memory_bytes = 4 * 1024 * 1024;
  return run;
}

TEST(Verdict, BaselineAndTracks) {
  const PolicyRun base = baseline_run();
  EXPECT_EQ(verdict_for(base, base), "baseline");
  EXPECT_EQ(verdict_for(tracking_run(), base), "tracks");
}

TEST(Verdict, NonFiniteLossDiverges) {
  const PolicyRun base = baseline_run();
  PolicyRun run = tracking_run();
  run.step_loss[40] = kNaN;
  EXPECT_EQ(verdict_for(run, base), "diverged");
  run = tracking_run();
  run.epoch_val_loss[2] = kInf;
  EXPECT_EQ(verdict_for(run, base), "diverged");
  run = tracking_run();
  run.epoch_loss[0] = -kInf;
  EXPECT_EQ(verdict_for(run, base), "diverged");
  // A missing test loss (NaN) is not a divergence.
  run = tracking_run();
  run.test_loss = kNaN;
  EXPECT_EQ(verdict_for(run, base), "tracks");
}

TEST(Verdict, FinalLossTwiceTheBaselineDiverges) {
  const PolicyRun base = baseline_run();
  PolicyRun run = tracking_run();
  run.epoch_loss.back() = 0.8;  // exactly 2x: not diverged, but far outside 5%
  EXPECT_EQ(verdict_for(run, base), "deviates");
  run.epoch_loss.back() = 0.81;
  EXPECT_EQ(verdict_for(run, base), "diverged");
}

TEST(Verdict, SmoothedCurveDeviationAboveHalfDiverges) {
  const PolicyRun base = baseline_run();
  PolicyRun run = tracking_run();
  for (double& v : run.step_loss) v *= 1.5;  // exactly 50% everywhere
  EXPECT_EQ(verdict_for(run, base), "tracks");
  run = tracking_run();
  for (double& v : run.step_loss) v *= 1.51;
  EXPECT_EQ(verdict_for(run, base), "diverged");
  // A single spike is smoothed: 3x the loss at one step moves the average by far less than 50%.
  run = tracking_run();
  run.step_loss[60] *= 3;
  EXPECT_EQ(verdict_for(run, base), "tracks");
  run.step_loss[60] *= 10;
  EXPECT_EQ(verdict_for(run, base), "diverged");
}

TEST(Verdict, EpochLossDeviationAboveFivePercentDeviates) {
  const PolicyRun base = baseline_run();
  PolicyRun run = tracking_run();
  run.epoch_loss = {1.05, 0.525, 0.42};  // exactly 5%
  EXPECT_EQ(verdict_for(run, base), "tracks");
  run.epoch_loss = {0.95, 0.475, 0.38};  // exactly 5% lower is as far off
  EXPECT_EQ(verdict_for(run, base), "tracks");
  run.epoch_loss = {1.0, 0.5, 0.4201};
  EXPECT_EQ(verdict_for(run, base), "deviates");
  run.epoch_loss = {0.949, 0.5, 0.4};
  EXPECT_EQ(verdict_for(run, base), "deviates");
}

TEST(Verdict, AccuracyMoreThanOnePointBelowDeviates) {
  const PolicyRun base = baseline_run();
  PolicyRun run = tracking_run();
  run.test_accuracy = 0.89;  // exactly 1 point below
  EXPECT_EQ(verdict_for(run, base), "tracks");
  run.test_accuracy = 0.8899;
  EXPECT_EQ(verdict_for(run, base), "deviates");
  run.test_accuracy = 0.99;  // better is fine
  EXPECT_EQ(verdict_for(run, base), "tracks");
  run.test_accuracy = kNaN;  // not measured: criterion not applied
  EXPECT_EQ(verdict_for(run, base), "tracks");
}

TEST(Verdict, SlowerButTrackingIsNoSpeedup) {
  const PolicyRun base = baseline_run();
  PolicyRun run = tracking_run();
  run.steps_per_second = 100;  // exactly 1.0x
  EXPECT_EQ(verdict_for(run, base), "tracks");
  run.steps_per_second = 99.9;
  EXPECT_EQ(verdict_for(run, base), "no speedup");
  // Divergence and deviation take precedence over speed.
  run.test_accuracy = 0.5;
  EXPECT_EQ(verdict_for(run, base), "deviates");
  run.step_loss[0] = kNaN;
  EXPECT_EQ(verdict_for(run, base), "diverged");
}

TEST(FillComparison, SetsDerivedFieldsAndVerdict) {
  const PolicyRun base = baseline_run();
  PolicyRun run = tracking_run();
  run.test_accuracy = 0.915;
  run.epoch_loss = {1.02, 0.5, 0.4};
  fill_comparison(run, base);
  EXPECT_NEAR(run.accuracy_delta, 1.5, 1e-9);
  EXPECT_DOUBLE_EQ(run.speedup, 1.5);
  EXPECT_DOUBLE_EQ(run.memory_ratio, 0.5);
  EXPECT_NEAR(run.max_loss_deviation, 0.02, 1e-12);
  EXPECT_EQ(run.verdict, "tracks");

  PolicyRun self = base;
  fill_comparison(self, base);
  EXPECT_EQ(self.accuracy_delta, 0);
  EXPECT_EQ(self.speedup, 1);
  EXPECT_EQ(self.memory_ratio, 1);
  EXPECT_EQ(self.max_loss_deviation, 0);
  EXPECT_EQ(self.verdict, "baseline");

  PolicyRun unmeasured = tracking_run();
  PolicyRun no_memory = base;
  no_memory.peak_memory_bytes = 0;
  fill_comparison(unmeasured, no_memory);
  EXPECT_TRUE(std::isnan(unmeasured.memory_ratio));
}

TEST(SmoothLoss, BiasCorrectedMovingAverage) {
  EXPECT_EQ(smooth_loss({1, 1, 1}), (std::vector<double>{1, 1, 1}));
  const std::vector<double> s = smooth_loss({2, kNaN, 4});
  ASSERT_EQ(s.size(), 3u);
  EXPECT_DOUBLE_EQ(s[0], 2);
  EXPECT_TRUE(std::isnan(s[1]));
  EXPECT_NEAR(s[2], (0.9 * 0.1 * 2 + 0.1 * 4) / (1 - 0.81), 1e-12);
  EXPECT_TRUE(smooth_loss({}).empty());
}

TEST(MaxRelativeDeviation, ComparesSharedIndices) {
  EXPECT_NEAR(max_relative_deviation({1.1, 2, 5}, {1, 2}), 0.1, 1e-12);
  EXPECT_TRUE(std::isnan(max_relative_deviation({}, {1})));
  EXPECT_TRUE(std::isinf(max_relative_deviation({kNaN}, {1})));
  EXPECT_TRUE(std::isnan(max_relative_deviation({7}, {kNaN})));
  EXPECT_EQ(max_relative_deviation({0}, {0}), 0);
  EXPECT_TRUE(std::isinf(max_relative_deviation({1}, {0})));
}

ComparisonReport sample_report() {
  ComparisonReport report;
  report.title = "MLP <on> MNIST";
  report.model = "mlp 784-128-10";
  report.data = "mnist";
  report.seed = 42;
  report.epochs = 3;
  PolicyRun base = baseline_run();
  PolicyRun fp16 = tracking_run();
  fp16.skipped_steps = 2;
  fp16.step_loss_scale.assign(fp16.step_loss.size(), 32768);
  fp16.step_loss_scale[0] = 65536;
  PolicyRun bf16 = tracking_run();
  bf16.policy = "mixed_bfloat16";
  bf16.steps_per_second = 90;
  fill_comparison(base, base);
  fill_comparison(fp16, base);
  fill_comparison(bf16, base);
  report.runs = {base, fp16, bf16};
  report.notes = {"CPU run; speedups need AVX512-FP16 & friends", "second note"};
  return report;
}

TEST(ComparisonTable, HasEveryColumnAndRow) {
  const std::string table = format_comparison_table(sample_report());
  for (const char* column : {"policy", "final loss", "test acc", "Δacc (pt)", "loss dev %", "steps/s", "speedup",
                             "peak MiB", "mem ratio", "skipped", "verdict"}) {
    EXPECT_NE(table.find(column), std::string::npos) << column;
  }
  std::istringstream in(table);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[1].rfind("float32 ", 0), 0u);
  EXPECT_NE(lines[1].find("baseline"), std::string::npos);
  EXPECT_NE(lines[1].find("90.00%"), std::string::npos);
  EXPECT_NE(lines[1].find("+0.00"), std::string::npos);
  EXPECT_NE(lines[1].find("8.0"), std::string::npos);  // peak MiB
  EXPECT_NE(lines[2].find("mixed_float16"), std::string::npos);
  EXPECT_NE(lines[2].find("1.50x"), std::string::npos);
  EXPECT_NE(lines[2].find("0.50x"), std::string::npos);
  EXPECT_NE(lines[2].find("0.4000"), std::string::npos);
  EXPECT_NE(lines[2].find("tracks"), std::string::npos);
  EXPECT_NE(lines[3].find("0.90x"), std::string::npos);
  EXPECT_NE(lines[3].find("no speedup"), std::string::npos);
  // Fixed width: the verdict column starts at the same character in every line.
  auto verdict_column = [](const std::string& line, const std::string& verdict) {
    const std::string prefix = line.substr(0, line.find(verdict));
    size_t n = 0;
    for (unsigned char c : prefix) n += (c & 0xC0) != 0x80;
    return n;
  };
  EXPECT_EQ(verdict_column(lines[0], "verdict"), verdict_column(lines[1], "baseline"));
  EXPECT_EQ(verdict_column(lines[0], "verdict"), verdict_column(lines[3], "no speedup"));
}

TEST(ComparisonTable, MissingValuesShowAsDash) {
  ComparisonReport report;
  PolicyRun run;
  run.policy = "float16";
  run.epoch_loss = {kNaN};
  run.verdict = "diverged";
  report.runs = {run};
  const std::string table = format_comparison_table(report);
  EXPECT_NE(table.find("nan"), std::string::npos);
  EXPECT_NE(table.find(" - "), std::string::npos);
}

TEST(ComparisonJson, CarriesEveryField) {
  const Json json = Json::parse(comparison_to_json(sample_report()).dump(2), "report.json");
  EXPECT_EQ(json.at("title").as_string(), "MLP <on> MNIST");
  EXPECT_EQ(json.at("seed").as_int64(), 42);
  EXPECT_EQ(json.at("epochs").as_int64(), 3);
  EXPECT_EQ(json.at("thresholds").at("deviates_loss_deviation").as_number(), 0.05);
  const Json& runs = json.at("runs");
  ASSERT_EQ(runs.size(), 3u);
  const Json& fp16 = runs.at(1);
  for (const char* key : {"policy", "verdict", "final_loss", "test_loss", "test_accuracy", "accuracy_delta",
                          "steps_per_second", "speedup", "peak_memory_bytes", "memory_ratio", "max_loss_deviation",
                          "skipped_steps", "epoch_loss", "epoch_val_loss", "step_loss", "step_loss_scale"}) {
    EXPECT_TRUE(fp16.contains(key)) << key;
  }
  EXPECT_EQ(fp16.at("policy").as_string(), "mixed_float16");
  EXPECT_EQ(fp16.at("verdict").as_string(), "tracks");
  EXPECT_EQ(fp16.at("speedup").as_number(), 1.5);
  EXPECT_EQ(fp16.at("skipped_steps").as_int64(), 2);
  EXPECT_EQ(fp16.at("final_loss").as_number(), 0.4);
  EXPECT_EQ(fp16.at("step_loss").size(), 90u);
  EXPECT_EQ(fp16.at("step_loss_scale").at(0).as_number(), 65536);
  EXPECT_EQ(runs.at(0).at("step_loss_scale").size(), 0u);
  EXPECT_EQ(json.at("notes").size(), 2u);

  ComparisonReport big;
  big.seed = (uint64_t{1} << 53) + 1;
  EXPECT_EQ(comparison_to_json(big).at("seed").as_string(), "9007199254740993");
  PolicyRun nan_run;
  nan_run.policy = "x";
  big.runs = {nan_run};
  // NaN (not measured) is written as null.
  const Json reread = Json::parse(comparison_to_json(big).dump(), "big.json");
  EXPECT_TRUE(reread.at("runs").at(0).at("test_accuracy").is_null());
}

TEST(StepsCsv, OneRowPerRunAndStep) {
  namespace fs = std::filesystem;
  const std::string path =
      (fs::temp_directory_path() / ("mixtrain_steps_" + std::to_string(::getpid()) + ".csv")).string();
  ComparisonReport report = sample_report();
  report.runs[0].step_loss[1] = kNaN;
  write_steps_csv(path, report);
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  fs::remove(path);
  EXPECT_EQ(text.rfind("step,policy,loss,loss_scale\r\n1,float32,2.1,\r\n2,float32,nan,\r\n", 0), 0u);
  EXPECT_NE(text.find("\r\n1,mixed_float16,2.1,65536\r\n2,mixed_float16,"), std::string::npos);
  EXPECT_EQ(count(text, "\r\n"), 1u + 3 * 90);
  EXPECT_THROW(write_steps_csv("/nonexistent-dir/steps.csv", report), Error);
}

TEST(ComparisonHtml, SelfContainedPageWithOnePolylinePerPolicy) {
  const ComparisonReport report = sample_report();
  const std::string html = render_comparison_html(report);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  // Loss and validation-loss charts: one line per policy each; loss-scale chart: only the scaled run; two bar
  // charts (steps/s, peak memory; no largest-batch chart without --batch-size auto).
  EXPECT_EQ(count(html, "<polyline class=\"series\" data-series=\"float32\""), 2u);
  EXPECT_EQ(count(html, "<polyline class=\"series\" data-series=\"mixed_bfloat16\""), 2u);
  EXPECT_EQ(count(html, "<polyline class=\"series\" data-series=\"mixed_float16\""), 3u);
  EXPECT_EQ(count(html, "<svg"), 5u);
  EXPECT_EQ(count(html, "<rect class=\"bar\""), 6u);
  EXPECT_NE(html.find("Loss scale per step"), std::string::npos);
  // No external resources of any kind.
  EXPECT_EQ(html.find("http"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  // Settings, table, notes, escaping.
  EXPECT_NE(html.find("<title>MLP &lt;on&gt; MNIST</title>"), std::string::npos);
  EXPECT_EQ(html.find("<on>"), std::string::npos);
  EXPECT_NE(html.find("mlp 784-128-10"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"left verdict verdict-no-speedup\">no speedup</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>Δacc (pt)</th>"), std::string::npos);
  EXPECT_NE(html.find("AVX512-FP16 &amp; friends"), std::string::npos);
  EXPECT_NE(html.find("smoothed"), std::string::npos);
  EXPECT_NE(html.find("moving average"), std::string::npos);

  // Without loss scales there is no loss-scale chart.
  ComparisonReport unscaled = report;
  for (PolicyRun& run : unscaled.runs) run.step_loss_scale.clear();
  const std::string plain = render_comparison_html(unscaled);
  EXPECT_EQ(count(plain, "<svg"), 4u);
  EXPECT_EQ(plain.find("Loss scale per step"), std::string::npos);
}

// compare --memory-plan: a stacked bar per policy with its measured peak, its parts named in the caption, and the
// plan in the JSON; without plans neither.
TEST(ComparisonHtml, MemoryPlansAreStackedBarsWithTheMeasuredPeak) {
  ComparisonReport report = sample_report();
  EXPECT_EQ(render_comparison_html(report).find("Where memory goes"), std::string::npos);
  EXPECT_TRUE(comparison_to_json(report).at("runs").at(0).at("memory_plan").is_null());
  for (PolicyRun& run : report.runs) {
    run.memory_plan = {{"weights", 4e6}, {"gradients", 4e6}, {"optimizer state", 8e6}, {"step", 2e6}};
    run.measured_memory_bytes = 1.9e7;
  }
  const std::string html = render_comparison_html(report);
  EXPECT_NE(html.find("Where memory goes"), std::string::npos);
  EXPECT_EQ(count(html, "<rect class=\"bar-part\""), 4 * report.runs.size());
  EXPECT_EQ(count(html, "<line class=\"bar-marker\""), report.runs.size());
  EXPECT_NE(html.find("weights, gradients, optimizer state, step;"), std::string::npos);
  const Json plan = comparison_to_json(report).at("runs").at(1).at("memory_plan");
  EXPECT_EQ(plan.at("parts_bytes").at("optimizer state").as_number(), 8e6);
  EXPECT_EQ(plan.at("total_bytes").as_number(), 1.8e7);
  EXPECT_EQ(plan.at("measured_bytes").as_number(), 1.9e7);
}

TEST(ComparisonHtml, EpochCurvesWhenNoStepsWereRecorded) {
  ComparisonReport report = sample_report();
  for (PolicyRun& run : report.runs) run.step_loss.clear();
  const std::string html = render_comparison_html(report);
  EXPECT_NE(html.find("Training loss per epoch"), std::string::npos);
  EXPECT_EQ(count(html, "<polyline class=\"series\" data-series=\"float32\""), 2u);  // with validation loss
}

}  // namespace
}  // namespace mixtrain
