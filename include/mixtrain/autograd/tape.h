// Reverse-mode automatic differentiation with a tape: each differentiable operation run while
// recording is on appends a closure that, given its output's gradient, adds its inputs' gradients.
// backward() replays the tape in reverse, then clears it (releasing saved activations).
#pragma once

#include <functional>

#include "mixtrain/autograd/var.h"

namespace mixtrain {

// True unless a NoGradGuard is alive on this thread.
bool grad_enabled();

// Disables recording in a scope (evaluation, prediction, optimizer updates), like torch.no_grad().
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Appends a backward step producing `output`. Called by differentiable functions only.
void record_backward(const Var& output, std::function<void()> backward_fn);

// Whether an op whose inputs include these Vars should record (recording on and some input requires grad).
bool should_record(std::initializer_list<const Var*> inputs);

// Seeds d(root)/d(root) = seed (a float32 scalar, e.g. the loss scale) and runs the tape in reverse.
// Gradients accumulate into every Var with requires_grad that the tape reaches; intermediate
// gradients are released as soon as they are consumed. The tape is empty afterwards.
void backward(const Var& root, float seed = 1.0f);
// The same with the seed given as a one-element floating tensor (e.g. an optimizer's scale_loss(ones), which
// stays on the device): d(root)/d(root) = seed, converted to the root's dtype and shape.
void backward(const Var& root, const Tensor& seed);

// Drops whatever was recorded (e.g. after a forward pass whose backward is not wanted).
void clear_tape();
// Number of recorded steps (for tests and memory diagnostics).
size_t tape_size();

}  // namespace mixtrain
