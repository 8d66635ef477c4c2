// Tensor::copy_from, contiguous(), clone() and to() on a device tensor go through the copy its backend installed
// (register_device_copy). A stand-in device here keeps its memory on the host, so the test can fill and read it, and
// its copy converts element by element through the tensors' strides, as the GPU's strided copy does.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/tensor.h"
#include "host_backed_device.h"

namespace mixtrain {
namespace {

using testing_device::HostBackedAllocator;

int g_copies = 0;

// The stand-in device's copy, counted.
void stand_in_copy(const Tensor& src, Tensor& dst) {
  ++g_copies;
  testing_device::strided_copy(src, dst);
}

const Device kDevice = Device::cuda(0);

class DeviceCopy : public testing::Test {
 protected:
  void SetUp() override {
    register_allocator(DeviceType::kCuda, &allocator_);
    register_device_copy(DeviceType::kCuda, &stand_in_copy);
    g_copies = 0;
  }
  void TearDown() override {
    register_device_copy(DeviceType::kCuda, nullptr);
    register_allocator(DeviceType::kCuda, nullptr);
  }

  // A host tensor's values on the stand-in device (same dtype, dense).
  static Tensor on_device(const Tensor& host) {
    Tensor t = Tensor::empty(host.shape(), host.dtype(), kDevice);
    std::memcpy(t.raw(), host.contiguous().raw(), host.nbytes());
    return t;
  }
  // A dense device tensor's bytes back in a host tensor.
  static Tensor on_host(const Tensor& dev) {
    EXPECT_TRUE(dev.is_contiguous());
    Tensor t = Tensor::empty(dev.shape(), dev.dtype());
    std::memcpy(t.raw(), dev.raw(), dev.nbytes());
    return t;
  }
  static bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  }

  HostBackedAllocator allocator_;
};

Tensor values(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.37f * static_cast<float>(i) - 5.1f + 1e-3f * static_cast<float>(i * i);
  return Tensor::from_floats(shape, v);
}

TEST_F(DeviceCopy, ContiguousOfADeviceViewUsesTheBackendsCopy) {
  const Tensor host = values({3, 5, 4});
  const Tensor view = on_device(host).permute({2, 0, 1}).slice(1, 1, 3);
  ASSERT_FALSE(view.is_contiguous());
  const Tensor dense = view.contiguous();
  EXPECT_EQ(g_copies, 1);
  EXPECT_EQ(dense.device(), kDevice);
  EXPECT_TRUE(same_bytes(on_host(dense), host.permute({2, 0, 1}).slice(1, 1, 3).contiguous()));
}

TEST_F(DeviceCopy, ToAndCloneOnADeviceGiveTheHostBits) {
  const Tensor host = values({6, 7});
  const Tensor dev = on_device(host);
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    g_copies = 0;
    const Tensor converted = dev.transpose(0, 1).to(dt);
    EXPECT_EQ(g_copies, 1) << dtype_name(dt);
    EXPECT_EQ(converted.device(), kDevice);
    EXPECT_TRUE(same_bytes(on_host(converted.contiguous()), host.transpose(0, 1).to(dt).contiguous())) << dtype_name(dt);
  }
  const Tensor copy = dev.clone();
  EXPECT_EQ(copy.device(), kDevice);
  EXPECT_NE(copy.raw(), dev.raw());
  EXPECT_TRUE(same_bytes(on_host(copy), host));
  EXPECT_TRUE(dev.to(DType::kFloat32).raw() == dev.raw());  // the same dtype: shared, no copy
}

TEST_F(DeviceCopy, BetweenDevicesItPointsToToDevice) {
  Tensor dev = on_device(values({2, 3}));
  try {
    dev.copy_from(values({2, 3}));
    FAIL() << "a host tensor was copied into a device tensor by copy_from";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("to_device"), std::string::npos) << e.what();
  }
  EXPECT_EQ(g_copies, 0);
}

TEST_F(DeviceCopy, WithoutABackendCopyItSaysSo) {
  register_device_copy(DeviceType::kCuda, nullptr);
  const Tensor view = on_device(values({4, 3})).transpose(0, 1);
  try {
    (void)view.contiguous();
    FAIL() << "a device view was compacted with no copy installed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not loaded"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mixtrain
