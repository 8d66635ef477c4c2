// NCCL's ABI as nccl_api.h declares it (loaded at run time, compiled without NCCL's header), checked against
// nccl.h where the build found that header; NCCL's loading where the library is installed; and on a machine with a
// GPU (scripts/gpu-check.sh runs this with MIXTRAIN_REQUIRE_GPU=1), one rank's device collectives over NCCL.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dist/nccl_api.h"
#include "mixtrain/dist/data_parallel.h"
#include "mixtrain/dist/device_communicator.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/transfer.h"

#ifdef MIXTRAIN_NCCL_HEADER
#include <nccl.h>

namespace mixtrain::nccl {
static_assert(sizeof(UniqueId) == sizeof(ncclUniqueId) && kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);
static_assert(sizeof(Result) == sizeof(ncclResult_t) && sizeof(DataType) == sizeof(ncclDataType_t) &&
              sizeof(RedOp) == sizeof(ncclRedOp_t) && sizeof(Comm) == sizeof(ncclComm_t));
static_assert(kSuccess == ncclSuccess && kUint8 == ncclUint8 && kFloat32 == ncclFloat32);
static_assert(kSum == ncclSum && kMax == ncclMax && kMin == ncclMin);
static_assert(NCCL_MAJOR == 2, "the declarations are NCCL 2's");
}  // namespace mixtrain::nccl
#endif

namespace mixtrain {
namespace {

TEST(NcclApi, LoadsWhereTheLibraryIsAndSaysWhyNotElsewhere) {
  std::string why;
  const nccl::Api* api = nccl::load(&why);
#ifdef MIXTRAIN_NCCL_HEADER
  // The toolkit this build used holds libnccl.so.2 beside nccl.h: it is one of the places looked in.
  ASSERT_NE(api, nullptr) << why;
#endif
  if (api == nullptr) {
    EXPECT_NE(why.find("NCCL"), std::string::npos) << why;
    GTEST_SKIP() << why;
  }
  int version = 0;
  ASSERT_EQ(api->get_version(&version), nccl::kSuccess);
  EXPECT_GE(version, 20000);
  EXPECT_LT(version, 30000);
  // Its error strings are there for the messages (no GPU is needed for either call).
  EXPECT_GT(std::strlen(api->error_string(1)), 0u);
}

TEST(NcclApi, StatusNamesTheVersionAndLibraryOrWhyNot) {
  const NcclStatus s = nccl_status();
  std::string why;
  int version = 0;
  const bool loads = nccl::load(&why, nullptr, &version) != nullptr;
  EXPECT_EQ(s.loaded, loads);
  if (!loads) {
    EXPECT_EQ(s.detail, why);
    return;
  }
  EXPECT_EQ(s.version, version);
  const std::string dotted = std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
                             std::to_string(version % 100);
  EXPECT_EQ(s.detail.rfind("NCCL " + dotted + " (", 0), 0u) << s.detail;
  EXPECT_NE(s.detail.find("libnccl.so.2)"), std::string::npos) << s.detail;
}

bool gpu_required() {
  const char* v = std::getenv("MIXTRAIN_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

std::vector<float> on_host(const Tensor& t) { return ops::to_device(t, Device::cpu()).to_floats(); }

// One process's NCCL communicator on the GPU: what every data-parallel step's collectives call, on a real device
// (NCCL's loading, its ABI as declared, the default stream's order with the backend's kernels).
TEST(NcclCollectives, OneRankReducesAndBroadcastsOnTheGpu) {
  const ops::CudaBackendStatus s = ops::load_cuda_backend();
  if (!s.loaded) {
    if (gpu_required()) FAIL() << "MIXTRAIN_REQUIRE_GPU=1 but the CUDA backend is not loaded: " << s.detail;
    GTEST_SKIP() << s.detail;
  }
  const Device gpu = Device::cuda(0);
  std::string why;
  const std::unique_ptr<Communicator> comm = device_communicator(world_communicator(), gpu, &why);
  ASSERT_NE(comm, nullptr) << why;
  EXPECT_EQ(comm->backend(), world_communicator().backend() + "+nccl");
  ASSERT_TRUE(comm->moves_memory_of(gpu));

  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 1e-3f, -7.0f};
  Tensor t = ops::to_device(Tensor::from_floats({5}, values), gpu);
  comm->all_reduce_on_device(t, ReduceOp::kSum);  // over one rank: the values themselves
  EXPECT_EQ(on_host(t), values);
  comm->all_reduce_on_device(t, ReduceOp::kMax);
  EXPECT_EQ(on_host(t), values);
  Tensor b = ops::to_device(Tensor::from_floats({5}, values, DType::kBFloat16), gpu);
  comm->broadcast_on_device(b, 0);
  EXPECT_EQ(on_host(b), Tensor::from_floats({5}, values, DType::kBFloat16).to_floats());
  EXPECT_EQ(comm->stats().calls, 3);

  // A float16 gradient weighted by one half: scaled and summed in float32 on the device, rounded back once.
  std::vector<Tensor> grads = {ops::to_device(Tensor::from_floats({5}, values, DType::kFloat16), gpu)};
  all_reduce_gradients(grads, *comm, 0.5f);
  std::vector<float> half;
  for (float v : values) half.push_back(0.5f * v);
  EXPECT_EQ(on_host(grads[0]), Tensor::from_floats({5}, half, DType::kFloat16).to_floats());
  EXPECT_EQ(comm->stats().calls, 4);
}

}  // namespace
}  // namespace mixtrain
