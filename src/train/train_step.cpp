// Model's training step: train_step() and queue_step(), its form that leaves the logs where the step ran.
#include <utility>

#include "fp8_amax_reduce.h"
#include "layer_bucket_observer.h"
#include "mixtrain/autograd/tape.h"
#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/distributed/zero.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/linear_cross_entropy.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/train/model.h"
#include "model_detail.h"

namespace mixtrain {

using detail::as_input;
using detail::check_xy;
using detail::on_device;
using detail::sample_shape_of;

namespace {

// Class-id labels (B,) score one prediction per row, (B, T) a sequence's T; counted from the shape, so a rank's
// empty shard of a small last batch counts alike.
int64_t labels_per_row(const Tensor& y) {
  int64_t n = 1;
  for (int64_t d = 1; d < y.rank(); ++d) n *= y.dim(d);
  return n;
}

}  // namespace

Logs Model::train_step(const Tensor& x, const Tensor& y, Communicator* comm, int64_t global_rows) {
  Tensor record = ops::full({kRecordSize}, DType::kFloat32, 0.0f, device());
  const QueuedStep q = queue_step(x, y, comm, global_rows, record);
  const Tensor host_record = ops::to_device(record, Device::cpu());
  resolve_update(host_record.data<float>(), q);
  return step_logs(host_record.data<float>(), q);
}

void Model::resolve_update(const float* record, const QueuedStep& q) {
  if (q.uncertain_update) optimizer_->inner_optimizer().resolve_uncertain_update(*q.uncertain_update, record[3] == 0.0f);
}

Logs Model::step_logs(const float* record, const QueuedStep& q) const {
  const double loss = q.global_loss ? *q.global_loss : static_cast<double>(record[0]);
  const double scored = static_cast<double>(q.rows) * static_cast<double>(q.labels_per_row);
  // A count slot's share of the scored predictions (data-parallel: the global batch's, combined on the host).
  const auto share = [&](int64_t slot, const std::optional<double>& global) {
    return global ? *global : scored > 0 ? static_cast<double>(record[slot]) / scored : 0.0;
  };
  Logs logs{{"loss", loss}};
  for (const auto& [name, slot] : metric_slots_)
    logs.emplace_back(name, share(slot, slot == 1 ? q.global_accuracy : q.global_top_k));
  if (q.scales_loss) logs.emplace_back("loss_scale", static_cast<double>(record[2]));
  return logs;
}

Model::QueuedStep Model::queue_step(const Tensor& x_in, const Tensor& y_in, Communicator* comm, int64_t global_rows,
                                    Tensor& record) {
  MIXTRAIN_CHECK(compiled(), (compiled_for_evaluation()
                                  ? "train_step: the model was compiled without an optimizer (for evaluation only); "
                                    "compile it with an optimizer to train"
                                  : "train_step: call compile() before training"));
  check_xy(x_in, y_in, "train_step");
  const StepShard shard = step_shard(x_in, comm, global_rows);
  const Tensor x = on_device(x_in, device()), y = on_device(y_in, device());
  build_for(sample_shape_of(x));
  clear_tape();
  const std::vector<Var> vars = trainable_weights();
  const bool flat = bind_arena(vars);
  const bool scales_loss = optimizer_->scales_loss();
  const SynchronizedNorms synchronized_bn = connect_batch_norms(shard);
  // Fewer samples than ranks (a small last batch; shards are as even as possible) leave some rank without any. With
  // synchronized layers that rank takes part in their exchanges without running the model (below), which keeps the
  // others' order only when the gradients' buckets start after the backward pass; decided alike on every rank.
  const bool empty_shards = shard.comm && shard.global_rows < shard.comm->size() && !synchronized_bn.empty();
  MIXTRAIN_CHECK(!empty_shards || !is_functional(),
                 "train_step: a global batch of " << shard.global_rows << " samples over " << shard.comm->size()
                                                  << " ranks leaves a rank without samples, which synchronized "
                                                     "BatchNormalization in a functional model cannot serve; use a "
                                                     "dataset or batch size whose last batch has a sample per rank");
  // Data-parallel dropout: the model's stream stays the same on every rank (checkpoints save it) and each step's
  // masks come from a stream derived from it and the rank (distributed/data_parallel.h).
  Rng* mask_rng = &dropout_rng_;
  Rng rank_rng;
  if (shard.comm != nullptr && shard.comm->size() > 1) {
    rank_rng = rank_step_rng(dropout_rng_, shard.comm->rank(), detail::kDropoutStream);
    mask_rng = &rank_rng;
  }
  QueuedStep queued{shard.rows, labels_per_row(y_in), scales_loss, std::nullopt, std::nullopt, std::nullopt,
                    std::nullopt};
  const std::vector<int64_t> micro_rows =
      detail::micro_batch_rows(shard.rows, optimizer_->gradient_accumulation_steps());
  MIXTRAIN_CHECK(micro_rows.size() <= 1 || synchronized_bn.empty(),
                 "train_step: gradient_accumulation_steps " << optimizer_->gradient_accumulation_steps()
                     << " with synchronized BatchNormalization over " << shard.comm->size()
                     << " ranks: each micro-batch would exchange statistics of part of the global batch; train "
                        "without synchronized BatchNormalization or without accumulation");
  bool overlapped = false;
  if (shard.rows > 0) {  // a rank's shard of a small last batch may be empty: it still takes part in the all-reduce
    overlapped = run_micro_batches(x, y, micro_rows, mask_rng, record,
                                   [&] { return start_overlapped_reduce(shard, flat, empty_shards); });
  } else {
    overlapped = start_overlapped_reduce(shard, flat, empty_shards);
    exchange_without_rows(synchronized_bn, record);
  }
  // The scale this step used, before the optimizer moves it.
  if (scales_loss) record.slice(0, 2, 3).copy_from(optimizer_->loss_scale_on(device()));
  if (overlapped) {
    set_observer(nullptr);
    overlap_->reduce().start_rest();
  }
  {
    NoGradGuard no_grad;
    std::vector<Tensor> grads;
    if (!flat) {
      grads.reserve(vars.size());
      for (const Var& v : vars) grads.push_back(v.has_grad() ? v.grad().to(DType::kFloat32) : Tensor());
    }
    if (shard.comm) {
      const std::vector<double> got_grad = reduce_flags_and_logs(shard, vars, record, queued);
      reduce_gradients(shard, vars, got_grad, flat, overlapped, grads);
    }
    apply_update(vars, grads, flat, record, queued);
  }
  // Each rank recorded its shard's FP8 amaxes: the histories roll with the global batch's, the same on every rank.
  if (shard.comm) all_reduce_fp8_amaxes(layers_, *shard.comm);
  for (const auto& l : layers_) l->on_optimizer_update();
  for (Var v : vars) v.zero_grad();
  queued.rows = shard.comm ? shard.global_rows : shard.rows;
  return queued;
}

Model::StepShard Model::step_shard(const Tensor& x, Communicator* comm, int64_t global_rows) const {
  if (comm && comm->size() == 1 && (global_rows == 0 || global_rows == x.dim(0))) comm = nullptr;
  const int64_t rows = x.dim(0);
  if (comm && global_rows == 0) global_rows = rows * comm->size();
  MIXTRAIN_CHECK(!comm || (global_rows > 0 && rows <= global_rows),
                 "train_step: a shard of " << rows << " rows of a global batch of " << global_rows << " rows");
  MIXTRAIN_CHECK(comm || rows > 0, "train_step: the batch is empty");
  const float weight =
      comm ? static_cast<float>(static_cast<double>(rows) / static_cast<double>(global_rows)) : 1.0f;
  return {comm, rows, global_rows, weight};
}

void Model::set_gradient_comm_dtype(DType wire) {
  MIXTRAIN_CHECK(wire == DType::kFloat32 || wire == DType::kBFloat16,
                 "set_gradient_comm_dtype: gradients travel as float32 or bfloat16, not " << dtype_name(wire));
  MIXTRAIN_CHECK(wire == DType::kFloat32 || device().is_cpu(),
                 "set_gradient_comm_dtype: the bfloat16 gradient exchange runs on the CPU (MPI moves host memory), "
                 "not on " << device().str());
  grad_comm_ = wire;
}

bool Model::bind_arena(const std::vector<Var>& vars) {
  // Parameters and gradients in flat buffers: (re)bound on the first step and after a dtype policy change
  // replaced values; the optimizer refreshes the 16-bit copies the layers read.
  if (!optimizer_->supports_arena()) return false;
  if (!arena_.bound_to(vars)) arena_.bind(vars);
  for (const auto& l : layers_) {
    const DType c = l->compute_dtype();
    if ((c == DType::kFloat16 || c == DType::kBFloat16) && l->reads_compute_copies()) arena_.enable_compute_copy(c);
  }
  arena_.zero_grad();
  return true;
}

Model::SynchronizedNorms Model::connect_batch_norms(const StepShard& shard) {
  // Synchronized BatchNormalization reduces its statistics over this step's ranks (none outside data parallelism),
  // knowing the global batch's samples. Each one the backward pass reaches (a weight at or before it needs a
  // gradient) also reduces its gradient sums there.
  SynchronizedNorms synchronized_bn;
  bool gradient_reaches = false;
  for (const auto& l : layers_) {
    gradient_reaches = gradient_reaches || (shard.comm != nullptr && !l->trainable_weights().empty());
    auto* bn = dynamic_cast<BatchNormalization*>(l.get());
    if (!bn) continue;
    bn->set_communicator(shard.comm, shard.comm ? shard.global_rows : 0);
    if (shard.comm && bn->synchronized()) synchronized_bn.emplace_back(bn, gradient_reaches);
  }
  return synchronized_bn;
}

bool Model::start_overlapped_reduce(const StepShard& shard, bool flat, bool empty_shards) {
  // Data-parallel with flat buffers: buckets of a stack's gradients start during backward (unless an observer
  // is already in force, e.g. inspection's).
  if (!overlap_) overlap_ = std::make_shared<LayerBucketObserver>();
  // On a device, only where the communicator moves its memory (NCCL): staged through the host, the gradients are
  // all-reduced once backward is done (all_reduce_gradients). ZeRO-1 reduce-scatters once backward is done.
  const bool here = device().is_cpu() || (shard.comm && shard.comm->moves_memory_of(device()));
  // The bfloat16 exchange sums between its two collectives, so its buckets go after backward.
  const bool overlapped = shard.comm && flat && here && !empty_shards && observer() == nullptr &&
                          grad_comm_ == DType::kFloat32 &&
                          !optimizer_->inner_optimizer().sharded() && overlap_->prepare(*this, arena_, bucket_bytes_);
  if (overlapped) {
    Tensor grads = arena_.gradient_buffer(DType::kFloat32);
    if (device().is_cpu())
      overlap_->reduce().begin(*shard.comm, grads.data<float>(), shard.weight);
    else
      overlap_->reduce().begin_on_device(*shard.comm, grads, shard.weight);
    set_observer(overlap_.get());
  }
  return overlapped;
}

Dense* Model::fused_head() const {
  if (!fused_loss_ || !loss_ || !loss_->sparse() || !loss_->from_logits() || track_top_k_ || observer() != nullptr)
    return nullptr;
  const std::vector<Layer*> outs = output_layers();
  auto* dense = outs.size() == 1 ? dynamic_cast<Dense*>(outs.front()) : nullptr;
  const bool fuses = dense && dense->fuses_crossentropy() && ops::supports<ops::Op::linear_cross_entropy>(device().type);
  return fuses ? dense : nullptr;
}

Model::ForwardLoss Model::forward_loss(const Tensor& x, const Tensor& y, const CallContext& ctx, const Tensor& seed) {
  ForwardLoss f;
  if (Dense* head = fused_head()) {
    CallContext to_head = ctx;
    to_head.stop_before = head;
    const Var hidden = call(Var(as_input(x)), to_head);
    f.loss = head->fused_crossentropy(hidden, y, seed, fused_chunk_rows_, &f.correct);
    f.scored = y.numel();
    return f;
  }
  f.out = call(Var(as_input(x)), ctx);
  f.loss = (*loss_)(f.out, y);
  if (track_accuracy_) f.correct = ops::count_correct(f.out.value(), y);
  const Tensor& scores = f.out.value();
  const int64_t classes = scores.rank() > 0 ? scores.dim(scores.rank() - 1) : 0;
  f.scored = classes > 0 ? scores.numel() / classes : 0;
  return f;
}

void Model::forward_backward(const Tensor& x, const Tensor& y, Rng* mask_rng, Tensor& record, const MicroBatch& mb) {
  // Seeding backward with the scaled 1 is scaling the loss: every gradient is multiplied by the scale.
  // A micro-batch's seed is its share of the batch's rows (times the scale): the gradients the micro-batches sum
  // into the arena are the batch's mean gradient, scaled once. The fused head makes its gradients for it at once.
  const Tensor seed = optimizer_->scale_loss(ops::full(Shape(std::vector<int64_t>{}), DType::kFloat32, mb.weight, device()));
  ForwardLoss f = forward_loss(x, y, CallContext{true, mask_rng}, seed);
  Var loss = f.loss;
  // Kernel regularizers' penalties join the training loss (Keras adds model.losses); without any, the sum is
  // a constant 0 that records nothing and is left out.
  const Var penalty = regularization_loss(*this);
  if (penalty.requires_grad()) loss = mixtrain::add(loss, penalty);
  backward(loss, seed);
  // The logs stay where the step ran: on a GPU nothing here waits for the host.
  if (mb.first && mb.last) {
    record.slice(0, 0, 1).copy_from(loss.value().reshape({1}));
    if (track_accuracy_) record.slice(0, 1, 2).copy_from(f.correct);
    if (track_top_k_)
      record.slice(0, kTopKSlot, kTopKSlot + 1).copy_from(ops::count_in_top_k(f.out.value(), y, kDefaultTopK));
    return;
  }
  // Accumulating: the batch's loss is the micro-batches' row-weighted sum, its correct rows their sum.
  const auto add_to_slot = [&](int64_t slot, const Tensor& value) {
    Tensor r = record.slice(0, slot, slot + 1);
    r.copy_from(mb.first ? value : ops::add(r, value));
  };
  add_to_slot(0, ops::scale(loss.value().reshape({1}).to(DType::kFloat32), mb.weight));
  if (track_accuracy_) add_to_slot(1, f.correct);
  if (track_top_k_) add_to_slot(kTopKSlot, ops::count_in_top_k(f.out.value(), y, kDefaultTopK));
}

void Model::exchange_without_rows(const SynchronizedNorms& norms, Tensor& record) {
  // No samples here: nothing to log, and the slot (reused every logging window) may hold an earlier step's summed
  // loss and correct count, which the device all-reduce below would add to this step's.
  record.slice(0, 0, 2).copy_from(ops::full({2}, DType::kFloat32, 0.0f, record.device()));
  record.slice(0, kTopKSlot, kTopKSlot + 1).copy_from(ops::full({1}, DType::kFloat32, 0.0f, record.device()));
  // The synchronized layers' exchanges, in the order the model's forward and backward passes make them on the
  // other ranks, with zero sums.
  for (const auto& [bn, reached] : norms) bn->exchange_statistics_without_rows();
  for (auto it = norms.rbegin(); it != norms.rend(); ++it)
    if (it->second) it->first->exchange_gradient_sums_without_rows();
}

std::vector<double> Model::reduce_flags_and_logs(const StepShard& shard, const std::vector<Var>& vars,
                                                 Tensor& record, QueuedStep& queued) {
  Communicator& comm = *shard.comm;
  // One small all-reduce: which variables got a gradient on any rank (so every rank updates the same ones)
  // and the global batch's row-weighted loss and accuracy.
  std::vector<double> small(vars.size() + 3, 0.0);
  for (size_t i = 0; i < vars.size(); ++i) small[i] = vars[i].has_grad() ? 1.0 : 0.0;
  if (comm.moves_memory_of(record.device())) {
    // The logs stay on the device (a GPU with NCCL), nothing waits: the record's loss, weighted by this rank's
    // share of the rows, and its correct count are summed over the ranks there (float32: the loss's last bits
    // may differ from the host's float64 sum), and the host sums the flags alone.
    Tensor loss_slot = record.slice(0, 0, 1);
    loss_slot.copy_from(ops::scale(loss_slot, shard.weight));
    Tensor logs = record.slice(0, 0, 2);
    comm.all_reduce_on_device(logs, ReduceOp::kSum);
    if (track_top_k_) {
      Tensor top_k = record.slice(0, kTopKSlot, kTopKSlot + 1);
      comm.all_reduce_on_device(top_k, ReduceOp::kSum);
    }
    comm.all_reduce(small.data(), static_cast<int64_t>(vars.size()), ReduceOp::kSum);
  } else {
    // The record is read here (on a device, a wait for the step so far): the logs join the all-reduce.
    const Tensor host_record = ops::to_device(record, Device::cpu());
    const float* r = host_record.data<float>();
    const int64_t rows = shard.rows;
    small[vars.size()] = rows > 0 ? static_cast<double>(r[0]) * static_cast<double>(rows) : 0.0;
    small[vars.size() + 1] = rows > 0 ? static_cast<double>(r[1]) : 0.0;
    small[vars.size() + 2] = rows > 0 ? static_cast<double>(r[kTopKSlot]) : 0.0;
    comm.all_reduce(small.data(), static_cast<int64_t>(small.size()), ReduceOp::kSum);
    queued.global_loss = small[vars.size()] / static_cast<double>(shard.global_rows);
    const double scored = static_cast<double>(shard.global_rows) * static_cast<double>(queued.labels_per_row);
    queued.global_accuracy = small[vars.size() + 1] / scored;
    queued.global_top_k = small[vars.size() + 2] / scored;
  }
  small.resize(vars.size());
  return small;
}

void Model::reduce_gradients(const StepShard& shard, const std::vector<Var>& vars, const std::vector<double>& got_grad,
                             bool flat, bool overlapped, std::vector<Tensor>& grads) {
  if (overlapped) {
    overlap_->reduce().wait();
    arena_.forget_gradient_buffer_rows();  // the reduce wrote the rows other ranks' embeddings used
    // Written on some rank, not here: the reduced values are in the buffer; mark them as this variable's.
    for (size_t i = 0; i < vars.size(); ++i) {
      Var v = vars[i];
      if (got_grad[i] > 0 && !v.has_grad()) v.set_grad(arena_.gradient_view(i).clone());
    }
  } else if (flat) {
    for (size_t i = 0; i < vars.size(); ++i) {
      Var v = vars[i];
      // The arena's buffer holds zeros for it: mark it written, as on the ranks that computed one.
      if (got_grad[i] > 0 && !v.has_grad()) v.set_grad(ops::full(v.shape(), v.dtype(), 0.0f, device()));
    }
    if (optimizer_->inner_optimizer().sharded())
      reduce_scatter_gradients(arena_, *shard.comm, shard.weight, grad_comm_);  // each rank sums its share
    else
      all_reduce_gradients(arena_, *shard.comm, shard.weight, bucket_bytes_, grad_comm_);
  } else {
    for (size_t i = 0; i < vars.size(); ++i)
      if (!grads[i].defined()) grads[i] = ops::full(vars[i].shape(), DType::kFloat32, 0.0f, device());
    all_reduce_gradients(grads, *shard.comm, shard.weight, grad_comm_);
    for (size_t i = 0; i < vars.size(); ++i)
      if (got_grad[i] == 0) grads[i] = Tensor();
  }
}

void Model::apply_update(const std::vector<Var>& vars, std::vector<Tensor>& grads, bool flat, Tensor& record,
                         QueuedStep& queued) {
  if (flat)
    optimizer_->apply_arena(arena_);  // a LossScaleOptimizer unscales, checks and applies or skips here
  else
    optimizer_->apply(grads, vars);
  // Whether the update was skipped stays where it ran, with the logs, until they are read.
  queued.uncertain_update = optimizer_->inner_optimizer().last_uncertain_update();
  if (queued.uncertain_update) record.slice(0, 3, 4).copy_from(optimizer_->last_skip_flag());
}

}  // namespace mixtrain
