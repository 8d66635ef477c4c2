// The CUDA backend behind the dispatch seam (docs/ARCHITECTURE.md, "Plugging in a second backend"). Nothing of
// CUDA appears in public headers: a build configured with MIXTRAIN_CUDA compiles the backend into the ops layer,
// and load_cuda_backend() installs its allocator and kernels when the machine has a GPU. Until then, and in a
// build without it, every op runs on the CPU as before and a cuda tensor is a clear error.
#pragma once

#include <cstdint>
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

// What the GPU GEMM has done in this process (zeros in a build without the backend or before it loaded): plans
// cuBLASLt declined (those products went through a float32 scratch and a rounding kernel, or the product then the
// activation kernel), and products it had no algorithm for at all, which the backend's own tiled kernel ran (far
// slower than the tensor cores: a model whose step needs it says so in `bench step`).
struct CudaGemmCounts {
  int64_t declined_plans = 0;
  int64_t fallback_products = 0;
};
CudaGemmCounts cuda_gemm_counts();

// For work queued on a GPU that may never finish: a device communicator's collectives when a peer process has
// died. While a check is registered, the CUDA backend publishes when the host began each wait for a GPU (a
// synchronous copy, a synchronize, a cudaFree), so that a watchdog thread can see how long it has been blocked
// (device_wait_seconds) and cut the queued work short (ncclCommAbort ends NCCL's kernels); when a wait returns,
// every check runs, and one throws (an Error) to say why the work was cut short (a cudaFree's wait runs none: the
// next wait reports).
using DeviceWaitCheck = std::function<void()>;
// Registers a check; the id returned removes it. A check may run on any thread that waits.
int add_device_wait_check(DeviceWaitCheck check);
void remove_device_wait_check(int id);
// How long the oldest of the host's current waits for a GPU has lasted, in seconds; 0 when none is under way (or
// no check is registered: waits are published only then).
double device_wait_seconds();

}  // namespace mixtrain::ops
