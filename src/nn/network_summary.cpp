// Network::summary: the model as a table, as Keras' model.summary() prints it.
#include <algorithm>
#include <iomanip>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "mixtrain/nn/network.h"

namespace mixtrain {

namespace {

std::string with_commas(int64_t n) {
  // Built by appending (GCC 12 warns wrongly, -Wrestrict, on inserting into a short string).
  const std::string digits = std::to_string(n);
  const size_t sign = n < 0 ? 1 : 0;
  std::string s = digits.substr(0, sign);
  for (size_t i = sign; i < digits.size(); ++i) {
    if (i > sign && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

std::string batch_shape(const Shape& s) {
  std::string out = "(None";
  for (int64_t d : s.dims()) out += ", " + std::to_string(d);
  return out + ")";
}

struct SummaryRow {
  std::string layer, shape, params, compute, variable, connected;
};

SummaryRow layer_row(const Layer& l, const std::string& shape, std::string connected) {
  return {l.name() + " (" + l.class_name() + ")", shape,
          with_commas(l.count_params()),
          dtype_name(l.compute_dtype()), dtype_name(l.variable_dtype()), std::move(connected)};
}

// The layers (or inputs) a call's inputs come from, "dense, split[1]".
std::string connected_to(const std::vector<SymbolicTensor>& inputs) {
  std::string connected;
  for (const SymbolicTensor& in : inputs) {
    // An output of a layer with several is named by its index, as Keras writes "layer[0][1]".
    std::string from = in.is_input() ? in.name() : in.layer()->name();
    if (!in.is_input() && in.layer()->num_outputs() > 1) {
      from += '[';
      from += std::to_string(in.output_index());
      from += ']';
    }
    connected += (connected.empty() ? "" : ", ") + from;
  }
  return connected;
}

// One output's shape; several outputs' shapes as a list, as Keras prints them.
std::string output_shapes(const std::vector<Shape>& shapes) {
  if (shapes.size() == 1) return batch_shape(shapes.front());
  std::string shape;
  for (const Shape& o : shapes) shape += (shape.empty() ? "[" : ", ") + batch_shape(o);
  shape += "]";
  return shape;
}

// The parameters of the layers counted, each layer once however often a graph calls it.
struct ParameterCount {
  std::set<const Layer*> counted;
  int64_t trainable = 0, total = 0;

  void count(const Layer& l) {
    if (!counted.insert(&l).second) return;
    total += l.count_params();
    for (const Var& w : l.trainable_weights()) trainable += w.value().numel();
  }
};

// The table: a rule, the header, the rows, the totals. graph: with the "Connected to" column.
void print_table(std::ostream& out, const std::string& name, const std::vector<SummaryRow>& rows, bool graph,
                 const ParameterCount& params) {
  size_t w_layer = 12, w_shape = 12, w_params = 7, w_compute = 7, w_connected = 12;
  for (const SummaryRow& r : rows) {
    w_layer = std::max(w_layer, r.layer.size());
    w_shape = std::max(w_shape, r.shape.size());
    w_params = std::max(w_params, r.params.size());
    w_compute = std::max(w_compute, r.compute.size());
    w_connected = std::max(w_connected, r.connected.size());
  }
  const size_t width = w_layer + 2 + w_shape + 2 + w_params + 2 + w_compute + 3 + 8 + (graph ? 2 + w_connected : 0);
  const std::string rule(width, '_');
  auto line = [&](const std::string& a, const std::string& b, const std::string& c, const std::string& d,
                  const std::string& e, const std::string& f) {
    out << std::left << std::setw(static_cast<int>(w_layer + 2)) << a << std::setw(static_cast<int>(w_shape + 2)) << b
        << std::right << std::setw(static_cast<int>(w_params)) << c << "  " << std::left
        << std::setw(static_cast<int>(w_compute + 3)) << d;
    if (graph)
      out << std::setw(10) << e << f;
    else
      out << e;
    out << "\n";
  };
  out << "Model: \"" << name << "\"\n" << rule << "\n";
  line("Layer (type)", "Output Shape", "Param #", "Compute", "Variable", graph ? "Connected to" : "");
  out << std::string(width, '=') << "\n";
  for (const SummaryRow& r : rows) line(r.layer, r.shape, r.params, r.compute, r.variable, r.connected);
  out << std::string(width, '=') << "\n";
  out << "Total params: " << with_commas(params.total) << "\nTrainable params: " << with_commas(params.trainable)
      << "\nNon-trainable params: " << with_commas(params.total - params.trainable) << "\n" << rule << "\n";
}

}  // namespace

void Network::summary(std::ostream& out) const {
  require_built("summary()");
  std::vector<SummaryRow> rows;
  ParameterCount params;
  if (is_functional()) {
    for (const SymbolicTensor& in : graph_inputs_)
      rows.push_back({in.name() + " (InputLayer)", batch_shape(in.shape()), "0", dtype_name(in.dtype()), "-", ""});
    for (const Step& s : steps_) {
      rows.push_back(layer_row(*s.node->layer, output_shapes(s.node->shapes), connected_to(s.inputs)));
      params.count(*s.node->layer);
    }
  } else {
    Shape s = input_shape_;
    for (auto& l : layers_) {
      s = l->compute_output_shape(s);
      rows.push_back(layer_row(*l, batch_shape(s), ""));
      params.count(*l);
    }
  }
  print_table(out, name_, rows, is_functional(), params);
}

}  // namespace mixtrain
