// cuBLASLt's workspace comes from the CUDA backend's block pool (src/ops/cuda/matmul.cpp): a GPU without the memory
// for it raises MemoryLimitExceeded, which `--batch-size auto` reads as "this batch does not fit", rather than an
// internal error, and a later product, with the memory back, makes it and runs. The workspace is made by a process's
// first product on a GPU, so the check runs in a child process of its own (CudaWorkspaceChild, which ctest and
// scripts/gpu-check.sh do not run by themselves) that fills the GPU before its first product. On a GPU only.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/core/allocator.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

// Fills the GPU's memory with tensors, halving the size at each refusal down to 512 bytes, then frees those under
// 1 MiB (they sit in the pool's small segments): a small product's output fits again, the 32 MiB workspace does not.
std::vector<Tensor> fill_gpu() {
  std::vector<Tensor> held;
  for (int64_t size = int64_t{1} << 30; size >= 512;) {
    try {
      held.push_back(Tensor::empty({size}, DType::kUInt8, kGpu));
    } catch (const MemoryLimitExceeded&) {
      size /= 2;
    }
  }
  std::erase_if(held, [](const Tensor& t) { return t.numel() < (int64_t{1} << 20); });
  return held;
}

TEST(CudaWorkspaceChild, AFullGpuRefusesTheWorkspaceAsAMemoryLimitExceeded) {
  REQUIRE_CUDA_GEMM();
  const Tensor a = gpu(testing::random_tensor({8, 8}, 1, DType::kFloat32));
  const Tensor b = gpu(testing::random_tensor({8, 8}, 2, DType::kFloat32));
  std::vector<Tensor> held = fill_gpu();
  try {
    (void)matmul(a, b);
    ADD_FAILURE() << "a product on a full GPU ran (" << held.size() << " tensors held)";
  } catch (const MemoryLimitExceeded& e) {
    EXPECT_NE(e.message().find("cuBLASLt's workspace"), std::string::npos) << e.message();
    std::printf("workspace refused: %s\n", e.message().c_str());
  }
  held.clear();  // the memory back: the next product makes the workspace and runs
  const Tensor c = matmul(a, b);
  EXPECT_TRUE(bit_equal(c, matmul(a, b)));
  std::printf("workspace made after the memory came back\n");
}

TEST(CudaBackend, OutOfMemoryForTheGemmWorkspaceIsAMemoryLimitExceeded) {
  REQUIRE_CUDA_GEMM();
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command =
      "'" + exe + "' --gtest_filter=CudaWorkspaceChild.AFullGpuRefusesTheWorkspaceAsAMemoryLimitExceeded 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  while (fgets(buffer, sizeof buffer, pipe)) out += buffer;
  const int status = pclose(pipe);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("workspace refused: cuBLASLt's workspace: out of GPU memory"), std::string::npos) << out;
  EXPECT_NE(out.find("workspace made after the memory came back"), std::string::npos) << out;
  EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << out;
}

}  // namespace
}  // namespace mixtrain::ops
