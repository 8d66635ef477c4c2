// The pieces of a data-parallel step on a Communicator, for Model::fit / train_step and for custom loops:
// which rows of a global batch a rank takes, the start from rank 0's weights, and the all-reduce of the flat
// gradient buffers (bucketed) that turns each rank's shard gradient into the global batch's mean gradient.
//
// A custom loop (every rank runs it on the same global batch order):
//   broadcast_variables(model.weights(), comm);                  // everyone starts from rank 0's weights
//   for each global batch idx (B rows):
//     ShardRange s = shard_range(B, comm.rank(), comm.size());  // this rank's rows of it
//     model.train_step(x.gather_rows(shard of idx), y..., &comm, B);
#pragma once

#include <cstdint>
#include <vector>

#include "mixtrain/autograd/var.h"
#include "mixtrain/core/random.h"
#include "mixtrain/distributed/communicator.h"
#include "mixtrain/optim/parameter_arena.h"

namespace mixtrain {

// Rows [begin, end) of a global batch of `rows` that `rank` of `size` takes: contiguous and as even as possible
// (the first rows % size ranks take one row more), so the shards of all ranks tile the batch in rank order.
struct ShardRange {
  int64_t begin = 0, end = 0;
  int64_t rows() const { return end - begin; }
};
ShardRange shard_range(int64_t rows, int rank, int size);

// Writes root's value of every variable into the same variable on every rank (bumping versions; compute copies
// become stale). Every rank must pass variables of the same shapes and dtypes in the same order.
void broadcast_variables(const std::vector<Var>& vars, Communicator& comm, int root = 0);
// Replaces every variable's value by its mean over the ranks (float32 arithmetic; BatchNormalization's per-rank
// moving statistics before an evaluation or a checkpoint). Identical values stay bit-identical.
void average_variables(const std::vector<Var>& vars, Communicator& comm);
// Copies root's random stream state to every rank.
void broadcast_rng(Rng& rng, Communicator& comm, int root = 0);
// The random stream of one data-parallel step on `rank`: derived from one draw of `shared` (a stream kept the same
// on every rank, which this advances) and the rank. Ranks draw different numbers (dropout masks), and the shared
// stream, which a checkpoint saves, is all a resumed run needs to draw the same ones again on every rank.
Rng rank_step_rng(Rng& shared, int rank, uint64_t stream);

// Bytes per all-reduce bucket: large enough that per-message latency is small against the transfer, small enough
// that several buckets are in flight at once (PyTorch DDP's default is 25 MiB; this CPU library's models are
// smaller).
inline constexpr int64_t kDefaultBucketBytes = int64_t{4} << 20;

// gradient_buffer(dtype) <- sum over ranks of weight * gradient_buffer(dtype), for each dtype of the arena, in
// buckets of bucket_bytes started one after the other and then waited for. With weight = this rank's rows / the
// global batch's rows, the result is the global batch's mean gradient on every rank, with the same bits on every
// rank; a non-finite element on any rank makes that element non-finite on every rank, so the loss-scale check
// that follows makes one decision for all. 16-bit buffers travel as float32 (and are rounded back once). A buffer
// on a device (a GPU arena) stays there when comm moves that device's memory (a DeviceCommunicator: NCCL), queued
// behind the backward pass with no wait; with a host communicator it is downloaded, reduced on the host and
// uploaded, with a wait for the device. Either way it gets the CPU path's arithmetic; the variable helpers above
// take the same two paths.
// Returns the bytes this rank handed to the all-reduce. wire kBFloat16: each bucket travels in bfloat16 and is summed
// in float32 (distributed/bfloat16_exchange.h; host buffers and host communicators only), half the bytes.
int64_t all_reduce_gradients(const ParameterArena& arena, Communicator& comm, float weight,
                             int64_t bucket_bytes = kDefaultBucketBytes, DType wire = DType::kFloat32);
// The same for separate gradient tensors (optimizers without flat-buffer support); every rank must pass defined
// tensors of the same shapes (zeros where a variable had no gradient).
int64_t all_reduce_gradients(std::vector<Tensor>& grads, Communicator& comm, float weight,
                             DType wire = DType::kFloat32);

}  // namespace mixtrain
