// RematScope: activation recomputation for the layers of a functional model, as Keras 3's keras.RematScope.
// Layers called on symbolic tensors while a scope is alive form one segment of the graph; when the model runs in
// training, each segment keeps only its inputs and its backward step runs the segment again (autograd/remat.h):
// in the same dtypes, with the same dropout masks, without updating BatchNormalization's moving statistics or
// the FP8 amax histories a second time, reporting to the network's observer once (values in the first run,
// gradients in the backward step). Gradients are the bits a model without the scope gives.
//
//   for (int i = 1; i <= layers; ++i) {
//     RematScope remat;                  // one scope per block: only each block's input is kept
//     h = block(h, "block_" + std::to_string(i));
//   }
//
// Unlike Keras' scope, whose "full" mode recomputes each layer on its own, the layers of one scope are
// recomputed together, so what is kept is the block's input, not every layer's. A scope opened inside another
// starts a segment of its own. RematScope(false) is none (so a flag can choose). Segments are layer calls that
// run one after another; a graph that interleaves two scopes' calls gets more, smaller segments. A layer shared
// between segments, or called on values from several, works too: a segment's inputs are whatever it reads from
// outside. Not recorded in get_config() or save_model(): a model loaded from its file runs without it. A
// synchronized BatchNormalization (set_synchronized) in a segment all-reduces its statistics again when recomputed,
// so every rank must hold rows of each batch (the CLI refuses --remat blocks with --sync-batch-norm).
#pragma once

namespace mixtrain {

class RematScope {
 public:
  explicit RematScope(bool enabled = true);
  ~RematScope();
  RematScope(const RematScope&) = delete;
  RematScope& operator=(const RematScope&) = delete;

 private:
  int previous_;
};

// The segment that layer calls on symbolic tensors on this thread join now: 0 outside every RematScope.
int current_remat_segment();

}  // namespace mixtrain
