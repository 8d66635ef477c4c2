// The update pass of Optimizer::apply_flat_gradients, behind a kernel table keyed by the arena's device
// (ops/dispatch.h): once apply_flat_gradients has checked everything and bound the flat slots, the pass of the
// arena's device runs. The CPU pass is the optimizer's own blocked, vectorised pass over the flat buffers (every
// update rule); the device pass builds one fused update op (ops/fused_update.h) for SGD, RMSprop, Adam and AdamW,
// which the device's backend runs. Private to the optim layer and its tests.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/ops/dispatch.h"
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
  // The CPU backend's pass (src/optim/optimizer_arena.cpp): reads the skip flag in host memory, then runs
  // update_span() on blocks of the runs across threads and converts each block into the compute copies.
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
  // Global clipping on the CPU: the factor apply() scales the gradients by (*scaled false: none).
  static float clip_scale(const Optimizer& opt, const FlatPass& pass, bool* scaled);
  // Bumps the version of every written variable and marks its compute copies current.
  static void mark_updated(const FlatPass& pass);
};

using FlatPassFn = void(Optimizer& opt, FlatPass& pass);
// kCpu: FlatPasses::cpu; kCuda: FlatPasses::device (the fused op's table then needs the CUDA backend loaded). A
// test may install FlatPasses::device as the CPU entry: the device pass then runs on the CPU through the fused
// op's CPU kernel, the reference of the device kernels.
ops::KernelTable<FlatPassFn>& flat_pass_table();

}  // namespace mixtrain::optim_detail
