#include "mixtrain/nn/session.h"

#include "mixtrain/autograd/tape.h"
#include "mixtrain/precision/policy.h"

namespace mixtrain {

void clear_session() {
  set_global_policy("float32");
  clear_tape();
}

}  // namespace mixtrain
