#include "mixtrain/train/model.h"

#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <unordered_map>
#include <utility>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/dist/data_parallel.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/report/progress_bar.h"

namespace mixtrain {

namespace {
// Independent random streams of one seed, so that e.g. adding dropout does not change the initial weights.
enum Stream : uint64_t { kInitStream = 1, kShuffleStream = 2, kDropoutStream = 3 };

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void check_xy(const Tensor& x, const Tensor& y, const char* where) {
  MIXTRAIN_CHECK(x.defined() && y.defined() && x.rank() >= 2 && x.dim(0) == y.dim(0),
                 where << ": x " << x.describe() << " and y " << y.describe() << " must have the same number of rows");
}

Shape sample_shape_of(const Tensor& x) {
  return Shape(std::vector<int64_t>(x.shape().dims().begin() + 1, x.shape().dims().end()));
}

// Integer inputs (ids) stay integers: each layer casts what it does not keep (Layer::operator()).
const Tensor& as_input(const Tensor& x) { return x; }

// A batch where the model's weights live: copied there from the host when the model was moved to a device.
Tensor on_device(const Tensor& t, const Device& device) { return t.device() == device ? t : ops::to_device(t, device); }

// The progress logger fit() adds for options.verbose, or null: when silent, on a data-parallel rank other than 0
// (one voice for the job), or when the caller's callbacks already show progress (two bars would interleave).
std::unique_ptr<ProgressBarLogger> verbose_progress(const FitOptions& options, const Communicator* comm) {
  if (options.verbose == 0 || (comm && comm->rank() != 0)) return nullptr;
  for (Callback* cb : options.callbacks)
    if (dynamic_cast<ProgressBarLogger*>(cb)) return nullptr;
  std::ostream& out = options.verbose_out ? *options.verbose_out : std::cout;
  // Redrawing in place needs a terminal; a captured or redirected stream gets one line per epoch.
  const bool interactive = options.verbose == 1 && &out == &std::cout && stdout_is_terminal();
  return std::make_unique<ProgressBarLogger>(out, interactive);
}
}  // namespace

// The all-reduce of a stack model's float32 gradient buffer in buckets started during the backward pass, as
// soon as every gradient in a bucket is final (PyTorch DDP's overlap). The arena lays variables out in layer
// order, so a bucket is a range of offsets covering whole layers; the backward pass reaches layer L's output
// gradient (the network observer's on_gradient) only after every operation recorded after L's output has run,
// which in a stack includes every use of the later layers' variables. Buckets start in one fixed order (last
// first) on every rank whatever the timing, as MPI's matching of collectives requires.
class Model::OverlappedReduce : public LayerObserver {
 public:
  // Whether `model` qualifies (a stack, one float32 group, every variable in exactly one layer) and the buckets;
  // false leaves the caller on the reduce-after-backward path.
  bool prepare(const Model& model, const ParameterArena& arena, int64_t bucket_bytes) {
    if (model.is_functional() || arena.dtypes() != std::vector<DType>{DType::kFloat32}) return false;
    if (layout_ == arena.layout_id() && bucket_bytes == bucket_bytes_) return !buckets_.empty();
    layout_ = arena.layout_id();
    bucket_bytes_ = bucket_bytes;
    buckets_.clear();
    layer_index_.clear();
    // start[l]: the first offset of layer l's variables (the next layer's start when it has none).
    const auto& layers = model.layers();
    std::unordered_map<const void*, size_t> var_index;
    for (size_t i = 0; i < arena.vars().size(); ++i) var_index[arena.vars()[i].id()] = i;
    const int64_t capacity = arena.capacity(DType::kFloat32);
    std::vector<int64_t> start(layers.size() + 1, capacity);
    size_t mapped = 0;
    for (size_t l = 0; l < layers.size(); ++l) {
      layer_index_[layers[l].get()] = l;
      int64_t lo = -1;
      for (const Var& v : layers[l]->trainable_weights()) {
        auto it = var_index.find(v.id());
        if (it == var_index.end()) continue;
        ++mapped;
        const int64_t off = arena.entry(it->second).offset;
        lo = lo < 0 ? off : std::min(lo, off);
      }
      start[l] = lo;
    }
    if (mapped != arena.vars().size()) return false;
    for (size_t l = layers.size(); l-- > 0;)
      if (start[l] < 0) start[l] = start[l + 1];
    // Buckets from the last layer back: close one at a layer boundary once it holds bucket_bytes.
    int64_t hi = capacity;
    for (size_t l = layers.size(); l-- > 1;) {
      if ((hi - start[l]) * static_cast<int64_t>(sizeof(float)) >= bucket_bytes && start[l] > 0) {
        buckets_.push_back({l, start[l], hi});
        hi = start[l];
      }
    }
    buckets_.push_back({0, 0, hi});  // the first layers' bucket: ready when backward ends
    return true;
  }

  void begin(Communicator& comm, float* grads, float weight) {
    comm_ = &comm;
    grads_ = grads;
    weight_ = weight;
    next_ = 0;
    inflight_.clear();
  }
  // Layer `layer`'s output gradient exists: every later layer's gradients are final.
  void on_gradient(const Layer& layer, const Tensor&) override {
    // Between layers' backward steps: let the buckets in flight advance (Open MPI moves their data only inside
    // MPI calls), then start the ones now ready.
    for (auto& r : inflight_) r->test();
    auto it = layer_index_.find(&layer);
    if (it != layer_index_.end()) start_until(it->second + 1);
  }
  // After backward: starts what is left, in the same order.
  void start_rest() { start_until(0); }
  void wait() {
    for (auto& r : inflight_) r->wait();
    inflight_.clear();
  }

 private:
  struct Bucket {
    size_t first_layer;
    int64_t lo, hi;  // float32 offsets
  };
  // Starts, last bucket first, every bucket whose layers all come at or after `layer`.
  void start_until(size_t layer) {
    while (next_ < buckets_.size() && buckets_[next_].first_layer >= layer) {
      const Bucket& b = buckets_[next_++];
      float* p = grads_ + b.lo;
      const int64_t n = b.hi - b.lo;
      if (weight_ != 1.0f)
        for (int64_t i = 0; i < n; ++i) p[i] *= weight_;
      inflight_.push_back(comm_->start_all_reduce(p, n, ReduceOp::kSum));
    }
  }

  uint64_t layout_ = 0;
  int64_t bucket_bytes_ = 0;
  std::vector<Bucket> buckets_;  // last layers first
  std::unordered_map<const Layer*, size_t> layer_index_;
  Communicator* comm_ = nullptr;
  float* grads_ = nullptr;
  float weight_ = 1.0f;
  size_t next_ = 0;
  std::vector<std::unique_ptr<Communicator::Request>> inflight_;
};

// What fit_state() reads while fit() runs.
struct Model::LiveFit {
  const FitPosition* pos;
  const History* history;
  int64_t steps_per_epoch, batch_size, rows;
  bool shuffle, sampled;
  const std::vector<Callback*>* callbacks;
  const RecoveryGuard* guard;
  bool epoch_recorded = false;  // pos->epoch is in the History (on_epoch_end): the state is the next epoch's start
};

namespace {

// The key of each callback that keeps state: its kind and its rank among the callbacks of that kind
// ("EarlyStopping.0"), so two of a kind keep their own states. Empty for the callbacks that keep none.
std::vector<std::string> callback_state_keys(const std::vector<Callback*>& callbacks) {
  std::map<std::string, int> seen;
  std::vector<std::string> keys;
  for (const Callback* cb : callbacks) {
    const std::string kind = cb->state_key();
    keys.push_back(kind.empty() ? "" : kind + "." + std::to_string(seen[kind]++));
  }
  return keys;
}

}  // namespace

std::optional<FitState> Model::fit_state() const {
  if (!live_fit_) return std::nullopt;
  const LiveFit& f = *live_fit_;
  FitState s;
  s.steps_per_epoch = f.steps_per_epoch;
  s.batch_size = f.batch_size;
  s.rows = f.rows;
  s.shuffle = f.shuffle;
  s.sampled = f.sampled;
  s.history = *f.history;
  if (f.epoch_recorded) {
    s.epoch = f.pos->epoch + 1;
  } else {
    s.epoch = f.pos->epoch;
    s.step = f.pos->step;
    if (s.step > 0) {
      s.epoch_shuffle_state = f.pos->shuffle_state;
      s.sums = f.pos->sums;
      s.seen = f.pos->seen;
    }
  }
  if (f.guard) s.recovery = f.guard->state_json();
  const std::vector<std::string> keys = callback_state_keys(*f.callbacks);
  for (size_t i = 0; i < keys.size(); ++i)
    if (!keys[i].empty()) s.callbacks.emplace_back(keys[i], (*f.callbacks)[i]->state());
  return s;
}

int64_t training_rows(int64_t n, double fraction) {
  MIXTRAIN_CHECK(fraction >= 0 && fraction < 1, "validation_split must be in [0, 1), got " << fraction);
  const int64_t n_train = n - static_cast<int64_t>(std::floor(static_cast<double>(n) * fraction));
  MIXTRAIN_CHECK(n_train > 0 && (fraction == 0 || n_train < n),
                 "validation_split " << fraction << " leaves " << n_train << " of " << n << " rows for training");
  return n_train;
}

ValidationSplit split_validation(const Tensor& x, const Tensor& y, double fraction) {
  const int64_t n = x.dim(0), n_train = training_rows(n, fraction);
  if (n_train == n) return {x, y, Tensor(), Tensor()};
  return {x.slice_rows(0, n_train), y.slice_rows(0, n_train), x.slice_rows(n_train, n), y.slice_rows(n_train, n)};
}

Model::Model(std::string name, uint64_t seed)
    : Network(std::move(name)),
      seed_(seed),
      init_rng_(Rng::derive(seed, kInitStream)),
      shuffle_rng_(Rng::derive(seed, kShuffleStream)),
      dropout_rng_(Rng::derive(seed, kDropoutStream)) {}

Model::Model(std::vector<SymbolicTensor> inputs, std::vector<SymbolicTensor> outputs, std::string name, uint64_t seed)
    : Network(std::move(inputs), std::move(outputs), std::move(name)),
      seed_(seed),
      init_rng_(Rng::derive(seed, kInitStream)),
      shuffle_rng_(Rng::derive(seed, kShuffleStream)),
      dropout_rng_(Rng::derive(seed, kDropoutStream)) {
  // The graph knows every shape: build now, as Keras does, so summary() and weights() are complete.
  build_for(input_shape());
}

void Model::compile(std::unique_ptr<Optimizer> optimizer, Loss loss, std::vector<std::string> metrics,
                    bool auto_scale_loss) {
  MIXTRAIN_CHECK(optimizer != nullptr, "compile: optimizer is null");
  bool float16_compute = false;
  for (auto& l : layers_) float16_compute = float16_compute || l->compute_dtype() == DType::kFloat16;
  if (auto_scale_loss && float16_compute && !optimizer->scales_loss())
    optimizer = std::make_unique<LossScaleOptimizer>(std::move(optimizer));
  // A float16 output feeds float16 logits to the loss: Keras advises a float32 output layer.
  for (const Layer* out : output_layers())
    if (out->compute_dtype() == DType::kFloat16)
      std::cerr << "warning: the output layer '" << out->name()
                << "' outputs float16 under a mixed policy; create it with dtype float32 "
                   "(e.g. Dense(10, \"linear\", dtype_arg(\"float32\"))) so the loss sees float32 values\n";
  optimizer_ = std::move(optimizer);
  loss_ = std::move(loss);
  track_accuracy_ = false;
  for (const std::string& m : metrics) {
    MIXTRAIN_CHECK(m == "accuracy" || m == "acc", "unknown metric '" << m << "'; valid metrics: accuracy");
    MIXTRAIN_CHECK(loss_->sparse(), "the accuracy metric needs sparse_categorical_crossentropy (class-id labels)");
    track_accuracy_ = true;
  }
}

void Model::enable_dynamic_loss_scaling() {
  MIXTRAIN_CHECK(compiled(), "enable_dynamic_loss_scaling: compile the model first");
  if (!optimizer_->scales_loss()) optimizer_ = std::make_unique<LossScaleOptimizer>(std::move(optimizer_));
}

void Model::build_for(const Shape& sample_shape) {
  if (!built()) build(sample_shape, init_rng_);
}

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
  const double accuracy = q.global_accuracy ? *q.global_accuracy
                          : q.rows ? static_cast<double>(record[1]) / static_cast<double>(q.rows)
                                   : 0.0;
  Logs logs{{"loss", loss}};
  if (track_accuracy_) logs.emplace_back("accuracy", accuracy);
  if (q.scales_loss) logs.emplace_back("loss_scale", static_cast<double>(record[2]));
  return logs;
}

Model::QueuedStep Model::queue_step(const Tensor& x_in, const Tensor& y_in, Communicator* comm, int64_t global_rows,
                                    Tensor& record) {
  MIXTRAIN_CHECK(compiled(), "train_step: call compile() before training");
  check_xy(x_in, y_in, "train_step");
  if (comm && comm->size() == 1 && (global_rows == 0 || global_rows == x_in.dim(0))) comm = nullptr;
  const Tensor x = on_device(x_in, device()), y = on_device(y_in, device());
  const int64_t rows = x.dim(0);
  if (comm && global_rows == 0) global_rows = rows * comm->size();
  MIXTRAIN_CHECK(!comm || (global_rows > 0 && rows <= global_rows),
                 "train_step: a shard of " << rows << " rows of a global batch of " << global_rows << " rows");
  MIXTRAIN_CHECK(comm || rows > 0, "train_step: the batch is empty");
  build_for(sample_shape_of(x));
  clear_tape();
  const std::vector<Var> vars = trainable_weights();
  // Parameters and gradients in flat buffers: (re)bound on the first step and after a dtype policy change
  // replaced values; the optimizer refreshes the 16-bit copies the layers read.
  const bool flat = optimizer_->supports_arena();
  if (flat) {
    if (!arena_.bound_to(vars)) arena_.bind(vars);
    for (const auto& l : layers_) {
      const DType c = l->compute_dtype();
      if (c == DType::kFloat16 || c == DType::kBFloat16) arena_.enable_compute_copy(c);
    }
    arena_.zero_grad();
  }
  const bool scales_loss = optimizer_->scales_loss();
  // Synchronized BatchNormalization reduces its statistics over this step's ranks (none outside data parallelism),
  // knowing the global batch's samples. Each one the backward pass reaches (a weight at or before it needs a
  // gradient) also reduces its gradient sums there.
  std::vector<std::pair<BatchNormalization*, bool>> synchronized_bn;
  bool gradient_reaches = false;
  for (const auto& l : layers_) {
    gradient_reaches = gradient_reaches || (comm != nullptr && !l->trainable_weights().empty());
    auto* bn = dynamic_cast<BatchNormalization*>(l.get());
    if (!bn) continue;
    bn->set_communicator(comm, comm ? global_rows : 0);
    if (comm && bn->synchronized()) synchronized_bn.emplace_back(bn, gradient_reaches);
  }
  // Fewer samples than ranks (a small last batch; shards are as even as possible) leave some rank without any. With
  // synchronized layers that rank takes part in their exchanges without running the model (below), which keeps the
  // others' order only when the gradients' buckets start after the backward pass; decided alike on every rank.
  const bool empty_shards = comm && global_rows < comm->size() && !synchronized_bn.empty();
  MIXTRAIN_CHECK(!empty_shards || !is_functional(),
                 "train_step: a global batch of " << global_rows << " samples over " << comm->size()
                                                  << " ranks leaves a rank without samples, which synchronized "
                                                     "BatchNormalization in a functional model cannot serve; use a "
                                                     "dataset or batch size whose last batch has a sample per rank");
  const float weight =
      comm ? static_cast<float>(static_cast<double>(rows) / static_cast<double>(global_rows)) : 1.0f;
  // Data-parallel with flat buffers: buckets of a stack's gradients start during backward (unless an observer
  // is already in force, e.g. inspection's).
  if (!overlap_) overlap_ = std::make_shared<OverlappedReduce>();
  // (On a device the gradients are all-reduced once backward is done: see all_reduce_gradients.)
  const bool overlapped = comm && flat && device().is_cpu() && !empty_shards && observer() == nullptr &&
                          overlap_->prepare(*this, arena_, bucket_bytes_);
  if (overlapped) {
    overlap_->begin(*comm, arena_.gradient_buffer(DType::kFloat32).data<float>(), weight);
    set_observer(overlap_.get());
  }
  // Data-parallel dropout: the model's stream stays the same on every rank (checkpoints save it) and each step's
  // masks come from a stream derived from it and the rank (dist/data_parallel.h).
  Rng* mask_rng = &dropout_rng_;
  Rng rank_rng;
  if (comm != nullptr && comm->size() > 1) {
    rank_rng = rank_step_rng(dropout_rng_, comm->rank(), kDropoutStream);
    mask_rng = &rank_rng;
  }
  QueuedStep queued{rows, scales_loss, std::nullopt, std::nullopt, std::nullopt};
  if (rows > 0) {  // a rank's shard of a small last batch may be empty: it still takes part in the all-reduce
    Var out = call(Var(as_input(x)), CallContext{true, mask_rng});
    Var loss = (*loss_)(out, y);
    // Kernel regularizers' penalties join the training loss (Keras adds model.losses); without any, the sum is
    // a constant 0 that records nothing and is left out.
    const Var penalty = regularization_loss(*this);
    if (penalty.requires_grad()) loss = mixtrain::add(loss, penalty);
    // Seeding backward with the scaled 1 is scaling the loss: every gradient is multiplied by the scale.
    backward(loss, optimizer_->scale_loss(ops::full(loss.shape(), DType::kFloat32, 1.0f, loss.value().device())));
    // The logs stay where the step ran: on a GPU nothing here waits for the host.
    record.slice(0, 0, 1).copy_from(loss.value().reshape({1}));
    if (track_accuracy_) record.slice(0, 1, 2).copy_from(ops::count_correct(out.value(), y));
  } else {
    // No samples here: nothing to log, and the slot (reused every logging window) may hold an earlier step's summed
    // loss and correct count, which the device all-reduce below would add to this step's.
    record.slice(0, 0, 2).copy_from(ops::full({2}, DType::kFloat32, 0.0f, record.device()));
    // The synchronized layers' exchanges, in the order the model's forward and backward passes make them on the
    // other ranks, with zero sums.
    for (const auto& [bn, reached] : synchronized_bn) bn->exchange_statistics_without_rows();
    for (auto it = synchronized_bn.rbegin(); it != synchronized_bn.rend(); ++it)
      if (it->second) it->first->exchange_gradient_sums_without_rows();
  }
  // The scale this step used, before the optimizer moves it.
  if (scales_loss) record.slice(0, 2, 3).copy_from(optimizer_->loss_scale_on(device()));
  if (overlapped) {
    set_observer(nullptr);
    overlap_->start_rest();
  }
  {
    NoGradGuard no_grad;
    std::vector<Tensor> grads;
    if (!flat) {
      grads.reserve(vars.size());
      for (const Var& v : vars) grads.push_back(v.has_grad() ? v.grad().to(DType::kFloat32) : Tensor());
    }
    if (comm) {
      // One small all-reduce: which variables got a gradient on any rank (so every rank updates the same ones)
      // and the global batch's row-weighted loss and accuracy.
      std::vector<double> small(vars.size() + 2, 0.0);
      for (size_t i = 0; i < vars.size(); ++i) small[i] = vars[i].has_grad() ? 1.0 : 0.0;
      if (comm->moves_memory_of(record.device())) {
        // The logs stay on the device (a GPU with NCCL), nothing waits: the record's loss, weighted by this rank's
        // share of the rows, and its correct count are summed over the ranks there (float32: the loss's last bits
        // may differ from the host's float64 sum), and the host sums the flags alone.
        Tensor loss_slot = record.slice(0, 0, 1);
        loss_slot.copy_from(ops::scale(loss_slot, weight));
        Tensor logs = record.slice(0, 0, 2);
        comm->all_reduce_on_device(logs, ReduceOp::kSum);
        comm->all_reduce(small.data(), static_cast<int64_t>(vars.size()), ReduceOp::kSum);
      } else {
        // The record is read here (on a device, a wait for the step so far): the logs join the all-reduce.
        const Tensor host_record = ops::to_device(record, Device::cpu());
        const float* r = host_record.data<float>();
        small[vars.size()] = rows > 0 ? static_cast<double>(r[0]) * static_cast<double>(rows) : 0.0;
        small[vars.size() + 1] = rows > 0 ? static_cast<double>(r[1]) : 0.0;
        comm->all_reduce(small.data(), static_cast<int64_t>(small.size()), ReduceOp::kSum);
        queued.global_loss = small[vars.size()] / static_cast<double>(global_rows);
        queued.global_accuracy = small[vars.size() + 1] / static_cast<double>(global_rows);
      }
      if (overlapped) {
        overlap_->wait();
        // Written on some rank, not here: the reduced values are in the buffer; mark them as this variable's.
        for (size_t i = 0; i < vars.size(); ++i) {
          Var v = vars[i];
          if (small[i] > 0 && !v.has_grad()) v.set_grad(arena_.gradient_view(i).clone());
        }
      } else if (flat) {
        for (size_t i = 0; i < vars.size(); ++i) {
          Var v = vars[i];
          // The arena's buffer holds zeros for it: mark it written, as on the ranks that computed one.
          if (small[i] > 0 && !v.has_grad()) v.set_grad(ops::full(v.shape(), v.dtype(), 0.0f, device()));
        }
        all_reduce_gradients(arena_, *comm, weight, bucket_bytes_);
      } else {
        for (size_t i = 0; i < vars.size(); ++i)
          if (!grads[i].defined()) grads[i] = ops::full(vars[i].shape(), DType::kFloat32, 0.0f, device());
        all_reduce_gradients(grads, *comm, weight);
        for (size_t i = 0; i < vars.size(); ++i)
          if (small[i] == 0) grads[i] = Tensor();
      }
    }
    if (flat)
      optimizer_->apply_arena(arena_);  // a LossScaleOptimizer unscales, checks and applies or skips here
    else
      optimizer_->apply(grads, vars);
    // Whether the update was skipped stays where it ran, with the logs, until they are read.
    queued.uncertain_update = optimizer_->inner_optimizer().last_uncertain_update();
    if (queued.uncertain_update) record.slice(0, 3, 4).copy_from(optimizer_->last_skip_flag());
  }
  for (Var v : vars) v.zero_grad();
  queued.rows = comm ? global_rows : rows;
  return queued;
}

History Model::fit(const Tensor& x_all, const Tensor& y_all, const FitOptions& options) {
  MIXTRAIN_CHECK(compiled(), "fit: call compile() before fit()");
  check_xy(x_all, y_all, "fit");
  MIXTRAIN_CHECK(options.epochs > 0, "fit: epochs must be positive, got " << options.epochs);
  MIXTRAIN_CHECK(options.initial_epoch >= 0, "fit: initial_epoch must be >= 0, got " << options.initial_epoch);
  MIXTRAIN_CHECK(options.batch_size > 0, "fit: batch_size must be positive, got " << options.batch_size);
  MIXTRAIN_CHECK(options.validation_split >= 0 && options.validation_split < 1,
                 "fit: validation_split must be in [0, 1), got " << options.validation_split);
  MIXTRAIN_CHECK(options.verbose >= 0 && options.verbose <= 2,
                 "fit: verbose must be 0 (silent), 1 (progress bar) or 2 (one line per epoch), got " << options.verbose);

  Tensor x = x_all, y = y_all, val_x, val_y;
  if (options.validation_data) {
    val_x = options.validation_data->first;
    val_y = options.validation_data->second;
    check_xy(val_x, val_y, "fit validation_data");
  } else if (options.validation_split > 0) {
    ValidationSplit v = split_validation(x_all, y_all, options.validation_split);
    x = v.x;
    y = v.y;
    val_x = v.val_x;
    val_y = v.val_y;
  }
  build_for(sample_shape_of(x));
  Communicator* comm = options.communicator && options.communicator->size() > 1 ? options.communicator : nullptr;
  if (comm) start_data_parallel(options, *comm);

  MIXTRAIN_CHECK(options.steps_per_epoch >= 0, "fit: steps_per_epoch must be >= 0, got " << options.steps_per_epoch);
  const int64_t n = x.dim(0);
  const bool sampled = options.steps_per_epoch > 0;
  const int64_t steps = sampled ? options.steps_per_epoch : (n + options.batch_size - 1) / options.batch_size;
  std::vector<Callback*> callbacks = options.callbacks;
  const std::unique_ptr<ProgressBarLogger> progress = verbose_progress(options, comm);
  if (progress) callbacks.push_back(progress.get());  // last, as Keras, so it shows what the others logged
  History history;
  RecoveryGuard* guard = options.recovery;
  FitPosition pos;  // epoch, step within it, row order and running sums
  pos.epoch = options.initial_epoch;
  // Draws an epoch's row order from `rng` (the shuffle stream, or a copy of it set to a saved state).
  const auto draw_order = [&](Rng& rng) {
    std::vector<int64_t> order;
    if (sampled) {
      order.resize(static_cast<size_t>(steps * options.batch_size));
      for (int64_t& row : order) row = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)));
    } else if (options.shuffle) {
      order = rng.permutation(n);
    } else {
      for (int64_t i = 0; i < n; ++i) order.push_back(i);
    }
    return order;
  };
  bool resumed_mid_epoch = false;
  if (options.resume) {
    const FitState& s = *options.resume;
    // Inside an epoch the rest of its batches must come from the same order; at an epoch boundary the next
    // epoch draws a new one, so the data or batch size may change there (as with initial_epoch).
    const bool mid_epoch = s.step > 0;
    const auto refuse = [](const std::string& what, const std::string& saved, const std::string& now) {
      MIXTRAIN_FAIL(kInvalidInput, "fit: the state to resume was saved with " << what << " " << saved
                                       << ", this fit has " << now,
                    "resume with the data, validation split, batch_size, steps_per_epoch and shuffle setting of the "
                    "run that saved it");
    };
    if (mid_epoch && s.rows != n) refuse("training rows", std::to_string(s.rows), std::to_string(n));
    if (mid_epoch && s.batch_size != options.batch_size)
      refuse("batch_size", std::to_string(s.batch_size), std::to_string(options.batch_size));
    if (mid_epoch && s.steps_per_epoch != steps)
      refuse("steps per epoch", std::to_string(s.steps_per_epoch), std::to_string(steps));
    if (mid_epoch && s.sampled != sampled)
      refuse("batches", s.sampled ? "sampled (steps_per_epoch)" : "in epochs", sampled ? "sampled" : "in epochs");
    if (mid_epoch && !sampled && s.shuffle != options.shuffle)
      refuse("shuffle", s.shuffle ? "true" : "false", options.shuffle ? "true" : "false");
    MIXTRAIN_CHECK(s.epoch >= 0 && s.step >= 0 && s.step <= steps && s.seen >= 0,
                   "fit: the state to resume is at epoch " << s.epoch << ", step " << s.step << " of " << steps
                                                           << " (" << s.seen << " rows seen): out of range");
    history = s.history;
    pos.epoch = s.epoch;
    if (s.step > 0) {
      MIXTRAIN_CHECK(s.epoch_shuffle_state.size() == 4,
                     "fit: the state to resume has no shuffle state for its epoch in progress");
      Rng redraw;
      redraw.set_state(s.epoch_shuffle_state);
      pos.order = draw_order(redraw);
      // The model's shuffle stream (restored with the checkpoint) must stand exactly after that draw, or the
      // following epochs would get other orders than the interrupted run's.
      if (redraw.state() != shuffle_rng_.state())
        MIXTRAIN_FAIL(kInvalidInput,
                      "fit: the model's shuffle stream does not continue from the resumed epoch's row order",
                      "load the checkpoint that holds this state (load_checkpoint) right before fit()");
      pos.shuffle_state = s.epoch_shuffle_state;
      pos.step = s.step;
      pos.sums = s.sums;
      pos.seen = s.seen;
      resumed_mid_epoch = true;
    }
  }
  LiveFit live{&pos, &history, steps, options.batch_size, n, options.shuffle, sampled, &callbacks, guard};
  struct LiveScope {  // fit_state() is empty again however fit() ends (a callback may throw)
    const LiveFit*& slot;
    ~LiveScope() { slot = nullptr; }
  } live_scope{live_fit_};
  live_fit_ = &live;

  for (Callback* cb : callbacks) cb->set_model(this);
  for (Callback* cb : callbacks) cb->on_train_begin(options.epochs, steps);
  if (options.resume) {
    // What the callbacks and the recovery ladder had counted when the state was saved (on_train_begin reset it).
    // A saved state without a callback of its key belongs to a callback this fit does without: ignored.
    const std::vector<std::string> keys = callback_state_keys(callbacks);
    for (const auto& [key, state] : options.resume->callbacks)
      for (size_t i = 0; i < keys.size(); ++i)
        if (keys[i] == key) callbacks[i]->restore_state(state);
    if (guard && !options.resume->recovery.empty()) guard->restore_state(options.resume->recovery);
  }
  stop_training = false;
  // Steps queued between two reads of their logs (FitOptions::steps_per_log), and their records.
  MIXTRAIN_CHECK(options.steps_per_log >= 0, "fit: steps_per_log must be >= 0, got " << options.steps_per_log);
  // (A data-parallel step through a host communicator reads its logs anyway; a device communicator keeps them there.)
  const bool read_each_step = guard || (comm && !comm->moves_memory_of(device()));
  const int64_t window = read_each_step              ? 1
                         : options.steps_per_log > 0 ? options.steps_per_log
                         : device().is_cpu()         ? 1
                                                     : FitOptions::kDefaultStepsPerLog;
  Tensor records = ops::full({window, kRecordSize}, DType::kFloat32, 0.0f, device());
  Logs epoch_logs;
  const auto running_means = [&] {
    Logs running;
    for (auto& [k, v] : pos.sums)
      running.emplace_back(k, k == "loss_scale" ? v : v / static_cast<double>(pos.seen));
    return running;
  };
  auto epoch_start = Clock::now();
  bool first_step_of_fit = true;
  while (pos.epoch < options.epochs && !stop_training) {
    if (resumed_mid_epoch) {
      epoch_start = Clock::now();
      for (Callback* cb : callbacks) cb->on_epoch_resume(pos.epoch, pos.step);
      resumed_mid_epoch = false;
    } else if (pos.step == 0 && pos.order.empty()) {  // a new epoch (a rollback restores its order instead)
      epoch_start = Clock::now();
      for (Callback* cb : callbacks) cb->on_epoch_begin(pos.epoch);
      pos.shuffle_state = shuffle_rng_.state();
      pos.order = draw_order(shuffle_rng_);
      pos.sums.clear();
      pos.seen = 0;
    }
    // A checkpoint saved after an epoch's last step resumes with only the epoch's end left.
    if (pos.step < steps) {
      // A resumed fit snapshots at its first step, or a rollback before the next period would have no target.
      if (guard && guard->healthy() &&
          (pos.step == 0 || pos.step % guard->snapshot_every() == 0 || first_step_of_fit)) {
        pos.history_steps = history.step_loss.size();
        pos.history_scales = history.step_loss_scale.size();
        pos.history_samples = history.samples;
        guard->snapshot(*this, pos);
      }
      first_step_of_fit = false;
      const auto rows_in_order = static_cast<int64_t>(pos.order.size());
      // Steps pos.step .. pos.step + window - 1 (fewer at the epoch's end) are queued, then their logs read at once.
      const int64_t count = std::min(window, steps - pos.step);
      const DType batch_dtype = is_float(x.dtype()) ? layers_.front()->compute_dtype() : x.dtype();
      const auto window_start = Clock::now();
      std::vector<QueuedStep> queued;
      std::vector<int64_t> batch_rows;
      std::vector<int64_t> idx;  // the last batch's rows (the recovery guard's window is one step)
      Tensor yb;
      for (int64_t k = 0; k < count; ++k) {
        const int64_t begin = (pos.step + k) * options.batch_size,
                      end = std::min(rows_in_order, begin + options.batch_size);
        // Data-parallel: this rank's contiguous shard of the global batch (all ranks hold the same order).
        const ShardRange shard =
            comm ? shard_range(end - begin, comm->rank(), comm->size()) : ShardRange{0, end - begin};
        idx.assign(pos.order.begin() + begin + shard.begin, pos.order.begin() + begin + shard.end);
        // Batches are gathered straight into the first layer's compute dtype: its input cast would make that
        // copy anyway, and the float32 batch would never be needed.
        yb = y.gather_rows(idx);
        Tensor slot = records.slice(0, k, k + 1).reshape({kRecordSize});
        queued.push_back(queue_step(x.gather_rows(idx, batch_dtype), yb, comm, end - begin, slot));
        batch_rows.push_back(end - begin);
      }
      // One read for the window: on a GPU the first wait for the device since the window began.
      const Tensor host_records = ops::to_device(records.slice(0, 0, count), Device::cpu());
      history.train_seconds += seconds_since(window_start);
      const float* rec = host_records.data<float>();
      bool rolled_back = false;
      for (int64_t k = 0; k < count; ++k) {
        resolve_update(rec + k * kRecordSize, queued[static_cast<size_t>(k)]);
        const Logs step_logs = this->step_logs(rec + k * kRecordSize, queued[static_cast<size_t>(k)]);
        history.step_loss.push_back(log_value(step_logs, "loss"));
        if (has_log(step_logs, "loss_scale")) history.step_loss_scale.push_back(log_value(step_logs, "loss_scale"));
        ++history.steps;
        history.samples += batch_rows[static_cast<size_t>(k)];
        // The guard runs with windows of one step (see `window`).
        if (guard && guard->after_step(
                         *this, step_logs, [&] { return std::make_pair(x.gather_rows(idx, is_float(x.dtype()) ? DType::kFloat32 : x.dtype()), yb); },
                         static_cast<int64_t>(history.step_loss.size()))) {
          pos = guard->restore(*this);
          history.step_loss.resize(pos.history_steps);
          history.step_loss_scale.resize(pos.history_scales);
          history.samples = pos.history_samples;
          // A snapshot from an earlier epoch: forget the epochs after it.
          while (!history.epoch.empty() && history.epoch.back() >= pos.epoch) {
            history.epoch.pop_back();
            history.epoch_seconds.pop_back();
            for (auto& [key, v] : history.history)
              if (!v.empty()) v.pop_back();
          }
          rolled_back = true;
          break;
        }
        // Running means weighted by rows, as Keras reports; the loss scale is the latest value.
        const double rows = static_cast<double>(batch_rows[static_cast<size_t>(k)]);
        if (pos.sums.empty())
          for (auto& [key, v] : step_logs) pos.sums.emplace_back(key, 0.0);
        for (size_t i = 0; i < pos.sums.size() && i < step_logs.size(); ++i)
          pos.sums[i].second = pos.sums[i].first == "loss_scale" ? step_logs[i].second
                                                                 : pos.sums[i].second + step_logs[i].second * rows;
        pos.seen += batch_rows[static_cast<size_t>(k)];
        ++pos.step;  // before the callbacks: a checkpoint saved by one resumes after this step
      }
      if (rolled_back) continue;
      const Logs running = running_means();
      for (Callback* cb : callbacks) cb->on_train_batch_end(pos.step, running);
      if (pos.step < steps && !stop_training) continue;
    }

    // End of the epoch (or of training, when a callback stopped it).
    epoch_logs = running_means();
    // Per-rank BatchNormalization statistics: evaluate and save their mean, the same on every rank.
    if (comm) average_variables(non_trainable_weights(), *comm);
    if (val_x.defined()) {
      EvaluateResult v = evaluate(val_x, val_y, std::max<int64_t>(options.batch_size, 256), comm);
      epoch_logs.emplace_back("val_loss", v.loss);
      if (track_accuracy_) epoch_logs.emplace_back("val_accuracy", v.accuracy);
    }
    // Callbacks add their entries (the learning-rate callbacks: "learning_rate") before History records them.
    for (Callback* cb : callbacks) cb->on_epoch_logs(pos.epoch, epoch_logs);
    history.epoch.push_back(pos.epoch);
    for (auto& [k, v] : epoch_logs) history.history[k].push_back(v);
    history.epoch_seconds.push_back(seconds_since(epoch_start));
    live.epoch_recorded = true;  // a checkpoint saved in on_epoch_end resumes at the next epoch
    for (Callback* cb : callbacks) cb->on_epoch_end(pos.epoch, epoch_logs);
    live.epoch_recorded = false;
    ++pos.epoch;
    pos.step = 0;
    pos.order.clear();
  }
  for (Callback* cb : callbacks) cb->on_train_end(epoch_logs);
  return history;
}

void Model::start_data_parallel(const FitOptions& options, Communicator& comm) {
  MIXTRAIN_CHECK(options.batch_size % comm.size() == 0,
                 "fit: the global batch size " << options.batch_size << " does not divide by the " << comm.size()
                                               << " ranks (each rank takes batch_size / ranks rows of every batch)");
  MIXTRAIN_CHECK(options.recovery == nullptr, "fit: the recovery ladder does not run data-parallel ("
                                                  << comm.size() << " ranks); train without it");
  // Rank 0's weights and streams everywhere: the same start and the same batch order on every rank.
  broadcast_variables(weights(), comm);
  if (!arena_.empty()) arena_.refresh_compute_copies();
  broadcast_rng(init_rng_, comm);
  broadcast_rng(shuffle_rng_, comm);
  broadcast_rng(dropout_rng_, comm);  // each step derives the rank's masks from it (train_step)
}

EvaluateResult Model::evaluate(const Tensor& x, const Tensor& y, int64_t batch_size, Communicator* comm) {
  MIXTRAIN_CHECK(compiled(), "evaluate: call compile() first");
  check_xy(x, y, "evaluate");
  MIXTRAIN_CHECK(batch_size > 0, "evaluate: batch_size must be positive");
  build_for(sample_shape_of(x));
  NoGradGuard no_grad;
  double loss_sum = 0, acc_sum = 0;
  const int64_t n = x.dim(0);
  if (comm && comm->size() == 1) comm = nullptr;
  const ShardRange mine = comm ? shard_range(n, comm->rank(), comm->size()) : ShardRange{0, n};
  // Each batch's mean loss and correct count stay where they were computed, a row per batch, until every batch is
  // queued: on a GPU the batches run back to back and the host reads once, not twice a batch. The sums are then the
  // ones a read per batch gives (float32 loss, accuracy as correct / scored rows, weighted by the batch's rows).
  const int64_t batches = (mine.end - mine.begin + batch_size - 1) / batch_size;
  Tensor logs = ops::full({std::max<int64_t>(batches, 1), 2}, DType::kFloat32, 0.0f, device());
  std::vector<std::pair<double, double>> rows_of;  // (the batch's samples, its scored rows)
  for (int64_t begin = mine.begin, i = 0; begin < mine.end; begin += batch_size, ++i) {
    const int64_t end = std::min(mine.end, begin + batch_size);
    Tensor xb = on_device(x.slice_rows(begin, end), device()), yb = on_device(y.slice_rows(begin, end), device());
    Var out = call(Var(as_input(xb)), CallContext{false, nullptr});
    Tensor row = logs.slice(0, i, i + 1).reshape({2});
    row.slice(0, 0, 1).copy_from((*loss_)(out, yb).value().reshape({1}));
    const Tensor& scores = out.value();
    const int64_t classes = scores.rank() > 0 ? scores.dim(scores.rank() - 1) : 0;
    if (track_accuracy_) row.slice(0, 1, 2).copy_from(ops::count_correct(scores, yb));
    rows_of.emplace_back(static_cast<double>(end - begin),
                         classes > 0 ? static_cast<double>(scores.numel() / classes) : 0.0);
  }
  const Tensor host_logs = ops::to_device(logs, Device::cpu());
  const float* l = host_logs.data<float>();
  for (size_t i = 0; i < rows_of.size(); ++i) {
    const auto [rows, scored] = rows_of[i];
    loss_sum += static_cast<double>(l[2 * i]) * rows;
    if (track_accuracy_) acc_sum += (scored > 0 ? static_cast<double>(l[2 * i + 1]) / scored : 0.0) * rows;
  }
  if (comm) {
    double sums[2] = {loss_sum, acc_sum};
    comm->all_reduce(sums, 2, ReduceOp::kSum);
    loss_sum = sums[0];
    acc_sum = sums[1];
  }
  return {n ? loss_sum / static_cast<double>(n) : 0.0, n ? acc_sum / static_cast<double>(n) : 0.0};
}

Tensor Model::predict(const Tensor& x, int64_t batch_size) {
  MIXTRAIN_CHECK(x.defined() && x.rank() >= 2, "predict: x must have a batch dimension, got " << x.describe());
  MIXTRAIN_CHECK(batch_size > 0, "predict: batch_size must be positive");
  build_for(sample_shape_of(x));
  NoGradGuard no_grad;
  const int64_t n = x.dim(0);
  std::vector<float> all;
  Shape out_shape;
  for (int64_t begin = 0; begin < n; begin += batch_size) {
    const int64_t end = std::min(n, begin + batch_size);
    Var out = call(Var(as_input(on_device(x.slice_rows(begin, end), device()))), CallContext{false, nullptr});
    const std::vector<float> v = on_device(out.value(), Device::cpu()).to_floats();
    all.insert(all.end(), v.begin(), v.end());
    out_shape = out.shape();
  }
  std::vector<int64_t> dims = out_shape.rank() ? out_shape.dims() : std::vector<int64_t>{0};
  dims[0] = n;
  return Tensor::from_floats(Shape(dims), all);
}

}  // namespace mixtrain
