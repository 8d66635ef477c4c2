#include "mixtrain/report/svg_plot.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Layout, in pixels.
constexpr double kMarginLeft = 64;
constexpr double kMarginRight = 20;
constexpr double kMarginBottom = 44;
constexpr double kTitleHeight = 26;
constexpr double kLegendRowHeight = 18;
constexpr double kLegendSwatch = 18;
constexpr double kLegendCharWidth = 7;  // rough width of a 12px sans-serif character
constexpr double kLegendGap = 18;

// Pixel coordinate with at most two decimals and no trailing zeros: "64", "158.5", "12.25".
std::string format_coord(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

// <line x1=".." y1=".." x2=".." y2=".."/> with optional extra attributes (" stroke=\"red\"").
std::string line_element(double x1, double y1, double x2, double y2, const std::string& extra = "") {
  return "<line x1=\"" + format_coord(x1) + "\" y1=\"" + format_coord(y1) + "\" x2=\"" + format_coord(x2) +
         "\" y2=\"" + format_coord(y2) + "\"" + extra + "/>\n";
}

// <text> with escaped content, anchored at (x, y) ("start", "middle" or "end").
std::string text_element(const char* css_class, double x, double y, const char* anchor, const std::string& text,
                         const std::string& extra = "") {
  return std::string("<text class=\"") + css_class + "\" x=\"" + format_coord(x) + "\" y=\"" + format_coord(y) +
         "\" text-anchor=\"" + anchor + "\"" + extra + ">" + html_escape(text) + "</text>\n";
}

std::string to_chars_string(double v, std::chars_format format) {
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, v, format);
  return std::string(buf, result.ptr);
}

// Width of a legend entry: swatch, gap, text.
double legend_entry_width(const Series& s) {
  size_t code_points = 0;
  for (unsigned char c : s.name) code_points += (c & 0xC0) != 0x80;
  return kLegendSwatch + 6 + kLegendCharWidth * static_cast<double>(code_points);
}

struct LegendSlot {
  double x, y;  // left end of the swatch, baseline of the row
};

// Lays the legend out left to right above the plot, wrapping to a new row when the plot width is used up.
std::vector<LegendSlot> legend_slots(const std::vector<Series>& series, const ChartOptions& options, double left,
                                     int* rows) {
  std::vector<LegendSlot> slots;
  const double right = options.width - kMarginRight;
  const double top = options.title.empty() ? 8 : kTitleHeight;
  double x = left;
  int row = 0;
  for (const Series& s : series) {
    const double w = legend_entry_width(s);
    if (x > left && x + w > right) {
      x = left;
      ++row;
    }
    slots.push_back({x, top + row * kLegendRowHeight + 12});
    x += w + kLegendGap;
  }
  *rows = series.empty() ? 0 : row + 1;
  return slots;
}

double transform(double v, bool log_y) {
  if (!std::isfinite(v)) return kNaN;
  if (log_y) return v > 0 ? std::log10(v) : kNaN;
  return v;
}

// Ticks at whole numbers for an index axis whose nice step would fall below 1.
std::vector<double> index_ticks(double lo, double hi) {
  std::vector<double> ticks = nice_ticks(lo, hi);
  if (ticks.size() < 2 || ticks[1] - ticks[0] >= 1 || lo != std::floor(lo)) return ticks;
  ticks.clear();
  const double last = std::max(std::ceil(hi), std::floor(lo) + 1);
  for (double t = std::floor(lo); t <= last; t += 1) ticks.push_back(t);
  return ticks;
}

}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  MIXTRAIN_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi,
                 "nice_ticks: the range must be finite with lo <= hi, got [" << lo << ", " << hi << "]");
  target = std::max(target, 1);
  if (lo == hi) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / target;
  if (!std::isfinite(raw) || raw <= 0) return {lo, hi};
  const double power = std::floor(std::log10(raw));
  const double error = raw / std::pow(10.0, power);
  const double factor = error >= std::sqrt(50.0) ? 10 : error >= std::sqrt(10.0) ? 5 : error >= std::sqrt(2.0) ? 2 : 1;
  // A step below 1 is applied as a division by its (integral) inverse, so 3 / 5 gives exactly 0.6.
  // The 1e-9 slack keeps a bound that is a tick up to rounding from adding one more tick.
  std::vector<double> ticks;
  if (power >= 0) {
    const double step = factor * std::pow(10.0, power);
    const double k0 = std::floor(lo / step + 1e-9), k1 = std::ceil(hi / step - 1e-9);
    for (double k = k0; k <= k1; k += 1) ticks.push_back(k * step);
  } else {
    const double inverse = std::pow(10.0, -power) / factor;
    if (!std::isfinite(inverse)) return {lo, hi};
    const double k0 = std::floor(lo * inverse + 1e-9), k1 = std::ceil(hi * inverse - 1e-9);
    for (double k = k0; k <= k1; k += 1) ticks.push_back(k / inverse);
  }
  for (double& t : ticks) {
    if (t == 0) t = 0;  // no "-0"
  }
  return ticks;
}

std::vector<double> log_decade_ticks(double lo_exp, double hi_exp) {
  MIXTRAIN_CHECK(std::isfinite(lo_exp) && std::isfinite(hi_exp) && lo_exp <= hi_exp,
                 "log_decade_ticks: the range must be finite with lo <= hi, got [" << lo_exp << ", " << hi_exp << "]");
  double a = std::floor(lo_exp + 1e-9), b = std::ceil(hi_exp - 1e-9);
  if (a >= b) {
    a -= 1;
    b = a + 2;
  }
  const double every = std::ceil((b - a) / 8);
  std::vector<double> ticks;
  for (double t = a; t < b + every; t += every) {
    ticks.push_back(t);
    if (t >= b) break;
  }
  return ticks;
}

std::string format_tick(double value) {
  if (value == 0) return "0";
  if (!std::isfinite(value)) return std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf";
  const double a = std::fabs(value);
  if (a >= 1e-4 && a < 1e6) return to_chars_string(value, std::chars_format::fixed);
  // "2.5e-05" -> "2.5e-5", "1e+06" -> "1e6".
  std::string s = to_chars_string(value, std::chars_format::scientific);
  const size_t e = s.find('e');
  std::string mantissa = s.substr(0, e), exponent = s.substr(e + 1);
  std::string sign;
  if (exponent[0] == '-' || exponent[0] == '+') {
    if (exponent[0] == '-') sign = "-";
    exponent.erase(0, 1);
  }
  exponent.erase(0, std::min(exponent.find_first_not_of('0'), exponent.size() - 1));
  return mantissa + "e" + sign + exponent;
}

std::vector<SeriesPoint> series_points(const std::vector<double>& y, const ChartOptions& options) {
  const size_t n = y.size();
  std::vector<SeriesPoint> points;
  const size_t max_points = options.max_points == 0 ? n : std::max<size_t>(options.max_points, 2);
  if (n <= max_points) {
    points.reserve(n);
    for (size_t i = 0; i < n; ++i) points.push_back({static_cast<double>(i), transform(y[i], options.log_y)});
    return points;
  }
  const size_t buckets = max_points / 2;
  const size_t width = (n + buckets - 1) / buckets;
  for (size_t start = 0; start < n; start += width) {
    const size_t end = std::min(n, start + width);
    size_t imin = end, imax = end, first_gap = end;
    double vmin = 0, vmax = 0;
    for (size_t i = start; i < end; ++i) {
      const double v = transform(y[i], options.log_y);
      if (std::isnan(v)) {
        if (first_gap == end) first_gap = i;
        continue;
      }
      if (imin == end || v < vmin) imin = i, vmin = v;
      if (imax == end || v > vmax) imax = i, vmax = v;
    }
    // The kept points in index order, with the gap (if any) at its own index.
    std::vector<SeriesPoint> kept;
    if (imin != end) kept.push_back({static_cast<double>(imin), vmin});
    if (imax != end && imax != imin) kept.push_back({static_cast<double>(imax), vmax});
    if (first_gap != end) kept.push_back({static_cast<double>(first_gap), kNaN});
    std::sort(kept.begin(), kept.end(), [](const SeriesPoint& a, const SeriesPoint& b) { return a.index < b.index; });
    points.insert(points.end(), kept.begin(), kept.end());
  }
  return points;
}

namespace {

// One downsampled point of a band; lo and hi are NaN at a gap.
struct BandPoint {
  double index, lo, hi;
};

std::vector<BandPoint> band_points(const AreaBand& band, const ChartOptions& options) {
  const size_t n = std::min(band.lo.size(), band.hi.size());
  std::vector<BandPoint> points;
  const size_t max_points = options.max_points == 0 ? n : std::max<size_t>(options.max_points, 2);
  const size_t width = n <= max_points ? 1 : (n + max_points / 2 - 1) / (max_points / 2);
  for (size_t start = 0; start < n; start += width) {
    const size_t end = std::min(n, start + width);
    double lo = kNaN, hi = kNaN;
    size_t first = end, gap = end;
    for (size_t i = start; i < end; ++i) {
      const double a = transform(band.lo[i], options.log_y), b = transform(band.hi[i], options.log_y);
      if (std::isnan(a) || std::isnan(b)) {
        if (gap == end) gap = i;
        continue;
      }
      if (first == end) first = i;
      lo = std::isnan(lo) ? std::min(a, b) : std::min(lo, std::min(a, b));
      hi = std::isnan(hi) ? std::max(a, b) : std::max(hi, std::max(a, b));
    }
    if (first != end && (gap == end || first < gap)) points.push_back({static_cast<double>(first), lo, hi});
    if (gap != end) points.push_back({static_cast<double>(gap), kNaN, kNaN});
    if (first != end && gap != end && first > gap) points.push_back({static_cast<double>(first), lo, hi});
  }
  return points;
}

// Everything line_chart_svg() places, computed once.
struct Layout {
  std::vector<std::vector<SeriesPoint>> points;  // per series
  std::vector<std::vector<BandPoint>> bands;     // per band
  std::vector<double> x_ticks, y_ticks;          // y ticks are log10 exponents on a log axis
  bool has_data = false;
  std::vector<LegendSlot> legend;                // the series', then the bands'
  PlotArea area{};
};

std::string y_tick_label(double tick, const ChartOptions& options) {
  return format_tick(options.log_y ? std::pow(10.0, tick) : tick);
}

Layout make_layout(const std::vector<Series>& series, const std::vector<AreaBand>& bands, const ChartOptions& options) {
  Layout layout;
  size_t longest = 0;
  double ymin = std::numeric_limits<double>::infinity(), ymax = -ymin;
  auto extend = [&](double v) {
    if (std::isnan(v)) return;
    ymin = std::min(ymin, v);
    ymax = std::max(ymax, v);
  };
  for (const Series& s : series) {
    layout.points.push_back(series_points(s.y, options));
    longest = std::max(longest, s.y.size());
    for (const SeriesPoint& p : layout.points.back()) extend(p.value);
  }
  std::vector<Series> legend_entries = series;
  for (const AreaBand& b : bands) {
    layout.bands.push_back(band_points(b, options));
    longest = std::max(longest, std::min(b.lo.size(), b.hi.size()));
    for (const BandPoint& p : layout.bands.back()) extend(p.lo), extend(p.hi);
    legend_entries.push_back({b.name, {}, b.color});
  }
  layout.has_data = ymin <= ymax;
  if (!layout.has_data) ymin = 0, ymax = 1;
  const double x_last = options.x_first + (longest > 1 ? static_cast<double>(longest - 1) : 0);
  layout.x_ticks = index_ticks(options.x_first, x_last);
  layout.y_ticks = options.log_y ? log_decade_ticks(ymin, ymax) : nice_ticks(ymin, ymax);

  // The left margin fits the longest y tick label between the rotated axis label and the axis.
  size_t label_chars = 0;
  for (double t : layout.y_ticks) label_chars = std::max(label_chars, y_tick_label(t, options).size());
  const double left = std::max(kMarginLeft, 34 + kLegendCharWidth * static_cast<double>(label_chars));
  int rows = 0;
  layout.legend = legend_slots(legend_entries, options, left, &rows);
  const double top = (options.title.empty() ? 8 : kTitleHeight) + rows * kLegendRowHeight + 10;
  layout.area = {left, top, std::max(1.0, options.width - left - kMarginRight),
                 std::max(1.0, options.height - top - kMarginBottom)};
  return layout;
}

// The chart's frame: background, title, grid, axes, tick and axis labels. No x ticks: no vertical grid
// lines and no x tick labels (a bar chart labels its bars).
std::string frame_svg(const ChartOptions& options, const std::vector<double>& x_ticks,
                      const std::vector<double>& y_ticks, const PlotArea& area,
                      const std::vector<std::string>& y_labels) {
  const double x0 = x_ticks.empty() ? 0 : x_ticks.front(), x1 = x_ticks.empty() ? 1 : x_ticks.back();
  const double y0 = y_ticks.front(), y1 = y_ticks.back();
  auto px = [&](double x) { return area.left + (x1 == x0 ? 0.5 : (x - x0) / (x1 - x0)) * area.width; };
  auto py = [&](double v) { return area.top + (y1 - v) / (y1 - y0) * area.height; };
  const double bottom = area.top + area.height, right = area.left + area.width;
  const double center_x = area.left + area.width / 2, center_y = area.top + area.height / 2;
  const std::string w = std::to_string(options.width), h = std::to_string(options.height);
  const std::string title = html_escape(options.title);
  std::string svg = "<svg class=\"chart\" width=\"" + w + "\" height=\"" + h + "\" viewBox=\"0 0 " + w + " " + h +
                    "\" role=\"img\" aria-label=\"" + title +
                    "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  svg += "<rect width=\"" + w + "\" height=\"" + h + "\" fill=\"#ffffff\"/>\n";
  if (!options.title.empty()) {
    svg += "<title>" + title + "</title>\n";
    svg += text_element("chart-title", options.width / 2.0, 18, "middle", options.title,
                        " font-size=\"14\" font-weight=\"bold\"");
  }
  svg += "<g class=\"grid\" stroke=\"#e3e3e3\" stroke-width=\"1\">\n";
  for (double t : x_ticks) svg += line_element(px(t), area.top, px(t), bottom);
  for (double t : y_ticks) svg += line_element(area.left, py(t), right, py(t));
  svg += "</g>\n<g class=\"axes\" stroke=\"#444444\" stroke-width=\"1\">\n";
  svg += line_element(area.left, bottom, right, bottom);
  svg += line_element(area.left, area.top, area.left, bottom);
  svg += "</g>\n<g class=\"tick-labels\" fill=\"#333333\">\n";
  for (double t : x_ticks) svg += text_element("x-tick", px(t), bottom + 16, "middle", format_tick(t));
  for (size_t i = 0; i < y_ticks.size(); ++i)
    svg += text_element("y-tick", area.left - 6, py(y_ticks[i]) + 4, "end", y_labels[i]);
  svg += "</g>\n";
  if (!options.x_label.empty()) {
    svg += text_element("x-label", center_x, options.height - 8.0, "middle", options.x_label, " fill=\"#333333\"");
  }
  if (!options.y_label.empty()) {
    const std::string rotate = " fill=\"#333333\" transform=\"rotate(-90 16 " + format_coord(center_y) + ")\"";
    svg += text_element("y-label", 16, center_y, "middle", options.y_label, rotate);
  }
  return svg;
}

// Maps chart values to pixels: x from the first to the last x tick across the plot, y from the last y tick at its
// top to the first at its bottom.
struct PlotScale {
  PlotArea area;
  double x0, x1, y0, y1;

  explicit PlotScale(const Layout& layout)
      : area(layout.area),
        x0(layout.x_ticks.front()),
        x1(layout.x_ticks.back()),
        y0(layout.y_ticks.front()),
        y1(layout.y_ticks.back()) {}
  double px(double x) const { return area.left + (x - x0) / (x1 - x0) * area.width; }
  double py(double v) const { return area.top + (y1 - v) / (y1 - y0) * area.height; }
};

// The legend: a line swatch for each series, then a shaded one for each band.
std::string legend_svg(const std::vector<Series>& series, const std::vector<AreaBand>& bands, const Layout& layout) {
  std::string svg = "<g class=\"legend\">\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const LegendSlot& slot = layout.legend[i];
    const double swatch_width = std::max(3.0, series[i].stroke_width);
    svg += line_element(slot.x, slot.y - 4, slot.x + kLegendSwatch, slot.y - 4,
                        " stroke=\"" + html_escape(series[i].color) + "\" stroke-width=\"" +
                            format_coord(swatch_width) + "\"");
    svg += text_element("legend-label", slot.x + kLegendSwatch + 6, slot.y, "start", series[i].name);
  }
  for (size_t i = 0; i < bands.size(); ++i) {
    const LegendSlot& slot = layout.legend[series.size() + i];
    svg += "<rect class=\"legend-band\" x=\"" + format_coord(slot.x) + "\" y=\"" + format_coord(slot.y - 10) +
           "\" width=\"" + format_coord(kLegendSwatch) + "\" height=\"12\" fill=\"" + html_escape(bands[i].color) +
           "\" fill-opacity=\"" + format_coord(std::max(bands[i].opacity, 0.3)) + "\"/>\n";
    svg += text_element("legend-label", slot.x + kLegendSwatch + 6, slot.y, "start", bands[i].name);
  }
  svg += "</g>\n";
  return svg;
}

// Bands, drawn behind the lines: one polygon per unbroken run of finite bounds (upper edge forward, lower back).
std::string bands_svg(const std::vector<AreaBand>& bands, const Layout& layout, const PlotScale& scale,
                      const ChartOptions& options) {
  if (bands.empty()) return "";
  std::string svg = "<g class=\"bands\" stroke=\"none\">\n";
  for (size_t i = 0; i < bands.size(); ++i) {
    std::vector<BandPoint> run;
    auto flush = [&] {
      if (run.size() >= 2) {
        svg += "<polygon class=\"band\" data-band=\"" + html_escape(bands[i].name) + "\" fill=\"" +
               html_escape(bands[i].color) + "\" fill-opacity=\"" + format_coord(bands[i].opacity) + "\" points=\"";
        for (size_t k = 0; k < run.size(); ++k)
          svg += (k ? " " : "") + format_coord(scale.px(options.x_first + run[k].index)) + "," +
                 format_coord(scale.py(run[k].hi));
        for (size_t k = run.size(); k-- > 0;)
          svg += " " + format_coord(scale.px(options.x_first + run[k].index)) + "," + format_coord(scale.py(run[k].lo));
        svg += "\"/>\n";
      }
      run.clear();
    };
    for (const BandPoint& p : layout.bands[i]) {
      if (std::isnan(p.lo)) flush();
      else run.push_back(p);
    }
    flush();
  }
  svg += "</g>\n";
  return svg;
}

// The lines: one polyline per unbroken run of finite points, a dot for a run of one.
std::string lines_svg(const std::vector<Series>& series, const Layout& layout, const PlotScale& scale,
                      const ChartOptions& options) {
  std::string svg = "<g class=\"lines\" fill=\"none\" stroke-linejoin=\"round\" stroke-linecap=\"round\">\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const std::string name = html_escape(series[i].name), color = html_escape(series[i].color);
    std::vector<std::pair<double, double>> run;  // pixel coordinates
    auto flush = [&] {
      if (run.size() == 1) {
        svg += "<circle class=\"point\" data-series=\"" + name + "\" cx=\"" + format_coord(run[0].first) +
               "\" cy=\"" + format_coord(run[0].second) + "\" r=\"" +
               format_coord(std::max(2.0, series[i].stroke_width)) + "\" fill=\"" + color + "\"/>\n";
      } else if (run.size() > 1) {
        svg += "<polyline class=\"series\" data-series=\"" + name + "\" stroke=\"" + color + "\" stroke-width=\"" +
               format_coord(series[i].stroke_width) + "\" points=\"";
        for (size_t k = 0; k < run.size(); ++k) {
          if (k) svg += ' ';
          svg += format_coord(run[k].first) + "," + format_coord(run[k].second);
        }
        svg += "\"/>\n";
      }
      run.clear();
    };
    for (const SeriesPoint& p : layout.points[i]) {
      if (std::isnan(p.value)) {
        flush();
      } else {
        run.emplace_back(scale.px(options.x_first + p.index), scale.py(p.value));
      }
    }
    flush();
  }
  svg += "</g>\n";
  return svg;
}

// Markers, over everything: a dashed line across the plot, the label near its top; labels of markers in x order
// take three rows in turn so that close ones do not overwrite each other.
std::string markers_svg(const std::vector<Marker>& markers, const PlotScale& scale) {
  if (markers.empty()) return "";
  const PlotArea& area = scale.area;
  const double bottom = area.top + area.height, right = area.left + area.width;
  std::vector<Marker> sorted = markers;
  std::stable_sort(sorted.begin(), sorted.end(), [](const Marker& a, const Marker& b) { return a.x < b.x; });
  std::string svg = "<g class=\"markers\" font-size=\"11\">\n";
  for (size_t i = 0; i < sorted.size(); ++i) {
    const Marker& m = sorted[i];
    const double x = std::clamp(scale.px(m.x), area.left, right);
    const std::string color = html_escape(m.color);
    const bool flip = x > area.left + area.width * 0.7;  // labels near the right edge read leftwards
    svg += "<g class=\"marker\" data-x=\"" + format_tick(m.x) + "\">\n";
    svg += line_element(x, area.top, x, bottom,
                        " stroke=\"" + color + "\" stroke-width=\"1.5\" stroke-dasharray=\"5,3\"");
    svg += text_element("marker-label", flip ? x - 4 : x + 4, area.top + 12 + static_cast<double>(i % 3) * 13,
                        flip ? "end" : "start", m.label, " fill=\"" + color + "\"");
    svg += "</g>\n";
  }
  svg += "</g>\n";
  return svg;
}

}  // namespace

PlotArea plot_area(const std::vector<Series>& series, const ChartOptions& options) {
  return make_layout(series, {}, options).area;
}

std::string line_chart_svg(const std::vector<Series>& series, const ChartOptions& options) {
  return line_chart_svg(series, options, {}, {});
}

std::string line_chart_svg(const std::vector<Series>& series, const ChartOptions& options,
                           const std::vector<AreaBand>& bands, const std::vector<Marker>& markers) {
  MIXTRAIN_CHECK(options.width > 0 && options.height > 0,
                 "line_chart_svg: width and height must be positive, got " << options.width << "x" << options.height);
  const Layout layout = make_layout(series, bands, options);
  const PlotScale scale(layout);
  std::vector<std::string> y_labels;
  for (double t : layout.y_ticks) y_labels.push_back(y_tick_label(t, options));
  std::string svg = frame_svg(options, layout.x_ticks, layout.y_ticks, layout.area, y_labels);
  if (!layout.has_data) {
    const PlotArea& area = layout.area;
    svg += text_element("no-data", area.left + area.width / 2, area.top + area.height / 2, "middle",
                        "no finite values", " fill=\"#888888\"");
  }
  svg += legend_svg(series, bands, layout);
  svg += bands_svg(bands, layout, scale, options);
  svg += lines_svg(series, layout, scale, options);
  svg += markers_svg(markers, scale);
  svg += "</svg>\n";
  return svg;
}

namespace {
// A stacked bar's segments from the bottom up, in a <g> named as a plain bar's <rect> is.
template <typename ToY>
std::string stacked_bar_svg(const Bar& b, double x, double width, ToY py) {
  std::string svg = "<g class=\"bar\" data-bar=\"" + html_escape(b.label) + "\">\n";
  double below = 0;
  for (const BarPart& part : b.parts) {
    const double value = std::max(0.0, part.value);
    const double y_top = py(below + value), y_bottom = py(below);
    svg += "<rect class=\"bar-part\" data-part=\"" + html_escape(part.name) + "\" x=\"" + format_coord(x) +
           "\" y=\"" + format_coord(y_top) + "\" width=\"" + format_coord(width) + "\" height=\"" +
           format_coord(std::max(0.0, y_bottom - y_top)) + "\" fill=\"" + html_escape(part.color) + "\"/>\n";
    below += value;
  }
  return svg + "</g>\n";
}
}  // namespace

std::string bar_chart_svg(const std::vector<Bar>& bars, const BarChartOptions& options) {
  MIXTRAIN_CHECK(options.width > 0 && options.height > 0,
                 "bar_chart_svg: width and height must be positive, got " << options.width << "x" << options.height);
  double top_value = 0;
  for (const Bar& b : bars) {
    if (std::isfinite(b.value) && b.value > 0) top_value = std::max(top_value, b.value);
    if (std::isfinite(b.marker) && b.marker > 0) top_value = std::max(top_value, b.marker);
  }
  const std::vector<double> y_ticks = nice_ticks(0, top_value > 0 ? top_value : 1);
  std::vector<std::string> y_labels;
  size_t label_chars = 0;
  for (double t : y_ticks) {
    y_labels.push_back(format_tick(t));
    label_chars = std::max(label_chars, y_labels.back().size());
  }
  const double left = std::max(kMarginLeft, 34 + kLegendCharWidth * static_cast<double>(label_chars));
  const double top = (options.title.empty() ? 8 : kTitleHeight) + 16;
  const PlotArea area{left, top, std::max(1.0, options.width - left - kMarginRight),
                      std::max(1.0, options.height - top - kMarginBottom)};
  ChartOptions frame;
  frame.title = options.title;
  frame.y_label = options.y_label;
  frame.width = options.width;
  frame.height = options.height;
  std::string svg = frame_svg(frame, {}, y_ticks, area, y_labels);
  const double y1 = y_ticks.back();
  auto py = [&](double v) { return area.top + (y1 - v) / y1 * area.height; };
  const double bottom = area.top + area.height;
  const double slot = area.width / static_cast<double>(std::max<size_t>(bars.size(), 1));
  const double bar_width = std::min(slot * 0.6, 90.0);
  svg += "<g class=\"bars\">\n";
  for (size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    const double center = area.left + slot * (static_cast<double>(i) + 0.5);
    const std::string label = html_escape(b.label);
    if (std::isfinite(b.value) && b.value >= 0) {
      const double y = py(b.value);
      if (b.parts.empty()) {
        svg += "<rect class=\"bar\" data-bar=\"" + label + "\" x=\"" + format_coord(center - bar_width / 2) +
               "\" y=\"" + format_coord(y) + "\" width=\"" + format_coord(bar_width) + "\" height=\"" +
               format_coord(std::max(0.0, bottom - y)) + "\" fill=\"" + html_escape(b.color) + "\"/>\n";
      } else {
        svg += stacked_bar_svg(b, center - bar_width / 2, bar_width, py);
      }
      if (std::isfinite(b.marker) && b.marker >= 0)
        svg += "<line class=\"bar-marker\" data-bar=\"" + label + "\" x1=\"" +
               format_coord(center - bar_width / 2 - 6) + "\" x2=\"" + format_coord(center + bar_width / 2 + 6) +
               "\" y1=\"" + format_coord(py(b.marker)) + "\" y2=\"" + format_coord(py(b.marker)) +
               "\" stroke=\"#111111\" stroke-width=\"2\"/>\n";
      const double text_y = std::min(y, std::isfinite(b.marker) ? py(b.marker) : y) - 4;
      svg += text_element("bar-value", center, text_y, "middle",
                          b.value_text.empty() ? format_tick(b.value) : b.value_text, " fill=\"#222222\"");
    } else {
      svg += text_element("bar-value", center, bottom - 4, "middle", "n/a", " fill=\"#888888\"");
    }
    svg += text_element("bar-label", center, bottom + 16, "middle", b.label, " fill=\"#333333\"");
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

}  // namespace mixtrain
