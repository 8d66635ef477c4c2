// Differentiable functions on Vars. Each runs the forward op from mixtrain::ops and, when recording,
// tapes the matching backward op. Gradients of an input arrive in that input's dtype.
#pragma once

#include "mixtrain/autograd/tape.h"
#include "mixtrain/core/random.h"
#include "mixtrain/ops/elementwise.h"

namespace mixtrain {

// Converts to dtype; the gradient is converted back (so a float32 variable read as float16
// receives its gradient in float32).
Var cast(const Var& x, DType dtype);
// x read in another dtype whose conversion is already done (`converted`, e.g. a layer's cached cast of a
// variable): the value is `converted`, the gradient reaches x converted back to x's dtype, as cast() would.
Var cast_cached(const Var& x, const Tensor& converted);
// op(a) x op(b), float32 accumulation, result in a's dtype.
Var matmul(const Var& a, const Var& b, bool trans_a = false, bool trans_b = false);
// Dense product: x (B, in) times kernel (in, out) plus bias. kernel_compute is the kernel read in x's dtype
// (a cached cast of the float32 variable `kernel`); the kernel's gradient is computed in float32 and added
// straight to `kernel`. bias may be undefined.
Var linear(const Var& x, const Var& kernel, const Tensor& kernel_compute, const Var& bias);
// activation(linear(x, kernel, kernel_compute, bias), a) as one op (ops::linear_activation: relu and gelu applied
// inside the GEMM on the CPU), with the same value and gradients bit for bit. The backward reads relu's
// derivative from the output and gelu's from the pre-activation, which the forward keeps only when recording.
Var linear_activation(const Var& x, const Var& kernel, const Tensor& kernel_compute, const Var& bias,
                      ops::Activation a);
Var add(const Var& a, const Var& b);
// The element-wise product of two Vars of one shape (a gate, as in GLU and SwiGLU), in their common autocast dtype;
// each operand's gradient is dy times the other (ops/multiply.h).
Var multiply(const Var& a, const Var& b);
Var scale(const Var& x, float s);
Var bias_add(const Var& x, const Var& bias);
Var activation(const Var& x, ops::Activation a);
// The activations by name, as keras.ops.relu / tf.nn.relu in a custom layer's call().
inline Var relu(const Var& x) { return activation(x, ops::Activation::kRelu); }
inline Var gelu(const Var& x) { return activation(x, ops::Activation::kGelu); }
inline Var sigmoid(const Var& x) { return activation(x, ops::Activation::kSigmoid); }
Var softmax(const Var& x);
Var log_softmax(const Var& x);
// Inverted dropout with a mask drawn from rng; identity when rate is 0.
Var dropout(const Var& x, float rate, Rng& rng);
Var reshape(const Var& x, const Shape& shape);
// Scalar float32 losses and reductions.
Var sparse_categorical_crossentropy(const Var& pred, const Tensor& labels, bool from_logits);
Var categorical_crossentropy(const Var& pred, const Tensor& targets, bool from_logits);
Var mean_squared_error(const Var& pred, const Tensor& target);
Var sum(const Var& x);
Var mean(const Var& x);
// Identity whose backward calls on_grad with the gradient flowing through, then passes it on unchanged:
// how inspection sees the gradients of intermediate activations.
Var tap(const Var& x, std::function<void(const Tensor& grad)> on_grad);

}  // namespace mixtrain
