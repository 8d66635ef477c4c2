#include "mixtrain/train/inspect.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/fp8_linear.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/precision/fp8_gemm_scales.h"
#include "mixtrain/train/float32_shadow.h"

namespace mixtrain {

namespace {

// values on the host in float32, contiguous.
std::vector<float> host_floats(const Tensor& values) {
  const Tensor t = ops::to_device(values, Device::cpu()).to(DType::kFloat32).contiguous();
  std::vector<float> out(static_cast<size_t>(t.numel()));
  std::memcpy(out.data(), t.raw(), out.size() * sizeof(float));
  return out;
}

// Whether `layer` quantizes GEMM operands under `policy` (its real one, before the shadow switched it).
bool inspects_fp8(const Layer& layer, const DTypePolicy& policy) {
  return policy.uses_float8() && !layer.fp8_gemms().empty();
}

// A row's name: the tensor, after its GEMM's name when the layer names its GEMMs ("query_key_value/input").
std::string fp8_row_name(const Fp8Gemm& gemm, std::string_view tensor) {
  return gemm.name.empty() ? std::string(tensor) : gemm.name + "/" + std::string(tensor);
}

// Merges into out (made on first use: input, weight and grad of each of the layer's GEMMs) the statistics of
// `values` cast as `tensor` of `gemm`.
void add_fp8_inspection(const Layer& layer, const DTypePolicy& policy, const Fp8Gemm& gemm, std::string_view tensor,
                        const Tensor& values, std::vector<Fp8TensorInspection>& out) {
  if (out.empty())
    for (const Fp8Gemm& g : layer.fp8_gemms())
      for (const char* name : {"input", "weight", "grad"})
        out.push_back({fp8_row_name(g, name), std::string_view(name) == "grad" ? policy.float8_backward_format()
                                                                                : policy.float8_forward_format(),
                       1.0f, {}});
  const std::string name = fp8_row_name(gemm, tensor);
  Fp8TensorInspection& row = *std::find_if(out.begin(), out.end(), [&](const auto& r) { return r.tensor == name; });
  const Fp8CastView v = fp8_cast_view(*gemm.scales, policy, tensor, host_floats(values),
                                      values.rank() > 0 ? values.dim(-1) : 1);
  row.scale = v.scale;
  row.stats.merge(v.stats);
}

class StatsObserver : public LayerObserver {
 public:
  explicit StatsObserver(std::map<const Layer*, LayerInspection>& out, const std::map<const Layer*, DTypePolicy>& real)
      : out_(out), real_(real) {}
  void on_input(const Layer& l, const Var& x) override {
    out_[&l].inputs.merge(range_stats(x.value(), dtype(l)));
    add_fp8(l, "input", x.value(), [](const Fp8Gemm& g) { return g.reads_layer_input; });
  }
  void on_output(const Layer& l, const Var& y) override {
    out_[&l].activations.merge(range_stats(y.value(), dtype(l)));
  }
  void on_gradient(const Layer& l, const Tensor& dy) override {
    out_[&l].gradients.merge(range_stats(dy, dtype(l)));
    add_fp8(l, "grad", dy, [](const Fp8Gemm& g) { return g.gives_layer_output; });
  }
  void on_fp8_operand(const Layer& l, std::string_view gemm, std::string_view tensor, const Tensor& value) override {
    add_fp8(l, tensor, value, [&](const Fp8Gemm& g) { return g.name == gemm; });
  }
  void on_internal(const Layer& l, std::string_view what, const Tensor& value) override {
    auto& internals = out_[&l].internals;
    auto it = std::find_if(internals.begin(), internals.end(), [&](const auto& e) { return e.first == what; });
    if (it == internals.end()) it = internals.insert(internals.end(), {std::string(what), RangeStats{}});
    it->second.merge(range_stats(value, dtype(l)));
  }

 private:
  DType dtype(const Layer& l) const { return real_.at(&l).compute_dtype(); }
  // The statistics of `value` cast as `tensor` of each of l's FP8 GEMMs that `reads` it, when l quantizes.
  template <typename Reads>
  void add_fp8(const Layer& l, std::string_view tensor, const Tensor& value, Reads reads) {
    if (!inspects_fp8(l, real_.at(&l))) return;
    for (const Fp8Gemm& g : l.fp8_gemms())
      if (reads(g)) add_fp8_inspection(l, real_.at(&l), g, tensor, value, out_[&l].fp8);
  }

  std::map<const Layer*, LayerInspection>& out_;
  const std::map<const Layer*, DTypePolicy>& real_;
};

std::string pct(double f) {
  char b[32];
  std::snprintf(b, sizeof b, f == 0 ? "0" : f < 1e-4 ? "<0.01%%" : "%.2f%%", f * 100);
  return b;
}
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}
}  // namespace

std::vector<LayerInspection> inspect_layers(Model& model, const Tensor& x, const Tensor& y, int64_t steps,
                                            int64_t batch_size) {
  MIXTRAIN_CHECK(model.compiled(), "inspect: compile the model first");
  MIXTRAIN_CHECK(steps > 0 && batch_size > 0, "inspect: steps and batch size must be positive");
  MIXTRAIN_CHECK(x.defined() && y.defined() && x.dim(0) == y.dim(0) && x.dim(0) > 0,
                 "inspect: x " << x.describe() << " and y " << y.describe() << " need the same, non-zero row count");
  model.build_for(Shape(std::vector<int64_t>(x.shape().dims().begin() + 1, x.shape().dims().end())));

  // The statistics are taken against each layer's real compute dtype, in a float32 shadow run.
  std::map<const Layer*, DTypePolicy> real;
  std::map<const Layer*, LayerInspection> stats;
  for (auto& l : model.layers()) {
    real.emplace(l.get(), l->dtype_policy());
    stats[l.get()] = LayerInspection{l->name(), l->class_name(), l->compute_dtype(), {}, {}, {}, {}, {}};
  }
  StatsObserver obs(stats, real);
  Float32Shadow shadow(model, &obs);
  const int64_t n = x.dim(0);
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t begin = (s * batch_size) % n, end = std::min(n, begin + batch_size);
    // On the model's device (a model moved with to()); the statistics read each value back to the host.
    Tensor xb = ops::to_device(x.slice_rows(begin, end), model.device()),
           yb = ops::to_device(y.slice_rows(begin, end), model.device());
    clear_tape();
    // Integer inputs (token ids) stay integers: the layers that read them keep them, the others cast.
    Var out = model.call(Var(xb), CallContext{});
    Var loss = model.loss()(out, yb);
    // Gradients of the loss as training scales it (the loss scale's seed; 1 without loss scaling).
    backward(loss, model.optimizer().scale_loss(ops::full(loss.shape(), DType::kFloat32, 1.0f, model.device())));
    for (Var w : model.weights()) w.zero_grad();
  }
  std::vector<LayerInspection> out;
  for (auto& l : model.layers()) {
    // Each GEMM's weight, as the FP8 layer quantizes it from its variables each step (MultiHeadAttention's query,
    // key and value kernels side by side, as one tensor).
    const DTypePolicy& policy = real.at(l.get());  // the shadow still holds the layers in float32
    if (inspects_fp8(*l, policy))
      for (const Fp8Gemm& g : l->fp8_gemms())
        add_fp8_inspection(*l, policy, g, "weight", kernels_side_by_side(g.kernels, g.weight_rows),
                           stats.at(l.get()).fp8);
    out.push_back(stats.at(l.get()));
  }
  return out;
}

std::string format_inspection(const std::vector<LayerInspection>& layers) {
  // The name column widens to the longest "name (Class)", so scoped names ("block_1/attention") stay whole.
  int w = 22;
  for (const LayerInspection& l : layers) {
    w = std::max(w, static_cast<int>(l.layer.size() + l.class_name.size() + 3));
    for (const Fp8TensorInspection& f : l.fp8) w = std::max(w, static_cast<int>(f.tensor.size() + 8));
  }
  std::string s;
  char line[1024];
  std::snprintf(line, sizeof line, "%-*s %-9s | %-10s %-9s %-9s %-5s %-5s | %-10s %-9s %-9s %-5s %-5s\n", w, "layer",
                "compute", "act max", "overflow", "underflow", "nan", "inf", "grad max", "overflow", "underflow",
                "nan", "inf");
  s += line;
  s += std::string(static_cast<size_t>(96 + w), '-') + "\n";
  auto extra_row = [&](const std::string& name, DType dtype, const RangeStats& a) {
    std::snprintf(line, sizeof line, "%-*s %-9s | %-10s %-9s %-9s %-5lld %-5lld |\n", w, name.c_str(),
                  dtype_name(dtype), num(a.max_abs).c_str(), pct(a.overflow_fraction()).c_str(),
                  pct(a.underflow_fraction()).c_str(), static_cast<long long>(a.nan), static_cast<long long>(a.inf));
    s += line;
  };
  for (const LayerInspection& l : layers) {
    const RangeStats &a = l.activations, &g = l.gradients;
    std::snprintf(line, sizeof line, "%-*s %-9s | %-10s %-9s %-9s %-5lld %-5lld | %-10s %-9s %-9s %-5lld %-5lld\n", w,
                  (l.layer + " (" + l.class_name + ")").c_str(), dtype_name(l.compute_dtype),
                  num(a.max_abs).c_str(), pct(a.overflow_fraction()).c_str(), pct(a.underflow_fraction()).c_str(),
                  static_cast<long long>(a.nan), static_cast<long long>(a.inf), num(g.max_abs).c_str(),
                  pct(g.overflow_fraction()).c_str(), pct(g.underflow_fraction()).c_str(),
                  static_cast<long long>(g.nan), static_cast<long long>(g.inf));
    s += line;
    // LayerNorm statistics run in float32, but their 16-bit inputs must first fit the compute dtype.
    if (l.class_name == "LayerNormalization") extra_row("  [inputs]", l.compute_dtype, l.inputs);
    for (const auto& [what, stats] : l.internals) extra_row("  [" + what + "]", l.compute_dtype, stats);
    for (const Fp8TensorInspection& f : l.fp8) {
      std::snprintf(line, sizeof line, "%-*s %-9s | amax %-9s scale %-9s saturated %-7s flushed to zero %s\n", w,
                    ("  [fp8 " + f.tensor + "]").c_str(), f.format == DType::kFloat8E5M2 ? "e5m2" : "e4m3",
                    num(f.stats.amax).c_str(), num(f.scale).c_str(), pct(f.stats.saturated_fraction()).c_str(),
                    pct(f.stats.flushed_fraction()).c_str());
      s += line;
    }
  }
  return s;
}

std::vector<std::string> layers_that_break(const std::vector<LayerInspection>& layers) {
  std::vector<std::string> out;
  for (const LayerInspection& l : layers)
    if (l.compute_dtype != DType::kFloat32 &&
        (l.inputs.breaks() || l.activations.breaks() ||
         std::any_of(l.internals.begin(), l.internals.end(), [](const auto& e) { return e.second.breaks(); })))
      out.push_back(l.layer);
  return out;
}

}  // namespace mixtrain
