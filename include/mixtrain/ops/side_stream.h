// A stream of its own beside a GPU's compute stream, for work that should neither queue behind the kernels nor make
// a synchronous copy or free queue behind it: NCCL's collectives (distributed/nccl_collectives.cpp). The backend's
// kernels, cuBLASLt and the copies run on the default stream (the compute stream); a side stream is created so that
// it does not synchronize with it implicitly, so every edge between the two is an event:
//   compute --(ready: recorded on compute, waited for by the side stream)--> the side stream's work on a buffer
//   the side stream's work --(done: recorded on the side stream, waited for by compute)--> compute's later kernels
// and the allocator holds the buffer's block until `done` has passed, so that a buffer freed on the host meanwhile is
// not handed to a kernel, or to the side stream's next work, while the side stream may still use it.
// No CUDA type appears here: the calls go through a StreamDriver (the CUDA backend's, or a recorder in the tests).
#pragma once

#include <functional>

namespace mixtrain::ops {

// The stream and event calls a side stream makes, with CUDA's handles as opaque pointers. The compute stream is
// nullptr (cudaStream_t 0, the default stream the backend's kernels run on).
class StreamDriver {
 public:
  virtual ~StreamDriver() = default;
  // A stream that does not synchronize implicitly with the default one (cudaStreamNonBlocking).
  virtual void* create_stream(int device) = 0;
  virtual void destroy_stream(int device, void* stream) = 0;
  virtual void* create_event(int device) = 0;  // without timing
  virtual void destroy_event(int device, void* event) = 0;
  virtual void record(void* event, void* stream) = 0;  // cudaEventRecord
  virtual void wait(void* stream, void* event) = 0;    // cudaStreamWaitEvent: stream's later work waits for event
  // The allocator keeps the block holding address p from being reused (when it is freed meanwhile) until the work
  // queued on stream so far is done.
  virtual void hold_until_done(int device, const void* p, void* stream) = 0;
};

// The CUDA backend's driver, or null in a build without the backend or before it loaded.
StreamDriver* cuda_stream_driver();

// One side stream on a device (the device current when its calls are made; the caller makes it current).
class SideStream {
 public:
  SideStream(StreamDriver& driver, int device);
  ~SideStream();  // queued work is not waited for: the stream's resources go once it is done (cudaStreamDestroy)
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  void* stream() const { return stream_; }
  // Queues work that reads or writes the device memory at `buffer` on the side stream, ordered by events: `queue`
  // (given the stream) runs after the side stream was made to wait for everything queued on compute so far, and the
  // buffer's block is held until that work is done. Compute does not wait for it yet: its kernels go on (a backward
  // pass's other layers) until join(), and must neither read nor write the buffer before then. When queue throws,
  // nothing is recorded after it (the caller's communicator is broken then; compute does not wait).
  void start(const void* buffer, const std::function<void(void* stream)>& queue);
  // Compute's later work waits for every work started so far (one wait, for the last: the side stream runs its work in
  // order); nothing when none is pending.
  void join();
  // start, then join: compute's next kernel reads the result.
  void run(const void* buffer, const std::function<void(void* stream)>& queue);

 private:
  StreamDriver& driver_;
  int device_;
  void* stream_ = nullptr;
  void* ready_ = nullptr;  // compute's work so far, reused: a wait takes the event's state when it is queued
  void* done_ = nullptr;   // the side stream's work so far, reused likewise
  bool pending_ = false;   // done_ marks work compute has not waited for
};

}  // namespace mixtrain::ops
