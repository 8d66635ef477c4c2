#include "mixtrain/train/losses.h"

#include "mixtrain/autograd/functions.h"

namespace mixtrain {

Loss::Loss(std::string_view name, bool from_logits) : name_(name), from_logits_(from_logits) {
  if (name_ == "mse") name_ = "mean_squared_error";
  MIXTRAIN_CHECK(name_ == "sparse_categorical_crossentropy" || name_ == "categorical_crossentropy" ||
                     name_ == "mean_squared_error",
                 "unknown loss '" << name
                                  << "'; valid losses: sparse_categorical_crossentropy, categorical_crossentropy, "
                                     "mean_squared_error (mse)");
}

Var Loss::operator()(const Var& prediction, const Tensor& y) const {
  if (name_ == "sparse_categorical_crossentropy") return sparse_categorical_crossentropy(prediction, y, from_logits_);
  if (name_ == "categorical_crossentropy") return categorical_crossentropy(prediction, y, from_logits_);
  return mean_squared_error(prediction, y);
}

}  // namespace mixtrain
