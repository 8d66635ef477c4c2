// SideStream (mixtrain/ops/side_stream.h): the event edges between a GPU's compute stream and a side stream, as
// plain calls on a StreamDriver, so their order is tested on every machine (tests/ops/side_stream_test.cpp).
#include "mixtrain/ops/side_stream.h"

namespace mixtrain::ops {

SideStream::SideStream(StreamDriver& driver, int device) : driver_(driver), device_(device) {
  stream_ = driver_.create_stream(device_);
  try {
    ready_ = driver_.create_event(device_);
    done_ = driver_.create_event(device_);
  } catch (...) {
    if (ready_ != nullptr) driver_.destroy_event(device_, ready_);
    driver_.destroy_stream(device_, stream_);
    throw;
  }
}

SideStream::~SideStream() {
  driver_.destroy_event(device_, done_);
  driver_.destroy_event(device_, ready_);
  driver_.destroy_stream(device_, stream_);
}

void SideStream::start(const void* buffer, const std::function<void(void* stream)>& queue) {
  // The buffer was written by kernels on compute: the side stream starts after them.
  driver_.record(ready_, nullptr);
  driver_.wait(stream_, ready_);
  queue(stream_);
  driver_.record(done_, stream_);
  pending_ = true;
  // A block freed on the host before the side stream is done with it waits for that point before the allocator hands
  // it out again, joined or not.
  driver_.hold_until_done(device_, buffer, stream_);
}

void SideStream::join() {
  // Compute's later kernels read the results, or reuse the memory, only after the side stream is done with them.
  if (pending_) driver_.wait(nullptr, done_);
  pending_ = false;
}

void SideStream::run(const void* buffer, const std::function<void(void* stream)>& queue) {
  start(buffer, queue);
  join();
}

#ifndef MIXTRAIN_HAVE_CUDA
StreamDriver* cuda_stream_driver() { return nullptr; }
#endif

}  // namespace mixtrain::ops
