// Activation recomputation (rematerialization), as Keras 3's keras.remat / RematScope and torch.utils.checkpoint:
// a recorded function that keeps only its inputs. Its forward pass runs without recording, so the activations
// inside it are released as soon as it returns; its backward step runs the function again, recording this time,
// in the same dtypes and with the random generator put back where it stood, so dropout draws the same masks,
// then back-propagates through what it recorded. Gradients are the bits keeping every activation gives: the
// recomputed values are the same bits and the backward steps run in the same order.
//
//   Var y = remat([&](const std::vector<Var>& in) {            // in: fresh handles on the inputs' values
//     return std::vector<Var>{dense2(dense1(in[0], ctx), ctx)};
//   }, {x}, ctx.rng).front();
//
// Memory: the inputs (which the caller's graph keeps anyway) and the outputs; the function's intermediates live
// only while one function's backward step runs. Time: the function's forward pass once more.
//
// What the function must do: compute from its inputs and from variables (weights) it reaches itself, draw its
// randomness from `rng` alone (a counter-based mask seeded from it, as dropout() and the attention do), and leave
// state it updates in training alone while in_recomputation() says so (BatchNormalization's moving statistics,
// the FP8 amax histories: nn/normalization.cpp, precision/fp8_gemm_scales.cpp). Its values in between are not
// recorded, so they cannot be GradientTape sources. Outside recording (no variable needs a gradient, or a
// NoGradGuard is alive) the function simply runs once.
#pragma once

#include <functional>
#include <vector>

#include "mixtrain/autograd/var.h"
#include "mixtrain/core/random.h"

namespace mixtrain {

using RematFunction = std::function<std::vector<Var>(const std::vector<Var>& inputs)>;

// fn(inputs), keeping only the inputs for its backward step (above). rng: the generator fn draws from (null:
// none); its state after the call is the one the first run left, as without recomputation.
std::vector<Var> remat(const RematFunction& fn, const std::vector<Var>& inputs, Rng* rng = nullptr);

// True on this thread while a backward step recomputes a function: state updated once per training forward pass
// must not be updated again.
bool in_recomputation();

}  // namespace mixtrain
