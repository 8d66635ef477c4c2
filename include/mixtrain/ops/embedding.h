// Embedding lookup, forward and backward side by side, as Keras' Embedding computes it: each integer id
// selects one row of a (input_dim, output_dim) table. The forward copies rows (converted once into the
// output dtype, so a float32 table read in float16 gives the same bits as casting the table first); the
// backward scatter-adds the output gradient into a float32 table gradient, repeated ids accumulating.
#pragma once

#include <vector>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// ids (...) int32 or int64 of any shape, table (input_dim, output_dim) floating -> (..., output_dim) in
// out_dtype. Every id must lie in [0, input_dim): otherwise an Error naming the id, its position and
// input_dim. Ids in host memory are checked by the call; ids on a GPU by its kernel, and the call returns (the bad
// positions' rows NaN, their gradient rows left out) with the Error raised at the host's next read from that GPU,
// so a training step never waits for the check.
Tensor embedding(const Tensor& ids, const Tensor& table, DType out_dtype);

// Gradient of embedding for the table: (input_dim, output_dim) float32, zero except the rows of ids,
// row r being the float32 sum of dy's rows whose id is r (in position order, so the bits do not depend on
// the thread count). dy is (..., output_dim) in any floating dtype.
Tensor embedding_backward(const Tensor& dy, const Tensor& ids, int64_t input_dim);

// The same gradient written into dtable (input_dim, output_dim) float32, contiguous, in host memory, touching only
// rows, as a sparse gradient would (Keras' IndexedSlices, PyTorch's sparse=True) while dtable stays the dense
// gradient an optimizer reads: the rows of ids get their sums (embedding_backward's bits); the rows of `clear` that no
// id names are zeroed; every other row is left as it is, so it must already hold zero. clear == nullptr: dtable's
// contents are unknown, and every row no id names is zeroed. Returns the rows of ids, increasing, each once: what may
// be nonzero in dtable afterwards, the `clear` of the next call into the same buffer.
std::vector<int64_t> embedding_backward_into(const Tensor& dy, const Tensor& ids, Tensor& dtable,
                                             const std::vector<int64_t>* clear);

namespace kernel {
// ids arrive contiguous and in range; y (ids.numel(), output_dim) is preallocated.
using EmbeddingFn = void(const Tensor& ids, const Tensor& table, Tensor& y);
// dtable (input_dim, output_dim) float32 is preallocated; the rows of ids are overwritten with their sums, and a
// kernel may leave the other rows as they are (the entries zero them first).
using EmbeddingBackwardFn = void(const Tensor& dy, const Tensor& ids, Tensor& dtable);

// Throws the Error the entry raises for an id outside [0, input_dim) at `position` of the flattened ids, for a
// device kernel that finds it (its ids are not readable on the host without a copy). op: "embedding" or
// "embedding_backward"; found_where, when not empty, is added to the hint (where and when a device found it).
[[noreturn]] void fail_id_out_of_range(const char* op, int64_t id, int64_t position, int64_t input_dim,
                                       const std::string& found_where = "");
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(embedding, EmbeddingFn)
MIXTRAIN_KERNEL_SIGNATURE(embedding_backward, EmbeddingBackwardFn)

}  // namespace mixtrain::ops
