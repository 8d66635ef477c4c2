// ZeRO stage 1 on a Communicator: the optimizer's slots split across the data-parallel ranks
// (Optimizer::set_shard_group), the gradients reduce-scattered instead of all-reduced (each rank sums only the
// share it updates), the updated weights all-gathered by the optimizer. Model::fit does this with
// FitOptions::zero_stage = 1; a custom loop:
//   model.optimizer().inner_optimizer().set_shard_group(shard_group(comm));
//   ... backward ...; reduce_scatter_gradients(arena, comm, rows_here / global_rows); optimizer.apply_arena(arena);
#pragma once

#include <cstdint>
#include <memory>

#include "mixtrain/distributed/communicator.h"
#include "mixtrain/optim/parameter_arena.h"
#include "mixtrain/optim/shard_group.h"

namespace mixtrain {

// The ranks of comm as a ShardGroup (comm must outlive it).
std::shared_ptr<ShardGroup> shard_group(Communicator& comm);

// For each dtype group of the arena: every rank's gradient buffer weighted by `weight`, and this rank's
// buffer_share() of it replaced by the sum over the ranks (the bits all_reduce_gradients gives those elements);
// the rest of the buffer holds this rank's weighted gradients. 16-bit buffers travel as float32 and are rounded
// back once. Host buffers only. Returns the bytes this rank handed over. wire kBFloat16: the values travel in
// bfloat16 and the share is their float32 sum in rank order (distributed/bfloat16_exchange.h), half the bytes.
int64_t reduce_scatter_gradients(const ParameterArena& arena, Communicator& comm, float weight,
                                 DType wire = DType::kFloat32);

}  // namespace mixtrain
