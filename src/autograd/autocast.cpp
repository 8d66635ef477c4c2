#include "mixtrain/autograd/autocast.h"

namespace mixtrain {

namespace {
thread_local AutocastScope* t_scope = nullptr;
}  // namespace

AutocastScope::AutocastScope(bool active) : previous_(t_scope) { t_scope = active ? this : nullptr; }

AutocastScope::~AutocastScope() { t_scope = previous_; }

Var autocast_operand(const Var& v) {
  // Outside layer calls (custom loops, optimizers, regularizers, tests on bare Vars) nothing is in force.
  AutocastScope* scope = t_scope;
  return scope ? scope->read(v) : v;
}

}  // namespace mixtrain
