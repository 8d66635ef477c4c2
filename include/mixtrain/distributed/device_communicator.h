// Data-parallel collectives on a GPU's memory. A DeviceCommunicator reduces and broadcasts tensors on one device
// where they live, queued in the device's order, so a data-parallel training step on a GPU waits for nothing (the
// host communicators move host memory: a device buffer would be downloaded, reduced and uploaded, one wait per
// step). The job's host communicator (MPI) starts it and keeps the host collectives (the small all-reduce of which
// variables have gradients, synchronized BatchNormalization's sums, evaluation's counts).
//
// On an NVIDIA GPU the device collectives are NCCL's, loaded at run time as cuBLASLt is, on a stream of their own
// ordered against the CUDA backend's kernels by events (ops/side_stream.h): a bucket of the gradient buffer starts
// its all-reduce when the backward pass's kernels have written it, the backward pass's later kernels run beside it,
// and the loss-scale check that follows reads the reduced buffer only after the step's join; a buffer freed
// meanwhile is not reused before then. DeviceCollectives
// is the seam NCCL sits behind, so tests run the same code on an emulated device.
#pragma once

#include <memory>
#include <string>

#include "mixtrain/distributed/communicator.h"

namespace mixtrain {

// The collectives of one device's memory over the ranks of a job, in place and queued in the device's order.
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  virtual std::string name() const = 0;  // "nccl"
  // t: contiguous float32, on the device.
  virtual void all_reduce(Tensor& t, ReduceOp op) = 0;
  // Root's bytes of t (contiguous, on the device) into t on every rank.
  virtual void broadcast(Tensor& t, int root) = 0;
  // all_reduce whose result the device's kernels wait for only at join(): they go on meanwhile (the backward pass's
  // other layers), and none may read or write t before then. By default an all_reduce, joined at once.
  virtual void start_all_reduce(Tensor& t, ReduceOp op) { all_reduce(t, op); }
  // The device's later kernels wait for every collective started so far.
  virtual void join() {}
};

class DeviceCommunicator final : public Communicator {
 public:
  // host: the job's communicator, which must outlive this one. collectives: over the same ranks in the same order,
  // on `device`.
  DeviceCommunicator(Communicator& host, const Device& device, std::unique_ptr<DeviceCollectives> collectives);

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  // The host's backend and the device collectives': "mpi+nccl".
  std::string backend() const override;
  // Host memory goes through the host communicator (counted in this one's stats too).
  void all_reduce(float* data, int64_t n, ReduceOp op) override;
  void all_reduce(double* data, int64_t n, ReduceOp op) override;
  std::unique_ptr<Request> start_all_reduce(float* data, int64_t n, ReduceOp op) override;
  void broadcast(void* data, int64_t bytes, int root) override;
  void barrier() override;
  [[noreturn]] void abort(int code) override;

  bool moves_memory_of(const Device& device) const override { return device == device_; }
  // Device memory goes through the device collectives. Their stats count calls and bytes; the seconds are the
  // host's time to queue them (the device's time shows in the step).
  void all_reduce_on_device(Tensor& t, ReduceOp op) override;
  void start_all_reduce_on_device(Tensor& t, ReduceOp op) override;
  void join_device() override;
  void broadcast_on_device(Tensor& t, int root) override;

  const Device& device() const { return device_; }

 private:
  // A host collective, its costs added to this communicator's stats.
  template <typename F>
  void counted(const F& host_call);
  // A device collective on t, checked and counted.
  template <typename F>
  void queue(const Tensor& t, const char* what, const F& device_call);

  Communicator& host_;
  Device device_;
  std::unique_ptr<DeviceCollectives> collectives_;
};

// NCCL's collectives on `device` (a GPU of the loaded CUDA backend) over the ranks of `host`. Collective: every
// rank of host calls it, each with its own GPU (NCCL takes one rank per GPU); rank 0's NCCL id travels by
// host.broadcast. Returns null on every rank, with the reason in *why, when any rank cannot use NCCL (a CPU
// device, no CUDA backend, no NCCL library): the caller then stages device memory through the host.
// NCCL is looked for at MIXTRAIN_NCCL_LIBRARY (a file path) when that is set, then as libnccl.so.2 on the loader's
// path, then in the CUDA toolkit this build used.
std::unique_ptr<DeviceCollectives> nccl_collectives(Communicator& host, const Device& device, std::string* why);

// NCCL as data-parallel training on GPUs would find it, for people and reports (doctor). Loads it once; needs no GPU.
struct NcclStatus {
  bool loaded = false;
  int version = 0;     // NCCL_VERSION_CODE: 22809 for 2.28.9
  std::string detail;  // "NCCL 2.28.9 (libnccl.so.2)", or why it cannot be loaded
};
NcclStatus nccl_status();

// The communicator for data-parallel training on `device`: a DeviceCommunicator over NCCL beside `host` where
// nccl_collectives serves (collective, as it is), else null with the reason in *why (use `host` then).
std::unique_ptr<Communicator> device_communicator(Communicator& host, const Device& device, std::string* why);

}  // namespace mixtrain
