// The model whose checkpoints the checkpoint fuzz target loads and the seed corpus holds: small, so one input
// costs microseconds, but with every kind of entry a checkpoint has (weights of two layers, Adam's slots and
// counters under a loss-scale wrapper, the Rng states).
#pragma once

#include <memory>

#include "mixtrain/nn/layers.h"
#include "mixtrain/optim/optimizer.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/model.h"

namespace mixtrain::fuzz {

// (2 features) -> Dense 4 relu (mixed_float16) -> Dense 3 (float32), Adam in a LossScaleOptimizer. Unbuilt, so
// loading a checkpoint also builds it from the file's input_shape.
inline std::unique_ptr<Model> make_fuzz_model() {
  auto m = std::make_unique<Model>("fuzz", 7);
  m->emplace<Dense>(4, "relu", dtype_arg("mixed_float16"));
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  m->compile(std::make_unique<LossScaleOptimizer>(make_optimizer("adam", 0.01f)),
             Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

}  // namespace mixtrain::fuzz
