// The environment variables mixtrain reads, one accessor each, so that they are found (and documented, see
// docs/CLI.md "Environment variables") in one place. src/core/environment.cpp is the only file that calls getenv.
// Each accessor reads the variable when called and gives its value when set (possibly empty), nullopt when
// unset; a caller that reads it once keeps the value itself (as the GEMM's method choices do), so a test may
// change a variable with setenv before a call that reads it afresh.
#pragma once

#include <optional>
#include <string>

namespace mixtrain::env {

// ---- CPU kernels ----
// MIXTRAIN_ISA: forces a lower instruction-set level (scalar, avx2, avx512) than the CPU offers.
std::optional<std::string> mixtrain_isa();
// MIXTRAIN_BF16_GEMM: forces the bfloat16 GEMM method (amx, dot, widen, amx_emulated) instead of the calibrated one.
std::optional<std::string> mixtrain_bf16_gemm();
// MIXTRAIN_F16_GEMM: forces the float16 GEMM method (amx, fp16, widen, amx_emulated, fp16_emulated).
std::optional<std::string> mixtrain_f16_gemm();
// MIXTRAIN_F16_GEMM_INTERVAL: k values per float16 partial sum of the fp16 method (an even number in [2, 1024]).
std::optional<std::string> mixtrain_f16_gemm_interval();

// ---- GPUs ----
// MIXTRAIN_CUDA_TF32: "1" lets cuBLASLt multiply float32 inputs on TF32 tensor cores.
std::optional<std::string> mixtrain_cuda_tf32();
// MIXTRAIN_REQUIRE_GPU: "1" makes what would quietly take a slower way on a GPU an error instead (an INVALID_VALUE
// answer of cuBLASLt for a product), and the GPU tests' skip a failure.
std::optional<std::string> mixtrain_require_gpu();
// MIXTRAIN_NCCL_TIMEOUT: seconds a GPU's queued NCCL collectives may take before the job is aborted (0: no limit).
std::optional<std::string> mixtrain_nccl_timeout();
// MIXTRAIN_NCCL_LIBRARY: the NCCL library to load, tried before libnccl.so.2.
std::optional<std::string> mixtrain_nccl_library();

// ---- Data ----
// MIXTRAIN_INPUT_BUDGET: the most one input may expand to in memory (a size such as 8G; core/input_budget.h).
std::optional<std::string> mixtrain_input_budget();
// MIXTRAIN_DATA_DIR: the directory that holds moby-dick.txt.
std::optional<std::string> mixtrain_data_dir();
// XDG_DATA_HOME: without MIXTRAIN_DATA_DIR, moby-dick.txt is in $XDG_DATA_HOME/mixtrain.
std::optional<std::string> xdg_data_home();
// HOME: without either, moby-dick.txt is in $HOME/.local/share/mixtrain.
std::optional<std::string> home();

// ---- MPI launchers (data-parallel jobs) ----
// OMPI_COMM_WORLD_SIZE: the job's process count under Open MPI's mpirun.
std::optional<std::string> ompi_comm_world_size();
// PMI_SIZE: the job's process count under MPICH's (Hydra's) launcher or Slurm's PMI.
std::optional<std::string> pmi_size();
// PMIX_RANK: set by a PMIx launcher; its presence alone says the process was launched (size unknown).
std::optional<std::string> pmix_rank();
// OMPI_COMM_WORLD_LOCAL_RANK: this process's rank on its machine under Open MPI (picks its GPU).
std::optional<std::string> ompi_comm_world_local_rank();
// MPI_LOCALRANKID: the same under MPICH.
std::optional<std::string> mpi_localrankid();
// SLURM_LOCALID: the same under Slurm.
std::optional<std::string> slurm_localid();

}  // namespace mixtrain::env
