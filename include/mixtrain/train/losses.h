// Loss functions as Keras names them. Losses always compute in float32 (they read a float16 prediction
// as float32), so a loss never overflows or underflows in the compute dtype.
#pragma once

#include <string>
#include <string_view>

#include "mixtrain/autograd/var.h"

namespace mixtrain {

class Loss {
 public:
  // name: "sparse_categorical_crossentropy", "categorical_crossentropy" or "mean_squared_error" ("mse").
  // from_logits: predictions are logits (Keras' default is false: probabilities).
  explicit Loss(std::string_view name, bool from_logits = false);
  // Scalar float32 loss averaged over the batch; y is int32 class ids (sparse) or float targets.
  Var operator()(const Var& prediction, const Tensor& y) const;
  const std::string& name() const { return name_; }
  bool from_logits() const { return from_logits_; }
  // Whether targets are class ids (int32), which also enables the accuracy metric.
  bool sparse() const { return name_ == "sparse_categorical_crossentropy"; }

 private:
  std::string name_;
  bool from_logits_;
};

}  // namespace mixtrain
