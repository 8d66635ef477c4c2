// Every built-in layer's configuration (Layer::get_config) rebuilds the same layer through the registry, and the
// registry's errors name what is wrong.
#include "mixtrain/nn/layer_registry.h"

#include <gtest/gtest.h>

#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/nn/swiglu.h"
#include "mixtrain/nn/transformer_layers.h"

namespace mixtrain {
namespace {

// One of every built-in layer, with arguments other than the defaults wherever a layer has them.
std::vector<std::shared_ptr<Layer>> every_builtin_layer() {
  const DTypeArg bf16 = dtype_arg("mixed_bfloat16"), f16 = dtype_arg("mixed_float16");
  auto dense = std::make_shared<Dense>(7, "softmax", bf16, false, "head");
  dense->set_kernel_initializer("he_normal").set_bias_initializer("ones").set_kernel_regularizer(L1L2(0.25f, 0.5f));
  auto conv = std::make_shared<Conv2D>(5, ops::Size2{3, 1}, ops::Size2{2, 1}, "same", "gelu", false, f16, "conv");
  conv->set_kernel_initializer("lecun_uniform");
  auto bn = std::make_shared<BatchNormalization>(0.8f, 1e-4f, f16, "bn");
  bn->set_synchronized(true);
  return {dense,
          conv,
          std::make_shared<Activation>("tanh", f16, "act"),
          std::make_shared<Dropout>(0.375f, bf16, "drop"),
          std::make_shared<Softmax>(dtype_arg("float32"), "probs"),
          std::make_shared<Flatten>(bf16, "flat"),
          std::make_shared<MaxPooling2D>(ops::Size2{3, 2}, ops::Size2{1, 2}, "same", f16, "max"),
          std::make_shared<AveragePooling2D>(ops::Size2{2, 3}, std::nullopt, "valid", bf16, "avg"),
          std::make_shared<GlobalAveragePooling2D>(f16, "gap"),
          std::make_shared<Add>(bf16, "sum"),
          std::make_shared<Multiply>(f16, "gate"),
          std::make_shared<Concatenate>(-2, bf16, "join"),
          bn,
          std::make_shared<Reshape>(std::vector<int64_t>{4, -1}, f16, "shape"),
          std::make_shared<SwiGLU>(12, 5, bf16, "ffn"),
          std::make_shared<Embedding>(31, 6, f16, "tokens"),
          std::make_shared<PositionEmbedding>(17, bf16, "positions"),
          std::make_shared<LayerNormalization>(1e-5f, f16, "ln"),
          std::make_shared<RMSNormalization>(1e-4f, bf16, "rms"),
          std::make_shared<MultiHeadAttention>(MultiHeadAttentionOptions{.num_heads = 3, .key_dim = 5, .dropout = 0.125f,
                                                                         .causal = true, .use_bias = false,
                                                                         .logit_multiplier = 2.0f, .dtype = f16,
                                                                         .name = "mha"})};
}

TEST(LayerRegistry, EveryBuiltinLayerRebuildsFromItsConfig) {
  const std::vector<std::shared_ptr<Layer>> layers = every_builtin_layer();
  EXPECT_EQ(layers.size(), 20u);
  for (const auto& layer : layers) {
    const std::optional<std::string> name = registered_layer_name(*layer);
    ASSERT_TRUE(name.has_value()) << layer->class_name();
    EXPECT_EQ(*name, layer->class_name());
    const Json config = layer->get_config();
    std::shared_ptr<Layer> rebuilt = layer_from_config(*name, config);
    EXPECT_EQ(typeid(*rebuilt), typeid(*layer)) << *name;
    EXPECT_EQ(rebuilt->get_config(), config) << *name << ": " << rebuilt->get_config().dump();
    EXPECT_EQ(rebuilt->name(), layer->name());
    EXPECT_TRUE(rebuilt->has_explicit_name());
    EXPECT_EQ(rebuilt->dtype_policy().name(), layer->dtype_policy().name());
  }
  // The rebuilt Dense reads its options back, not only the same JSON.
  auto dense = std::dynamic_pointer_cast<Dense>(layer_from_config("Dense", layers[0]->get_config()));
  EXPECT_EQ(dense->units(), 7);
  EXPECT_EQ(dense->kernel_regularizer().l1, 0.25f);
  EXPECT_EQ(dense->kernel_regularizer().l2, 0.5f);
  EXPECT_EQ(dense->compute_dtype(), DType::kBFloat16);
  EXPECT_GE(registered_layer_names().size(), 20u);  // the built-ins, and what other tests registered
}

TEST(LayerRegistry, RotaryAttentionRebuildsAndOlderConfigsMeanNoRotary) {
  const MultiHeadAttention mha(
      MultiHeadAttentionOptions{}.with_num_heads(2).with_key_dim(4).with_causal(true).with_rotary(true).with_rotary_base(
          500.0f));
  const Json config = mha.get_config();
  auto rebuilt = std::dynamic_pointer_cast<MultiHeadAttention>(layer_from_config("MultiHeadAttention", config));
  ASSERT_TRUE(rebuilt);
  EXPECT_TRUE(rebuilt->options().rotary);
  EXPECT_EQ(rebuilt->options().rotary_base, 500.0f);
  EXPECT_EQ(rebuilt->get_config(), config);
  Json older = config;  // a config written before the rotary keys existed
  std::erase_if(older.as_object(), [](const auto& kv) { return kv.first.rfind("rotary", 0) == 0; });
  ASSERT_FALSE(older.contains("rotary"));
  auto plain = std::dynamic_pointer_cast<MultiHeadAttention>(layer_from_config("MultiHeadAttention", older));
  EXPECT_FALSE(plain->options().rotary);
  // An odd key_dim cannot turn in pairs.
  EXPECT_THROW(MultiHeadAttention(MultiHeadAttentionOptions{}.with_num_heads(1).with_key_dim(5).with_rotary(true)),
               Error);
}

class Probe : public Layer {
 public:
  explicit Probe(DTypeArg dtype = std::nullopt, const std::string& name = {}) : Layer("probe", dtype, name) {}
  static std::shared_ptr<Probe> from_config(const Json& c) {
    const LayerBaseArgs b = layer_base_args(c);
    return std::make_shared<Probe>(b.dtype, b.name);
  }
};

TEST(LayerRegistry, RegistrationsAndUnknownNamesAreChecked) {
  register_layer<Probe>("registry_test>Probe");
  register_layer<Probe>("registry_test>Probe");  // the same registration again changes nothing
  EXPECT_EQ(registered_layer_name(Probe()), "registry_test>Probe");
  EXPECT_THROW(register_layer<Probe>("registry_test>Other"), Error);  // one type, one name
  EXPECT_THROW(register_layer<Probe>("Dense"), Error);                // a name taken by another type
  try {
    layer_from_config("registry_test>Missing", Probe(std::nullopt, "p").get_config());
    FAIL() << "an unknown class was built";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown layer class 'registry_test>Missing'"), std::string::npos);
    EXPECT_NE(e.hint().find("MIXTRAIN_REGISTER_LAYER"), std::string::npos);
  }
  // A configuration that lacks an argument is refused naming the class and a missing key.
  try {
    layer_from_config("Dense", Json::object({{"name", "d"}, {"dtype", "float32"}}));
    FAIL() << "a Dense without units was built";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'Dense'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has no key"), std::string::npos) << e.what();
  }
  EXPECT_THROW(layer_base_args(Json::object({{"name", "d"}, {"dtype", "float64x"}})), Error);
}

}  // namespace
}  // namespace mixtrain
