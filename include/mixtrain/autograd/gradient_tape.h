// GradientTape: gradients of a value with respect to chosen variables, returned rather than accumulated, as
// TensorFlow's tf.GradientTape (the custom-training-loop API of Keras):
//
//   GradientTape tape;                                  // records the operations that follow
//   Var logits = model.call(Var(x), {.training = true, .rng = &rng});
//   Var loss = sparse_categorical_crossentropy(logits, y, /*from_logits=*/true);
//   std::vector<Tensor> grads = tape.gradient(loss, model.trainable_weights());
//   optimizer.apply(grads, model.trainable_weights());
//
// Gradients go to the caller only: while gradient() runs, what backward steps would add to a variable's own
// gradient (Var::grad(), the accumulation backward() and Model::train_step use) is collected aside, so no
// variable keeps a stale gradient afterwards and gradients a caller accumulated before stay as they were.
// Each returned gradient has its variable's dtype (float32 for the mixed policies' variables), undefined when
// the target does not depend on that variable (TensorFlow returns None).
//
// Tapes nest, as tf.GradientTape does for first-order gradients: every tape alive on a thread records what runs
// while it is alive, and each gives the gradients of what it recorded since it started. An inner tape's
// gradient() leaves the record of an enclosing tape whole, so the outer tape's gradients afterwards are the
// same as without the inner one:
//
//   GradientTape outer;
//   Var h = activation(matmul(x, w1), ops::Activation::kTanh);
//   std::vector<Tensor> inner_grads;
//   {
//     GradientTape inner;
//     Var y = sum(matmul(h, w2));
//     inner_grads = inner.gradient(y, {w2, h});                    // d y / d w2 and d y / d h
//   }
//   Var loss = mean(matmul(h, w2));
//   std::vector<Tensor> grads = outer.gradient(loss, {w1, w2});  // through h: all outer recorded
//
// Gradients are values (Tensors), not recorded computations: no second-order gradients (differentiating a
// gradient, tf's tape-over-gradient), and a Var made from a returned gradient is a constant to every tape.
// backward() and clear_tape() take the whole thread's record, that of live tapes included.
#pragma once

#include <cstddef>
#include <vector>

#include "mixtrain/autograd/var.h"

namespace mixtrain {

class GradientTape {
 public:
  // Starts recording on this thread: every differentiable operation on a Var that requires a gradient is
  // recorded from here on, even inside a NoGradGuard scope opened before (as tf.GradientTape records
  // whatever the surrounding code does); the previous recording mode returns with the destructor. Inside
  // another live tape, both record (nested tapes, above); destroy tapes in reverse order of creation.
  GradientTape();
  // Drops whatever this tape recorded and no gradient() consumed (and the saved activations with it), except
  // what an enclosing live tape recorded too.
  ~GradientTape();
  GradientTape(const GradientTape&) = delete;
  GradientTape& operator=(const GradientTape&) = delete;

  // Makes v a source whose operations are recorded (tape.watch): for inputs and constants, which do not
  // require a gradient unless asked.
  void watch(Var v);

  // d(sum of target) / d(source) for each source, scaled by output_gradient (e.g. a loss scale), from the
  // operations recorded since this tape started; sources may be variables or recorded intermediate values.
  // A tape gives gradients once (its record is consumed, as a non-persistent tf.GradientTape; an enclosing
  // live tape keeps its own copy): a second call is an Error.
  std::vector<Tensor> gradient(const Var& target, const std::vector<Var>& sources, float output_gradient = 1.0f);

 private:
  size_t start_;
  bool previous_grad_enabled_;
  bool used_ = false;
};

// The same on everything this thread recorded since the tape was last cleared (backward() or clear_tape()),
// without a GradientTape object (torch.autograd.grad): returns d(target)/d(source) and leaves no gradient on
// any variable. What a live tape recorded stays on the thread for that tape.
std::vector<Tensor> gradients(const Var& target, const std::vector<Var>& sources, float output_gradient = 1.0f);

}  // namespace mixtrain
