// svg_plot: a small line-chart renderer that writes inline <svg> for self-contained HTML reports.
// Each series is drawn against its point index (x = x_first, x_first + 1, ...), so per-step and
// per-epoch curves of different lengths share one x axis. The output uses no external resources
// (no fonts, scripts or stylesheets), so a page that embeds it reads offline.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

namespace mixtrain {

// One line on the chart. Non-finite values (and, on a log axis, values <= 0) are gaps.
struct Series {
  std::string name;       // shown in the legend and as the polylines' data-series attribute
  std::vector<double> y;  // y[i] is drawn at x = x_first + i
  std::string color;      // any CSS color, e.g. "#1f77b4"
  // Line width in pixels. Series are drawn in order, so a wide first line stays visible under
  // narrower ones that track it closely (a baseline under the runs compared with it).
  double stroke_width = 1.5;
};

// A shaded area between a lower and an upper curve (a band), drawn behind the lines.
struct AreaBand {
  std::string name;            // shown in the legend and as the polygons' data-band attribute
  std::vector<double> lo, hi;  // drawn at x = x_first + i; an index where either is non-finite is a gap
  std::string color;
  double opacity = 0.22;
};

// A vertical line at x with a short label above the plot: an event on the x axis.
struct Marker {
  double x = 0;
  std::string label;
  std::string color = "#444444";
};

struct ChartOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  int width = 720;   // pixels
  int height = 360;  // pixels
  bool log_y = false;
  double x_first = 1;  // x value of each series' first point
  // A series longer than this is downsampled to at most this many points: the x range is cut into
  // max_points / 2 equal buckets and each keeps its minimum and maximum, so spikes stay visible.
  size_t max_points = 1500;
};

// The plot rectangle inside the chart (pixels from the top-left corner of the <svg>).
struct PlotArea {
  double left, top, width, height;
};

// Where line_chart_svg() puts the plot rectangle: margins for the axes and labels (the left one at
// least 64 px, wider when long y tick labels need it), plus one legend row above the plot per line
// of legend entries.
PlotArea plot_area(const std::vector<Series>& series, const ChartOptions& options);

// "Nice" axis ticks for the data range [lo, hi]: about `target` evenly spaced values whose step is
// 1, 2 or 5 times a power of ten, extended so the first tick is <= lo and the last >= hi (the axis
// spans exactly the ticks). nice_ticks(0.13, 2.47) = {0, 0.5, 1, 1.5, 2, 2.5}. Ticks are computed
// as integer multiples (or quotients) of the step, so 0.6 is 0.6 and not 0.6000000000000001.
// lo == hi is widened around the value. Requires finite lo <= hi.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

// Ticks for a log axis as log10 exponents: whole decades covering [lo_exp, hi_exp] (both log10 of
// the data range), every k-th decade when the range spans more than ~8 of them.
std::vector<double> log_decade_ticks(double lo_exp, double hi_exp);

// Short tick label: the shortest decimal that reads back to the value, with exponents written
// compactly ("0.5", "2000", "1e6", "2.5e-5").
std::string format_tick(double value);

// The points of one series after the log transform (when options.log_y) and downsampling, as
// (index, value) pairs in index order; a gap is a pair whose value is NaN. At most
// options.max_points finite points. A bucket that holds a non-finite value keeps its finite
// minimum and maximum and a gap at the first non-finite position.
struct SeriesPoint {
  double index;  // position in the original series
  double value;  // y, or log10(y) on a log axis; NaN marks a gap
};
std::vector<SeriesPoint> series_points(const std::vector<double>& y, const ChartOptions& options);

// Renders the chart: title, axes with tick labels and light grid lines, axis labels, a legend, and
// for each series one <polyline class="series" data-series="NAME" points="x,y x,y ..."> per
// unbroken run of finite points (a run of a single point is a <circle class="point">). All text is
// HTML-escaped. Coordinates are pixels with at most two decimals.
std::string line_chart_svg(const std::vector<Series>& series, const ChartOptions& options);

// As above, plus bands drawn behind the lines (one <polygon class="band" data-band="NAME"> per unbroken run
// of finite bounds, included in the y range and the legend) and markers drawn over them (each a
// <g class="marker" data-x="X"> holding a dashed <line> across the plot and a <text> label; labels of
// nearby markers are staggered). A band is downsampled like a series, keeping each bucket's lowest lower
// bound and highest upper bound.
std::string line_chart_svg(const std::vector<Series>& series, const ChartOptions& options,
                           const std::vector<AreaBand>& bands, const std::vector<Marker>& markers = {});

// A segment of a stacked bar, from the bottom up.
struct BarPart {
  std::string name;  // its data-part attribute
  double value = 0;  // >= 0
  std::string color;
};
// One bar of a bar chart.
struct Bar {
  Bar() = default;
  Bar(std::string label, double value, std::string color, std::string value_text = {}, std::vector<BarPart> parts = {},
      double marker = std::numeric_limits<double>::quiet_NaN())
      : label(std::move(label)), value(value), color(std::move(color)), value_text(std::move(value_text)),
        parts(std::move(parts)), marker(marker) {}
  std::string label;  // under the bar, and its data-bar attribute
  double value = 0;   // non-finite or negative: no bar, "n/a" is written instead
  std::string color;
  std::string value_text;  // written above the bar (empty: format_tick(value))
  // Stacked: the bar drawn as these segments (their sum is `value`, which the caller sets), color unused.
  std::vector<BarPart> parts;
  // A level drawn across the bar as a dark line (e.g. a measurement beside a plan); NaN: none.
  double marker = std::numeric_limits<double>::quiet_NaN();
};
struct BarChartOptions {
  std::string title;
  std::string y_label;
  int width = 360;   // pixels
  int height = 260;  // pixels
};
// A vertical bar chart from 0: title, a y axis with nice ticks and grid lines, and per bar a
// <rect class="bar" data-bar="LABEL"> with its value above and its label below. A stacked bar is a
// <g class="bar" data-bar="LABEL"> of <rect class="bar-part" data-part="NAME">; a marker is a
// <line class="bar-marker" data-bar="LABEL">. The y axis reaches the highest bar or marker.
std::string bar_chart_svg(const std::vector<Bar>& bars, const BarChartOptions& options);

// Escapes text for HTML and XML content and attribute values: & < > " '.
std::string html_escape(std::string_view text);

}  // namespace mixtrain
