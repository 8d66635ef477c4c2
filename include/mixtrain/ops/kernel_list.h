// Every kernel a backend may implement, listed once: the member name (Op::<member>) and the op's name in errors.
// ops/backend.h turns the list into the Kernels every backend fills and the lookup the op entries call; each op's
// header gives its kernels' signatures (`namespace kernel { using <Name>Fn = ...; }`, the only place a signature is
// written) and ties each to its Op with MIXTRAIN_KERNEL_SIGNATURE. Adding an op adds one line per kernel here
// (docs/ARCHITECTURE.md, "Adding an op"). This header includes no op header, so the op headers sit below the
// backend and the entries above it.
#pragma once

// X(member, "name in errors")
#define MIXTRAIN_KERNEL_LIST(X) \
  X(fill, "fill") \
  X(activation, "activation") \
  X(activation_backward, "activation_backward") \
  X(add, "add") \
  X(scale, "scale") \
  X(bias_add, "bias_add") \
  X(sum_rows, "sum_rows") \
  X(dropout, "dropout") \
  X(dropout_mask, "dropout_mask") \
  X(count_nonfinite, "count_nonfinite") \
  X(square, "square") \
  X(square_backward, "square_backward") \
  X(multiply, "multiply") \
  X(rotary_embedding, "rotary_embedding") \
  X(cast, "cast") \
  X(unscale_and_check, "unscale_and_check") \
  X(unscale_and_count_nonfinite, "unscale_and_count_nonfinite") \
  X(update_loss_scale, "update_loss_scale") \
  X(apply_loss_scale, "apply_loss_scale") \
  X(reduce_sum, "reduce_sum") \
  X(reduce_sum_backward, "reduce_sum_backward") \
  X(softmax, "softmax") \
  X(softmax_backward, "softmax_backward") \
  X(crossentropy, "crossentropy") \
  X(crossentropy_backward, "crossentropy_backward") \
  X(mse, "mean_squared_error") \
  X(mse_backward, "mean_squared_error_backward") \
  X(sum_all, "sum") \
  X(accuracy, "sparse_categorical_accuracy") \
  X(count_correct, "count_correct") \
  X(count_in_top_k, "count_in_top_k") \
  X(penalty, "regularization_penalty") \
  X(penalty_backward, "regularization_penalty_backward") \
  X(bmm, "bmm") \
  X(linear_activation, "linear_activation") \
  X(conv2d, "conv2d") \
  X(conv2d_backward, "conv2d_backward") \
  X(pool2d, "pool2d") \
  X(pool2d_backward, "pool2d_backward") \
  X(global_average_pool2d, "global_average_pool2d") \
  X(global_average_pool2d_backward, "global_average_pool2d_backward") \
  X(batch_moments, "batch_moments") \
  X(moving_statistics, "update_moving_statistics") \
  X(batch_norm, "batch_norm") \
  X(batch_norm_backward, "batch_norm_backward") \
  X(batch_channel_sums, "batch_channel_sums") \
  X(batch_norm_input_grad, "batch_norm_input_grad") \
  X(layer_norm, "layer_norm") \
  X(layer_norm_backward, "layer_norm_backward") \
  X(rms_norm, "rms_norm") \
  X(rms_norm_backward, "rms_norm_backward") \
  X(embedding, "embedding") \
  X(embedding_backward, "embedding_backward") \
  X(attention, "scaled_dot_product_attention") \
  X(attention_backward, "scaled_dot_product_attention_backward") \
  X(flash_attention, "flash_attention") \
  X(flash_attention_backward, "flash_attention_backward") \
  X(fused_update, "fused_update") \
  X(fp8_amax, "fp8_amax") \
  X(fp8_quantize, "fp8_quantize") \
  X(mx_block_quantize, "mx_block_quantize") \
  X(mx_block_encode, "mx_block_encode") \
  X(mx_block_decode, "mx_block_decode") \
  X(scaled_matmul, "scaled_matmul") \
  X(linear_cross_entropy, "linear_cross_entropy") \
  X(global_norm, "global_norm")

namespace mixtrain::ops {

// One value per kernel of the list.
enum class Op : int {
#define MIXTRAIN_OP_ENUM(member, name) member,
  MIXTRAIN_KERNEL_LIST(MIXTRAIN_OP_ENUM)
#undef MIXTRAIN_OP_ENUM
};
#define MIXTRAIN_OP_COUNT(member, name) +1
inline constexpr int kNumOps = 0 MIXTRAIN_KERNEL_LIST(MIXTRAIN_OP_COUNT);
#undef MIXTRAIN_OP_COUNT

// The signature of an op's kernel: declared by the op's header with MIXTRAIN_KERNEL_SIGNATURE.
template <Op op>
struct KernelOf;

}  // namespace mixtrain::ops

// In namespace mixtrain::ops, after the op's `namespace kernel` block: Op::member's kernels have type kernel::Alias.
#define MIXTRAIN_KERNEL_SIGNATURE(member, Alias) \
  template <>                                  \
  struct KernelOf<Op::member> {                \
    using Fn = kernel::Alias;                  \
  };
