// The built-in models of the registry: an MLP, a convolutional network and a small residual network.
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/remat_scope.h"
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

// The image shape of `in` for a model that halves it twice (two 2x2 max-poolings): each side must keep at least
// one pixel after them, so at least 4. A 3x3 image became an internal Dense error about a (0,) sample.
std::vector<int64_t> image_pooled_twice(const ModelInputSpec& in, const char* model) {
  const std::vector<int64_t> image = image_shape_of(in);
  MIXTRAIN_CHECK(image[0] >= 4 && image[1] >= 4,
                 "the " << model << " model halves its images twice (two 2x2 poolings), so they need at least 4x4 "
                        << "pixels; this data's are " << image[0] << "x" << image[1]
                        << " (use --model mlp for samples this small)");
  return image;
}

// Two Conv-BatchNorm-ReLU-MaxPool stages, then Dense(hidden[0] or 128, relu), dropout and float32 logits.
std::unique_ptr<Model> build_cnn(const RunConfig& cfg, const ModelInputSpec& in) {
  const std::vector<int64_t> image = image_pooled_twice(in, "cnn");
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
  const std::vector<int64_t> image = image_pooled_twice(in, "resnet");
  int64_t flat = 1;
  for (int64_t d : image) flat *= d;
  SymbolicTensor x = Input({flat}, DType::kFloat32, "pixels");
  SymbolicTensor h = (*make_layer<Reshape>(image))(x);
  h = conv_bn(h, 32, 3, "stem", 1, true);
  h = (*make_layer<MaxPooling2D>(2))(h);
  // --remat blocks: each block keeps only its input; its Conv-BN layers run again in backward (nn/remat_scope.h).
  const bool remat = cfg.remat == "blocks";
  {
    RematScope scope(remat);
    h = residual_block(h, 32, "block_1");
  }
  h = (*make_layer<MaxPooling2D>(2))(h);
  {
    RematScope scope(remat);
    h = residual_block(h, 64, "block_2");
  }
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
  o.norm = cfg.norm;
  o.mlp = cfg.mlp;
  o.positions = cfg.positions;
  o.flash_attention = cfg.attention == "tiled";
  o.fused_loss = cfg.fused_loss;
  o.remat = cfg.remat == "blocks";
  o.recompute_activations = cfg.remat == "activations";
  o.mlp_outliers_from = cfg.mlp_outliers_from;
  o.mlp_outliers_log2 = cfg.mlp_outliers_log2;
  o.mlp_outliers_rise = cfg.mlp_outliers_rise;
  return build_transformer_lm(o, cfg.seed);
}

// Dense(units) on `in` inputs: the kernel and the bias.
double dense_weights(double in, double units) { return (in + 1.0) * units; }

ModelSizeEstimate estimate_mlp(const RunConfig& cfg, const ModelInputSpec& in) {
  ModelSizeEstimate e;
  double width = static_cast<double>(in.num_features);
  std::vector<double> outputs;
  for (int64_t h : cfg.hidden) outputs.push_back(static_cast<double>(h));
  outputs.push_back(static_cast<double>(in.num_classes));
  for (double units : outputs) {
    e.weights += dense_weights(width, units);
    e.activations_per_sample += units;
    e.largest_activation_per_sample = std::max(e.largest_activation_per_sample, units);
    width = units;
  }
  return e;
}

// The dense head only (the two convolution stages add 18,496 weights and more activations: a lower bound).
ModelSizeEstimate estimate_cnn(const RunConfig& cfg, const ModelInputSpec& in) {
  const std::vector<int64_t> image = image_shape_of(in);
  const double flat = static_cast<double>(image[0] / 4) * static_cast<double>(image[1] / 4) * 64.0;
  const double units = static_cast<double>(cfg.hidden.empty() ? 128 : cfg.hidden.front());
  ModelSizeEstimate e;
  e.weights = dense_weights(flat, units) + dense_weights(units, static_cast<double>(in.num_classes));
  e.activations_per_sample = flat + 2.0 * units;  // flattened features, the hidden layer and its dropout
  e.largest_activation_per_sample = std::max(flat, units);
  return e;
}

// build_resnet's weights exactly (each BatchNormalization holds 4 per channel: gamma, beta and the two moving
// statistics) and every layer output it keeps for backward, per sample. Under --remat blocks a block keeps its input
// (the pooling before it, counted) and its output, and one block's outputs at a time live again while its backward
// step recomputes it.
ModelSizeEstimate estimate_resnet(const RunConfig& cfg, const ModelInputSpec& in) {
  const std::vector<int64_t> image = image_shape_of(in);
  const double channels = static_cast<double>(image.size() == 3 ? image[2] : 1);
  const auto conv_bn = [](double in_ch, double out_ch, double kernel) { return kernel * kernel * in_ch * out_ch + 4 * out_ch; };
  ModelSizeEstimate e;
  e.weights = conv_bn(channels, 32, 3) + 2 * conv_bn(32, 32, 3) + conv_bn(32, 64, 3) + conv_bn(64, 64, 3) +
              conv_bn(32, 64, 1) + dense_weights(64, static_cast<double>(in.num_classes));
  const double full = static_cast<double>(image[0]) * static_cast<double>(image[1]);
  const double half = static_cast<double>(image[0] / 2) * static_cast<double>(image[1] / 2);
  const double quarter = static_cast<double>(image[0] / 4) * static_cast<double>(image[1] / 4);
  // stem conv, BN, ReLU; pool; block 1: conv, BN, ReLU, conv, BN, add, ReLU; pool; block 2: the same seven plus the
  // shortcut's conv and BN, at 64 channels; global pooling and the logits.
  const double block_1 = 7 * half * 32, block_2 = 9 * quarter * 64;
  const double blocks = cfg.remat == "blocks" ? half * 32 + quarter * 64 + std::max(block_1, block_2) : block_1 + block_2;
  e.activations_per_sample = 3 * full * 32 + half * 32 + quarter * 32 + blocks + 64 + static_cast<double>(in.num_classes);
  e.largest_activation_per_sample = full * 32;
  return e;
}

// Per block at least the attention's four D x D projections and the feed-forward's D x rD pair, plus the token
// and position tables; one (T, D) activation per block is a lower bound on what backward keeps.
ModelSizeEstimate estimate_transformer(const RunConfig& cfg, const ModelInputSpec& in) {
  const double d = static_cast<double>(cfg.width);
  const double t = static_cast<double>(in.num_features);
  const double ratio = static_cast<double>(TransformerLMOptions{}.mlp_ratio);  // build_transformer keeps it
  ModelSizeEstimate e;
  e.weights = static_cast<double>(cfg.num_layers) * (4.0 + 2.0 * ratio) * d * d +
              (static_cast<double>(in.num_classes) + t) * d;
  // The logits: a score per character at every position, the widest output by far for a large vocabulary.
  const double logits = t * static_cast<double>(in.num_classes);
  e.activations_per_sample = static_cast<double>(cfg.num_layers) * t * d + logits;
  e.largest_activation_per_sample = std::max(t * d, logits);
  return e;
}

}  // namespace

void register_builtin_models() {
  register_model("mlp", "Dense layers of --hidden sizes with ReLU, float32 logits", build_mlp,
                 estimate_mlp);
  register_model("cnn", "two Conv-BatchNorm-ReLU-MaxPool stages (32, 64 filters), Dense, float32 logits", build_cnn,
                 estimate_cnn);
  register_model("resnet", "a small residual network (functional API): stem, two residual blocks, global pooling",
                 build_resnet, estimate_resnet);
  register_model("transformer",
                 "a character language model: decoder-only transformer (--context, --width, --layers, --heads)",
                 build_transformer, estimate_transformer);
}

}  // namespace mixtrain
