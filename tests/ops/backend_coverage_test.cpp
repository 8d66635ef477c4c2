// Every backend answers every op of ops/kernel_list.h: the CPU's with a kernel for each, the CUDA backend's (where the
// build has it) with a kernel for each or a place in its list of what it does not support. Registration needs no
// GPU, so this runs on every machine: an op added to the list without its kernels fails here, not at run time.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mixtrain/ops/backend.h"

#ifdef MIXTRAIN_HAVE_CUDA
#include "ops/cuda/backend.h"
#endif

namespace mixtrain::ops {
namespace {

std::vector<std::string> missing(const Kernels& k, const std::vector<Op>& unsupported = {}) {
  std::vector<std::string> names;
  for (Op op : all_ops()) {
    bool listed = false;
    for (Op u : unsupported) listed = listed || u == op;
    if (!k.has(op) && !listed) names.emplace_back(op_name(op));
  }
  return names;
}

TEST(BackendCoverage, TheCpuBackendHasEveryKernel) {
  EXPECT_EQ(missing(cpu_backend().kernels()), std::vector<std::string>{});
  EXPECT_EQ(static_cast<int>(cpu_backend().op_names().size()), kNumOps);
}

TEST(BackendCoverage, TheCudaBackendHasEveryKernelItDoesNotListAsUnsupported) {
#ifndef MIXTRAIN_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA backend";
#else
  Kernels all;
  cuda::register_kernels(all, /*with_gemm=*/true);
  EXPECT_EQ(missing(all, cuda::unsupported_ops()), std::vector<std::string>{});
  // Without cuBLASLt the GEMM's users are the ones left out, and nothing else.
  Kernels no_gemm;
  cuda::register_kernels(no_gemm, /*with_gemm=*/false);
  EXPECT_EQ(missing(no_gemm, cuda::unsupported_ops()),
            (std::vector<std::string>{"bmm", "linear_activation", "conv2d", "conv2d_backward",
                                      "scaled_dot_product_attention", "scaled_dot_product_attention_backward"}));
#endif
}

}  // namespace
}  // namespace mixtrain::ops
