// make_optimizer (declared in optimizer.h): the one place that knows every optimizer by name, in a unit of its own
// so that the base class does not include the optimizers derived from it.
#include <memory>
#include <string_view>

#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/optimizer.h"
#include "mixtrain/optim/rmsprop.h"
#include "mixtrain/optim/sgd.h"

namespace mixtrain {

std::unique_ptr<Optimizer> make_optimizer(std::string_view name, float learning_rate) {
  if (name == "sgd") return std::make_unique<Sgd>(learning_rate);
  if (name == "adam") return std::make_unique<Adam>(learning_rate);
  if (name == "adamw") return std::make_unique<AdamW>(learning_rate);
  if (name == "rmsprop") return std::make_unique<RMSprop>(learning_rate);
  MIXTRAIN_FAIL(kInvalidInput, "unknown optimizer '" << name << "'; valid names: sgd, adam, adamw, rmsprop",
                "use one of: sgd, adam, adamw, rmsprop");
}

}  // namespace mixtrain
