// OverlappedReduce: the all-reduce of a flat float32 gradient buffer in buckets started during the backward pass,
// as soon as every gradient in a bucket is final (PyTorch DDP's overlap), instead of all at once after it.
//
// The caller cuts the buffer into segments (a stack model's layers, in forward order: train/model.cpp), whose
// gradients become final from the last segment back; a bucket is a range of whole segments. Buckets start in one
// fixed order (last first) on every rank whatever the timing, as MPI's matching of collectives requires. A step:
//   reduce.begin(comm, grads, weight);
//   ... during backward, each time the segments from s on are final: reduce.advance(); reduce.start_final(s);
//   reduce.start_rest();  // after backward
//   reduce.wait();
// On a device whose memory the communicator moves (a GPU with NCCL), begin_on_device starts each bucket as a device
// all-reduce that the device's kernels do not wait for (Communicator::start_all_reduce_on_device): the rest of the
// backward pass runs while the earlier buckets are reduced, and wait() is where the device's later kernels (the
// optimizer step) wait for them all.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "mixtrain/distributed/communicator.h"

namespace mixtrain {

class OverlappedReduce {
 public:
  // Cuts a buffer of `capacity` float32 into buckets at segment boundaries, from the last segment back: a bucket
  // closes at a segment's start once it holds bucket_bytes, and the first segments, whatever is left, are the last
  // bucket. Segment s starts at offset segment_start[s] (non-decreasing, the first at 0).
  void plan(const std::vector<int64_t>& segment_start, int64_t capacity, int64_t bucket_bytes);
  // The planned buckets, last segments first: the float32 offsets [lo, hi) of each.
  std::vector<std::pair<int64_t, int64_t>> bucket_ranges() const;

  // Starts a step on grads[0, capacity): each bucket is multiplied by `weight` (unless 1) just before it starts.
  void begin(Communicator& comm, float* grads, float weight);
  // Starts a step on grads, the contiguous float32 buffer on a device comm moves: each bucket is weighted in place
  // by a kernel just before it starts.
  void begin_on_device(Communicator& comm, const Tensor& grads, float weight);
  // Lets the buckets in flight advance (Open MPI moves their data only inside MPI calls).
  void advance();
  // Segments `segment` and after are final: starts, last bucket first, every bucket whose segments all come at or
  // after it.
  void start_final(size_t segment);
  // After backward: starts what is left, in the same order.
  void start_rest() { start_final(0); }
  // Waits for every bucket started; the buffer then holds the sums over the ranks (on a device: for the device's
  // later kernels, and the host waits for nothing).
  void wait();

 private:
  struct Bucket {
    size_t first_segment;
    int64_t lo, hi;  // float32 offsets
  };

  std::vector<Bucket> buckets_;  // last segments first
  Communicator* comm_ = nullptr;
  float* grads_ = nullptr;
  Tensor device_grads_;  // begin_on_device's buffer; undefined on the host path
  float weight_ = 1.0f;
  size_t next_ = 0;
  std::vector<std::unique_ptr<Communicator::Request>> inflight_;
};

}  // namespace mixtrain
