// A small residual network written with the functional API, trained under mixed_bfloat16 (or the policy
// in $POLICY) on synthetic 8x8 textures (the class: horizontal stripes, vertical stripes, a checkerboard or
// a flat image, under noise), then saved and reloaded into a second model built in the same process.
// Exits non-zero when it does not learn or the reload differs.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/precision/policy.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"

using namespace mixtrain;

namespace {

std::unique_ptr<Model> small_resnet(uint64_t seed) {
  SymbolicTensor x = Input({64}, DType::kFloat32, "pixels");
  SymbolicTensor h = (*make_layer<Reshape>(std::vector<int64_t>{8, 8, 1}))(x);
  auto conv = make_layer<Conv2D>(8, 3, 1, "same");
  conv->set_name("block_1/conv");  // weights saved as "block_1/conv/kernel" and "block_1/conv/bias"
  SymbolicTensor y = (*make_layer<Activation>("relu"))((*make_layer<BatchNormalization>(0.9f))((*conv)(h)));
  SymbolicTensor skip = (*make_layer<Conv2D>(8, 1, 1, "same"))(h);
  SymbolicTensor r = (*make_layer<Add>())({y, skip});
  SymbolicTensor pooled = (*make_layer<GlobalAveragePooling2D>())(r);
  SymbolicTensor logits = (*make_layer<Dense>(4, "linear", dtype_arg("float32")))(pooled);  // float32 output
  return std::make_unique<Model>(std::vector<SymbolicTensor>{x}, std::vector<SymbolicTensor>{logits},
                                 "small_resnet", seed);
}

}  // namespace

int main() {
  set_global_policy(std::getenv("POLICY") ? std::getenv("POLICY") : "mixed_bfloat16");  // before the model is built, as in Keras
  auto model = small_resnet(1);
  auto twin = small_resnet(2);  // a second model in the same process: same weight paths
  set_global_policy("float32");

  const int64_t n = 512;
  Rng rng(7);
  std::vector<float> pixels(static_cast<size_t>(n * 64));
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(i % 4);
    labels[static_cast<size_t>(i)] = c;
    for (int p = 0; p < 64; ++p) {
      const int row = p / 8, col = p % 8;
      const bool lit = c == 0 ? row % 2 == 0 : c == 1 ? col % 2 == 0 : c == 2 ? (row + col) % 2 == 0 : false;
      pixels[static_cast<size_t>(i * 64 + p)] = (lit ? 1.0f : 0.0f) + 0.3f * rng.normal();
    }
  }
  Tensor x = Tensor::from_floats({n, 64}, pixels), y = Tensor::from_ints({n}, labels);

  model->compile(make_optimizer("adam", 1e-2f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  model->summary(std::cout);
  FitOptions options;
  options.epochs = 6;
  options.batch_size = 32;
  model->fit(x, y, options);
  const EvaluateResult r = model->evaluate(x, y);
  std::printf("accuracy after 6 epochs: %.4f\n", r.accuracy);

  const std::string path =
      (std::filesystem::temp_directory_path() / ("functional_example_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  save_checkpoint(path, *model, CheckpointInfo{});
  load_checkpoint(path, *twin);  // matched by path, e.g. block_1/conv/kernel
  std::filesystem::remove(path);
  const bool same = model->predict(x).to_floats() == twin->predict(x).to_floats();
  std::printf("reloaded model predicts identically: %s\n", same ? "yes" : "no");
  return r.accuracy > 0.9 && same ? 0 : 1;
}
