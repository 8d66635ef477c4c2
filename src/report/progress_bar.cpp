#include "mixtrain/report/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>

namespace mixtrain {

namespace {

std::string printf_string(const char* format, double value) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof buf, format, value);
  return std::string(buf, static_cast<size_t>(n > 0 ? n : 0));
}

// " - loss: 0.5123 - accuracy: 0.8120"
std::string values_text(const MetricValues& values) {
  std::string s;
  for (const auto& [name, value] : values) {
    s += " - ";
    s += name;
    s += ": ";
    s += format_metric_value(value);
  }
  return s;
}

// " - 4s - 9ms/step": wall time, then the time per step in the unit that keeps it readable.
std::string timing_text(double seconds, int64_t steps) {
  std::string s = printf_string(" - %.0fs", seconds);
  if (steps <= 0) return s;
  const double per_step = seconds / static_cast<double>(steps);
  if (per_step >= 1 || per_step == 0) return s + printf_string(" - %.0fs/step", per_step);
  if (per_step >= 1e-3) return s + printf_string(" - %.0fms/step", per_step * 1e3);
  return s + printf_string(" - %.0fus/step", per_step * 1e6);
}

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

std::string format_metric_value(double value) {
  const double a = std::fabs(value);
  if (std::isfinite(value) && (a >= 1e4 || (a > 0 && a < 1e-3))) return printf_string("%.4g", value);
  return printf_string("%.4f", value);
}

std::string format_eta(double seconds) {
  const long long s = std::llround(std::max(seconds, 0.0));
  char buf[48];
  if (s > 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, (s % 3600) / 60, s % 60);
  } else if (s > 60) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%llds", s);
  }
  return buf;
}

ProgressBar::ProgressBar(int64_t total_steps, std::ostream& out, bool interactive)
    : total_(total_steps), out_(out), interactive_(interactive), start_(std::chrono::steady_clock::now()) {}

std::string ProgressBar::counter(int64_t step) const {
  if (total_ <= 0) return std::to_string(step) + "/Unknown";
  const std::string total = std::to_string(total_);
  std::string current = std::to_string(step);
  // Only a redrawn line needs the fixed width; a one-off summary line reads better unpadded.
  if (interactive_ && current.size() < total.size()) current.insert(0, total.size() - current.size(), ' ');
  return current + "/" + total;
}

std::string ProgressBar::bar(int64_t step) const {
  const double fraction = std::min(1.0, static_cast<double>(step) / static_cast<double>(total_));
  const int filled = static_cast<int>(kBarWidth * fraction);
  std::string s = "[";
  if (filled > 0) {
    s.append(static_cast<size_t>(filled - 1), '=');
    s += step < total_ ? '>' : '=';
  }
  s.append(static_cast<size_t>(kBarWidth - filled), '.');
  return s + "]";
}

void ProgressBar::draw(const std::string& line) {
  out_ << '\r' << line;
  if (line.size() < last_width_) out_ << std::string(last_width_ - line.size(), ' ');
  out_.flush();
  last_width_ = line.size();
  drawn_ = true;
}

void ProgressBar::update(int64_t step, const MetricValues& values) {
  last_step_ = step;
  if (!interactive_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool last = total_ > 0 && step >= total_;
  if (drawn_ && !last && seconds_between(last_draw_, now) < kRedrawIntervalSeconds) return;
  last_draw_ = now;

  const double elapsed = seconds_between(start_, now);
  std::string line = counter(step);
  if (total_ <= 0) {
    line += timing_text(elapsed, 0);  // no ETA without a total: show the elapsed time
  } else {
    line += ' ';
    line += bar(step);
    if (last) {
      line += timing_text(elapsed, step);
    } else {
      const double eta = step > 0 ? elapsed / static_cast<double>(step) * static_cast<double>(total_ - step) : 0.0;
      line += " - ETA: ";
      line += format_eta(eta);
    }
  }
  draw(line + values_text(values));
}

void ProgressBar::finish(const MetricValues& values, double seconds) {
  const int64_t steps = last_step_ > 0 ? last_step_ : total_;
  std::string line = counter(steps);
  if (interactive_ && total_ > 0) {
    line += ' ';
    line += bar(steps);
  }
  line += timing_text(seconds, steps) + values_text(values);
  if (interactive_) {
    draw(line);
  } else {
    out_ << line;
  }
  out_ << '\n';
  out_.flush();
}

}  // namespace mixtrain
