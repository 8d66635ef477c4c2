#include "mixtrain/nn/merging.h"

#include "mixtrain/autograd/tape.h"

namespace mixtrain {

Add::Add(DTypeArg dtype, const std::string& name) : Layer("add", std::move(dtype), name) {}

Shape Add::compute_output_shape_multi(const std::vector<Shape>& input_shapes) const {
  MIXTRAIN_CHECK(input_shapes.size() >= 2, "Add '" << name() << "' takes two or more inputs");
  for (const Shape& s : input_shapes)
    MIXTRAIN_CHECK(s == input_shapes[0], "Add '" << name() << "': input shapes differ: " << input_shapes[0] << " and "
                                                 << s);
  return input_shapes[0];
}

Var Add::call_multi(const std::vector<Var>& xs, const CallContext&) {
  Var sum = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) sum = add(sum, xs[i]);
  return sum;
}

Multiply::Multiply(DTypeArg dtype, const std::string& name) : Layer("multiply", std::move(dtype), name) {}

Shape Multiply::compute_output_shape_multi(const std::vector<Shape>& input_shapes) const {
  MIXTRAIN_CHECK(input_shapes.size() >= 2, "Multiply '" << name() << "' takes two or more inputs");
  for (const Shape& s : input_shapes)
    MIXTRAIN_CHECK(s == input_shapes[0], "Multiply '" << name() << "': input shapes differ: " << input_shapes[0]
                                                      << " and " << s);
  return input_shapes[0];
}

Var Multiply::call_multi(const std::vector<Var>& xs, const CallContext&) {
  Var product = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) product = multiply(product, xs[i]);
  return product;
}

Concatenate::Concatenate(int axis, DTypeArg dtype, const std::string& name)
    : Layer("concatenate", std::move(dtype), name), axis_(axis) {
  MIXTRAIN_CHECK(axis != 0, "Concatenate: axis 0 is the batch; concatenate along a feature axis (e.g. -1)");
}

int Concatenate::sample_axis(int sample_rank) const {
  const int a = axis_ < 0 ? axis_ + sample_rank : axis_ - 1;
  MIXTRAIN_CHECK(a >= 0 && a < sample_rank, "Concatenate '" << name() << "': axis " << axis_
                                                            << " out of range for inputs of per-sample rank "
                                                            << sample_rank);
  return a;
}

Shape Concatenate::compute_output_shape_multi(const std::vector<Shape>& input_shapes) const {
  MIXTRAIN_CHECK(input_shapes.size() >= 2, "Concatenate '" << name() << "' takes two or more inputs");
  const int rank = input_shapes[0].rank();
  const int a = sample_axis(rank);
  std::vector<int64_t> dims = input_shapes[0].dims();
  dims[static_cast<size_t>(a)] = 0;
  for (const Shape& s : input_shapes) {
    bool fits = s.rank() == rank;
    for (int d = 0; fits && d < rank; ++d) fits = d == a || s[d] == input_shapes[0][d];
    MIXTRAIN_CHECK(fits, "Concatenate '" << name() << "': " << s << " does not fit " << input_shapes[0]
                                         << " outside axis " << axis_);
    dims[static_cast<size_t>(a)] += s[a];
  }
  return Shape(dims);
}

Var Concatenate::call_multi(const std::vector<Var>& xs, const CallContext&) {
  std::vector<Shape> shapes;
  for (const Var& x : xs) shapes.emplace_back(std::vector<int64_t>(x.shape().dims().begin() + 1, x.shape().dims().end()));
  const Shape sample = compute_output_shape_multi(shapes);
  const int a = sample_axis(sample.rank()) + 1;  // in the batched tensor
  std::vector<int64_t> dims = sample.dims();
  dims.insert(dims.begin(), xs[0].shape()[0]);
  // On the inputs' device (a model moved with to()): each input is written into its slice there.
  Tensor out = Tensor::empty(Shape(dims), compute_dtype(), xs[0].value().device());
  int64_t at = 0;
  for (const Var& x : xs) {
    MIXTRAIN_CHECK(x.shape()[0] == dims[0], "Concatenate '" << name() << "': batch sizes differ");
    out.slice(a, at, at + x.shape()[a]).copy_from(x.value());  // a strided write into the output
    at += x.shape()[a];
  }
  bool rec = false;
  for (const Var& x : xs) rec = rec || should_record({&x});
  Var y(out, rec);
  if (rec) {
    record_backward(y, [xs, y, a]() {
      int64_t off = 0;
      for (Var x : xs) {
        const int64_t n = x.shape()[a];
        if (x.requires_grad()) x.accumulate_grad(y.grad().slice(a, off, off + n).contiguous());
        off += n;
      }
    });
  }
  return y;
}

}  // namespace mixtrain
