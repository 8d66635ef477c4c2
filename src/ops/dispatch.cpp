#include "mixtrain/ops/dispatch.h"

namespace mixtrain::ops {

void fail_unsupported(const char* op, const Device& device) {
  MIXTRAIN_FAIL(kInvalidInput, op << ": no kernel for device " << device.str(),
                "this build's backends do not implement it there; run on the cpu device");
}

Device common_device(const char* op, std::initializer_list<const Tensor*> inputs) {
  const Tensor* first = nullptr;
  for (const Tensor* t : inputs) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    MIXTRAIN_CHECK(t->device() == first->device(), op << ": inputs are on different devices: " << first->describe()
                                                      << " and " << t->describe());
  }
  return first ? first->device() : Device::cpu();
}

}  // namespace mixtrain::ops
