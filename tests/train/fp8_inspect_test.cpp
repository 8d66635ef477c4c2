// inspect under the float8 policies: each FP8 layer reports its quantized input, weight and gradient with the scale
// the layer would cast them with and the shares saturated and flushed to zero, counted here from the formats'
// definitions (E4M3: magnitudes above 464 saturate, at or below 2^-10 flush), not from the converter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/transformer_layers.h"
#include "mixtrain/precision/fp8_gemm_scales.h"
#include "mixtrain/train/inspect.h"
#include "mixtrain/train/model.h"
#include "quiet_policy_test.h"

namespace mixtrain {
namespace {

class Fp8Inspect : public QuietPolicyTest {
 protected:
  void TearDown() override {
    set_fp8_recipe(Fp8Recipe::kDelayed);
    QuietPolicyTest::TearDown();
  }
};

constexpr int64_t kRows = 32, kFeatures = 8;

std::unique_ptr<Model> model() {
  auto m = std::make_unique<Model>("inspected", 2);
  m->emplace<Dense>(4, "linear", dtype_arg("mixed_float8"));
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  m->compile(make_optimizer("sgd", 1e-3f), Loss("sparse_categorical_crossentropy", true), {});
  return m;
}

// Rows of ones with, in each row, one value of 1000 (past E4M3's range at scale 1) and one of 1e-4 (below half its
// smallest subnormal, 2^-10 = 9.8e-4): 1/8 of the input saturates and 1/8 flushes when cast with scale 1.
std::pair<Tensor, Tensor> data() {
  std::vector<float> x(static_cast<size_t>(kRows * kFeatures), 1.0f);
  std::vector<int32_t> y(static_cast<size_t>(kRows));
  for (int64_t r = 0; r < kRows; ++r) {
    x[static_cast<size_t>(r * kFeatures + r % kFeatures)] = 1000.0f;
    x[static_cast<size_t>(r * kFeatures + (r + 3) % kFeatures)] = -1e-4f;
    y[static_cast<size_t>(r)] = static_cast<int32_t>(r % 3);
  }
  return {Tensor::from_floats({kRows, kFeatures}, x), Tensor::from_ints({kRows}, y)};
}

const Fp8TensorInspection& row(const LayerInspection& l, const std::string& tensor) {
  for (const Fp8TensorInspection& f : l.fp8)
    if (f.tensor == tensor) return f;
  throw std::runtime_error("no fp8 row " + tensor);
}

// Under the block recipe each row of 8 features is one block whose scale 2^2 fits its 1000 (1000 <= 448 * 4):
// nothing saturates, -1e-4 / 4 still flushes (1/8 of the input), and the scale column reads 1.
TEST_F(Fp8Inspect, BlockRecipeCountsEachBlockAtItsOwnScale) {
  set_fp8_recipe(Fp8Recipe::kBlock);
  auto m = model();
  auto [x, y] = data();
  const std::vector<LayerInspection> layers = inspect_layers(*m, x, y, 2, 16);
  const Fp8TensorInspection& in = row(layers[0], "input");
  EXPECT_EQ(in.scale, 1.0f);
  EXPECT_EQ(in.stats.amax, 1000.0f);
  EXPECT_EQ(in.stats.count, kRows * kFeatures);
  EXPECT_EQ(in.stats.saturated_fraction(), 0.0);
  EXPECT_DOUBLE_EQ(in.stats.flushed_fraction(), 1.0 / kFeatures);
  EXPECT_EQ(row(layers[0], "weight").stats.saturated_fraction(), 0.0);
}

TEST_F(Fp8Inspect, ReportsAmaxScaleAndTheSharesSaturatedAndFlushed) {
  auto m = model();
  auto [x, y] = data();
  const std::vector<LayerInspection> layers = inspect_layers(*m, x, y, 2, 16);
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_TRUE(layers[1].fp8.empty()) << "the float32 layer quantizes nothing";
  ASSERT_EQ(layers[0].fp8.size(), 3u);
  // Before its first update the delayed recipe casts with scale 1.
  const Fp8TensorInspection& in = row(layers[0], "input");
  EXPECT_EQ(in.format, DType::kFloat8E4M3FN);
  EXPECT_EQ(in.scale, 1.0f);
  EXPECT_EQ(in.stats.amax, 1000.0f);
  EXPECT_EQ(in.stats.count, kRows * kFeatures);
  EXPECT_DOUBLE_EQ(in.stats.saturated_fraction(), 1.0 / kFeatures);
  EXPECT_DOUBLE_EQ(in.stats.flushed_fraction(), 1.0 / kFeatures);
  // The kernel, counted from its values by the definition.
  const Fp8TensorInspection& w = row(layers[0], "weight");
  const Tensor& kernel = dynamic_cast<const Dense&>(*m->layers()[0]).kernel().value();
  int64_t flushed = 0;
  float amax = 0;
  for (int64_t i = 0; i < kernel.numel(); ++i) {
    const float v = kernel.data<float>()[i];
    flushed += v != 0 && std::fabs(v) <= std::ldexp(1.0, -10);
    amax = std::max(amax, std::fabs(v));
  }
  EXPECT_EQ(w.stats.count, kernel.numel());
  EXPECT_EQ(w.stats.amax, amax);
  EXPECT_EQ(w.stats.flushed, flushed);
  EXPECT_EQ(w.stats.saturated, 0);
  // The gradient goes back in E5M2, one value per output of each batch.
  const Fp8TensorInspection& g = row(layers[0], "grad");
  EXPECT_EQ(g.format, DType::kFloat8E5M2);
  EXPECT_EQ(g.stats.count, kRows * 4);
  EXPECT_GT(g.stats.amax, 0.0f);
  const std::string table = format_inspection(layers);
  EXPECT_NE(table.find("[fp8 input]"), std::string::npos) << table;
  EXPECT_NE(table.find("12.50%"), std::string::npos) << "the input's saturated and flushed shares\n" << table;
}

// After an update the delayed scale comes from the history (448 / 1000 for the input), so nothing saturates any more
// while the 1e-4 values still flush; the current recipe takes each batch's own amax, the same here.
TEST_F(Fp8Inspect, UsesTheScaleTheLayerWouldCastWith) {
  auto [x, y] = data();
  for (Fp8Recipe recipe : {Fp8Recipe::kDelayed, Fp8Recipe::kCurrent}) {
    set_fp8_recipe(recipe);
    auto m = model();
    FitOptions o;
    o.epochs = 1;
    o.batch_size = kRows;
    o.verbose = 0;
    o.shuffle = false;
    m->fit(x, y, o);
    const LayerInspection l = inspect_layers(*m, x, y, 1, kRows)[0];
    const Fp8TensorInspection& in = row(l, "input");
    EXPECT_EQ(in.scale, 448.0f / 1000.0f) << fp8_recipe_name(recipe);
    if (recipe == Fp8Recipe::kDelayed) {
      EXPECT_EQ(in.scale, dynamic_cast<const Dense&>(*m->layers()[0]).fp8_scales()->input.delayed().scale());
    }
    EXPECT_EQ(in.stats.saturated, 0) << fp8_recipe_name(recipe);
    EXPECT_DOUBLE_EQ(in.stats.flushed_fraction(), 1.0 / kFeatures) << fp8_recipe_name(recipe);
  }
}

// MultiHeadAttention quantizes two GEMMs, and each gets its three rows named after it: the query, key and value
// projection reads the layer's input (the data: 1/8 saturates and 1/8 flushes at scale 1, as Dense's above) and its
// three kernels as one (D, 3 heads key_dim) weight, its gradient that of the fused product; the output projection
// reads the attention's result and gives the layer's output, whose gradient it quantizes. After a step each row's
// scale is its own GEMM's delayed scale.
constexpr int64_t kT = 4, kHeads = 2, kKeyDim = 3;

std::unique_ptr<Model> attention_model() {
  auto m = std::make_unique<Model>("attention", 3);
  m->emplace<MultiHeadAttention>(MultiHeadAttentionOptions()
                                     .with_num_heads(kHeads)
                                     .with_key_dim(kKeyDim)
                                     .with_dtype("mixed_float8")
                                     .with_name("block_1/attention"));
  m->emplace<Flatten>();
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  m->compile(make_optimizer("sgd", 1e-3f), Loss("sparse_categorical_crossentropy", true), {});
  return m;
}

// data() as kRows / kT sequences of kT positions.
std::pair<Tensor, Tensor> sequences() {
  auto [x, y] = data();
  const std::vector<int32_t> all = y.to_ints();
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < kRows / kT; ++i) labels.push_back(all[static_cast<size_t>(i)]);
  return {x.reshape({kRows / kT, kT, kFeatures}), Tensor::from_ints({kRows / kT}, labels)};
}

// amax of the float32 values of some variables.
float amax_of(const std::vector<Var>& vars) {
  float amax = 0;
  for (const Var& v : vars)
    for (float e : v.value().to_floats()) amax = std::max(amax, std::fabs(e));
  return amax;
}

TEST_F(Fp8Inspect, AttentionReportsBothProjectionsUnderTheirNames) {
  auto m = attention_model();
  auto [x, y] = sequences();
  const std::vector<LayerInspection> layers = inspect_layers(*m, x, y, 2, 4);
  ASSERT_EQ(layers.size(), 3u);
  std::vector<std::string> names;
  for (const Fp8TensorInspection& f : layers[0].fp8) names.push_back(f.tensor);
  EXPECT_EQ(names, (std::vector<std::string>{"query_key_value/input", "query_key_value/weight", "query_key_value/grad",
                                             "attention_output/input", "attention_output/weight",
                                             "attention_output/grad"}));
  const int64_t width = kHeads * kKeyDim;
  const Fp8TensorInspection& in = row(layers[0], "query_key_value/input");
  EXPECT_EQ(in.format, DType::kFloat8E4M3FN);
  EXPECT_EQ(in.stats.amax, 1000.0f);
  EXPECT_EQ(in.stats.count, kRows * kFeatures);
  EXPECT_DOUBLE_EQ(in.stats.saturated_fraction(), 1.0 / kFeatures);
  EXPECT_DOUBLE_EQ(in.stats.flushed_fraction(), 1.0 / kFeatures);
  std::vector<Var> qkv_kernels, output_kernel;
  for (const Var& w : m->layers()[0]->weights()) {
    const std::string& n = w.name();
    if (n.ends_with("/query/kernel") || n.ends_with("/key/kernel") || n.ends_with("/value/kernel")) qkv_kernels.push_back(w);
    if (n.ends_with("/attention_output/kernel")) output_kernel.push_back(w);
  }
  ASSERT_EQ(qkv_kernels.size(), 3u);
  ASSERT_EQ(output_kernel.size(), 1u);
  const Fp8TensorInspection& qkv_w = row(layers[0], "query_key_value/weight");
  EXPECT_EQ(qkv_w.stats.count, kFeatures * 3 * width);
  EXPECT_EQ(qkv_w.stats.amax, amax_of(qkv_kernels));
  const Fp8TensorInspection& out_w = row(layers[0], "attention_output/weight");
  EXPECT_EQ(out_w.stats.count, width * kFeatures);
  EXPECT_EQ(out_w.stats.amax, amax_of(output_kernel));
  const Fp8TensorInspection& a = row(layers[0], "attention_output/input");
  EXPECT_EQ(a.format, DType::kFloat8E4M3FN);
  EXPECT_EQ(a.stats.count, kRows * width);
  EXPECT_GT(a.stats.amax, 0.0f);
  const Fp8TensorInspection& qkv_g = row(layers[0], "query_key_value/grad");
  EXPECT_EQ(qkv_g.format, DType::kFloat8E5M2);
  EXPECT_EQ(qkv_g.stats.count, kRows * 3 * width);
  EXPECT_GT(qkv_g.stats.amax, 0.0f);
  const Fp8TensorInspection& out_g = row(layers[0], "attention_output/grad");
  EXPECT_EQ(out_g.format, DType::kFloat8E5M2);
  EXPECT_EQ(out_g.stats.count, kRows * kFeatures);
  EXPECT_TRUE(layers[1].fp8.empty() && layers[2].fp8.empty());
  const std::string table = format_inspection(layers);
  EXPECT_NE(table.find("block_1/attention (MultiHeadAttention)"), std::string::npos) << table;
  EXPECT_NE(table.find("[fp8 query_key_value/input]"), std::string::npos) << table;
  EXPECT_NE(table.find("[fp8 attention_output/grad]"), std::string::npos) << table;

  FitOptions o;
  o.epochs = 1;
  o.batch_size = kRows / kT;
  o.verbose = 0;
  o.shuffle = false;
  m->fit(x, y, o);
  const LayerInspection after = inspect_layers(*m, x, y, 1, kRows / kT)[0];
  std::map<std::string, float> scales;
  for (const auto& [key, t] : m->layers()[0]->extra_state())
    if (key.ends_with("/scale")) scales[key] = t.to_floats()[0];
  for (const char* gemm : {"query_key_value", "attention_output"})
    for (const char* tensor : {"input", "weight", "grad"}) {
      const std::string name = std::string(gemm) + "/" + tensor;
      ASSERT_TRUE(scales.count(std::string(gemm) + "/fp8/" + tensor + "/scale")) << name;
      EXPECT_EQ(row(after, name).scale, scales[std::string(gemm) + "/fp8/" + tensor + "/scale"]) << name;
    }
  EXPECT_EQ(row(after, "query_key_value/input").scale, 448.0f / 1000.0f);
}

}  // namespace
}  // namespace mixtrain
