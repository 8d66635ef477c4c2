#include "mixtrain/autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "mixtrain/autograd/tape.h"

namespace mixtrain {

GradCheckResult check_gradients(const std::function<Var(const std::vector<Var>&)>& f,
                                const std::vector<Tensor>& inputs, float eps) {
  std::vector<Var> vars;
  for (const Tensor& t : inputs) {
    MIXTRAIN_CHECK(t.dtype() == DType::kFloat32, "check_gradients: inputs must be float32, got " << t.describe());
    vars.emplace_back(t.clone(), true);
  }
  clear_tape();
  Var y = f(vars);
  backward(y);

  GradCheckResult r;
  for (size_t v = 0; v < vars.size(); ++v) {
    const Tensor analytic = vars[v].has_grad() ? vars[v].grad().to(DType::kFloat32) : Tensor::zeros(vars[v].shape(), DType::kFloat32);
    float* x = vars[v].mutable_value().data<float>();
    for (int64_t i = 0; i < vars[v].value().numel(); ++i) {
      const float orig = x[i];
      double f_plus, f_minus;
      {
        NoGradGuard ng;
        x[i] = orig + eps;
        f_plus = f(vars).value().item();
        x[i] = orig - eps;
        f_minus = f(vars).value().item();
        x[i] = orig;
      }
      const double numeric = (f_plus - f_minus) / (2.0 * eps);
      const double a = analytic.at(i);
      const double abs_err = std::fabs(a - numeric);
      const double rel_err = abs_err / std::max(1.0, std::fabs(numeric));
      if (abs_err > r.max_abs_error) r.max_abs_error = abs_err;
      if (rel_err > r.max_rel_error) {
        r.max_rel_error = rel_err;
        std::ostringstream s;
        s << "input " << v << ", element " << i << ": analytic " << a << " vs numeric " << numeric;
        r.worst = s.str();
      }
    }
  }
  return r;
}

}  // namespace mixtrain
