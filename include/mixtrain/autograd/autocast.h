// Autocast of variables, as Keras' AutocastVariable: while a layer's call() runs, the differentiable functions
// read that layer's floating variables in its compute dtype, so a custom layer under a mixed policy writes
// matmul(x, kernel_) with its float32 kernel and computes in float16 or bfloat16.
//
// The layer puts an AutocastScope in force on its thread for the length of the call (LayerAutocastScope,
// nn/layer.h); each differentiable function passes its Var operands through autocast_operand(), which asks the
// scope in force, if any, what to compute with. Functions whose operands are already dtype-aware take their
// variables as they are: cast() and cast_cached() (an explicit read), and the fused layer functions that get a
// variable next to its compute-dtype copy or read parameters in float32 on purpose (linear, linear_activation,
// conv2d, fused_projection, embedding, add_position_embedding, layer_norm, batch_norm).
#pragma once

#include "mixtrain/autograd/var.h"

namespace mixtrain {

class AutocastScope {
 public:
  virtual ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

  // What an operation computes with in place of v: v itself unless v is one of the scope's variables and
  // needs a cast, then a differentiable read of it in the compute dtype (its gradient reaches v).
  virtual Var read(const Var& v) = 0;

 protected:
  // Puts this scope in force on this thread until it is destroyed, then the one before it again (scopes nest
  // as layer calls do). active = false puts none in force: a layer that does not autocast, called inside one
  // that does, reads every variable as it is.
  explicit AutocastScope(bool active);

 private:
  AutocastScope* previous_;
};

// v, or what the scope in force on this thread reads instead (above); v itself outside every layer call.
Var autocast_operand(const Var& v);

}  // namespace mixtrain
