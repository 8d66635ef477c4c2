// The data-parallel gradient exchange with bfloat16 on the wire (FitOptions::grad_comm, --grad-comm bfloat16): half
// the bytes of the float32 exchange, the sums still in float32.
//
// MPI has no bfloat16 sum, and a sum in bfloat16 would round after every addition (PyTorch's bf16_compress_hook
// all-reduces in bfloat16 through NCCL: the hop-by-hop sums round). Here the reduction widens instead: each rank
// rounds its float32 values to bfloat16 once, an all-to-all hands rank r block r of every rank, rank r widens the
// blocks and sums them in float32 in rank order 0, 1, ..., N - 1 (a fixed order, so the bits do not depend on MPI's
// algorithm), and, for the all-reduce, rounds its block's sum to bfloat16 once and all-gathers it. Every rank then
// holds the same bits. Per rank, the all-to-all sends (N - 1)/N and the all-gather (N - 1)/N of the buffer in
// bfloat16: 2 (N - 1)/N x 2 bytes per value, half a float32 ring all-reduce's 2 (N - 1)/N x 4.
//
// Error: each value is rounded once (relative error at most 2^-8, bfloat16's unit roundoff, for values in its
// normal range), the float32 sum adds float32 error, and the all-reduce rounds the sum once more, so an element of
// the result differs from the float32 exchange's by at most 2^-8 sum_r |x_r| + 2^-8 |sum_r x_r| plus float32 terms.
// A non-finite value is never hidden: inf rounds to inf, NaN to a quiet NaN, and any sum with either stays
// non-finite, so a loss-scale check after the exchange skips on every rank. bfloat16 has float32's exponent range:
// gradients scaled for float16 stay representable; only finite values within 2^-9 of float32's largest round up to
// inf (the check then skips that update and lowers the scale, as it would one step later in float32).
#pragma once

#include <cstdint>
#include <vector>

#include "mixtrain/distributed/communicator.h"

namespace mixtrain {

// In place: every rank's data[0, n) ends as the bfloat16 rounding of the float32 sum, in rank order, of every rank's
// data rounded to bfloat16, widened back to float32 (the same bits on every rank). Returns the bytes this rank
// handed over (2 n: the buffer in bfloat16).
int64_t all_reduce_bfloat16(float* data, int64_t n, Communicator& comm);

// data holds the sum of counts elements, block r (counts[r] elements after the blocks before it) being rank r's:
// this rank's block ends as the float32 sum, in rank order, of every rank's block rounded to bfloat16 (not rounded
// again: it stays here, for this rank's share of the update); the other blocks are left unspecified. Returns the
// bytes this rank handed over.
int64_t reduce_scatter_bfloat16(float* data, const std::vector<int64_t>& counts, Communicator& comm);

}  // namespace mixtrain
