// Learning-rate schedules, as keras.optimizers.schedules: a schedule maps the optimizer's update count
// (Optimizer::iterations(), 0 before the first update) to the learning rate of the next update.
//
//   auto opt = std::make_unique<Adam>();
//   opt->set_learning_rate_schedule(std::make_shared<CosineDecay>(0.0, 9000, 0.0, 1e-3, 1000));
//
// Names, arguments, defaults and formulas are Keras 3's. Each formula is evaluated in double and rounded once
// to float; Keras evaluates it in the dtype of initial_learning_rate (float32), so the two agree to float32
// rounding. Arguments that Keras refuses (decay_steps <= 0, mismatched boundaries and values) throw Error, and
// so do arguments that are not finite. A schedule is a pure function of its step: the optimizer evaluates it
// once per update, and a checkpoint restores the position by restoring iterations().
//
// ConstantSchedule and LinearWarmup are not Keras classes: make_schedule() composes them with Keras' ones for
// the command line's warmup.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mixtrain {

class LearningRateSchedule {
 public:
  virtual ~LearningRateSchedule() = default;
  // The learning rate at `step` (>= 0; Error otherwise). Must not depend on anything but step: it may be
  // evaluated more than once per update and from any thread.
  virtual float operator()(int64_t step) const = 0;
  // The class name, e.g. "CosineDecay" (Keras' default op names differ for two classes: "PiecewiseConstant",
  // "SGDRDecay").
  virtual std::string name() const;
  // name() with the arguments, for logs: "ExponentialDecay(initial_learning_rate=0.1, decay_steps=1000, ...)".
  virtual std::string describe() const;
};

// initial_learning_rate * decay_rate ^ (step / decay_steps); with staircase the exponent is floored, so the
// rate drops every decay_steps steps.
class ExponentialDecay : public LearningRateSchedule {
 public:
  ExponentialDecay(double initial_learning_rate, double decay_steps, double decay_rate, bool staircase = false);
  float operator()(int64_t step) const override;
  std::string name() const override { return "ExponentialDecay"; }
  std::string describe() const override;

 private:
  double initial_learning_rate_, decay_steps_, decay_rate_;
  bool staircase_;
};

// values[0] while step <= boundaries[0], values[i] while boundaries[i-1] < step <= boundaries[i], values.back()
// after boundaries.back(). boundaries strictly increase; values has one more element.
class PiecewiseConstantDecay : public LearningRateSchedule {
 public:
  PiecewiseConstantDecay(std::vector<int64_t> boundaries, std::vector<double> values);
  float operator()(int64_t step) const override;
  std::string name() const override { return "PiecewiseConstantDecay"; }
  std::string describe() const override;

 private:
  std::vector<int64_t> boundaries_;
  std::vector<double> values_;
};

// (initial - end) * (1 - s / decay_steps) ^ power + end with s = min(step, decay_steps): from
// initial_learning_rate to end_learning_rate in decay_steps, then constant. With cycle, decay_steps is
// instead the first multiple of decay_steps >= step (decay_steps itself at step 0), so the decay restarts.
class PolynomialDecay : public LearningRateSchedule {
 public:
  PolynomialDecay(double initial_learning_rate, double decay_steps, double end_learning_rate = 1e-4,
                  double power = 1.0, bool cycle = false);
  float operator()(int64_t step) const override;
  std::string name() const override { return "PolynomialDecay"; }
  std::string describe() const override;

 private:
  double initial_learning_rate_, decay_steps_, end_learning_rate_, power_;
  bool cycle_;
};

// initial_learning_rate / (1 + decay_rate * step / decay_steps); with staircase, step / decay_steps is floored.
class InverseTimeDecay : public LearningRateSchedule {
 public:
  InverseTimeDecay(double initial_learning_rate, double decay_steps, double decay_rate, bool staircase = false);
  float operator()(int64_t step) const override;
  std::string name() const override { return "InverseTimeDecay"; }
  std::string describe() const override;

 private:
  double initial_learning_rate_, decay_steps_, decay_rate_;
  bool staircase_;
};

// Cosine decay with an optional linear warmup (Keras 3). Without warmup_target:
//   from * ((1 - alpha) * 0.5 * (1 + cos(pi * s / decay_steps)) + alpha),  s = min(step, decay_steps),
// with from = initial_learning_rate: initial_learning_rate down to alpha * initial_learning_rate, then constant.
// With warmup_target: s = min(step, warmup_steps + decay_steps); while s < warmup_steps the rate rises linearly,
// initial_learning_rate + (warmup_target - initial_learning_rate) * s / warmup_steps, then the cosine above runs
// on s - warmup_steps with from = warmup_target (down to alpha * warmup_target).
class CosineDecay : public LearningRateSchedule {
 public:
  CosineDecay(double initial_learning_rate, double decay_steps, double alpha = 0.0,
              std::optional<double> warmup_target = std::nullopt, int64_t warmup_steps = 0);
  float operator()(int64_t step) const override;
  std::string name() const override { return "CosineDecay"; }
  std::string describe() const override;

 private:
  double initial_learning_rate_, decay_steps_, alpha_;
  std::optional<double> warmup_target_;
  int64_t warmup_steps_;
};

// Cosine decay with warm restarts (SGDR): the multiplier decays from 1 to alpha over first_decay_steps, then
// restarts; period i lasts t_mul^i * first_decay_steps steps and starts at m_mul^i * initial_learning_rate.
//   rate = initial_learning_rate * ((1 - alpha) * 0.5 * m_mul^i * (1 + cos(pi * f)) + alpha)
// where i is the period of step and f the fraction of it completed. Keras finds i with a floor of a logarithm;
// here i is corrected by one where rounding put the floor on the wrong side of a restart, so every restart
// falls exactly on its step (Keras' float32 can miss one by a step).
class CosineDecayRestarts : public LearningRateSchedule {
 public:
  CosineDecayRestarts(double initial_learning_rate, double first_decay_steps, double t_mul = 2.0,
                      double m_mul = 1.0, double alpha = 0.0);
  float operator()(int64_t step) const override;
  std::string name() const override { return "CosineDecayRestarts"; }
  std::string describe() const override;

 private:
  double initial_learning_rate_, first_decay_steps_, t_mul_, m_mul_, alpha_;
};

// ---- Not Keras classes: building blocks of make_schedule() ----

// The same rate at every step (what a plain float learning rate is in Keras).
class ConstantSchedule : public LearningRateSchedule {
 public:
  explicit ConstantSchedule(double learning_rate);
  float operator()(int64_t step) const override;
  std::string name() const override { return "ConstantSchedule"; }
  std::string describe() const override;

 private:
  double learning_rate_;
};

// A linear ramp from warmup_learning_rate (at step 0) towards after(0) over warmup_steps steps, then
// after(step - warmup_steps): `after` starts where the warmup ends, as TF Model Garden's LinearWarmup.
class LinearWarmup : public LearningRateSchedule {
 public:
  LinearWarmup(std::shared_ptr<const LearningRateSchedule> after, int64_t warmup_steps,
               double warmup_learning_rate = 0.0);
  float operator()(int64_t step) const override;
  std::string name() const override { return "LinearWarmup"; }
  std::string describe() const override;

 private:
  std::shared_ptr<const LearningRateSchedule> after_;
  int64_t warmup_steps_;
  double warmup_learning_rate_;
};

// The schedules the command line offers, over a run of total_steps updates (all epochs, counted from the
// first: a resumed run restores iterations() and continues the same curve), each after a linear warmup from 0
// to learning_rate over the first warmup_steps updates (none when 0):
//   "constant"  learning_rate
//   "cosine"    cosine decay from learning_rate to 0.1 * learning_rate over total_steps - warmup_steps updates
//               (Keras' CosineDecay with alpha 0.1, warmup_target learning_rate; alpha 0.1 rather than 0 so the
//               last epochs still learn)
//   "linear"    linear decay from learning_rate to 0 over total_steps - warmup_steps updates (PolynomialDecay
//               with end_learning_rate 0, power 1)
// Throws Error (kInvalidInput) for an unknown name (listing the valid ones), a learning rate that is not finite
// and >= 0, total_steps < 1, or warmup_steps outside [0, total_steps].
std::shared_ptr<LearningRateSchedule> make_schedule(std::string_view name, float learning_rate, int64_t total_steps,
                                                    int64_t warmup_steps);

}  // namespace mixtrain
