#include "mixtrain/report/svg_plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

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

// The points="..." attribute of every series polyline, in order. (std::regex recurses per character
// and overflows the stack on long attributes, so this scans by hand.)
std::vector<std::string> polyline_points(const std::string& svg) {
  std::vector<std::string> out;
  const std::string open = "<polyline class=\"series\"", attribute = " points=\"";
  for (size_t pos = svg.find(open); pos != std::string::npos; pos = svg.find(open, pos + 1)) {
    const size_t tag_end = svg.find('>', pos);
    const size_t start = svg.find(attribute, pos);
    if (start == std::string::npos || start > tag_end) continue;
    const size_t value = start + attribute.size();
    out.push_back(svg.substr(value, svg.find('"', value) - value));
  }
  return out;
}

size_t point_count(const std::string& points) { return points.empty() ? 0 : count(points, " ") + 1; }

TEST(NiceTicks, KnownRanges) {
  EXPECT_EQ(nice_ticks(0, 1), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1}));
  EXPECT_EQ(nice_ticks(0.13, 2.47), (std::vector<double>{0, 0.5, 1, 1.5, 2, 2.5}));
  EXPECT_EQ(nice_ticks(0, 1875), (std::vector<double>{0, 500, 1000, 1500, 2000}));
  EXPECT_EQ(nice_ticks(-3, 7), (std::vector<double>{-4, -2, 0, 2, 4, 6, 8}));
  EXPECT_EQ(nice_ticks(0, 0.3), (std::vector<double>{0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3}));
  EXPECT_EQ(nice_ticks(2.31, 2.34), (std::vector<double>{2.31, 2.315, 2.32, 2.325, 2.33, 2.335, 2.34}));
  EXPECT_EQ(nice_ticks(-0.7, -0.1), (std::vector<double>{-0.7, -0.6, -0.5, -0.4, -0.3, -0.2, -0.1}));
  // A single value is widened around it.
  EXPECT_EQ(nice_ticks(5, 5), (std::vector<double>{4.4, 4.6, 4.8, 5, 5.2, 5.4, 5.6}));
  EXPECT_EQ(nice_ticks(0, 0), (std::vector<double>{-1, -0.5, 0, 0.5, 1}));
  EXPECT_THROW(nice_ticks(1, 0), Error);
  EXPECT_THROW(nice_ticks(0, kNaN), Error);
}

TEST(NiceTicks, CoverTheRangeWithAboutFiveTicks) {
  const double ranges[][2] = {{0.0013, 0.0871}, {1, 2345}, {-1e6, 3e7}, {0.98, 1.02}, {17, 19}, {1e-8, 3e-8}};
  for (const auto& r : ranges) {
    const std::vector<double> t = nice_ticks(r[0], r[1]);
    ASSERT_GE(t.size(), 3u) << r[0] << ".." << r[1];
    EXPECT_LE(t.size(), 12u) << r[0] << ".." << r[1];
    EXPECT_LE(t.front(), r[0]);
    EXPECT_GE(t.back(), r[1]);
  }
}

TEST(LogDecadeTicks, WholeDecades) {
  EXPECT_EQ(log_decade_ticks(std::log10(32768.0), std::log10(32768.0)), (std::vector<double>{4, 5}));
  EXPECT_EQ(log_decade_ticks(std::log10(1024.0), std::log10(65536.0)), (std::vector<double>{3, 4, 5}));
  EXPECT_EQ(log_decade_ticks(4, 4), (std::vector<double>{3, 4, 5}));
  EXPECT_EQ(log_decade_ticks(0, 20), (std::vector<double>{0, 3, 6, 9, 12, 15, 18, 21}));
}

TEST(FormatTick, ShortAndCompact) {
  EXPECT_EQ(format_tick(0), "0");
  EXPECT_EQ(format_tick(0.5), "0.5");
  EXPECT_EQ(format_tick(0.6), "0.6");
  EXPECT_EQ(format_tick(-1.5), "-1.5");
  EXPECT_EQ(format_tick(2000), "2000");
  EXPECT_EQ(format_tick(100000), "100000");
  EXPECT_EQ(format_tick(1e6), "1e6");
  EXPECT_EQ(format_tick(2.5e-5), "2.5e-5");
  EXPECT_EQ(format_tick(-3e-12), "-3e-12");
}

TEST(HtmlEscape, EscapesMarkupCharacters) {
  EXPECT_EQ(html_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  EXPECT_EQ(html_escape("plain Δ"), "plain Δ");
}

TEST(LineChart, ThreePointSeriesCoordinates) {
  ChartOptions options;
  options.title = "T";
  options.width = 400;
  options.height = 300;
  const std::vector<Series> series = {{"a", {0, 0.5, 1}, "#123456"}};
  const PlotArea area = plot_area(series, options);
  EXPECT_EQ(area.left, 64);
  EXPECT_EQ(area.top, 54);  // title 26 + one legend row 18 + 10
  EXPECT_EQ(area.width, 316);
  EXPECT_EQ(area.height, 202);

  const std::string svg = line_chart_svg(series, options);
  // x axis ticks 1, 2, 3 (whole steps) span the width; y ticks 0..1 span the height.
  const std::vector<std::string> lines = polyline_points(svg);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "64,256 222,155 380,54");
  EXPECT_EQ(point_count(lines[0]), 3u);
  EXPECT_NE(svg.find("data-series=\"a\" stroke=\"#123456\""), std::string::npos);
  EXPECT_NE(svg.find(">0.6</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">1.5</text>"), std::string::npos);  // no half steps on the x axis
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
}

TEST(LineChart, NonFiniteValuesBreakTheLine) {
  ChartOptions options;
  const std::vector<Series> series = {{"s", {1, 2, kNaN, 3, 4, kInf, 5, -kInf, 6, 7, 8}, "red"}};
  const std::string svg = line_chart_svg(series, options);
  const std::vector<std::string> lines = polyline_points(svg);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(point_count(lines[0]), 2u);
  EXPECT_EQ(point_count(lines[1]), 2u);
  EXPECT_EQ(point_count(lines[2]), 3u);
  // The lone 5 between two gaps is a dot.
  EXPECT_EQ(count(svg, "<circle class=\"point\" data-series=\"s\""), 1u);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(LineChart, LogAxisTreatsNonPositiveValuesAsGaps) {
  ChartOptions options;
  options.log_y = true;
  const std::string svg = line_chart_svg({{"scale", {1024, 2048, 0, 4096, -1, 8192}, "blue"}}, options);
  EXPECT_EQ(polyline_points(svg).size(), 1u);
  EXPECT_EQ(count(svg, "<circle class=\"point\""), 2u);
  EXPECT_NE(svg.find(">1000</text>"), std::string::npos);
  EXPECT_NE(svg.find(">10000</text>"), std::string::npos);
}

TEST(LineChart, AllNonFiniteStillDrawsAxes) {
  const std::string svg = line_chart_svg({{"x", {kNaN, kNaN}, "red"}}, ChartOptions{});
  EXPECT_TRUE(polyline_points(svg).empty());
  EXPECT_NE(svg.find("no finite values"), std::string::npos);
  EXPECT_NE(line_chart_svg({}, ChartOptions{}).find("</svg>"), std::string::npos);
}

TEST(SeriesPoints, DownsamplingKeepsExtremesUnderTheCap) {
  std::vector<double> y(100000);
  for (size_t i = 0; i < y.size(); ++i) y[i] = std::sin(i * 0.001);
  y[54321] = 50;   // a spike
  y[77777] = -50;  // a dip
  ChartOptions options;
  const std::vector<SeriesPoint> points = series_points(y, options);
  EXPECT_LE(points.size(), options.max_points);
  EXPECT_GE(points.size(), options.max_points * 9 / 10);
  bool spike = false, dip = false;
  for (size_t i = 0; i < points.size(); ++i) {
    if (i) {
      EXPECT_LT(points[i - 1].index, points[i].index);
    }
    spike |= points[i].index == 54321 && points[i].value == 50;
    dip |= points[i].index == 77777 && points[i].value == -50;
  }
  EXPECT_TRUE(spike);
  EXPECT_TRUE(dip);

  const std::string svg = line_chart_svg({{"long", y, "black"}}, options);
  const std::vector<std::string> lines = polyline_points(svg);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_LE(point_count(lines[0]), options.max_points);

  // Short series are not touched; max_points 0 keeps everything.
  options.max_points = 0;
  EXPECT_EQ(series_points(y, options).size(), y.size());
  EXPECT_EQ(series_points({1, 2, 3}, ChartOptions{}).size(), 3u);
}

TEST(SeriesPoints, BucketWithNonFiniteValueKeepsAGap) {
  ChartOptions options;
  options.max_points = 4;  // two buckets of five
  const std::vector<SeriesPoint> points = series_points({5, 1, kNaN, 9, 2, 3, 4, 0, 8, 6}, options);
  ASSERT_EQ(points.size(), 5u);
  EXPECT_EQ(points[0].index, 1);  // min 1
  EXPECT_EQ(points[0].value, 1);
  EXPECT_EQ(points[1].index, 2);  // the gap
  EXPECT_TRUE(std::isnan(points[1].value));
  EXPECT_EQ(points[2].index, 3);  // max 9
  EXPECT_EQ(points[3].index, 7);  // min 0
  EXPECT_EQ(points[4].index, 8);  // max 8
}

TEST(LineChart, EscapesAllText) {
  ChartOptions options;
  options.title = "<script>alert('x')</script>";
  options.x_label = "step & \"epoch\"";
  options.y_label = "a<b";
  const std::string svg = line_chart_svg({{"p<o>l\"icy", {1, 2}, "#fff\" onload=\"x"}}, options);
  EXPECT_EQ(svg.find("<script>"), std::string::npos);
  EXPECT_NE(svg.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(svg.find("step &amp; &quot;epoch&quot;"), std::string::npos);
  EXPECT_NE(svg.find(">a&lt;b</text>"), std::string::npos);
  EXPECT_NE(svg.find("data-series=\"p&lt;o&gt;l&quot;icy\""), std::string::npos);
  EXPECT_EQ(svg.find("onload=\""), std::string::npos);
}

TEST(LineChart, LegendWrapsAndMovesThePlotDown) {
  ChartOptions options;
  options.width = 300;
  std::vector<Series> series;
  for (int i = 0; i < 6; ++i) series.push_back({"mixed_bfloat16_" + std::to_string(i), {1, 2}, "red"});
  const PlotArea one = plot_area({series[0]}, options), many = plot_area(series, options);
  EXPECT_GT(many.top, one.top);
  EXPECT_EQ(polyline_points(line_chart_svg(series, options)).size(), 6u);
}

}  // namespace
}  // namespace mixtrain
