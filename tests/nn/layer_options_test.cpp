// Every layer's optional arguments by name: options structs filled with chained `with_` setters in any order, or
// with designated initializers in declaration order, and the short forms Dense(64, "relu") and Conv2D(32, 3, "relu").
// Each case checks that the values reached the layer (its accessors, its configuration, its output), and that a
// layer built from options rebuilds from its configuration (the whole-model file's path).
#include <gtest/gtest.h>

#include <algorithm>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layer_registry.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/nn/swiglu.h"
#include "mixtrain/nn/transformer_layers.h"

namespace mixtrain {
namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = r.uniform(-1.0f, 1.0f);
  return Tensor::from_floats(shape, v);
}

// The layer rebuilt from its configuration has the same configuration (what load_model relies on).
void expect_rebuilds(const Layer& layer) {
  const Json config = layer.get_config();
  std::shared_ptr<Layer> rebuilt = layer_from_config(layer.class_name(), config);
  EXPECT_EQ(rebuilt->get_config(), config) << layer.class_name() << ": " << rebuilt->get_config().dump();
}

TEST(LayerOptions, Conv2DActivationAndPaddingInAnyOrder) {
  // padding is declared before activation: the setters take them the other way round.
  Conv2D c(6, 3, Conv2DOptions().with_activation("relu").with_name("c1").with_padding("same").with_strides(2));
  EXPECT_EQ(c.name(), "c1");
  EXPECT_EQ(c.options().padding, ops::Padding::kSame);
  EXPECT_EQ(c.options().strides, ops::Size2(2));
  // "same" with stride 2 keeps ceil(7 / 2) = 4 positions; "valid" would give 3.
  EXPECT_EQ(c.compute_output_shape(Shape{7, 7, 2}), (Shape{4, 4, 6}));
  EXPECT_EQ(c.get_config().at("activation").as_string(), "relu");
  // The activation acts: the same kernel without it gives negative outputs, with it they are their ReLU.
  Conv2D linear(6, 3, Conv2DOptions().with_strides(2).with_padding("same"));
  Rng rng(1), rng2(1);
  Var x(random_tensor({2, 7, 7, 2}, 2));
  const std::vector<float> y = c(x, CallContext{false, &rng}).value().to_floats();
  const std::vector<float> z = linear(x, CallContext{false, &rng2}).value().to_floats();
  ASSERT_EQ(c.kernel().value().to_floats(), linear.kernel().value().to_floats());  // one seed, one kernel
  ASSERT_EQ(y.size(), z.size());
  EXPECT_LT(*std::min_element(z.begin(), z.end()), 0.0f);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], std::max(z[i], 0.0f)) << i;
  expect_rebuilds(c);
  clear_tape();
}

TEST(LayerOptions, Conv2DDesignatedInitializersAndTheShortForm) {
  Conv2D d(4, 3, {.padding = "same", .activation = "relu", .use_bias = false});
  EXPECT_EQ(d.options().padding, ops::Padding::kSame);
  EXPECT_EQ(d.get_config().at("activation").as_string(), "relu");
  EXPECT_FALSE(d.get_config().at("use_bias").as_bool());

  Conv2D s(32, 3, "relu");  // Keras' Conv2D(32, 3, activation="relu")
  EXPECT_EQ(s.filters(), 32);
  EXPECT_EQ(s.kernel_size(), ops::Size2(3));
  EXPECT_EQ(s.options().strides, ops::Size2(1));
  EXPECT_EQ(s.options().padding, ops::Padding::kValid);
  EXPECT_EQ(s.get_config().at("activation").as_string(), "relu");
  Conv2D strided(8, 3, 2);  // a number in third place is still the stride
  EXPECT_EQ(strided.options().strides, ops::Size2(2));
  EXPECT_EQ(strided.get_config().at("activation").as_string(), "linear");
  EXPECT_THROW(Conv2D(8, 3, "relux"), Error);
  expect_rebuilds(d);
}

TEST(LayerOptions, DenseOptionsInAnyOrderAndTheShortForm) {
  Dense d(5, DenseOptions()
                 .with_name("h")
                 .with_kernel_regularizer(L2(0.5f))
                 .with_use_bias(false)
                 .with_kernel_initializer("zeros")
                 .with_activation("relu")
                 .with_dtype("mixed_bfloat16"));
  EXPECT_EQ(d.name(), "h");
  EXPECT_EQ(d.kernel_regularizer().l2, 0.5f);
  EXPECT_EQ(d.compute_dtype(), DType::kBFloat16);
  Rng rng(3);
  d.build(Shape{4}, rng);
  EXPECT_EQ(d.count_params(), 4 * 5);  // no bias
  for (float w : d.kernel().value().to_floats()) EXPECT_EQ(w, 0.0f);
  EXPECT_EQ(d.get_config().at("activation").as_string(), "relu");
  expect_rebuilds(d);

  Dense designated(3, {.activation = "softmax", .name = "probs"});
  EXPECT_EQ(designated.name(), "probs");
  EXPECT_EQ(designated.get_config().at("activation").as_string(), "softmax");
  Dense short_form(64, "relu");
  EXPECT_EQ(short_form.units(), 64);
  EXPECT_EQ(short_form.get_config().at("activation").as_string(), "relu");
  EXPECT_TRUE(short_form.get_config().at("use_bias").as_bool());
}

TEST(LayerOptions, PoolingNormalizationMergingAndPlainLayers) {
  MaxPooling2D mp(Pooling2DOptions().with_padding("same").with_pool_size(3).with_strides(2));
  EXPECT_EQ(mp.options().pool_size, ops::Size2(3));
  EXPECT_EQ(mp.options().strides, ops::Size2(2));
  EXPECT_EQ(mp.options().padding, ops::Padding::kSame);
  AveragePooling2D ap({.pool_size = 3, .name = "avg"});
  EXPECT_EQ(ap.options().strides, ops::Size2(3));  // strides default to pool_size
  EXPECT_EQ(ap.name(), "avg");
  expect_rebuilds(mp);

  BatchNormalization bn(BatchNormalizationOptions().with_synchronized(true).with_epsilon(1e-5f).with_momentum(0.9f));
  EXPECT_TRUE(bn.synchronized());
  EXPECT_FLOAT_EQ(static_cast<float>(bn.get_config().at("epsilon").as_number()), 1e-5f);
  EXPECT_FLOAT_EQ(static_cast<float>(bn.get_config().at("momentum").as_number()), 0.9f);
  LayerNormalization ln(LayerNormalizationOptions().with_name("ln").with_epsilon(1e-5f));
  EXPECT_EQ(ln.name(), "ln");
  EXPECT_FLOAT_EQ(static_cast<float>(ln.get_config().at("epsilon").as_number()), 1e-5f);
  RMSNormalization rms({.epsilon = 1e-5f});
  EXPECT_FLOAT_EQ(static_cast<float>(rms.get_config().at("epsilon").as_number()), 1e-5f);
  EXPECT_FLOAT_EQ(static_cast<float>(RMSNormalization().get_config().at("epsilon").as_number()), 1e-6f);

  Concatenate cat(ConcatenateOptions().with_name("cat").with_axis(1));
  EXPECT_EQ(cat.name(), "cat");
  EXPECT_EQ(cat.get_config().at("axis").as_int64(), 1);
  MultiHeadAttention mha(MultiHeadAttentionOptions().with_causal(true).with_key_dim(4).with_num_heads(2));
  EXPECT_TRUE(mha.get_config().at("causal").as_bool());
  EXPECT_EQ(mha.get_config().at("num_heads").as_int64(), 2);

  // The layers whose only optional arguments are dtype and name take LayerOptions.
  const LayerOptions o = LayerOptions().with_name("n").with_dtype("float16");
  std::vector<std::shared_ptr<Layer>> plain = {
      std::make_shared<Activation>("relu", o),  std::make_shared<Dropout>(0.5f, o),
      std::make_shared<Softmax>(o),             std::make_shared<Flatten>(o),
      std::make_shared<GlobalAveragePooling2D>(o), std::make_shared<Add>(o),
      std::make_shared<Multiply>(o),            std::make_shared<Reshape>(std::vector<int64_t>{-1}, o),
      std::make_shared<SwiGLU>(4, 2, o),        std::make_shared<Embedding>(10, 4, o),
      std::make_shared<PositionEmbedding>(8, o)};
  for (const auto& l : plain) {
    EXPECT_EQ(l->name(), "n") << l->class_name();
    EXPECT_EQ(l->compute_dtype(), DType::kFloat16) << l->class_name();
    expect_rebuilds(*l);
  }
  Softmax named({.name = "p"});
  EXPECT_EQ(named.name(), "p");
}

}  // namespace
}  // namespace mixtrain
