// --device for the commands that run a model: parsed with core's parse_device, checked against what this machine
// can use through the ops layer (kept apart from args.cpp, whose parser is fuzzed with core alone).
#include <string>

#include "args.h"
#include "mixtrain/core/error.h"
#include "mixtrain/ops/gemm_timing.h"

namespace mixtrain::cli {

Device device_flag(const Args& a) {
  const std::string text = a.str("device", "cpu");
  try {
    return parse_device(text);
  } catch (const Error& e) {
    MIXTRAIN_FAIL(kInvalidInput, "--device: " << e.message(), e.hint());
  }
}

Device usable_device_flag(const Args& a, const char* command) {
  const Device device = device_flag(a);
  const std::string problem = ops::gemm_device_problem(device);
  if (!problem.empty())
    MIXTRAIN_FAIL(kInvalidInput, command << " --device " << device.str() << ": this machine cannot use it: " << problem,
                  "--device cpu (the default) runs on the CPU; --device cuda needs a build with the CUDA backend "
                  "(-DMIXTRAIN_CUDA=ON where nvcc is found) and an NVIDIA GPU with its driver");
  return device;
}

}  // namespace mixtrain::cli
