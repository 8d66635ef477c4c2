#include "mixtrain/nn/sequential.h"

#include <iomanip>
#include <ostream>
#include <sstream>

namespace mixtrain {

namespace {
std::string with_commas(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}
std::string batch_shape(const Shape& s) {
  std::string out = "(None";
  for (int64_t d : s.dims()) out += ", " + std::to_string(d);
  return out + ")";
}
}  // namespace

Sequential::Sequential(std::string name) : name_(std::move(name)) {}

void Sequential::build(const Shape& input_shape, Rng& rng) {
  MIXTRAIN_CHECK(!layers_.empty(), "model '" << name_ << "' has no layers");
  Shape s = input_shape;
  for (auto& l : layers_) {
    l->build(s, rng);
    s = l->compute_output_shape(s);
  }
  input_shape_ = input_shape;
  built_ = true;
}

Shape Sequential::output_shape() const {
  Shape s = input_shape_;
  for (auto& l : layers_) s = l->compute_output_shape(s);
  return s;
}

Var Sequential::call(const Var& x, const CallContext& ctx) {
  Var h = x;
  for (auto& l : layers_) {
    if (observer_) observer_->on_input(*l, h);
    h = (*l)(h, ctx);
    if (observer_) {
      observer_->on_output(*l, h);
      LayerObserver* obs = observer_;
      const Layer* layer = l.get();
      h = tap(h, [obs, layer](const Tensor& dy) { obs->on_gradient(*layer, dy); });
    }
  }
  return h;
}

Layer* Sequential::layer(const std::string& name) const {
  for (auto& l : layers_)
    if (l->name() == name) return l.get();
  MIXTRAIN_FAIL(kInvalidInput, "model '" << name_ << "' has no layer named '" << name << "'", "");
}

std::vector<Var> Sequential::weights() const {
  std::vector<Var> out;
  for (auto& l : layers_)
    for (const Var& w : l->weights()) out.push_back(w);
  return out;
}

std::vector<Var> Sequential::trainable_weights() const {
  std::vector<Var> out;
  for (auto& l : layers_)
    for (const Var& w : l->trainable_weights()) out.push_back(w);
  return out;
}

int64_t Sequential::count_params() const {
  int64_t n = 0;
  for (auto& l : layers_) n += l->count_params();
  return n;
}

void Sequential::summary(std::ostream& out) const {
  const int w_layer = 28, w_shape = 16, w_params = 12, w_dtype = 10;
  const std::string rule(w_layer + w_shape + w_params + 2 * w_dtype, '_');
  out << "Model: \"" << name_ << "\"\n" << rule << "\n";
  out << std::left << std::setw(w_layer) << "Layer (type)" << std::setw(w_shape) << "Output Shape" << std::right
      << std::setw(w_params) << "Param #" << "  " << std::left << std::setw(w_dtype - 2) << "Compute"
      << std::setw(w_dtype) << "  Variable" << "\n";
  out << std::string(rule.size(), '=') << "\n";
  Shape s = input_shape_;
  int64_t trainable = 0, total = 0;
  for (auto& l : layers_) {
    s = l->compute_output_shape(s);
    std::ostringstream name;
    name << l->name() << " (" << l->class_name() << ")";
    out << std::left << std::setw(w_layer) << name.str() << std::setw(w_shape) << (built_ ? batch_shape(s) : "?")
        << std::right << std::setw(w_params) << with_commas(l->count_params()) << "  " << std::left
        << std::setw(w_dtype - 2) << dtype_name(l->compute_dtype()) << "  " << dtype_name(l->variable_dtype())
        << "\n";
    total += l->count_params();
    for (const Var& w : l->trainable_weights()) trainable += w.value().numel();
  }
  out << std::string(rule.size(), '=') << "\n";
  out << "Total params: " << with_commas(total) << "\nTrainable params: " << with_commas(trainable)
      << "\nNon-trainable params: " << with_commas(total - trainable) << "\n" << rule << "\n";
}

}  // namespace mixtrain
