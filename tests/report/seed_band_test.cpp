// float32's seed band and the verdicts judged against it: the band's arithmetic, the tolerance of
// max(band widths, fixed floor), each criterion on both sides of its threshold, spikes of the validation loss,
// recovered runs, runs by steps (a language model), and what the JSON and the HTML page carry.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "mixtrain/core/error.h"
#include "mixtrain/report/comparison.h"
#include "mixtrain/report/svg_plot.h"

namespace mixtrain {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + needle.size())) ++n;
  return n;
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// A float32 run of one seed: 3 epochs of 30 steps, its losses scaled by `loss`, its accuracy given.
PolicyRun seed_run(uint64_t seed, double loss, double accuracy) {
  PolicyRun run;
  run.policy = "float32";
  run.seed = seed;
  run.batch_size = 32;
  for (int i = 0; i < 90; ++i) run.step_loss.push_back(loss * (2.0 * std::exp(-i / 30.0) + 0.1));
  run.epoch_loss = {1.0 * loss, 0.5 * loss, 0.4 * loss};
  run.epoch_val_loss = {1.1 * loss, 0.6 * loss, 0.45 * loss, };
  run.test_loss = 0.42 * loss;
  run.test_accuracy = accuracy;
  run.steps_per_second = 100;
  run.peak_memory_bytes = 8 << 20;
  return run;
}

// float32's runs of seeds 1, 2, 3: losses within +-10% of each other, accuracy 0.84 to 0.90.
std::vector<PolicyRun> noisy_seeds() { return {seed_run(1, 1.0, 0.87), seed_run(2, 1.1, 0.84), seed_run(3, 0.95, 0.90)}; }

// A mixed run with seed 1 whose losses are `loss` x the first seed's.
PolicyRun mixed(double loss, double accuracy) {
  PolicyRun run = seed_run(1, loss, accuracy);
  run.policy = "mixed_float16";
  run.steps_per_second = 150;
  return run;
}

TEST(SeedBand, SeriesBandTakesTheFiniteExtremesAndTheFirstCurve) {
  const SeriesBand b = series_band({{1, 2, kNaN}, {3, 1}, {2, 5, 4}});
  EXPECT_EQ(b.lo, (std::vector<double>{1, 1, 4}));
  EXPECT_EQ(b.hi, (std::vector<double>{3, 5, 4}));
  ASSERT_EQ(b.ref.size(), 3u);
  EXPECT_EQ(b.ref[0], 1);
  EXPECT_EQ(b.ref[1], 2);
  EXPECT_TRUE(std::isnan(b.ref[2]));
  EXPECT_TRUE(series_band({}).lo.empty());
}

TEST(SeedBand, ToleranceIsTheLargerOfBandWidthsAndTheFloor) {
  EXPECT_DOUBLE_EQ(band_tolerance(1.0, 1.2, 1.0, 0.05), 0.2);
  EXPECT_DOUBLE_EQ(band_tolerance(1.0, 1.01, 1.0, 0.05), 0.05);  // a tiny band: the floor
  EXPECT_DOUBLE_EQ(band_tolerance(1.0, 1.2, 4.0, 0.05), 0.8);
  EXPECT_TRUE(std::isnan(band_tolerance(kNaN, 1.0, 1.0, 0.05)));
  SeriesBand b;
  b.lo = {1.0, 1.0};
  b.hi = {1.2, 1.01};
  b.ref = {1.1, 1.0};
  const std::vector<double> ceiling = deviation_ceiling(b);
  EXPECT_DOUBLE_EQ(ceiling[0], 1.2 + 0.2);
  EXPECT_DOUBLE_EQ(ceiling[1], 1.01 + 0.05);
}

TEST(SeedBand, MakeBandSpansTheSeeds) {
  const Float32Band band = make_float32_band(noisy_seeds());
  EXPECT_EQ(band.seeds, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_DOUBLE_EQ(band.test_accuracy.lo, 0.84);
  EXPECT_DOUBLE_EQ(band.test_accuracy.hi, 0.90);
  EXPECT_DOUBLE_EQ(band.test_accuracy.ref, 0.87);
  EXPECT_DOUBLE_EQ(band.final_loss.lo, 0.4 * 0.95);
  EXPECT_DOUBLE_EQ(band.final_loss.hi, 0.4 * 1.1);
  EXPECT_DOUBLE_EQ(band.epoch_val_loss.hi[2], 0.45 * 1.1);
  // The step band is of the smoothed curves.
  const std::vector<double> smoothed = smooth_loss(seed_run(2, 1.1, 0).step_loss);
  EXPECT_DOUBLE_EQ(band.step_loss.hi[50], smoothed[50]);
  EXPECT_THROW(make_float32_band({}), Error);
}

TEST(SeedBand, WithinTheSeedSpreadTracksWhereTheFixedThresholdsWouldNot) {
  const std::vector<PolicyRun> seeds = noisy_seeds();
  const Float32Band band = make_float32_band(seeds);
  // 8% above the same-seed float32 run and 2.5 points less accurate: beyond the fixed 5% and 1 point, but
  // float32's own seeds differ as much.
  PolicyRun run = mixed(1.08, 0.845);
  fill_comparison(run, seeds[0], band);
  EXPECT_EQ(run.verdict, "tracks") << run.verdict_reason;
  EXPECT_EQ(run.numerics_verdict, "tracks");
  EXPECT_EQ(run.fixed_threshold_verdict, "deviates");
  EXPECT_TRUE(contains(run.verdict_reason, "within float32's seed band")) << run.verdict_reason;
  EXPECT_TRUE(contains(run.verdict_reason, "fixed thresholds would have said \"deviates\"")) << run.verdict_reason;
  EXPECT_TRUE(contains(run.verdict_reason, "over 3 seeds")) << run.verdict_reason;
  for (const BandCheck& c : run.checks) EXPECT_FALSE(c.crossed) << c.quantity;
  // The same run against the first seed alone deviates, as it always did.
  EXPECT_EQ(verdict_for(run, seeds[0]), "deviates");
}

TEST(SeedBand, OutsideTheBandByMoreThanItsWidthDeviates) {
  const std::vector<PolicyRun> seeds = noisy_seeds();
  const Float32Band band = make_float32_band(seeds);
  // Last epoch: band 0.38-0.44 (width 0.06 > 5% of 0.4): the tolerance is one width, 0.06.
  PolicyRun run = mixed(1.0, 0.87);
  run.epoch_loss[2] = 0.44 + 0.059;
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "tracks");
  run.epoch_loss[2] = 0.44 + 0.061;
  Verdict v = judge_run(run, band, seeds[0]);
  EXPECT_EQ(v.verdict, "deviates");
  EXPECT_TRUE(contains(v.reason, "In epoch 3, the training loss 0.501 is above float32's band 0.38–0.44 over 3 seeds"))
      << v.reason;
  // Below the band counts as well for the training loss.
  run.epoch_loss[2] = 0.38 - 0.061;
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "deviates");
  // Accuracy only downwards: band 84-90%, tolerance max(6 points, 1 point).
  run = mixed(1.0, 0.99);
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "tracks");
  run.test_accuracy = 0.84 - 0.059;
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "tracks");
  run.test_accuracy = 0.84 - 0.061;
  v = judge_run(run, band, seeds[0]);
  EXPECT_EQ(v.verdict, "deviates");
  EXPECT_TRUE(contains(v.reason, "test accuracy 77.90% is below float32's band 84.00%–90.00%")) << v.reason;
  // Test loss only upwards.
  run = mixed(1.0, 0.87);
  run.test_loss = 0.1;
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "tracks");
  run.test_loss = 0.42 * 1.1 + 0.42 * 0.15 + 0.01;
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "deviates");
}

TEST(SeedBand, ATinyBandFallsBackToTheFixedFloor) {
  // Three seeds that agree to 0.1%: the band is narrower than 5%, so 5% is allowed.
  const std::vector<PolicyRun> seeds = {seed_run(1, 1.0, 0.87), seed_run(2, 1.001, 0.87), seed_run(3, 0.999, 0.87)};
  const Float32Band band = make_float32_band(seeds);
  PolicyRun run = mixed(1.03, 0.87);
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "tracks");
  run = mixed(1.07, 0.87);
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "deviates");
}

TEST(SeedBand, FarAboveTheBandDiverges) {
  const std::vector<PolicyRun> seeds = noisy_seeds();
  const Float32Band band = make_float32_band(seeds);
  // Final loss: band 0.38-0.44; diverged beyond max(4 widths = 0.24, 1x the baseline's 0.4) = 0.84.
  PolicyRun run = mixed(1.0, 0.87);
  run.epoch_loss[2] = 0.44 + 0.399;
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "deviates");
  run.epoch_loss[2] = 0.44 + 0.401;
  Verdict v = judge_run(run, band, seeds[0]);
  EXPECT_EQ(v.verdict, "diverged");
  EXPECT_TRUE(contains(v.reason, "final training loss")) << v.reason;
  EXPECT_TRUE(contains(v.reason, "counts as diverging")) << v.reason;
  // The smoothed per-step curve far above the band at the end.
  run = mixed(1.0, 0.87);
  for (size_t i = 60; i < run.step_loss.size(); ++i) run.step_loss[i] *= 6;
  v = judge_run(run, band, seeds[0]);
  EXPECT_EQ(v.verdict, "diverged");
  EXPECT_TRUE(contains(v.reason, "smoothed training loss")) << v.reason;
  // ... but not compared step by step with a different batch size (the steps are not the same data).
  run.batch_size = 64;
  EXPECT_NE(judge_run(run, band, seeds[0]).verdict, "diverged");
  // A non-finite loss diverges, and says where.
  run = mixed(1.0, 0.87);
  run.step_loss[12] = kNaN;
  v = judge_run(run, band, seeds[0]);
  EXPECT_EQ(v.verdict, "diverged");
  EXPECT_TRUE(contains(v.reason, "At step 13, the training loss (per step) became NaN")) << v.reason;
}

TEST(SeedBand, AValidationSpikeIsNotADeviation) {
  std::vector<PolicyRun> seeds = noisy_seeds();
  for (PolicyRun& s : seeds) s.epoch_val_loss = {1.0, 0.8, 0.7, 0.6, 0.5};
  seeds[1].epoch_val_loss = {1.02, 0.82, 0.71, 0.61, 0.51};
  const Float32Band band = make_float32_band(seeds);
  PolicyRun run = mixed(1.0, 0.87);
  run.epoch_val_loss = {1.0, 1.6, 0.7, 0.6, 0.5};  // one epoch far off, then back
  Verdict v = judge_run(run, band, seeds[0]);
  EXPECT_EQ(v.verdict, "tracks") << v.reason;
  EXPECT_TRUE(contains(v.reason, "at only 1 of 5 epochs and not the last: a spike")) << v.reason;
  run.epoch_val_loss = {1.0, 0.8, 0.7, 0.6, 0.9};  // off at the end
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "deviates");
  run.epoch_val_loss = {1.0, 1.6, 1.4, 1.2, 0.5};  // off at most epochs
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "deviates");
}

TEST(SeedBand, ARecoveredRunIsJudgedFromWhereItResumedAndWhereItEnded) {
  const std::vector<PolicyRun> seeds = noisy_seeds();
  const Float32Band band = make_float32_band(seeds);
  PolicyRun run = mixed(1.0, 0.87);
  run.step_loss[10] = kNaN;      // before the rollback target: not judged
  run.epoch_loss[0] = 3.0;       // the epoch it left the band in, lagging after: not judged
  run.recovery = {{50, "layers_to_float32", "left the band", {"dense", "dense_1"}, -1},
                  {50, "rollback", "back to the last good snapshot", {}, 40}};
  Verdict v = judge_run(run, band, seeds[0]);
  EXPECT_EQ(v.verdict, "tracks") << v.reason;
  EXPECT_EQ(v.judged_from_step, 40);
  EXPECT_TRUE(contains(v.reason, "After its recovery moved dense, dense_1 to float32 at step 50, rolling back to step 40"))
      << v.reason;
  // Where it ended still counts.
  run.epoch_loss[2] = 0.6;
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "deviates");
  // A non-finite loss after the rollback still diverges.
  run = mixed(1.0, 0.87);
  run.recovery = {{50, "rollback", "", {}, 40}};
  run.step_loss[45] = kNaN;
  EXPECT_EQ(judge_run(run, band, seeds[0]).verdict, "diverged");
  // Rolled back to the very start: the whole run is the recovered one and every epoch counts.
  run = mixed(1.0, 0.87);
  run.recovery = {{20, "layers_to_float32", "", {"conv2d"}, -1}, {20, "rollback", "", {}, 0}};
  run.epoch_loss[0] = 3.0;
  v = judge_run(run, band, seeds[0]);
  EXPECT_EQ(v.verdict, "deviates");
  EXPECT_EQ(v.judged_from_step, 0);
}

TEST(SeedBand, ARunByStepsIsJudgedTheSameWay) {
  // A character language model: 4 evaluation intervals of 25 steps, validation loss per interval, accuracy per
  // character, the test loss being the last validation loss. Nothing in the verdict is model-specific.
  auto lm = [](uint64_t seed, double scale, const char* policy) {
    PolicyRun r;
    r.policy = policy;
    r.seed = seed;
    for (int i = 0; i < 100; ++i) r.step_loss.push_back(scale * (3.0 * std::exp(-i / 40.0) + 1.2));
    r.epoch_loss = {3.2 * scale, 2.3 * scale, 1.8 * scale, 1.6 * scale};
    r.epoch_val_loss = {3.0 * scale, 2.2 * scale, 1.9 * scale, 1.7 * scale};
    r.test_loss = r.epoch_val_loss.back();
    r.test_accuracy = 0.52 / scale;
    return r;
  };
  const std::vector<PolicyRun> seeds = {lm(1, 1.0, "float32"), lm(2, 1.02, "float32"), lm(3, 0.99, "float32")};
  const Float32Band band = make_float32_band(seeds);
  EXPECT_EQ(judge_run(lm(1, 1.01, "mixed_bfloat16"), band, seeds[0]).verdict, "tracks");
  PolicyRun worse = lm(1, 1.01, "mixed_bfloat16");
  worse.epoch_val_loss.back() = 2.1;
  worse.test_loss = 2.1;
  const Verdict v = judge_run(worse, band, seeds[0]);
  EXPECT_EQ(v.verdict, "deviates");
  EXPECT_TRUE(contains(v.reason, "test loss") || contains(v.reason, "validation loss")) << v.reason;
}

ComparisonReport banded_report() {
  ComparisonReport report;
  report.title = "band";
  report.seed = 1;
  report.epochs = 3;
  report.batch_size_auto = true;
  std::vector<PolicyRun> seeds = noisy_seeds();
  PolicyRun f16 = mixed(1.02, 0.86);
  f16.batch_size = 64;
  f16.recovery = {{50, "layers_to_float32", "left the band", {"dense"}, -1},
                  {50, "rollback", "back to the last good snapshot", {}, 40}};
  f16.layer_dtypes = {{"dense", "float32"}, {"dense_1", "float16"}};
  seeds[0].layer_dtypes = {{"dense", "float32"}, {"dense_1", "float32"}};
  report.band = make_float32_band(seeds);
  report.extra_seeds = {seeds[1], seeds[2]};
  fill_comparison(seeds[0], seeds[0], report.band);
  fill_comparison(f16, seeds[0], report.band);
  report.runs = {seeds[0], f16};
  return report;
}

TEST(SeedBand, JsonCarriesTheBandTheChecksAndTheRecovery) {
  const Json json = Json::parse(comparison_to_json(banded_report()).dump(), "report.json");
  const Json& band = json.at("band");
  EXPECT_EQ(band.at("seeds").size(), 3u);
  EXPECT_EQ(band.at("step_loss").at("lo").size(), 90u);
  EXPECT_EQ(band.at("epoch_val_loss").at("hi").size(), 3u);
  EXPECT_DOUBLE_EQ(band.at("test_accuracy").at("lo").as_number(), 0.84);
  EXPECT_EQ(json.at("thresholds").at("band_margin").as_number(), kBandMargin);
  EXPECT_EQ(json.at("thresholds").at("diverged_band_margin").as_number(), kDivergedBandMargin);
  EXPECT_TRUE(json.at("batch_size_auto").as_bool());
  EXPECT_EQ(json.at("float32_seeds").size(), 2u);
  const Json& f16 = json.at("runs").at(1);
  EXPECT_EQ(f16.at("verdict").as_string(), "tracks");
  EXPECT_EQ(f16.at("numerics_verdict").as_string(), "tracks");
  EXPECT_FALSE(f16.at("verdict_reason").as_string().empty());
  EXPECT_EQ(f16.at("judged_from_step").as_int64(), 40);
  EXPECT_GE(f16.at("checks").size(), 4u);
  for (const char* key : {"quantity", "kind", "index", "value", "lo", "hi", "tolerance", "excess", "crossed"})
    EXPECT_TRUE(f16.at("checks").at(0).contains(key)) << key;
  EXPECT_EQ(f16.at("recovery").at(1).at("resume_step").as_int64(), 40);
  EXPECT_EQ(f16.at("layer_compute_dtypes").at("dense").as_string(), "float32");
  EXPECT_EQ(f16.at("batch_size").as_int64(), 64);
}

TEST(SeedBand, HtmlShadesTheBandMarksRecoveryAndDrawsBars) {
  const std::string html = render_comparison_html(banded_report());
  // The band behind the per-step loss and the validation loss.
  EXPECT_EQ(count(html, "<polygon class=\"band\" data-band=\"float32 over 3 seeds\""), 2u);
  // One marker for the switch (the rollback is part of its label).
  EXPECT_EQ(count(html, "<g class=\"marker\""), 1u);
  EXPECT_TRUE(contains(html, "mixed_float16: dense → float32, back to step 40"));
  // Bars: steps/s, peak memory and the largest batch (--batch-size auto), one per policy.
  EXPECT_EQ(count(html, "<rect class=\"bar\" data-bar=\"mixed_float16\""), 3u);
  EXPECT_TRUE(contains(html, "Largest batch that fits"));
  // Layers' dtypes, the switched one marked; the reasons.
  EXPECT_TRUE(contains(html, "<table class=\"dtypes\">"));
  EXPECT_TRUE(contains(html, "float32 (recovery)"));
  EXPECT_TRUE(contains(html, "<ul class=\"reasons\">"));
  EXPECT_TRUE(contains(html, "seeds (band)"));
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

TEST(SvgPlot, BandsAreShadedPolygonsWithGapsAndMarkersAreLabelledLines) {
  Series s{"run", {1, 2, 3, 4}, "#123456"};
  AreaBand b{"band", {0.5, 1.5, kNaN, 3.5}, {1.5, 2.5, 3.5, 4.5}, "#abcdef"};
  ChartOptions o;
  const std::string svg = line_chart_svg({s}, o, {b}, {{2, "switch", "#ff0000"}});
  // A non-finite bound splits the band; a single point draws nothing.
  EXPECT_EQ(count(svg, "<polygon class=\"band\" data-band=\"band\""), 1u);
  EXPECT_EQ(count(svg, "<g class=\"marker\" data-x=\"2\""), 1u);
  EXPECT_TRUE(contains(svg, ">switch</text>"));
  EXPECT_TRUE(contains(svg, "<rect class=\"legend-band\""));
  // The y axis covers the band (4.5), not only the series (4).
  EXPECT_TRUE(contains(svg, ">5</text>")) << svg;
  // The band comes before the lines, so the lines are drawn over it.
  EXPECT_LT(svg.find("<polygon class=\"band\""), svg.find("<polyline class=\"series\""));
}

TEST(SvgPlot, BarChartDrawsOneRectPerMeasuredBar) {
  BarChartOptions o;
  o.title = "speed";
  const std::string svg = bar_chart_svg({{"a", 10, "#111111", ""}, {"b", 25, "#222222", "25 /s"}, {"c", kNaN, "#333333", ""}}, o);
  EXPECT_EQ(count(svg, "<rect class=\"bar\""), 2u);
  EXPECT_TRUE(contains(svg, ">25 /s</text>"));
  EXPECT_TRUE(contains(svg, ">n/a</text>"));
  EXPECT_TRUE(contains(svg, ">c</text>"));
  // The taller bar reaches higher (smaller y).
  const auto y_of = [&](const std::string& bar) {
    const size_t p = svg.find("data-bar=\"" + bar + "\"");
    const size_t y = svg.find(" y=\"", p) + 4;
    return std::stod(svg.substr(y, svg.find('"', y) - y));
  };
  EXPECT_LT(y_of("b"), y_of("a"));
  EXPECT_THROW(bar_chart_svg({}, BarChartOptions{"", "", 0, 10}), Error);
}

// Stacked bars (compare --memory-plan's chart): one rect per part, stacked from the bottom with heights in
// proportion to the values, and the marker line at its own level, which the y axis reaches.
TEST(SvgPlot, StackedBarsStackTheirPartsAndDrawTheMarker) {
  BarChartOptions o;
  o.height = 300;
  Bar plan{"mixed", 30, "", "30 MiB", {{"weights", 10, "#111111"}, {"step", 20, "#222222"}}, 45};
  const std::string svg = bar_chart_svg({plan, {"plain", 15, "#333333", ""}}, o);
  EXPECT_EQ(count(svg, "<rect class=\"bar-part\""), 2u);
  EXPECT_EQ(count(svg, "<rect class=\"bar\""), 1u);  // the plain bar
  EXPECT_EQ(count(svg, "<line class=\"bar-marker\" data-bar=\"mixed\""), 1u);
  const auto attr = [&](const std::string& from, const char* name) {
    const size_t p = svg.find(from);
    const size_t v = svg.find(std::string(" ") + name + "=\"", p) + std::strlen(name) + 3;
    return std::stod(svg.substr(v, svg.find('"', v) - v));
  };
  const double w_y = attr("data-part=\"weights\"", "y"), w_h = attr("data-part=\"weights\"", "height");
  const double s_y = attr("data-part=\"step\"", "y"), s_h = attr("data-part=\"step\"", "height");
  EXPECT_NEAR(s_h, 2 * w_h, 0.02);      // 20 against 10
  EXPECT_NEAR(s_y + s_h, w_y, 0.02);    // the step sits on the weights
  const double marker_y = attr("class=\"bar-marker\"", "y1");
  EXPECT_NEAR(w_y + w_h - marker_y, 1.5 * (s_h + w_h), 0.05);  // 45 against 30
  EXPECT_TRUE(contains(svg, ">50</text>")) << svg;              // the axis reaches past the marker
}

}  // namespace
}  // namespace mixtrain
