// Trains a tiny mixed_bfloat16 classifier on XOR-like data with the installed library.
#include <iostream>

#include "mixtrain/nn/layers.h"
#include "mixtrain/precision/policy.h"
#include "mixtrain/train/model.h"

int main() {
  using namespace mixtrain;
  set_global_policy("mixed_bfloat16");
  Model model("xor", /*seed=*/3);
  model.emplace<Dense>(16, "tanh");
  model.emplace<Dense>(2, "linear", dtype_arg("float32"));
  model.compile(make_optimizer("adam", 0.05f), Loss("sparse_categorical_crossentropy", /*from_logits=*/true),
                {"accuracy"});
  std::vector<float> xs;
  std::vector<int32_t> ys;
  for (int i = 0; i < 256; ++i) {
    const int a = i & 1, b = (i >> 1) & 1;
    xs.push_back(a ? 1.0f : -1.0f);
    xs.push_back(b ? 1.0f : -1.0f);
    ys.push_back(a ^ b);
  }
  Tensor x = Tensor::from_floats({256, 2}, xs), y = Tensor::from_ints({256}, ys);
  FitOptions options;
  options.epochs = 30;
  options.batch_size = 32;
  model.fit(x, y, options);
  const EvaluateResult r = model.evaluate(x, y);
  model.summary(std::cout);
  std::cout << "xor accuracy " << r.accuracy << "\n";
  return r.accuracy == 1.0 ? 0 : 1;
}
