// --device for the commands that run a model: parsed with core's parse_device, checked against what this machine
// can use through the ops layer (kept apart from args.cpp, whose parser is fuzzed with core alone).
#include <cstdlib>
#include <string>

#include "args.h"
#include "commands.h"
#include "mixtrain/core/environment.h"
#include "mixtrain/core/error.h"
#include "mixtrain/distributed/communicator.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/gemm_timing.h"

namespace mixtrain::cli {

Device device_flag(const Args& a) {
  const std::string text = a.str("device", "cpu");
  try {
    return parse_device(text);
  } catch (const Error& e) {
    MIXTRAIN_FAIL(kInvalidInput, "--device: " << e.message(), e.hint());
  }
}

namespace {
// This process's rank among the job's processes on this machine (the launcher says it: Open MPI, MPICH, Slurm), or its
// rank in the job when no launcher says.
int local_rank(const Communicator& job) {
  for (const auto& v : {env::ompi_comm_world_local_rank(), env::mpi_localrankid(), env::slurm_localid()})
    if (v && !v->empty()) return std::atoi(v->c_str());
  return job.rank();
}
}  // namespace

Device usable_device_flag(const Args& a, const char* command) {
  Device device = device_flag(a);
  // Data-parallel (mpirun) with a plain `--device cuda`: the ranks on a machine take its GPUs in turn, as one
  // process per GPU is the usual launch (`--device cuda:N` puts every rank on GPU N).
  const Communicator* job = data_parallel_job();
  if (job != nullptr && a.str("device", "cpu") == "cuda") {
    const int gpus = ops::load_cuda_backend().device_count;
    if (gpus > 0) device = Device::cuda(local_rank(*job) % gpus);
  }
  const std::string problem = ops::gemm_device_problem(device);
  if (!problem.empty())
    MIXTRAIN_FAIL(kInvalidInput, command << " --device " << device.str() << ": this machine cannot use it: " << problem,
                  "--device cpu (the default) runs on the CPU; --device cuda needs a build with the CUDA backend "
                  "(-DMIXTRAIN_CUDA=ON where nvcc is found) and an NVIDIA GPU with its driver");
  return device;
}

}  // namespace mixtrain::cli
