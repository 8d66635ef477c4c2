#include "mixtrain/train/float32_shadow.h"

namespace mixtrain {

Float32Shadow::Float32Shadow(Network& model, LayerObserver* observer)
    : model_(model), previous_observer_(model.observer()) {
  for (auto& l : model_.layers()) {
    policies_.emplace(l.get(), l->dtype_policy());
    l->set_dtype_policy(DTypePolicy::from_name("float32"));
  }
  model_.set_observer(observer);
}

Float32Shadow::~Float32Shadow() {
  model_.set_observer(previous_observer_);
  for (auto& l : model_.layers()) l->set_dtype_policy(policies_.at(l.get()));
}

}  // namespace mixtrain
