#include "mixtrain/core/environment.h"

#include <cstdlib>

namespace mixtrain::env {

namespace {
std::optional<std::string> read(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}
}  // namespace

std::optional<std::string> mixtrain_isa() { return read("MIXTRAIN_ISA"); }
std::optional<std::string> mixtrain_bf16_gemm() { return read("MIXTRAIN_BF16_GEMM"); }
std::optional<std::string> mixtrain_f16_gemm() { return read("MIXTRAIN_F16_GEMM"); }
std::optional<std::string> mixtrain_f16_gemm_interval() { return read("MIXTRAIN_F16_GEMM_INTERVAL"); }
std::optional<std::string> mixtrain_cuda_tf32() { return read("MIXTRAIN_CUDA_TF32"); }
std::optional<std::string> mixtrain_require_gpu() { return read("MIXTRAIN_REQUIRE_GPU"); }
std::optional<std::string> mixtrain_nccl_timeout() { return read("MIXTRAIN_NCCL_TIMEOUT"); }
std::optional<std::string> mixtrain_nccl_library() { return read("MIXTRAIN_NCCL_LIBRARY"); }
std::optional<std::string> mixtrain_input_budget() { return read("MIXTRAIN_INPUT_BUDGET"); }
std::optional<std::string> mixtrain_data_dir() { return read("MIXTRAIN_DATA_DIR"); }
std::optional<std::string> xdg_data_home() { return read("XDG_DATA_HOME"); }
std::optional<std::string> home() { return read("HOME"); }
std::optional<std::string> ompi_comm_world_size() { return read("OMPI_COMM_WORLD_SIZE"); }
std::optional<std::string> pmi_size() { return read("PMI_SIZE"); }
std::optional<std::string> pmix_rank() { return read("PMIX_RANK"); }
std::optional<std::string> ompi_comm_world_local_rank() { return read("OMPI_COMM_WORLD_LOCAL_RANK"); }
std::optional<std::string> mpi_localrankid() { return read("MPI_LOCALRANKID"); }
std::optional<std::string> slurm_localid() { return read("SLURM_LOCALID"); }

}  // namespace mixtrain::env
