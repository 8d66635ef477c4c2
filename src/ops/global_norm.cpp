// global_norm's entry (ops/global_norm.h): validation, the output on the tensors' device, dispatch.
#include "mixtrain/ops/global_norm.h"
#include "mixtrain/ops/backend.h"

#include <string>

namespace mixtrain::ops {

Tensor global_norm(const std::vector<Tensor>& xs) {
  std::vector<Tensor> defined;
  for (const Tensor& x : xs) {
    if (!x.defined()) continue;
    MIXTRAIN_CHECK(is_float(x.dtype()), "global_norm: tensor " << defined.size() << " is " << x.describe()
                                                                << ", expected a floating-point tensor");
    if (!defined.empty()) {
      MIXTRAIN_CHECK(x.device() == defined.front().device(), "global_norm: the tensors are on different devices: "
                                                                 << defined.front().describe() << " and "
                                                                 << x.describe());
    }
    defined.push_back(x.contiguous());
  }
  const Device device = defined.empty() ? Device::cpu() : defined.front().device();
  Tensor out = Tensor::empty({1}, DType::kFloat32, device);
  kernel_for<Op::global_norm>(device)(defined, out);
  return out;
}

}  // namespace mixtrain::ops
