#include "fp8_inspection.h"

#include <algorithm>
#include <cstring>

#include "mixtrain/ops/transfer.h"
#include "mixtrain/precision/fp8_gemm_scales.h"

namespace mixtrain::detail {

namespace {

const Fp8TensorScale* scale_of(const Fp8GemmScales& s, std::string_view tensor) {
  return tensor == "input" ? &s.input : tensor == "weight" ? &s.weight : &s.grad;
}

// values on the host in float32, contiguous.
std::vector<float> host_floats(const Tensor& values) {
  const Tensor t = ops::to_device(values, Device::cpu()).to(DType::kFloat32).contiguous();
  std::vector<float> out(static_cast<size_t>(t.numel()));
  std::memcpy(out.data(), t.raw(), out.size() * sizeof(float));
  return out;
}

}  // namespace

bool inspects_fp8(const Layer& layer, const DTypePolicy& policy) {
  return policy.uses_float8() && layer.fp8_layer_scales() != nullptr;
}

void add_fp8_inspection(const Layer& layer, const DTypePolicy& policy, const char* tensor, const Tensor& values,
                        std::vector<Fp8TensorInspection>& out) {
  if (out.empty())
    for (const char* name : {"input", "weight", "grad"})
      out.push_back({name, std::string_view(name) == "grad" ? policy.float8_backward_format()
                                                           : policy.float8_forward_format(),
                     1.0f, {}});
  Fp8TensorInspection& row = *std::find_if(out.begin(), out.end(), [&](const auto& r) { return r.tensor == tensor; });
  const std::vector<float> x = host_floats(values);
  const int64_t n = static_cast<int64_t>(x.size());
  const Fp8LayerScales& scales = *layer.fp8_layer_scales();
  if (scales.recipe() == Fp8Recipe::kCurrent) {
    row.scale = current_scale(x.data(), n, row.format);
  } else if (const Fp8GemmScales* s = scales.get(); s && s->input.format() == policy.float8_forward_format()) {
    row.scale = scale_of(*s, tensor)->delayed().scale();
  }  // else: the layer has not quantized yet, and its first cast uses scale 1
  row.stats.merge(fp8_cast_stats(x.data(), n, row.format, row.scale));
}

}  // namespace mixtrain::detail
