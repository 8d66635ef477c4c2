// FP8 delayed scaling under data parallelism: each rank records the amaxes of its own shard, so before the histories
// roll (Layer::on_optimizer_update) every delayed-scaling tensor's amax of the step, in every FP8 GEMM of every layer
// (Layer::fp8_gemms: Dense's, Conv2D's, both of MultiHeadAttention's projections), becomes the largest over the
// ranks, and every rank keeps the same histories and scales (Transformer Engine reduces its amaxes over the
// data-parallel group the same way; docs/FP8.md).
#pragma once

#include <memory>
#include <vector>

namespace mixtrain {

class Communicator;
class Layer;

// One small all-reduce (max) of all of the step's amaxes together, once per optimizer update; no exchange when no
// layer quantizes under the delayed recipe. Every rank must call it with the same layers (the same model).
void all_reduce_fp8_amaxes(const std::vector<std::shared_ptr<Layer>>& layers, Communicator& comm);

}  // namespace mixtrain
