// The CUDA backend behind the dispatch seam (docs/ARCHITECTURE.md, "Plugging in a second backend"). Nothing of
// CUDA appears in public headers: a build configured with MIXTRAIN_CUDA compiles the backend into the ops layer,
// and load_cuda_backend() installs its allocator and kernels when the machine has a GPU. Until then, and in a
// build without it, every op runs on the CPU as before and a cuda tensor is a clear error.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace mixtrain::ops {

struct CudaBackendStatus {
  bool compiled = false;  // this build has the CUDA backend (MIXTRAIN_CUDA found the toolkit)
  bool loaded = false;    // its allocator and kernels are installed: cuda:N tensors work
  int device_count = 0;   // GPUs the CUDA runtime sees
  // Each GPU's name and compute capability, by index: "NVIDIA H200 (compute capability 9.0)".
  std::vector<std::string> devices;
  std::string detail;     // one line for people: why it is not loaded, or the GPU names
  std::vector<std::string> ops;  // the ops with a CUDA kernel once loaded
};

// Installs the backend once (later calls return the first call's status). Never throws: a missing driver or
// GPU is reported in detail.
CudaBackendStatus load_cuda_backend();

// A check for the host to make while it waits for a GPU, for work queued there that may never finish: a device
// communicator's collectives when a peer process has died. Called every few milliseconds of a wait with the seconds
// waited so far; it throws (an Error) to end the wait. Only while a watch is registered do the CUDA backend's
// waits poll the device instead of blocking in the driver.
using DeviceWaitWatch = std::function<void(double waited_seconds)>;
// Registers a watch; the id returned removes it.
int add_device_wait_watch(DeviceWaitWatch watch);
void remove_device_wait_watch(int id);

}  // namespace mixtrain::ops
