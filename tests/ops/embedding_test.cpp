// Embedding lookup and its scatter-add gradient against float64 references, in every table and output
// dtype, with int32 and int64 ids of several shapes.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mixtrain/ops/embedding.h"

#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::unit;

std::vector<int64_t> random_ids(int64_t n, int64_t input_dim, uint64_t seed) {
  Rng r(seed);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t& id : ids) id = static_cast<int64_t>(r.below(static_cast<uint64_t>(input_dim)));
  return ids;
}

Tensor ids_tensor(const Shape& shape, const std::vector<int64_t>& ids, DType dtype) {
  if (dtype == DType::kInt64) return Tensor::from_int64s(shape, ids);
  return Tensor::from_ints(shape, std::vector<int32_t>(ids.begin(), ids.end()));
}

// Rounds a float64 value into dtype d and back: what one rounding into d gives.
double round_into(double x, DType d) {
  return Tensor::from_floats({1}, {static_cast<float>(x)}, d).at(0);
}

// A gather only copies: each output element is its table element rounded once into the output dtype
// (exactly; no tolerance).
TEST(Embedding, GathersRowsRoundedOnceIntoTheOutputDType) {
  struct Case {
    Shape ids;
    int64_t input_dim, output_dim;
  };
  const Case cases[] = {{{1}, 1, 1}, {{7}, 17, 7}, {{3, 17}, 31, 5}, {{2, 31}, 129, 17}, {{2, 3, 5}, 7, 129}};
  for (DType table_dtype : kFloatDTypes)
    for (DType out_dtype : kFloatDTypes)
      for (DType id_dtype : {DType::kInt32, DType::kInt64})
        for (const Case& c : cases) {
          const std::vector<int64_t> ids = random_ids(c.ids.numel(), c.input_dim, 1);
          Tensor table = random_tensor({c.input_dim, c.output_dim}, 2, table_dtype, -3.0f, 3.0f);
          Tensor y = embedding(ids_tensor(c.ids, ids, id_dtype), table, out_dtype);
          std::vector<int64_t> want_shape = c.ids.dims();
          want_shape.push_back(c.output_dim);
          ASSERT_EQ(y.shape(), Shape(want_shape));
          ASSERT_EQ(y.dtype(), out_dtype);
          const std::vector<float> tv = table.to_floats(), yv = y.to_floats();
          for (size_t i = 0; i < ids.size(); ++i)
            for (int64_t j = 0; j < c.output_dim; ++j) {
              const double want = round_into(tv[static_cast<size_t>(ids[i] * c.output_dim + j)], out_dtype);
              ASSERT_EQ(yv[i * static_cast<size_t>(c.output_dim) + static_cast<size_t>(j)], want)
                  << dtype_name(table_dtype) << " -> " << dtype_name(out_dtype) << " ids " << c.ids;
            }
        }
}

TEST(Embedding, OutOfRangeIdsNameTheIdAndInputDim) {
  Tensor table = Tensor::zeros({10, 3}, DType::kFloat32);
  for (int64_t bad : {int64_t{10}, int64_t{-1}, int64_t{1000}}) {
    for (DType id_dtype : {DType::kInt32, DType::kInt64}) {
      Tensor ids = ids_tensor({2, 2}, {0, 3, bad, 9}, id_dtype);
      try {
        embedding(ids, table, DType::kFloat32);
        ADD_FAILURE() << "id " << bad << " was accepted";
      } catch (const Error& e) {
        const std::string m = e.message();
        EXPECT_NE(m.find("id " + std::to_string(bad)), std::string::npos) << m;
        EXPECT_NE(m.find("input_dim 10"), std::string::npos) << m;
        EXPECT_NE(m.find("position 2"), std::string::npos) << m;
      }
      EXPECT_THROW(embedding_backward(Tensor::zeros({2, 2, 3}, DType::kFloat32), ids, 10), Error);
    }
  }
  EXPECT_THROW(embedding(Tensor::zeros({2}, DType::kFloat32), table, DType::kFloat32), Error);  // float ids
  EXPECT_THROW(embedding(Tensor::from_ints({1}, {0}), Tensor::zeros({3}, DType::kFloat32), DType::kFloat32), Error);
  EXPECT_THROW(embedding_backward(Tensor::zeros({2, 4}, DType::kFloat32), Tensor::from_ints({2}, {0, 1}), 0), Error);
  EXPECT_THROW(embedding_backward(Tensor::zeros({3, 4}, DType::kFloat32), Tensor::from_ints({2}, {0, 1}), 5), Error);
}

// The gradient of row r is the float32 sum of its positions' gradient rows: repeated ids accumulate.
// Sums of n terms in float32 lie within n * 2^-24 * sum |terms| of the float64 sum.
TEST(Embedding, BackwardScatterAddsRepeatedIdsInFloat32) {
  for (DType d : kFloatDTypes)
    for (const Shape& s : {Shape{1}, Shape{7}, Shape{4, 17}, Shape{3, 129}}) {
      constexpr int64_t kInputDim = 5, kWidth = 7;  // few ids: most repeat
      const std::vector<int64_t> ids = random_ids(s.numel(), kInputDim, 3);
      std::vector<int64_t> gshape = s.dims();
      gshape.push_back(kWidth);
      Tensor dy = random_tensor(Shape(gshape), 4, d);
      Tensor dt = embedding_backward(dy, ids_tensor(s, ids, DType::kInt32), kInputDim);
      ASSERT_EQ(dt.dtype(), DType::kFloat32);
      ASSERT_EQ(dt.shape(), (Shape{kInputDim, kWidth}));
      const std::vector<float> g = dy.to_floats(), got = dt.to_floats();
      std::vector<double> want(static_cast<size_t>(kInputDim * kWidth), 0.0), mag(want.size(), 0.0);
      std::vector<int64_t> count(static_cast<size_t>(kInputDim), 0);
      for (size_t i = 0; i < ids.size(); ++i) {
        ++count[static_cast<size_t>(ids[i])];
        for (int64_t j = 0; j < kWidth; ++j) {
          const size_t o = static_cast<size_t>(ids[i] * kWidth + j);
          want[o] += g[i * kWidth + static_cast<size_t>(j)];
          mag[o] += std::fabs(g[i * kWidth + static_cast<size_t>(j)]);
        }
      }
      for (size_t o = 0; o < want.size(); ++o) {
        const double n = static_cast<double>(count[o / kWidth]);
        ASSERT_NEAR(got[o], want[o], (n + 1) * 0x1p-24 * mag[o]) << dtype_name(d) << " " << s << " element " << o;
        if (n == 0) {
          ASSERT_EQ(got[o], 0.0f);
        }
      }
    }
}

// embedding_backward_into touches rows only: the rows of ids get embedding_backward's bits, the rows it is told
// to clear become zero, and a row in neither keeps whatever it held (a sentinel here, which a dense write would
// have zeroed). Called twice into one buffer, as a training step's backward is, the second call given the first's
// rows: the buffer then equals the second dense gradient exactly.
TEST(Embedding, BackwardIntoTouchesOnlyTheRowsOfIdsAndTheRowsToClear) {
  constexpr int64_t kInputDim = 23, kWidth = 9;
  constexpr float kSentinel = 7.5f;
  for (DType d : kFloatDTypes)
    for (DType id_dtype : {DType::kInt32, DType::kInt64}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + " ids " + dtype_name(id_dtype));
      // Step 1 uses ids in [0, 12) (repeated), step 2 ids in [8, 20): rows 0..7 must be cleared, 20..22 never touched.
      const std::vector<int64_t> ids1 = random_ids(15, 12, 11);
      std::vector<int64_t> ids2 = random_ids(14, 12, 12);
      for (int64_t& id : ids2) id += 8;
      const Tensor dy1 = random_tensor({3, 5, kWidth}, 13, d), dy2 = random_tensor({2, 7, kWidth}, 14, d);
      const Tensor i1 = ids_tensor({3, 5}, ids1, id_dtype), i2 = ids_tensor({2, 7}, ids2, id_dtype);
      Tensor buffer = Tensor::full({kInputDim, kWidth}, DType::kFloat32, kSentinel);

      std::vector<int64_t> rows = embedding_backward_into(dy1, i1, buffer, nullptr);  // contents unknown
      std::vector<int64_t> want_rows = ids1;
      std::sort(want_rows.begin(), want_rows.end());
      want_rows.erase(std::unique(want_rows.begin(), want_rows.end()), want_rows.end());
      EXPECT_EQ(rows, want_rows);
      const Tensor dense1 = embedding_backward(dy1, i1, kInputDim);
      EXPECT_EQ(0, std::memcmp(buffer.raw(), dense1.raw(), dense1.nbytes()));

      // Rows 20..22 hold zero (a gradient buffer's contract); a sentinel there shows they are left alone.
      float* b = buffer.data<float>();
      std::fill(b + 20 * kWidth, b + kInputDim * kWidth, kSentinel);
      const std::vector<int64_t> rows2 = embedding_backward_into(dy2, i2, buffer, &rows);
      const Tensor dense2 = embedding_backward(dy2, i2, kInputDim);
      const float* want = dense2.data<float>();
      for (int64_t r = 0; r < kInputDim; ++r)
        for (int64_t j = 0; j < kWidth; ++j) {
          const size_t o = static_cast<size_t>(r * kWidth + j);
          if (r >= 20)
            ASSERT_EQ(b[o], kSentinel) << "row " << r << " was written";
          else
            ASSERT_EQ(std::memcmp(&b[o], &want[o], sizeof(float)), 0) << "row " << r << " column " << j;
        }
      for (int64_t r : rows2) EXPECT_TRUE(r >= 8 && r < 20) << r;
    }
}

TEST(Embedding, BackwardIntoRefusesAMismatchedTableAndRowsOutside) {
  const Tensor ids = Tensor::from_ints({2}, {0, 3});
  const Tensor dy = Tensor::zeros({2, 4}, DType::kFloat32);
  Tensor wrong_width = Tensor::zeros({5, 3}, DType::kFloat32), half = Tensor::zeros({5, 4}, DType::kFloat16);
  Tensor good = Tensor::zeros({5, 4}, DType::kFloat32);
  EXPECT_THROW(embedding_backward_into(dy, ids, wrong_width, nullptr), Error);
  EXPECT_THROW(embedding_backward_into(dy, ids, half, nullptr), Error);
  const std::vector<int64_t> outside = {5};
  EXPECT_THROW(embedding_backward_into(dy, ids, good, &outside), Error);
  Tensor small = Tensor::zeros({3, 4}, DType::kFloat32);  // id 3 is beyond its rows
  EXPECT_THROW(embedding_backward_into(dy, ids, small, nullptr), Error);
}

TEST(Embedding, ViewsAreReadAsTheirElements) {
  // ids as a transposed view, the table as a column slice.
  Tensor ids = Tensor::from_ints({2, 3}, {0, 1, 2, 3, 4, 0}).transpose(0, 1);  // (3, 2)
  Tensor big = random_tensor({5, 8}, 5, DType::kFloat32);
  Tensor table = big.slice(1, 2, 6);  // (5, 4), not contiguous
  Tensor y = embedding(ids, table, DType::kFloat32);
  ASSERT_EQ(y.shape(), (Shape{3, 2, 4}));
  const std::vector<int32_t> idv = ids.contiguous().to_ints();
  const std::vector<float> tv = table.contiguous().to_floats(), yv = y.to_floats();
  for (size_t i = 0; i < idv.size(); ++i)
    for (size_t j = 0; j < 4; ++j) EXPECT_EQ(yv[i * 4 + j], tv[static_cast<size_t>(idv[i]) * 4 + j]);
}

TEST(Embedding, ResultsDoNotDependOnTheThreadCount) {
  const std::vector<int64_t> ids = random_ids(4096, 300, 6);
  Tensor idt = ids_tensor({64, 64}, ids, DType::kInt64);
  Tensor table = random_tensor({300, 33}, 7, DType::kFloat32);
  Tensor dy = random_tensor({64, 64, 33}, 8, DType::kBFloat16);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> ys, gs;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    ys.push_back(embedding(idt, table, DType::kFloat16).to_floats());
    gs.push_back(embedding_backward(dy, idt, 300).to_floats());
  }
  omp_set_num_threads(saved);
  for (size_t i = 1; i < ys.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(ys[0].data(), ys[i].data(), ys[0].size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(gs[0].data(), gs[i].data(), gs[0].size() * sizeof(float)));
  }
}

}  // namespace
}  // namespace mixtrain::ops
