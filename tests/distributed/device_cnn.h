// The model of the data-parallel tests on (emulated) devices, and its weights read back to the host.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/precision/policy.h"
#include "mixtrain/train/model.h"

namespace mixtrain::distributed_test {

// Rows of 8 features as 2 x 4 images: convolution, batch normalization (over the ranks' global batch when
// synchronized, else per rank with its moving statistics averaged each epoch), ReLU, dropout, a float32 read-out,
// under `policy` (mixed_float16 adds dynamic loss scaling); Adam.
inline std::unique_ptr<Model> device_cnn(const std::string& policy, bool synchronized_bn, uint64_t seed) {
  set_global_policy(policy);
  auto m = std::make_unique<Model>("cnn", seed);
  m->emplace<Reshape>(std::vector<int64_t>{2, 4, 1});
  m->emplace<Conv2D>(8, 3, 1, "same", "linear", /*use_bias=*/false);
  m->emplace<BatchNormalization>(0.9f)->set_synchronized(synchronized_bn);
  m->emplace<Activation>("relu");
  m->emplace<Flatten>();
  m->emplace<Dropout>(0.2f);
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  m->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

// Every weight's values (moving statistics included), read back to the host.
inline std::vector<float> host_values(const Model& m) {
  std::vector<float> all;
  for (const Var& v : m.weights()) {
    const std::vector<float> f = ops::to_device(v.value(), Device::cpu()).to_floats();
    all.insert(all.end(), f.begin(), f.end());
  }
  return all;
}

}  // namespace mixtrain::distributed_test
