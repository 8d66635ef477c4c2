// Finite-difference gradient checking: compares the tape's gradients with central differences.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "mixtrain/autograd/var.h"

namespace mixtrain {

struct GradCheckResult {
  double max_abs_error = 0;  // largest |analytic - numeric| over all checked elements
  double max_rel_error = 0;  // largest |analytic - numeric| / max(1, |numeric|)
  std::string worst;         // "input 1, element 7: analytic 0.123 vs numeric 0.125"
};

// f maps the inputs (float32 Vars with requires_grad) to a scalar Var. The scalar is evaluated in
// double-sum form through f at x +- eps per element.
GradCheckResult check_gradients(const std::function<Var(const std::vector<Var>&)>& f,
                                const std::vector<Tensor>& inputs, float eps = 1e-2f);

}  // namespace mixtrain
