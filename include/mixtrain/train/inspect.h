// Per-layer numerics of a model under its policy: for each layer, how its activations and gradients fit
// the layer's compute dtype (max |x|, overflow and underflow fractions, NaN and inf counts).
// The model runs in a float32 shadow (same weights, every layer computing in float32), so the
// statistics show what a float16 or bfloat16 copy of each value would lose, not values already broken.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/precision/fp8_scaling.h"
#include "mixtrain/precision/range_stats.h"
#include "mixtrain/train/model.h"

namespace mixtrain {

// One quantized operand of an FP8 layer's GEMM ("input", "weight" or "grad"; for a layer of several GEMMs after the
// GEMM's name, Layer::fp8_gemms: MultiHeadAttention's "query_key_value/input", ..., "attention_output/grad"), cast
// as the layer would cast it: with
// the delayed recipe's current scale (1 before the layer's first update), or under the current recipe with each
// batch's own amax (`scale` then the last batch's).
struct Fp8TensorInspection {
  std::string tensor;
  DType format;
  float scale = 1.0f;
  Fp8CastStats stats;  // amax, the share saturated and the share flushed to zero
};

struct LayerInspection {
  std::string layer;          // layer name
  std::string class_name;     // "Dense", ...
  DType compute_dtype;        // the dtype the statistics are measured against
  RangeStats inputs;          // values entering the layer (what its input cast sees)
  RangeStats activations;     // the layer's outputs
  RangeStats gradients;       // gradients of the loss w.r.t. the outputs, times the loss scale in use
  // Values inside the layer that it reports (LayerObserver::on_internal), e.g. MultiHeadAttention's
  // "attention_logits", measured against the same compute dtype; in the order first reported.
  std::vector<std::pair<std::string, RangeStats>> internals;
  // For a layer that quantizes its GEMM operands under a float8 policy (Dense, Conv2D): input, weight and grad, the
  // input as it enters the layer and the grad as it reaches the layer's output (for a layer with an activation, the
  // GEMM's gradient is that times the activation's derivative). Empty for the others.
  std::vector<Fp8TensorInspection> fp8;
};

// Runs `steps` batches of batch_size rows from (x, y) forward and backward without updating anything.
// Gradients are multiplied by the model's current loss scale (1 without a LossScaleOptimizer), as the
// real run would compute them. The model's policies and weights are unchanged afterwards.
std::vector<LayerInspection> inspect_layers(Model& model, const Tensor& x, const Tensor& y, int64_t steps,
                                            int64_t batch_size);

// A fixed-width table, one row per layer: activation and gradient max |x|, overflow %, underflow %, NaN, inf;
// then one row per internal value ("block_1/attention [attention_logits]"), for LayerNormalization layers one row
// for their inputs ("[inputs]", whose statistics decide whether the normalization can run in 16 bits), and for FP8
// layers one row per quantized tensor ("[fp8 input]", "[fp8 query_key_value/input]": format, amax, scale,
// saturated %, flushed %).
std::string format_inspection(const std::vector<LayerInspection>& layers);

// Names of the layers whose inputs, activations or internal values do not fit their compute dtype (overflow,
// NaN or inf).
std::vector<std::string> layers_that_break(const std::vector<LayerInspection>& layers);

}  // namespace mixtrain
