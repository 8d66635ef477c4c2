#include "mixtrain/optim/schedules.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <utility>

#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {

constexpr double kPi = 3.14159265358979323846;

// Shortest form that reads back as the same double for the usual arguments (0.1, 1e-4, 1000).
std::string fmt(double v) {
  std::ostringstream os;
  os << std::setprecision(9) << v;
  return os.str();
}

const char* fmt(bool b) { return b ? "true" : "false"; }

void check_finite(const char* schedule, const char* arg, double v) {
  MIXTRAIN_CHECK(std::isfinite(v), schedule << ": " << arg << " must be finite, got " << v);
}

void check_decay_steps(const char* schedule, const char* arg, double v) {
  // Keras: "Argument `decay_steps` must be > 0."
  MIXTRAIN_CHECK(std::isfinite(v) && v > 0.0, schedule << ": " << arg << " must be finite and > 0, got " << v);
}

void check_step(const LearningRateSchedule& s, int64_t step) {
  MIXTRAIN_CHECK(step >= 0, s.name() << ": step must be >= 0, got " << step);
}

// The cosine factor of CosineDecay: from 1 at fraction 0 down to alpha at fraction 1.
double cosine_decayed(double completed_fraction, double alpha) {
  const double cosine = 0.5 * (1.0 + std::cos(kPi * completed_fraction));
  return (1.0 - alpha) * cosine + alpha;
}

}  // namespace

std::string LearningRateSchedule::name() const { return "LearningRateSchedule"; }
std::string LearningRateSchedule::describe() const { return name(); }

// ---- ExponentialDecay ----

ExponentialDecay::ExponentialDecay(double initial_learning_rate, double decay_steps, double decay_rate,
                                   bool staircase)
    : initial_learning_rate_(initial_learning_rate),
      decay_steps_(decay_steps),
      decay_rate_(decay_rate),
      staircase_(staircase) {
  check_finite("ExponentialDecay", "initial_learning_rate", initial_learning_rate);
  check_decay_steps("ExponentialDecay", "decay_steps", decay_steps);
  check_finite("ExponentialDecay", "decay_rate", decay_rate);
}

float ExponentialDecay::operator()(int64_t step) const {
  check_step(*this, step);
  double p = static_cast<double>(step) / decay_steps_;
  if (staircase_) p = std::floor(p);
  return static_cast<float>(initial_learning_rate_ * std::pow(decay_rate_, p));
}

std::string ExponentialDecay::describe() const {
  return "ExponentialDecay(initial_learning_rate=" + fmt(initial_learning_rate_) + ", decay_steps=" +
         fmt(decay_steps_) + ", decay_rate=" + fmt(decay_rate_) + ", staircase=" + fmt(staircase_) + ")";
}

// ---- PiecewiseConstantDecay ----

PiecewiseConstantDecay::PiecewiseConstantDecay(std::vector<int64_t> boundaries, std::vector<double> values)
    : boundaries_(std::move(boundaries)), values_(std::move(values)) {
  if (boundaries_.size() + 1 != values_.size()) {
    MIXTRAIN_FAIL(kInvalidInput,
                  "PiecewiseConstantDecay: " << boundaries_.size() << " boundaries need " << boundaries_.size() + 1
                                             << " values, got " << values_.size(),
                  "give one value per interval: values[0] up to boundaries[0], ..., values.back() after the last");
  }
  for (size_t i = 1; i < boundaries_.size(); ++i) {
    MIXTRAIN_CHECK(boundaries_[i] > boundaries_[i - 1],
                   "PiecewiseConstantDecay: boundaries must increase strictly, got " << boundaries_[i - 1] << " then "
                                                                                     << boundaries_[i]);
  }
  for (double v : values_) check_finite("PiecewiseConstantDecay", "every value", v);
}

float PiecewiseConstantDecay::operator()(int64_t step) const {
  check_step(*this, step);
  // The first boundary >= step closes step's interval (intervals are (b[i-1], b[i]]).
  const size_t i = static_cast<size_t>(std::lower_bound(boundaries_.begin(), boundaries_.end(), step) -
                                       boundaries_.begin());
  return static_cast<float>(values_[i]);
}

std::string PiecewiseConstantDecay::describe() const {
  std::string b, v;
  for (int64_t x : boundaries_) b += (b.empty() ? "" : ", ") + std::to_string(x);
  for (double x : values_) v += (v.empty() ? "" : ", ") + fmt(x);
  return "PiecewiseConstantDecay(boundaries=[" + b + "], values=[" + v + "])";
}

// ---- PolynomialDecay ----

PolynomialDecay::PolynomialDecay(double initial_learning_rate, double decay_steps, double end_learning_rate,
                                 double power, bool cycle)
    : initial_learning_rate_(initial_learning_rate),
      decay_steps_(decay_steps),
      end_learning_rate_(end_learning_rate),
      power_(power),
      cycle_(cycle) {
  check_finite("PolynomialDecay", "initial_learning_rate", initial_learning_rate);
  check_decay_steps("PolynomialDecay", "decay_steps", decay_steps);
  check_finite("PolynomialDecay", "end_learning_rate", end_learning_rate);
  check_finite("PolynomialDecay", "power", power);
}

float PolynomialDecay::operator()(int64_t step) const {
  check_step(*this, step);
  double s = static_cast<double>(step);
  double decay_steps = decay_steps_;
  if (cycle_) {
    // The first multiple of decay_steps that is >= step; decay_steps itself at step 0.
    decay_steps *= step == 0 ? 1.0 : std::ceil(s / decay_steps_);
  } else {
    s = std::min(s, decay_steps);
  }
  const double p = s / decay_steps;
  return static_cast<float>((initial_learning_rate_ - end_learning_rate_) * std::pow(1.0 - p, power_) +
                            end_learning_rate_);
}

std::string PolynomialDecay::describe() const {
  return "PolynomialDecay(initial_learning_rate=" + fmt(initial_learning_rate_) + ", decay_steps=" +
         fmt(decay_steps_) + ", end_learning_rate=" + fmt(end_learning_rate_) + ", power=" + fmt(power_) +
         ", cycle=" + fmt(cycle_) + ")";
}

// ---- InverseTimeDecay ----

InverseTimeDecay::InverseTimeDecay(double initial_learning_rate, double decay_steps, double decay_rate,
                                   bool staircase)
    : initial_learning_rate_(initial_learning_rate),
      decay_steps_(decay_steps),
      decay_rate_(decay_rate),
      staircase_(staircase) {
  check_finite("InverseTimeDecay", "initial_learning_rate", initial_learning_rate);
  check_decay_steps("InverseTimeDecay", "decay_steps", decay_steps);
  check_finite("InverseTimeDecay", "decay_rate", decay_rate);
}

float InverseTimeDecay::operator()(int64_t step) const {
  check_step(*this, step);
  double p = static_cast<double>(step) / decay_steps_;
  if (staircase_) p = std::floor(p);
  return static_cast<float>(initial_learning_rate_ / (1.0 + decay_rate_ * p));
}

std::string InverseTimeDecay::describe() const {
  return "InverseTimeDecay(initial_learning_rate=" + fmt(initial_learning_rate_) + ", decay_steps=" +
         fmt(decay_steps_) + ", decay_rate=" + fmt(decay_rate_) + ", staircase=" + fmt(staircase_) + ")";
}

// ---- CosineDecay ----

CosineDecay::CosineDecay(double initial_learning_rate, double decay_steps, double alpha,
                         std::optional<double> warmup_target, int64_t warmup_steps)
    : initial_learning_rate_(initial_learning_rate),
      decay_steps_(decay_steps),
      alpha_(alpha),
      warmup_target_(warmup_target),
      warmup_steps_(warmup_steps) {
  check_finite("CosineDecay", "initial_learning_rate", initial_learning_rate);
  check_decay_steps("CosineDecay", "decay_steps", decay_steps);
  check_finite("CosineDecay", "alpha", alpha);
  if (warmup_target) check_finite("CosineDecay", "warmup_target", *warmup_target);
  MIXTRAIN_CHECK(warmup_steps >= 0, "CosineDecay: warmup_steps must be >= 0, got " << warmup_steps);
}

float CosineDecay::operator()(int64_t step) const {
  check_step(*this, step);
  const double s = static_cast<double>(step);
  if (!warmup_target_) {
    return static_cast<float>(initial_learning_rate_ * cosine_decayed(std::min(s, decay_steps_) / decay_steps_,
                                                                      alpha_));
  }
  const double warmup = static_cast<double>(warmup_steps_);
  const double clamped = std::min(s, decay_steps_ + warmup);
  if (clamped < warmup) {
    const double delta = *warmup_target_ - initial_learning_rate_;
    return static_cast<float>(delta * (clamped / warmup) + initial_learning_rate_);
  }
  return static_cast<float>(*warmup_target_ * cosine_decayed((clamped - warmup) / decay_steps_, alpha_));
}

std::string CosineDecay::describe() const {
  std::string out = "CosineDecay(initial_learning_rate=" + fmt(initial_learning_rate_) +
                    ", decay_steps=" + fmt(decay_steps_) + ", alpha=" + fmt(alpha_);
  if (warmup_target_) {
    out += ", warmup_target=" + fmt(*warmup_target_) + ", warmup_steps=" + std::to_string(warmup_steps_);
  }
  return out + ")";
}

// ---- CosineDecayRestarts ----

CosineDecayRestarts::CosineDecayRestarts(double initial_learning_rate, double first_decay_steps, double t_mul,
                                         double m_mul, double alpha)
    : initial_learning_rate_(initial_learning_rate),
      first_decay_steps_(first_decay_steps),
      t_mul_(t_mul),
      m_mul_(m_mul),
      alpha_(alpha) {
  check_finite("CosineDecayRestarts", "initial_learning_rate", initial_learning_rate);
  check_decay_steps("CosineDecayRestarts", "first_decay_steps", first_decay_steps);
  MIXTRAIN_CHECK(std::isfinite(t_mul) && t_mul > 0.0,
                 "CosineDecayRestarts: t_mul must be finite and > 0, got " << t_mul);
  check_finite("CosineDecayRestarts", "m_mul", m_mul);
  check_finite("CosineDecayRestarts", "alpha", alpha);
}

float CosineDecayRestarts::operator()(int64_t step) const {
  check_step(*this, step);
  double fraction = static_cast<double>(step) / first_decay_steps_;  // in units of the first period
  double restart = 0.0;
  if (t_mul_ == 1.0) {
    restart = std::floor(fraction);
    fraction -= restart;
  } else {
    // Period i starts at (1 - t_mul^i) / (1 - t_mul) first periods (a geometric sum).
    auto start = [this](double i) { return (1.0 - std::pow(t_mul_, i)) / (1.0 - t_mul_); };
    if (t_mul_ < 1.0 && fraction * (1.0 - t_mul_) >= 1.0) {
      MIXTRAIN_FAIL(kInvalidInput,
                    "CosineDecayRestarts: with t_mul " << t_mul_ << " < 1 the periods shrink and all end by step "
                                                       << first_decay_steps_ / (1.0 - t_mul_) << "; step " << step
                                                       << " lies beyond",
                    "use t_mul >= 1 for a run this long");
    }
    restart = std::floor(std::log(1.0 - fraction * (1.0 - t_mul_)) / std::log(t_mul_));
    // The logarithm can round across a restart; put step in the period that contains it.
    if (fraction < start(restart)) {
      restart -= 1.0;
    } else if (fraction >= start(restart + 1.0)) {
      restart += 1.0;
    }
    fraction = (fraction - start(restart)) / std::pow(t_mul_, restart);
  }
  const double cosine = 0.5 * std::pow(m_mul_, restart) * (1.0 + std::cos(kPi * fraction));
  return static_cast<float>(initial_learning_rate_ * ((1.0 - alpha_) * cosine + alpha_));
}

std::string CosineDecayRestarts::describe() const {
  return "CosineDecayRestarts(initial_learning_rate=" + fmt(initial_learning_rate_) + ", first_decay_steps=" +
         fmt(first_decay_steps_) + ", t_mul=" + fmt(t_mul_) + ", m_mul=" + fmt(m_mul_) + ", alpha=" + fmt(alpha_) +
         ")";
}

// ---- ConstantSchedule, LinearWarmup ----

ConstantSchedule::ConstantSchedule(double learning_rate) : learning_rate_(learning_rate) {
  check_finite("ConstantSchedule", "learning_rate", learning_rate);
}

float ConstantSchedule::operator()(int64_t step) const {
  check_step(*this, step);
  return static_cast<float>(learning_rate_);
}

std::string ConstantSchedule::describe() const { return "ConstantSchedule(learning_rate=" + fmt(learning_rate_) + ")"; }

LinearWarmup::LinearWarmup(std::shared_ptr<const LearningRateSchedule> after, int64_t warmup_steps,
                           double warmup_learning_rate)
    : after_(std::move(after)), warmup_steps_(warmup_steps), warmup_learning_rate_(warmup_learning_rate) {
  MIXTRAIN_CHECK(after_ != nullptr, "LinearWarmup: the schedule after the warmup is null");
  MIXTRAIN_CHECK(warmup_steps >= 0, "LinearWarmup: warmup_steps must be >= 0, got " << warmup_steps);
  check_finite("LinearWarmup", "warmup_learning_rate", warmup_learning_rate);
}

float LinearWarmup::operator()(int64_t step) const {
  check_step(*this, step);
  if (step >= warmup_steps_) return (*after_)(step - warmup_steps_);
  const double target = (*after_)(0);
  const double fraction = static_cast<double>(step) / static_cast<double>(warmup_steps_);
  return static_cast<float>(warmup_learning_rate_ + (target - warmup_learning_rate_) * fraction);
}

std::string LinearWarmup::describe() const {
  return "LinearWarmup(warmup_steps=" + std::to_string(warmup_steps_) +
         ", warmup_learning_rate=" + fmt(warmup_learning_rate_) + ", after=" + after_->describe() + ")";
}

// ---- make_schedule ----

std::shared_ptr<LearningRateSchedule> make_schedule(std::string_view name, float learning_rate, int64_t total_steps,
                                                    int64_t warmup_steps) {
  static constexpr const char* kNames = "constant, cosine, linear";
  if (name != "constant" && name != "cosine" && name != "linear") {
    MIXTRAIN_FAIL(kInvalidInput, "unknown learning-rate schedule '" << name << "'; valid names: " << kNames,
                  std::string("use one of: ") + kNames);
  }
  MIXTRAIN_CHECK(std::isfinite(learning_rate) && learning_rate >= 0.0f,
                 "learning rate must be finite and >= 0, got " << learning_rate);
  MIXTRAIN_CHECK(total_steps >= 1, "the '" << name << "' schedule needs total_steps >= 1, got " << total_steps);
  if (warmup_steps < 0 || warmup_steps > total_steps) {
    MIXTRAIN_FAIL(kInvalidInput,
                  "warmup_steps " << warmup_steps << " must lie in [0, total_steps " << total_steps << "]",
                  "give a warmup no longer than the run (epochs x steps per epoch)");
  }
  const double lr = learning_rate;
  // The decay runs over what the warmup leaves, at least one step (Keras refuses decay_steps 0).
  const double decay_steps = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  if (name == "cosine") {
    if (warmup_steps == 0) return std::make_shared<CosineDecay>(lr, decay_steps, 0.1);
    return std::make_shared<CosineDecay>(0.0, decay_steps, 0.1, lr, warmup_steps);
  }
  std::shared_ptr<LearningRateSchedule> after;
  if (name == "constant") {
    after = std::make_shared<ConstantSchedule>(lr);
  } else {
    after = std::make_shared<PolynomialDecay>(lr, decay_steps, 0.0, 1.0);
  }
  if (warmup_steps == 0) return after;
  return std::make_shared<LinearWarmup>(std::move(after), warmup_steps, 0.0);
}

}  // namespace mixtrain
