#include "mixtrain/distributed/data_parallel.h"

#include <algorithm>

#include "mixtrain/core/error.h"
#include "mixtrain/distributed/bfloat16_exchange.h"
#include "mixtrain/optim/shard_group.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

ShardRange shard_range(int64_t rows, int rank, int size) {
  MIXTRAIN_CHECK(size > 0 && rank >= 0 && rank < size, "shard_range: rank " << rank << " of " << size);
  MIXTRAIN_CHECK(rows >= 0, "shard_range: negative row count " << rows);
  // Rows split as ZeRO splits a flat buffer among the ranks: equal parts, the first ones a row longer.
  const BufferShare share = buffer_share(rows, rank, size);
  return {share.begin, share.end};
}

namespace {
// The host communicators move host memory: a tensor on a device travels through a host copy (this rank's own,
// contiguous).
Tensor host_copy(const Tensor& t) {
  return t.device().is_cpu() ? t.clone() : ops::to_device(t.contiguous(), Device::cpu());
}
// Whether comm moves the memory of t's device itself (a DeviceCommunicator on that GPU): then t stays there.
bool on_device(const Tensor& t, const Communicator& comm) {
  return !t.device().is_cpu() && comm.moves_memory_of(t.device());
}
}  // namespace

void broadcast_variables(const std::vector<Var>& vars, Communicator& comm, int root) {
  if (comm.size() == 1) return;
  for (const Var& v : vars) {
    Var var = v;
    if (on_device(var.value(), comm)) {
      Tensor t = var.value().clone();  // a new value, so the version bumps and compute copies go stale
      comm.broadcast_on_device(t, root);
      var.set_value(t);
      continue;
    }
    Tensor t = host_copy(var.value());
    comm.broadcast(t.raw(), static_cast<int64_t>(t.nbytes()), root);
    var.set_value(ops::to_device(t, var.value().device()));
  }
}

void average_variables(const std::vector<Var>& vars, Communicator& comm) {
  if (comm.size() == 1) return;
  const float inv = 1.0f / static_cast<float>(comm.size());
  for (const Var& v : vars) {
    Var var = v;
    if (on_device(var.value(), comm)) {
      // The host path's arithmetic on the device: a float32 sum, scaled, rounded once into the variable's dtype.
      const Tensor& value = var.value();
      Tensor t = value.dtype() == DType::kFloat32 ? value.clone() : ops::cast(value, DType::kFloat32);
      comm.all_reduce_on_device(t, ReduceOp::kSum);
      var.set_value(ops::cast(ops::scale(t, inv), var.value().dtype()));
      continue;
    }
    Tensor t = host_copy(var.value()).to(DType::kFloat32);  // this rank's own copy
    float* p = t.data<float>();
    comm.all_reduce(p, t.numel(), ReduceOp::kSum);
    for (int64_t i = 0; i < t.numel(); ++i) p[i] *= inv;
    var.set_value(ops::to_device(t.to(var.value().dtype()), var.value().device()));
  }
}

void broadcast_rng(Rng& rng, Communicator& comm, int root) {
  if (comm.size() == 1) return;
  std::vector<uint64_t> s = rng.state();
  comm.broadcast(s.data(), static_cast<int64_t>(s.size() * sizeof(uint64_t)), root);
  rng.set_state(s);
}

Rng rank_step_rng(Rng& shared, int rank, uint64_t stream) {
  return Rng::derive(shared.next_u64(), stream + static_cast<uint64_t>(rank));
}

namespace {
// Scales and starts the buckets of one float32 buffer, then waits for all of them.
// Returns the bytes handed over.
int64_t reduce_float32(float* p, int64_t n, Communicator& comm, float weight, int64_t bucket_bytes, DType wire) {
  const int64_t bucket = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(sizeof(float)));
  std::vector<std::unique_ptr<Communicator::Request>> inflight;
  int64_t bytes = 0;
  for (int64_t b = 0; b < n; b += bucket) {
    const int64_t len = std::min(bucket, n - b);
    // Scaling a bucket just before it leaves keeps it in cache for the send.
    if (weight != 1.0f)
      for (int64_t i = b; i < b + len; ++i) p[i] *= weight;
    if (wire == DType::kBFloat16) {
      bytes += all_reduce_bfloat16(p + b, len, comm);  // blocking: the float32 sums sit between its two collectives
      continue;
    }
    inflight.push_back(comm.start_all_reduce(p + b, len, ReduceOp::kSum));
    bytes += len * static_cast<int64_t>(sizeof(float));
  }
  for (auto& r : inflight) r->wait();
  return bytes;
}

int64_t reduce_tensor(Tensor& g, Communicator& comm, float weight, int64_t bucket_bytes, DType wire) {
  MIXTRAIN_CHECK(g.defined() && g.is_contiguous() && is_float(g.dtype()),
                 "all_reduce_gradients: needs a contiguous floating tensor, got " << g.describe());
  MIXTRAIN_CHECK(wire == DType::kFloat32 || wire == DType::kBFloat16,
                 "all_reduce_gradients: gradients travel as float32 or bfloat16, not " << dtype_name(wire));
  MIXTRAIN_CHECK(wire == DType::kFloat32 || !on_device(g, comm),
                 "all_reduce_gradients: the bfloat16 exchange runs on host communicators, not on "
                     << comm.backend() << " for " << g.describe());
  if (g.device().is_cpu() && g.dtype() == DType::kFloat32) {
    return reduce_float32(g.data<float>(), g.numel(), comm, weight, bucket_bytes, wire);
  } else if (on_device(g, comm)) {
    // Where g lives, queued behind the backward pass: the host path's float32 arithmetic (weighted, summed,
    // rounded once into g's dtype), in one call (a device collective needs no buckets to overlap the host's work).
    // Weighted in place: no second buffer of the gradients' size, and no copy back for a float32 buffer.
    Tensor f = ops::cast(g, DType::kFloat32);  // g itself when float32
    if (weight != 1.0f) ops::scale_in_place(f, weight);
    comm.all_reduce_on_device(f, ReduceOp::kSum);
    if (g.dtype() != DType::kFloat32) g.copy_from(f);
  } else {
    // A float32 host copy is reduced (MPI has no 16-bit float type, and the communicators move host memory), then
    // rounded once back into g where it lives.
    Tensor f = ops::to_device(g, Device::cpu()).to(DType::kFloat32);  // never g itself
    const int64_t bytes = reduce_float32(f.data<float>(), f.numel(), comm, weight, bucket_bytes, wire);
    g.copy_from(g.device().is_cpu() ? f : ops::to_device(f.to(g.dtype()), g.device()));
    return bytes;
  }
  return g.numel() * static_cast<int64_t>(sizeof(float));
}
}  // namespace

int64_t all_reduce_gradients(const ParameterArena& arena, Communicator& comm, float weight, int64_t bucket_bytes,
                             DType wire) {
  MIXTRAIN_CHECK(bucket_bytes > 0, "all_reduce_gradients: bucket_bytes must be positive, got " << bucket_bytes);
  if (comm.size() == 1 && weight == 1.0f) return 0;
  int64_t bytes = 0;
  for (DType d : arena.dtypes()) {
    Tensor g = arena.gradient_buffer(d);
    bytes += reduce_tensor(g, comm, weight, bucket_bytes, wire);
  }
  return bytes;
}

int64_t all_reduce_gradients(std::vector<Tensor>& grads, Communicator& comm, float weight, DType wire) {
  if (comm.size() == 1 && weight == 1.0f) return 0;
  int64_t bytes = 0;
  for (Tensor& g : grads) bytes += reduce_tensor(g, comm, weight, kDefaultBucketBytes, wire);
  return bytes;
}

}  // namespace mixtrain
