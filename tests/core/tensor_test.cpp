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
  EXPECT_STREQ(t.device(), "cpu");
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
