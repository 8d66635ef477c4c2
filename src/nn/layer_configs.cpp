// Every built-in layer's configuration, both ways: get_config() writes its constructor's arguments (and options set
// after construction that change what it computes: initializers, regularizer, synchronized statistics) beside the
// name and dtype Layer::get_config() writes, and its factory in the registry reads them back.
#include "builtin_layers.h"
#include "mixtrain/nn/layer_registry.h"
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/nn/swiglu.h"
#include "mixtrain/nn/transformer_layers.h"

namespace mixtrain {

namespace {

Json size2_json(ops::Size2 s) { return Json::array({s.h, s.w}); }
ops::Size2 size2_from(const Json& j) { return {j.at(size_t{0}).as_int64(), j.at(size_t{1}).as_int64()}; }
float float_at(const Json& c, const char* key) { return static_cast<float>(c.at(key).as_number()); }

// The kernel options of Dense and Conv2D.
void add_kernel_options(Json& c, const KernelOptions& o) {
  c["kernel_initializer"] = initializer_name(o.kernel_initializer);
  c["bias_initializer"] = initializer_name(o.bias_initializer);
  c["kernel_regularizer"] = Json::object({{"l1", o.kernel_regularizer.l1}, {"l2", o.kernel_regularizer.l2}});
}
template <typename L>
std::shared_ptr<Layer> with_kernel_options(std::shared_ptr<L> layer, const Json& c) {
  layer->set_kernel_initializer(c.at("kernel_initializer").as_string());
  layer->set_bias_initializer(c.at("bias_initializer").as_string());
  const Json& r = c.at("kernel_regularizer");
  layer->set_kernel_regularizer(Regularizer{float_at(r, "l1"), float_at(r, "l2")});
  return layer;
}

Json pool_json(Json c, const ops::Pool2dOptions& o) {
  c["pool_size"] = size2_json(o.pool_size);
  c["strides"] = size2_json(o.strides);
  c["padding"] = ops::padding_name(o.padding);
  return c;
}
template <typename L>
std::shared_ptr<Layer> pool_from(const Json& c) {
  const LayerBaseArgs b = layer_base_args(c);
  return std::make_shared<L>(size2_from(c.at("pool_size")), size2_from(c.at("strides")),
                             c.at("padding").as_string(), b.dtype, b.name);
}

// A layer whose constructor takes only dtype and name.
template <typename L>
std::shared_ptr<Layer> plain_from(const Json& c) {
  const LayerBaseArgs b = layer_base_args(c);
  return std::make_shared<L>(b.dtype, b.name);
}

std::shared_ptr<Layer> dense_from(const Json& c) {
  const LayerBaseArgs b = layer_base_args(c);
  return with_kernel_options(std::make_shared<Dense>(c.at("units").as_int64(), c.at("activation").as_string(),
                                                     b.dtype, c.at("use_bias").as_bool(), b.name),
                             c);
}

std::shared_ptr<Layer> conv2d_from(const Json& c) {
  const LayerBaseArgs b = layer_base_args(c);
  return with_kernel_options(
      std::make_shared<Conv2D>(c.at("filters").as_int64(), size2_from(c.at("kernel_size")),
                               size2_from(c.at("strides")), c.at("padding").as_string(),
                               c.at("activation").as_string(), c.at("use_bias").as_bool(), b.dtype, b.name),
      c);
}

std::shared_ptr<Layer> batch_norm_from(const Json& c) {
  const LayerBaseArgs b = layer_base_args(c);
  auto layer = std::make_shared<BatchNormalization>(float_at(c, "momentum"), float_at(c, "epsilon"), b.dtype, b.name);
  layer->set_synchronized(c.at("synchronized").as_bool());
  return layer;
}

std::shared_ptr<Layer> reshape_from(const Json& c) {
  const LayerBaseArgs b = layer_base_args(c);
  std::vector<int64_t> target;
  for (const Json& d : c.at("target_shape").as_array()) target.push_back(d.as_int64());
  return std::make_shared<Reshape>(std::move(target), b.dtype, b.name);
}

std::shared_ptr<Layer> attention_from(const Json& c) {
  const LayerBaseArgs b = layer_base_args(c);
  MultiHeadAttentionOptions o;
  o.num_heads = c.at("num_heads").as_int64();
  o.key_dim = c.at("key_dim").as_int64();
  o.dropout = float_at(c, "dropout");
  o.causal = c.at("causal").as_bool();
  o.use_bias = c.at("use_bias").as_bool();
  o.logit_multiplier = float_at(c, "logit_multiplier");
  // Configs saved before rotary existed have no such keys: those models had no rotary embedding.
  if (const Json* r = c.find("rotary")) o.rotary = r->as_bool();
  if (const Json* r = c.find("rotary_base")) o.rotary_base = static_cast<float>(r->as_number());
  o.dtype = b.dtype;
  o.name = b.name;
  return std::make_shared<MultiHeadAttention>(o);
}

// The layers whose constructors take one or two numbers before dtype and name.
template <typename L, typename T>
std::shared_ptr<Layer> one_arg_from(const Json& c, const char* key) {
  const LayerBaseArgs b = layer_base_args(c);
  return std::make_shared<L>(static_cast<T>(c.at(key).as_number()), b.dtype, b.name);
}
template <typename L>
std::shared_ptr<Layer> two_ints_from(const Json& c, const char* first, const char* second) {
  const LayerBaseArgs b = layer_base_args(c);
  return std::make_shared<L>(c.at(first).as_int64(), c.at(second).as_int64(), b.dtype, b.name);
}

}  // namespace

Json Dense::get_config() const {
  Json c = Layer::get_config();
  c["units"] = units_;
  c["activation"] = layer_activation_name(activation_);
  c["use_bias"] = use_bias_;
  add_kernel_options(c, kernel_options_);
  return c;
}

Json Conv2D::get_config() const {
  Json c = Layer::get_config();
  c["filters"] = filters_;
  c["kernel_size"] = size2_json(kernel_size_);
  c["strides"] = size2_json(options_.strides);
  c["padding"] = ops::padding_name(options_.padding);
  c["activation"] = layer_activation_name(activation_);
  c["use_bias"] = use_bias_;
  add_kernel_options(c, kernel_options_);
  return c;
}

Json Activation::get_config() const {
  Json c = Layer::get_config();
  c["activation"] = layer_activation_name(activation_);
  return c;
}

Json Dropout::get_config() const {
  Json c = Layer::get_config();
  c["rate"] = rate_;
  return c;
}

Json Softmax::get_config() const { return Layer::get_config(); }
Json Flatten::get_config() const { return Layer::get_config(); }
Json GlobalAveragePooling2D::get_config() const { return Layer::get_config(); }
Json Add::get_config() const { return Layer::get_config(); }
Json Multiply::get_config() const { return Layer::get_config(); }
Json MaxPooling2D::get_config() const { return pool_json(Layer::get_config(), options_); }
Json AveragePooling2D::get_config() const { return pool_json(Layer::get_config(), options_); }

Json Concatenate::get_config() const {
  Json c = Layer::get_config();
  c["axis"] = axis_;
  return c;
}

Json BatchNormalization::get_config() const {
  Json c = Layer::get_config();
  c["momentum"] = momentum_;
  c["epsilon"] = epsilon_;
  c["synchronized"] = synchronized_;
  return c;
}

Json Reshape::get_config() const {
  Json c = Layer::get_config();
  Json target = Json::array();
  for (int64_t d : target_) target.push_back(d);
  c["target_shape"] = target;
  return c;
}

Json SwiGLU::get_config() const {
  Json c = Layer::get_config();
  c["hidden_units"] = hidden_units_;
  c["output_units"] = output_units_;
  return c;
}

Json Embedding::get_config() const {
  Json c = Layer::get_config();
  c["input_dim"] = input_dim_;
  c["output_dim"] = output_dim_;
  return c;
}

Json PositionEmbedding::get_config() const {
  Json c = Layer::get_config();
  c["sequence_length"] = sequence_length_;
  return c;
}

Json LayerNormalization::get_config() const {
  Json c = Layer::get_config();
  c["epsilon"] = epsilon_;
  return c;
}

Json RMSNormalization::get_config() const {
  Json c = Layer::get_config();
  c["epsilon"] = epsilon_;
  return c;
}

Json MultiHeadAttention::get_config() const {
  Json c = Layer::get_config();
  c["num_heads"] = options_.num_heads;
  c["key_dim"] = options_.key_dim;
  c["dropout"] = options_.dropout;
  c["causal"] = options_.causal;
  c["use_bias"] = options_.use_bias;
  c["logit_multiplier"] = options_.logit_multiplier;
  c["rotary"] = options_.rotary;
  c["rotary_base"] = options_.rotary_base;
  return c;
}

namespace detail {

void register_builtin_layers(AddLayerFactory add) {
  add("Dense", typeid(Dense), dense_from);
  add("Activation", typeid(Activation), [](const Json& c) -> std::shared_ptr<Layer> {
    const LayerBaseArgs b = layer_base_args(c);
    return std::make_shared<Activation>(c.at("activation").as_string(), b.dtype, b.name);
  });
  add("Dropout", typeid(Dropout), [](const Json& c) { return one_arg_from<Dropout, float>(c, "rate"); });
  add("Softmax", typeid(Softmax), plain_from<Softmax>);
  add("Flatten", typeid(Flatten), plain_from<Flatten>);
  add("Conv2D", typeid(Conv2D), conv2d_from);
  add("MaxPooling2D", typeid(MaxPooling2D), pool_from<MaxPooling2D>);
  add("AveragePooling2D", typeid(AveragePooling2D), pool_from<AveragePooling2D>);
  add("GlobalAveragePooling2D", typeid(GlobalAveragePooling2D), plain_from<GlobalAveragePooling2D>);
  add("Add", typeid(Add), plain_from<Add>);
  add("Multiply", typeid(Multiply), plain_from<Multiply>);
  add("Concatenate", typeid(Concatenate), [](const Json& c) { return one_arg_from<Concatenate, int>(c, "axis"); });
  add("BatchNormalization", typeid(BatchNormalization), batch_norm_from);
  add("Reshape", typeid(Reshape), reshape_from);
  add("SwiGLU", typeid(SwiGLU),
      [](const Json& c) { return two_ints_from<SwiGLU>(c, "hidden_units", "output_units"); });
  add("Embedding", typeid(Embedding), [](const Json& c) { return two_ints_from<Embedding>(c, "input_dim", "output_dim"); });
  add("PositionEmbedding", typeid(PositionEmbedding),
      [](const Json& c) { return one_arg_from<PositionEmbedding, int64_t>(c, "sequence_length"); });
  add("LayerNormalization", typeid(LayerNormalization),
      [](const Json& c) { return one_arg_from<LayerNormalization, float>(c, "epsilon"); });
  add("RMSNormalization", typeid(RMSNormalization),
      [](const Json& c) { return one_arg_from<RMSNormalization, float>(c, "epsilon"); });
  add("MultiHeadAttention", typeid(MultiHeadAttention), attention_from);
}

}  // namespace detail

}  // namespace mixtrain
