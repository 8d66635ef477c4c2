#include "mixtrain/nn/remat_scope.h"

namespace mixtrain {

namespace {
thread_local int t_segment = 0;
thread_local int t_last_segment = 0;  // segments are numbered anew by each scope, so two scopes never merge
}  // namespace

RematScope::RematScope(bool enabled) : previous_(t_segment) {
  if (enabled) t_segment = ++t_last_segment;
}

RematScope::~RematScope() { t_segment = previous_; }

int current_remat_segment() { return t_segment; }

}  // namespace mixtrain
