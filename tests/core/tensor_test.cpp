#include <gtest/gtest.h>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/dtype.h"
#include "mixtrain/core/tensor.h"

namespace mixtrain {
namespace {

TEST(DType, TraitsAndNames) {
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_TRUE(is_float(DType::kBFloat16));
  EXPECT_FALSE(is_float(DType::kInt32));
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(parse_dtype("half"), DType::kFloat16);
  for (int i = 0; i < kNumDTypes; ++i) EXPECT_EQ(parse_dtype(dtype_name(static_cast<DType>(i))), static_cast<DType>(i));
  try {
    parse_dtype("float8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float32, float16, bfloat16"), std::string::npos);
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
  }
}

TEST(Tensor, CreationShapeAndConversion) {
  Tensor t = Tensor::from_floats({2, 3}, {1, 2, 3, 4, 5, 1.0f / 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.device().str(), "cpu");
  Tensor h = t.to(DType::kFloat16);
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_EQ(h.nbytes(), 12u);
  EXPECT_FLOAT_EQ(h.at(5), half_bits_to_float(float_to_half_bits(1.0f / 3)));
  EXPECT_NE(h.at(5), t.at(5));
  Tensor b = t.to(DType::kBFloat16).to(DType::kFloat32);
  EXPECT_NEAR(b.at(5), 1.0f / 3, 1.0f / 256);
  EXPECT_THROW(t.data<float16>(), Error);
  EXPECT_THROW(t.reshape({4, 2}), Error);
  EXPECT_EQ(t.reshape({3, 2}).at(4), 5.0f);
}

TEST(Tensor, RowsSliceAndGather) {
  Tensor t = Tensor::from_floats({3, 2}, {0, 1, 10, 11, 20, 21});
  EXPECT_EQ(t.slice_rows(1, 3).to_floats(), (std::vector<float>{10, 11, 20, 21}));
  EXPECT_EQ(t.gather_rows({2, 0}).to_floats(), (std::vector<float>{20, 21, 0, 1}));
  EXPECT_THROW(t.slice_rows(2, 4), Error);
  EXPECT_THROW(t.gather_rows({3}), Error);
}

TEST(Allocator, CountsLiveAndPeakBytes) {
  const int64_t base = memory_stats().live_bytes;
  reset_peak_memory();
  {
    Tensor a = Tensor::zeros({1000}, DType::kFloat32);
    Tensor b = Tensor::zeros({1000}, DType::kFloat16);
    EXPECT_EQ(memory_stats().live_bytes - base, 6000);
  }
  EXPECT_EQ(memory_stats().live_bytes, base);
  EXPECT_EQ(memory_stats().peak_bytes - base, 6000);
  reset_peak_memory();
  EXPECT_EQ(memory_stats().peak_bytes, base);
}

// The memory limit refuses an allocation that would take the live tensor bytes past it, before allocating,
// and says how much was asked for and in use; under the limit, and with no limit, allocations go through.
TEST(Allocator, MemoryLimitRefusesWhatWouldPassIt) {
  struct NoLimitAfterwards {
    ~NoLimitAfterwards() { set_memory_limit(0); }
  } no_limit_afterwards;
  const int64_t base = memory_stats().live_bytes;
  set_memory_limit(base + 10000);
  {
    Tensor fits = Tensor::zeros({2000}, DType::kFloat32);  // 8,000 bytes
    try {
      Tensor too_big = Tensor::zeros({1000}, DType::kFloat32);  // 4,000 more: 12,000 > 10,000
      FAIL() << "an allocation past the limit was made";
    } catch (const MemoryLimitExceeded& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_EQ(e.requested_bytes(), 4000);
      EXPECT_EQ(e.live_bytes(), base + 8000);
      EXPECT_NE(e.message().find("a tensor of 3.9 KiB"), std::string::npos) << e.message();
    }
    EXPECT_EQ(memory_stats().live_bytes, base + 8000);  // nothing was counted for the refused tensor
  }
  Tensor again = Tensor::zeros({2400}, DType::kFloat32);  // 9,600 bytes: fits once the first is freed
  EXPECT_THROW(set_memory_limit(-1), Error);
  set_memory_limit(0);  // none
  EXPECT_EQ(memory_limit(), 0);
  Tensor big = Tensor::zeros({100000}, DType::kFloat32);
  EXPECT_EQ(memory_stats().live_bytes, base + 9600 + 400000);
}

TEST(Error, CarriesLocationAndHint) {
  try {
    MIXTRAIN_FAIL(kIo, "cannot open 'x.idx'", "check the path");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(e.where().find("tensor_test.cpp:"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("hint: check the path"), std::string::npos);
  }
}

}  // namespace
}  // namespace mixtrain

namespace mixtrain {
namespace {

Tensor iota(const Shape& shape, DType dtype = DType::kFloat32) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return Tensor::from_floats(shape, v, dtype);
}

TEST(TensorViews, TransposeIsAViewWithSwappedStrides) {
  Tensor t = iota({2, 3, 4});
  Tensor v = t.transpose(0, 2);  // (4, 3, 2)
  EXPECT_EQ(v.shape(), (Shape{4, 3, 2}));
  EXPECT_TRUE(v.shares_storage(t));
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_EQ(v.strides(), (std::vector<int64_t>{1, 4, 12}));
  // v[i][j][k] == t[k][j][i]
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) EXPECT_EQ(v.at(i * 6 + j * 2 + k), t.at(k * 12 + j * 4 + i));
  EXPECT_THROW(v.data<float>(), Error);  // kernels never see a strided view by accident
  Tensor c = v.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage(t));
  EXPECT_EQ(c.to_floats(), v.to_floats());
  EXPECT_TRUE(t.contiguous().shares_storage(t));  // already dense: no copy
}

TEST(TensorViews, PermuteSliceAndReshape) {
  Tensor t = iota({2, 3, 4, 5});
  Tensor p = t.permute({0, 2, 3, 1});  // NCHW -> NHWC
  EXPECT_EQ(p.shape(), (Shape{2, 4, 5, 3}));
  EXPECT_EQ(p.at(((1 * 4 + 2) * 5 + 3) * 3 + 1), t.at(((1 * 3 + 1) * 4 + 2) * 5 + 3));
  EXPECT_THROW(t.permute({0, 0, 1, 2}), Error);
  EXPECT_THROW(t.permute({0, 1, 2}), Error);

  Tensor s = t.slice(2, 1, 3);  // (2, 3, 2, 5)
  EXPECT_TRUE(s.shares_storage(t));
  EXPECT_EQ(s.offset(), 5);
  EXPECT_EQ(s.at(0), 5.0f);
  EXPECT_EQ(s.at(s.numel() - 1), t.at(((1 * 3 + 2) * 4 + 2) * 5 + 4));
  EXPECT_THROW(t.slice(2, 3, 5), Error);
  Tensor rows = t.slice(0, 1, 2);  // a dense run: still contiguous
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.data<float>()[0], 60.0f);

  Tensor r = t.reshape({6, -1});
  EXPECT_EQ(r.shape(), (Shape{6, 20}));
  EXPECT_TRUE(r.shares_storage(t));
  Tensor rs = s.reshape({-1});  // a strided view is copied first
  EXPECT_FALSE(rs.shares_storage(t));
  EXPECT_EQ(rs.to_floats(), s.to_floats());
  EXPECT_THROW(t.reshape({7, -1}), Error);
  EXPECT_THROW(t.reshape({-1, -1}), Error);
}

TEST(TensorViews, WritesThroughAViewReachTheBase) {
  Tensor t = Tensor::zeros({3, 4}, DType::kFloat32);
  Tensor col = t.slice(1, 2, 3);  // (3, 1)
  col.copy_from(Tensor::from_floats({3, 1}, {1, 2, 3}, DType::kBFloat16));
  EXPECT_EQ(t.to_floats(), (std::vector<float>{0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0}));
  Tensor h = t.transpose(0, 1).to(DType::kFloat16);  // conversion of a view is dense
  EXPECT_TRUE(h.is_contiguous());
  EXPECT_EQ(h.at(2 * 3 + 1), 2.0f);
}

TEST(TensorViews, RankAndDeviceLimits) {
  EXPECT_NO_THROW(Tensor::empty(Shape(std::vector<int64_t>(kMaxRank, 1)), DType::kFloat32));
  EXPECT_THROW(Tensor::empty(Shape(std::vector<int64_t>(kMaxRank + 1, 1)), DType::kFloat32), Error);
  EXPECT_THROW(Tensor::empty({int64_t{1} << 62, 4}, DType::kFloat32), Error);  // bytes overflow
  EXPECT_EQ(parse_device("cuda:3").str(), "cuda:3");
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_THROW(parse_device("tpu"), Error);
  EXPECT_THROW(parse_device("cuda:x"), Error);
  // No backend has registered a CUDA allocator in a CPU build: a clear error, not a crash.
  EXPECT_THROW(Tensor::empty({2}, DType::kFloat32, Device::cuda(0)), Error);
}

TEST(TensorViews, IntegerTensorsStayExact) {
  const int64_t big = (int64_t{1} << 40) + 3;  // not representable in float32
  Tensor ids = Tensor::from_int64s({3}, {big, -7, 0});
  EXPECT_EQ(ids.dtype(), DType::kInt64);
  EXPECT_EQ(ids.to_int64s(), (std::vector<int64_t>{big, -7, 0}));
  Tensor i32 = Tensor::from_ints({2}, {123456789, -5}).to(DType::kInt64);
  EXPECT_EQ(i32.to_int64s(), (std::vector<int64_t>{123456789, -5}));
  EXPECT_EQ(Tensor::from_ints({1}, {16777217}).to_int64s()[0], 16777217);  // int -> int never via float
  EXPECT_TRUE(is_index(DType::kInt64));
  EXPECT_FALSE(is_index(DType::kUInt8));
}

}  // namespace
}  // namespace mixtrain
