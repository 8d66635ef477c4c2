// The environment accessors: each reads its own variable, at the call (so setenv before a call is seen), and
// tells an unset variable (nullopt) from an empty one.
#include "mixtrain/core/environment.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace mixtrain {
namespace {

struct Accessor {
  const char* variable;
  std::optional<std::string> (*read)();
};

const std::vector<Accessor>& accessors() {
  static const std::vector<Accessor> all = {
      {"MIXTRAIN_ISA", env::mixtrain_isa},
      {"MIXTRAIN_BF16_GEMM", env::mixtrain_bf16_gemm},
      {"MIXTRAIN_F16_GEMM", env::mixtrain_f16_gemm},
      {"MIXTRAIN_F16_GEMM_INTERVAL", env::mixtrain_f16_gemm_interval},
      {"MIXTRAIN_CUDA_TF32", env::mixtrain_cuda_tf32},
      {"MIXTRAIN_NCCL_TIMEOUT", env::mixtrain_nccl_timeout},
      {"MIXTRAIN_NCCL_LIBRARY", env::mixtrain_nccl_library},
      {"MIXTRAIN_INPUT_BUDGET", env::mixtrain_input_budget},
      {"MIXTRAIN_DATA_DIR", env::mixtrain_data_dir},
      {"XDG_DATA_HOME", env::xdg_data_home},
      {"HOME", env::home},
      {"OMPI_COMM_WORLD_SIZE", env::ompi_comm_world_size},
      {"PMI_SIZE", env::pmi_size},
      {"PMIX_RANK", env::pmix_rank},
      {"OMPI_COMM_WORLD_LOCAL_RANK", env::ompi_comm_world_local_rank},
      {"MPI_LOCALRANKID", env::mpi_localrankid},
      {"SLURM_LOCALID", env::slurm_localid},
  };
  return all;
}

// Puts a variable back as it was when the test started.
class SavedVariable {
 public:
  explicit SavedVariable(const char* name) : name_(name) {
    if (const char* v = std::getenv(name)) value_ = v;
  }
  ~SavedVariable() {
    if (value_) ::setenv(name_, value_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> value_;
};

TEST(Environment, EachAccessorReadsItsOwnVariableAtTheCall) {
  for (const Accessor& a : accessors()) {
    SCOPED_TRACE(a.variable);
    SavedVariable saved(a.variable);
    ::unsetenv(a.variable);
    EXPECT_EQ(a.read(), std::nullopt);
    const std::string value = std::string("value of ") + a.variable;
    ::setenv(a.variable, value.c_str(), 1);
    EXPECT_EQ(a.read(), value);
    // No other accessor answers with this variable's value.
    for (const Accessor& other : accessors()) {
      if (other.read != a.read) {
        EXPECT_NE(other.read(), value) << other.variable;
      }
    }
  }
}

TEST(Environment, AnEmptyVariableIsSetAndEmpty) {
  SavedVariable saved("MIXTRAIN_NCCL_TIMEOUT");
  ::setenv("MIXTRAIN_NCCL_TIMEOUT", "", 1);
  EXPECT_EQ(env::mixtrain_nccl_timeout(), std::string());
  ::unsetenv("MIXTRAIN_NCCL_TIMEOUT");
  EXPECT_EQ(env::mixtrain_nccl_timeout(), std::nullopt);
}

}  // namespace
}  // namespace mixtrain
