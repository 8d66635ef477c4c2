// Every kernel a backend may implement, listed once: the member of ops::Kernels that holds it, its signature (the
// `kernel::<Name>Fn` alias declared beside the op in include/mixtrain/ops/<op>.h, the only place a kernel's
// signature is written) and the op's name in errors. ops/backend.h turns the list into the Op enum, the Kernels
// struct every backend fills, and the typed lookup the op entries call. Adding an op adds one line here
// (docs/ARCHITECTURE.md, "Adding an op").
#pragma once

#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/batch_norm.h"
#include "mixtrain/ops/conv2d.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/embedding.h"
#include "mixtrain/ops/fused_update.h"
#include "mixtrain/ops/global_norm.h"
#include "mixtrain/ops/layer_norm.h"
#include "mixtrain/ops/loss_scale.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/pooling.h"
#include "mixtrain/ops/reduce.h"
#include "mixtrain/ops/softmax.h"
#include "mixtrain/ops/square.h"
#include "mixtrain/ops/transfer.h"

// X(member, signature, "name in errors")
#define MIXTRAIN_KERNEL_LIST(X)                                                                 \
  /* elementwise.h */                                                                           \
  X(fill, FillFn, "fill")                                                                       \
  X(activation, ActivationFn, "activation")                                                     \
  X(activation_backward, ActivationBackwardFn, "activation_backward")                           \
  X(add, AddFn, "add")                                                                          \
  X(scale, ScaleFn, "scale")                                                                    \
  X(bias_add, BiasAddFn, "bias_add")                                                            \
  X(sum_rows, SumRowsFn, "sum_rows")                                                            \
  X(dropout, DropoutFn, "dropout")                                                              \
  X(dropout_mask, DropoutMaskFn, "dropout_mask")                                                \
  X(count_nonfinite, CountNonfiniteFn, "count_nonfinite")                                       \
  /* square.h */                                                                                \
  X(square, SquareFn, "square")                                                                 \
  X(square_backward, SquareBackwardFn, "square_backward")                                       \
  /* transfer.h */                                                                              \
  X(cast, CastFn, "cast")                                                                       \
  /* loss_scale.h */                                                                            \
  X(unscale_and_check, UnscaleCheckFn, "unscale_and_check")                                     \
  X(unscale_and_count_nonfinite, UnscaleFn, "unscale_and_count_nonfinite")                      \
  X(update_loss_scale, UpdateLossScaleFn, "update_loss_scale")                                  \
  X(apply_loss_scale, ApplyLossScaleFn, "apply_loss_scale")                                     \
  /* reduce.h */                                                                                \
  X(reduce_sum, ReduceSumFn, "reduce_sum")                                                      \
  X(reduce_sum_backward, ReduceSumBackwardFn, "reduce_sum_backward")                            \
  /* softmax.h */                                                                               \
  X(softmax, SoftmaxFn, "softmax")                                                              \
  X(softmax_backward, SoftmaxBackwardFn, "softmax_backward")                                    \
  /* losses.h */                                                                                \
  X(crossentropy, CrossentropyFn, "crossentropy")                                               \
  X(crossentropy_backward, CrossentropyBackwardFn, "crossentropy_backward")                     \
  X(mse, MseFn, "mean_squared_error")                                                           \
  X(mse_backward, MseBackwardFn, "mean_squared_error_backward")                                 \
  X(sum_all, SumAllFn, "sum")                                                                   \
  X(accuracy, AccuracyFn, "sparse_categorical_accuracy")                                        \
  X(count_correct, CountCorrectFn, "count_correct")                                             \
  X(penalty, PenaltyFn, "regularization_penalty")                                               \
  X(penalty_backward, PenaltyBackwardFn, "regularization_penalty_backward")                     \
  /* matmul.h */                                                                                \
  X(bmm, BmmFn, "bmm")                                                                          \
  X(linear_activation, LinearActivationFn, "linear_activation")                                 \
  /* conv2d.h */                                                                                \
  X(conv2d, Conv2dFn, "conv2d")                                                                 \
  X(conv2d_backward, Conv2dBackwardFn, "conv2d_backward")                                       \
  /* pooling.h */                                                                               \
  X(pool2d, Pool2dFn, "pool2d")                                                                 \
  X(pool2d_backward, Pool2dBackwardFn, "pool2d_backward")                                       \
  X(global_average_pool2d, GlobalAveragePool2dFn, "global_average_pool2d")                      \
  X(global_average_pool2d_backward, GlobalAveragePool2dBackwardFn,                              \
    "global_average_pool2d_backward")                                                           \
  /* batch_norm.h */                                                                            \
  X(batch_moments, BatchMomentsFn, "batch_moments")                                             \
  X(moving_statistics, MovingStatisticsFn, "update_moving_statistics")                          \
  X(batch_norm, BatchNormFn, "batch_norm")                                                      \
  X(batch_norm_backward, BatchNormBackwardFn, "batch_norm_backward")                            \
  X(batch_channel_sums, BatchChannelSumsFn, "batch_channel_sums")                               \
  X(batch_norm_input_grad, BatchNormInputGradFn, "batch_norm_input_grad")                       \
  /* layer_norm.h */                                                                            \
  X(layer_norm, LayerNormFn, "layer_norm")                                                      \
  X(layer_norm_backward, LayerNormBackwardFn, "layer_norm_backward")                            \
  /* embedding.h */                                                                             \
  X(embedding, EmbeddingFn, "embedding")                                                        \
  X(embedding_backward, EmbeddingBackwardFn, "embedding_backward")                              \
  /* attention.h */                                                                             \
  X(attention, AttentionFn, "scaled_dot_product_attention")                                     \
  X(attention_backward, AttentionBackwardFn, "scaled_dot_product_attention_backward")           \
  /* fused_update.h, global_norm.h */                                                           \
  X(fused_update, FusedUpdateFn, "fused_update")                                                \
  X(global_norm, GlobalNormFn, "global_norm")
