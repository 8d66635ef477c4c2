// The built-in models of the registry: an MLP, a convolutional network and a small residual network.
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/train/model_registry.h"
#include "mixtrain/train/transformer_model.h"
#include "mixtrain/train/run.h"

namespace mixtrain {

namespace {

// Batch normalization momentum of the built-in models: 0.9 (PyTorch's default, momentum=0.1 there) rather
// than Keras' 0.99. With 0.99 the moving statistics keep e^-1 of their initial values after 100 steps, so
// a run of a few hundred steps evaluates with statistics far from the data's; 0.9 settles in tens of steps.
constexpr float kBatchNormMomentum = 0.9f;

// Dense(hidden..., relu) then a float32 Dense(num_classes) output.
std::unique_ptr<Model> build_mlp(const RunConfig& cfg, const ModelInputSpec& in) {
  auto model = std::make_unique<Model>("mlp", cfg.seed);
  for (int64_t h : cfg.hidden) model->emplace<Dense>(h, "relu");
  // Output logits in float32: the loss and softmax then never see float16 values.
  model->emplace<Dense>(in.num_classes, "linear", dtype_arg("float32"));
  return model;
}

// Two Conv-BatchNorm-ReLU-MaxPool stages, then Dense(hidden[0] or 128, relu), dropout and float32 logits.
std::unique_ptr<Model> build_cnn(const RunConfig& cfg, const ModelInputSpec& in) {
  const std::vector<int64_t> image = image_shape_of(in);
  auto model = std::make_unique<Model>("cnn", cfg.seed);
  model->emplace<Reshape>(image);
  for (int64_t filters : {32, 64}) {
    // No bias before BatchNormalization: its beta is the bias.
    model->emplace<Conv2D>(filters, 3, 1, "same", "linear", /*use_bias=*/false);
    model->emplace<BatchNormalization>(kBatchNormMomentum);
    model->emplace<Activation>("relu");
    model->emplace<MaxPooling2D>(2);
  }
  model->emplace<Flatten>();
  model->emplace<Dense>(cfg.hidden.empty() ? 128 : cfg.hidden.front(), "relu");
  model->emplace<Dropout>(0.3f);
  model->emplace<Dense>(in.num_classes, "linear", dtype_arg("float32"));
  return model;
}

// Conv-BN(-ReLU) with a scoped name, e.g. "block_1/conv_1" and "block_1/bn_1".
SymbolicTensor conv_bn(const SymbolicTensor& x, int64_t filters, int64_t kernel, const std::string& scope, int index,
                       bool relu) {
  auto conv = make_layer<Conv2D>(filters, kernel, 1, "same", "linear", /*use_bias=*/false);
  conv->set_name(scope + "/conv_" + std::to_string(index));
  auto bn = make_layer<BatchNormalization>(kBatchNormMomentum);
  bn->set_name(scope + "/bn_" + std::to_string(index));
  SymbolicTensor y = (*bn)((*conv)(x));
  if (!relu) return y;
  auto act = make_layer<Activation>("relu");
  act->set_name(scope + "/relu_" + std::to_string(index));
  return (*act)(y);
}

// A residual block: two 3x3 Conv-BN on the main path; the skip path is the input, or a 1x1 Conv-BN
// projection when the channel count changes; their sum goes through ReLU.
SymbolicTensor residual_block(const SymbolicTensor& x, int64_t filters, const std::string& scope) {
  SymbolicTensor main = conv_bn(x, filters, 3, scope, 1, true);
  main = conv_bn(main, filters, 3, scope, 2, false);
  SymbolicTensor skip = x.shape()[-1] == filters ? x : conv_bn(x, filters, 1, scope + "/shortcut", 1, false);
  auto add = make_layer<Add>();
  add->set_name(scope + "/add");
  auto act = make_layer<Activation>("relu");
  act->set_name(scope + "/out");
  return (*act)((*add)({main, skip}));
}

// Stem Conv-BN-ReLU (32) and pooling, a residual block of 32, pooling, a projected block of 64, global
// average pooling and float32 logits: written with the functional API.
std::unique_ptr<Model> build_resnet(const RunConfig& cfg, const ModelInputSpec& in) {
  const std::vector<int64_t> image = image_shape_of(in);
  int64_t flat = 1;
  for (int64_t d : image) flat *= d;
  SymbolicTensor x = Input({flat}, DType::kFloat32, "pixels");
  SymbolicTensor h = (*make_layer<Reshape>(image))(x);
  h = conv_bn(h, 32, 3, "stem", 1, true);
  h = (*make_layer<MaxPooling2D>(2))(h);
  h = residual_block(h, 32, "block_1");
  h = (*make_layer<MaxPooling2D>(2))(h);
  h = residual_block(h, 64, "block_2");
  h = (*make_layer<GlobalAveragePooling2D>())(h);
  auto head = make_layer<Dense>(in.num_classes, "linear", dtype_arg("float32"));
  head->set_name("logits");
  SymbolicTensor out = (*head)(h);
  return std::make_unique<Model>(std::vector<SymbolicTensor>{x}, std::vector<SymbolicTensor>{out}, "resnet", cfg.seed);
}

// A character language model on windows of sample_shape {T} ids over num_classes characters.
std::unique_ptr<Model> build_transformer(const RunConfig& cfg, const ModelInputSpec& in) {
  MIXTRAIN_CHECK(in.sample_shape.size() == 1 && in.sample_shape[0] == in.num_features,
                 "the transformer reads windows of character ids (--data moby-dick or text:PATH); this data has "
                 "samples of " << in.num_features << " features");
  TransformerLMOptions o;
  o.vocabulary_size = in.num_classes;
  o.context_length = in.sample_shape[0];
  o.width = cfg.width;
  o.num_layers = cfg.num_layers;
  o.num_heads = cfg.num_heads;
  o.dropout = cfg.dropout;
  o.attention_logit_multiplier = cfg.attention_logit_multiplier;
  return build_transformer_lm(o, cfg.seed);
}

}  // namespace

void register_builtin_models() {
  register_model("mlp", "Dense layers of --hidden sizes with ReLU, float32 logits", build_mlp);
  register_model("cnn", "two Conv-BatchNorm-ReLU-MaxPool stages (32, 64 filters), Dense, float32 logits", build_cnn);
  register_model("resnet", "a small residual network (functional API): stem, two residual blocks, global pooling",
                 build_resnet);
  register_model("transformer",
                 "a character language model: decoder-only transformer (--context, --width, --layers, --heads)",
                 build_transformer);
}

}  // namespace mixtrain
