// Sequential: a linear stack of layers, as keras.Sequential (the short form of a Network).
#pragma once

#include "mixtrain/nn/network.h"

namespace mixtrain {

class Sequential : public Network {
 public:
  explicit Sequential(std::string name = "sequential") : Network(std::move(name)) {}
};

}  // namespace mixtrain
