#include "mixtrain/ops/dtype_check.h"

namespace mixtrain::ops {

const char* dtype_mismatch_hint() {
  return "cast one operand to the other's dtype (cast(x, DType::kFloat16)); inside a layer's call() the layer's "
         "own variables are read in its compute dtype already; a variable of another layer, of a layer that opts "
         "out (autocasts_variables()), or used outside call() is read as it is: there read it with "
         "autocast(variable) (Layer::autocast: differentiable, the cached cast Dense uses)";
}

void check_same_dtype(std::string_view op, std::string_view a_name, const Tensor& a, std::string_view b_name,
                      const Tensor& b) {
  if (a.dtype() == b.dtype()) return;
  MIXTRAIN_FAIL(kInvalidInput,
                op << ": " << a_name << " " << a.describe() << " and " << b_name << " " << b.describe()
                   << " differ in dtype (" << dtype_name(a.dtype()) << " and " << dtype_name(b.dtype()) << ")",
                dtype_mismatch_hint());
}

}  // namespace mixtrain::ops
