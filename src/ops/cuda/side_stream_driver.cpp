// The CUDA backend's StreamDriver (mixtrain/ops/side_stream.h): CUDA's stream and event calls, and the allocator's
// hold on a block a side stream uses (backend.cpp).
#include <cuda_runtime.h>

#include "backend.h"
#include "mixtrain/ops/side_stream.h"

namespace mixtrain::ops {
namespace cuda {
namespace {

class CudaStreamDriver final : public StreamDriver {
 public:
  void* create_stream(int device) override {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    cudaStream_t s = nullptr;
    // Non-blocking: a stream made by cudaStreamCreate would wait for, and hold up, the default stream's work.
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void destroy_stream(int device, void* stream) override {
    (void)cudaSetDevice(device);
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));  // returns at once; freed when its work is done
  }
  void* create_event(int device) override {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void destroy_event(int device, void* event) override {
    (void)cudaSetDevice(device);
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  void record(void* event, void* stream) override {
    check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
               "cudaEventRecord");
  }
  void wait(void* stream, void* event) override {
    check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
               "cudaStreamWaitEvent");
  }
  void hold_until_done(int device, const void* p, void* stream) override { hold_block(device, p, stream); }
};

}  // namespace
}  // namespace cuda

StreamDriver* cuda_stream_driver() {
  if (!load_cuda_backend().loaded) return nullptr;
  static cuda::CudaStreamDriver driver;
  return &driver;
}

}  // namespace mixtrain::ops
