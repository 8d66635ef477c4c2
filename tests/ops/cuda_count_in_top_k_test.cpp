// CudaBackend.CountInTopK*: the GPU's ops::count_in_top_k gives the CPU's count (skips without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/core/random.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/transfer.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;

float read_count(const Tensor& t) { return to_device(t, Device::cpu()).data<float>()[0]; }

TEST(CudaBackend, CountInTopKCountsTheCpusRows) {
  REQUIRE_CUDA_BACKEND();
  Rng r(23);
  for (DType dt : kFloatDTypes) {
    for (int64_t classes : {1, 2, 7, 33, 129, 1000}) {
      for (DType label_dtype : {DType::kInt32, DType::kInt64}) {
        const int64_t batch = 300;
        // Few distinct values (ties at the k-th place count for the label), NaN scores in some rows.
        std::vector<float> s(static_cast<size_t>(batch * classes));
        for (float& x : s) x = std::round(r.uniform(-3.0f, 3.0f));
        const float nan = std::numeric_limits<float>::quiet_NaN();
        for (int64_t b = 0; b < batch; b += 11) s[static_cast<size_t>(b * classes)] = nan;
        std::vector<int64_t> l(static_cast<size_t>(batch));
        for (int64_t& x : l) x = static_cast<int64_t>(r.uniform(0.0f, static_cast<float>(classes))) % classes;
        const Tensor scores = Tensor::from_floats({batch, classes}, s, dt);
        const Tensor labels = Tensor::from_int64s({batch}, l).to(label_dtype);
        for (int64_t k : {1, 5, 2000}) {
          const std::string what = std::string(dtype_name(dt)) + " classes=" + std::to_string(classes) + " k=" +
                                   std::to_string(k);
          EXPECT_EQ(read_count(count_in_top_k(gpu(scores), gpu(labels), k)),
                    read_count(count_in_top_k(scores, labels, k)))
              << what;
        }
      }
    }
  }
  // Only counting passes this: every label in the top 2, one in the top 1.
  const Tensor s = Tensor::from_floats({2, 3}, {3, 2, 1, 1, 3, 2});
  const Tensor l = Tensor::from_ints({2}, {1, 2});
  EXPECT_EQ(read_count(count_in_top_k(gpu(s), gpu(l), 2)), 2.0f);
  EXPECT_EQ(read_count(count_in_top_k(gpu(s), gpu(l), 1)), 0.0f);
}

}  // namespace
}  // namespace mixtrain::ops
