// Communicator: the collective operations data-parallel training needs (all-reduce, broadcast), as a plain C++
// interface. MPI implements it across processes and machines (compiled only when the build found MPI); a
// single-process implementation keeps every caller's code path the same without MPI; a DeviceCommunicator
// (distributed/device_communicator.h) adds NCCL's collectives on a GPU's memory. No MPI or NCCL header reaches a public
// header.
//
// Every rank must call the same collectives in the same order with the same element counts (the MPI rule).
// A data-parallel step: every rank starts from rank 0's weights (broadcast), computes gradients on its shard of
// the global batch, all-reduces them (sum of the shard-weighted gradients = the global batch's mean gradient),
// and applies the same update, so the weights stay identical (train/model.h's fit and train_step do this when
// given a Communicator).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/tensor.h"

namespace mixtrain {

enum class ReduceOp { kSum, kMax, kMin };

// What a communicator has exchanged since construction or reset_stats(): the cost a step pays for data
// parallelism (the bench reports its share of step time).
struct CommStats {
  int64_t calls = 0;     // collectives started
  int64_t bytes = 0;     // payload bytes handed to collectives by this rank
  double seconds = 0;    // wall time this rank spent inside collectives (blocking calls and waits)
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This process's index in [0, size()) and the number of processes.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "single" or "mpi".
  virtual std::string backend() const = 0;

  // In place: every rank ends with op over all ranks' data[0, n). For float32 sums the result has the same bits
  // on every rank (one reduction order for all; MPI's standard asks implementations to give this and Open MPI's
  // algorithms do), which is what keeps replicated weights identical.
  virtual void all_reduce(float* data, int64_t n, ReduceOp op) = 0;
  virtual void all_reduce(double* data, int64_t n, ReduceOp op) = 0;

  // A started all-reduce: data must stay valid and untouched until wait() returns. Lets a caller start several
  // buckets, so that one bucket travels while the next is being prepared.
  class Request {
   public:
    virtual ~Request() = default;
    virtual void wait() = 0;
    // Lets the transfer advance without blocking (MPI moves a non-blocking collective's data only inside MPI
    // calls); true once it is complete. wait() is still required.
    virtual bool test() { return false; }
  };
  virtual std::unique_ptr<Request> start_all_reduce(float* data, int64_t n, ReduceOp op) = 0;

  // Copies root's bytes [data, data + bytes) to every rank.
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;

  // ZeRO's two collectives (distributed/zero.h). data holds the sum of counts elements on every rank, block r
  // (counts[r] elements after the blocks of the ranks before it) being rank r's. reduce_scatter: this rank's block
  // ends as the float32 sum over the ranks (the bits all_reduce gives it); the other blocks are left unspecified.
  // The default all-reduces the whole buffer (right, and twice the traffic); MPI overrides it.
  virtual void reduce_scatter(float* data, const std::vector<int64_t>& counts);
  // all_gather, in bytes: every rank's block r ends as rank r's block. The default broadcasts block by block.
  virtual void all_gather(void* data, const std::vector<int64_t>& byte_counts);
  // all_to_all, in bytes: send holds size() blocks of block_bytes[r] bytes each, block r for rank r, in rank order;
  // recv gets size() blocks of block_bytes[rank()] bytes, block s from rank s (the bfloat16 gradient exchange,
  // distributed/bfloat16_exchange.h, hands each rank the pieces it sums). The default broadcasts every rank's
  // whole send buffer (right, and size() times the traffic); MPI overrides it.
  virtual void all_to_all(const void* send, void* recv, const std::vector<int64_t>& block_bytes);
  virtual void barrier() = 0;
  // Ends every process of the job with this exit code (an error on one rank would otherwise leave the others
  // waiting in a collective forever).
  [[noreturn]] virtual void abort(int code) = 0;

  // Device memory. A communicator that moves a device's memory itself (a DeviceCommunicator) says so for that
  // device; the callers (distributed/data_parallel.h, Model's training step) then reduce tensors there in place, queued in
  // the device's order with no wait for it, instead of staging them through host copies. The host communicators
  // serve no device.
  virtual bool moves_memory_of(const Device& device) const;
  // In place: every rank ends with op over all ranks' t, a contiguous float32 tensor on such a device.
  virtual void all_reduce_on_device(Tensor& t, ReduceOp op);
  // all_reduce_on_device whose result the device's kernels wait for only at join_device(): they go on meanwhile (the
  // backward pass's other layers, while earlier buckets of gradients are reduced), and none may read or write t
  // before then. By default all_reduce_on_device, joined at once.
  virtual void start_all_reduce_on_device(Tensor& t, ReduceOp op) { all_reduce_on_device(t, op); }
  // The device's later kernels (and the host's reads of its memory) wait for every start_all_reduce_on_device so far.
  virtual void join_device() {}
  // Root's bytes of t, a contiguous tensor on such a device, into t on every rank.
  virtual void broadcast_on_device(Tensor& t, int root);

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

 protected:
  CommStats stats_;
};

// One process: collectives leave data as it is (the sum over one rank), and cost nothing.
class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  void all_reduce(float*, int64_t, ReduceOp) override;
  void all_reduce(double*, int64_t, ReduceOp) override;
  std::unique_ptr<Request> start_all_reduce(float* data, int64_t n, ReduceOp op) override;
  void broadcast(void*, int64_t, int root) override;
  void barrier() override {}
  [[noreturn]] void abort(int code) override;
};

// Whether this build can run across processes (it found MPI at configure time).
bool mpi_compiled();
// Whether this process was started by an MPI launcher (mpirun, mpiexec, srun): OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// PMIX_RANK in the environment. A plain `mixtrain train` never starts MPI.
bool launched_by_mpi();
// The communicator of all processes of this job: MPI's world when mpi_compiled() and launched_by_mpi()
// (initialised on the first call, finalised at exit), a SingleProcessCommunicator otherwise. Throws Error when
// launched by mpirun but built without MPI and the launcher started more than one process (each would train
// alone on the whole data set).
Communicator& world_communicator();

}  // namespace mixtrain
