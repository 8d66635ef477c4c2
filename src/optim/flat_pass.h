// The update pass of Optimizer::apply_flat_gradients: once apply_flat_gradients has checked everything and bound
// the flat slots, the host side of the pass for the arena's device runs and calls the fused update op
// (ops/fused_update.h), whose kernel for that device updates the flat buffers. The CPU pass reads the skip flag and
// keeps the iteration count on the host and runs every rule (an optimizer's own through its update_span()); the
// device pass leaves the flag and the count on the device, for SGD, RMSprop, Adam and AdamW. Private to the optim
// layer and its tests.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/ops/fused_update.h"
#include "mixtrain/optim/optimizer.h"

namespace mixtrain::optim_detail {

// What apply_flat_gradients hands to a pass: checked, with the flat slots bound to the arena's layout.
struct FlatPass {
  ParameterArena& arena;
  const std::vector<Tensor>& flat_grads;  // the caller's gradient buffers, or empty
  std::vector<Tensor> grad_bufs;          // per dtype group (arena.dtypes() order): the gradients the pass reads
  std::vector<std::string> keys;          // per variable: its checkpoint key
  std::vector<char> written;              // per variable: it has a gradient, so it is updated
  const UpdateGate& gate;
};

// A run of consecutive written variables of one update class in one dtype group's buffers: [begin, end).
struct FlatRun {
  size_t group;
  int64_t begin;
  int64_t end;
  int cls;
};

struct FlatPasses {
  // The CPU's pass (src/optim/optimizer_arena.cpp): reads the skip flag in host memory (a skipped step changes
  // nothing), then runs the fused update op on the CPU with the exact count: the rule's fused_rule(), or else the
  // optimizer's update_span() as the op's span rule.
  static void cpu(Optimizer& opt, FlatPass& pass);
  // The device pass: the fused update op on the arena's device, with the flag and the iteration count read there
  // (Optimizer::apply_flat_gradients documents what the host keeps). Refuses an optimizer without a fused_rule().
  static void device(Optimizer& opt, FlatPass& pass);

  // Throws Error naming the optimizer when its rule has no device pass (no fused_rule()).
  static void require_device_rule(const Optimizer& opt, const Device& device);

 private:
  // Gives written variables without slots their (zero) regions of the flat slot buffers: their first update.
  static void create_slots(Optimizer& opt, const FlatPass& pass);
  // Runs of written variables, per group in arena.dtypes() order, in buffer order.
  static std::vector<FlatRun> runs(const Optimizer& opt, const FlatPass& pass);
  // The gradients of the written variables, in the arena's order: what global clipping takes the norm of.
  static std::vector<Tensor> written_grads(const FlatPass& pass);
  // The fused op's groups: the arena's buffers, the pass's gradients, the flat slots, the compute copies and the
  // runs (their tensor on the arena's device made again only when the runs change).
  static std::vector<ops::FusedUpdateGroup> fused_groups(Optimizer& opt, const FlatPass& pass);
  // Global clipping's norm of the written gradients, on the arena's device (undefined without clipping).
  static Tensor clip_norm_tensor(const Optimizer& opt, const FlatPass& pass);
  // Bumps the version of every written variable and marks its compute copies current.
  static void mark_updated(const FlatPass& pass);

  // ---- Sharded (Optimizer::set_shard_group; src/optim/optimizer_shard.cpp) ----
  // Whether the step is skipped: the flag, or sharded, the flags of all ranks (written back into found_inf, so the
  // loss-scale rule that reads it next moves every rank's scale alike).
  static bool skips(const Optimizer& opt, const Tensor& found_inf);
  // Global clipping's norm over all ranks' shares of the written gradients, float32 (1,) on the CPU.
  static Tensor sharded_norm(const Optimizer& opt, const FlatPass& pass);
  // Rows (begin, count, class) of the runs clipped to the share, with begins relative to it.
  static std::vector<int64_t> rows_in_share(const std::vector<int64_t>& rows, const BufferShare& share);
  // Every rank's updated share of the values and compute copies, into every rank's buffers.
  static void gather_updated(const Optimizer& opt, const FlatPass& pass);
};

// Tests: while on, an arena on the CPU takes the device pass (the flag and the count read by the op's kernel), so
// that the device path runs on any machine; with the op's reference kernel installed (ops::kernel::
// fused_update_reference) it runs the device kernels' arithmetic. Off by default.
void set_device_pass_on_cpu_for_testing(bool on);

}  // namespace mixtrain::optim_detail
