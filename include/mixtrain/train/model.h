// Model: a network that trains, as a Keras model: compile(), fit(), evaluate(), predict(). Written as a
// stack (Model m; m.emplace<Dense>(...)) or as a functional graph (Model(inputs, outputs)).
#pragma once

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/nn/network.h"
#include "mixtrain/optim/optimizer.h"
#include "mixtrain/train/callback.h"
#include "mixtrain/train/fit_state.h"
#include "mixtrain/train/history.h"
#include "mixtrain/train/losses.h"
#include "mixtrain/train/recovery.h"
#include "mixtrain/train/stop_request.h"

namespace mixtrain {

class BatchNormalization;   // nn/normalization.h
class Dense;                // nn/layers.h
class LayerBucketObserver;  // src/train/layer_bucket_observer.h

struct FitOptions {
  // fit() runs epochs initial_epoch .. epochs-1 (Keras semantics): to resume a run saved after k completed
  // epochs, load the checkpoint and pass initial_epoch = k with the original epochs.
  int epochs = 1;
  int initial_epoch = 0;
  // Continues a fit saved during training (CheckpointInfo::fit_state from load_checkpoint) at the exact next
  // batch: the epoch in progress is resumed at its next step with the same row order and running sums, and the
  // returned History continues the saved one. Takes the place of initial_epoch. fit() refuses a state saved
  // inside an epoch with other training rows, batch size, steps_per_epoch or shuffle setting, naming the
  // difference (at an epoch boundary they may change, as with initial_epoch). One process resumes bit-identically;
  // data-parallel ranks other than 0 derive their dropout streams anew at every fit(), so with Dropout their
  // masks after a resume differ from an uninterrupted run's.
  std::optional<FitState> resume;
  int64_t batch_size = 32;
  // Fraction of the training rows (the last ones, before shuffling, as Keras) held out for validation.
  double validation_split = 0.0;
  // Explicit validation data; takes precedence over validation_split.
  std::optional<std::pair<Tensor, Tensor>> validation_data;
  // Rows each process evaluates at once in the validation pass. 0 (the default): a training step's rows on each
  // process (batch_size / ranks), as Keras' fit(validation_batch_size=None) takes batch_size: a validation batch
  // then holds less than a step, which keeps what the backward pass reads, so the step sets the run's peak memory.
  int64_t validation_batch_size = 0;
  bool shuffle = true;
  // When positive, an epoch is this many steps whose batches are drawn uniformly at random, with replacement,
  // from the training rows (Keras' steps_per_epoch on a repeated, shuffled data set; how language models
  // sample windows). Validation runs at the end of each such epoch, so it sets the evaluation interval.
  int64_t steps_per_epoch = 0;
  std::vector<Callback*> callbacks;
  // On a device (a model moved with Model::to): how many steps are queued between two reads of their logs, each
  // read a wait for the device. The steps' losses all reach the History; callbacks' on_train_batch_end, the
  // progress bar and TerminateOnNaN see the logs at those points (as Keras' steps_per_execution), and at the end
  // of each epoch. 0 (the default): kDefaultStepsPerLog on a device, 1 on the CPU, where reading costs nothing.
  // Ignored (1) with a recovery guard, which acts on every step's logs, and data-parallel through a host
  // communicator, which reads them anyway (a DeviceCommunicator keeps them on the device: the window applies).
  int64_t steps_per_log = 0;
  static constexpr int64_t kDefaultStepsPerLog = 32;
  // When set, non-finite steps are handled by the recovery ladder (see train/recovery.h). Not owned.
  RecoveryGuard* recovery = nullptr;
  // Data-parallel training when it has more than one rank (not owned; every rank calls fit with the same data,
  // options and seed). fit() first copies rank 0's weights and random streams to every rank; batch_size is the
  // global batch (it must divide by the rank count), each rank trains on its contiguous shard of every global
  // batch of the one shuffled order, and the gradients are all-reduced before the optimizer, so every rank
  // applies (or, under loss scaling, skips) the same update. Dropout masks differ per rank (a stream derived from
  // the rank); BatchNormalization uses per-rank batch statistics unless created with sync (nn/normalization.h),
  // and its moving statistics are averaged over the ranks before each validation. Validation is sharded.
  // The recovery ladder does not run data-parallel.
  Communicator* communicator = nullptr;
  // ZeRO stage with that communicator: 0 (every rank keeps the whole optimizer state) or 1 (the optimizer's slots
  // split across the ranks, distributed/zero.h: gradients reduce-scattered, each rank updating its share, the
  // updated weights all-gathered). The model's arena on the CPU only. Nothing with one rank. The optimizer stays
  // sharded after fit(): call optimizer().inner_optimizer().gather_shards() on every rank before reading state().
  int zero_stage = 0;
  // The dtype the gradients travel in between the ranks: float32 (the default) or bfloat16, half the bytes, each
  // rank's values rounded once and summed in float32 in rank order (distributed/bfloat16_exchange.h). With
  // zero_stage 1 the reduce-scatter travels in bfloat16. The model's arena on the CPU only. Nothing with one rank.
  DType grad_comm = DType::kFloat32;
  // Keras' verbose: 0 prints nothing; 1 (the default) a progress bar per epoch when the output is standard output
  // on a terminal, otherwise one summary line per epoch, as Keras does when not on a tty; 2 one summary line per
  // epoch. Each epoch starts with "Epoch N/M". Only rank 0 of a data-parallel run prints, and callbacks that
  // already hold a ProgressBarLogger get no second one.
  int verbose = 1;
  // Where verbose progress goes (not owned); null: std::cout. Another stream is never redrawn as a terminal.
  std::ostream* verbose_out = nullptr;
  // Polled after every completed step (after each window of steps_per_log steps on a device): once requested,
  // fit() stops there (see train/stop_request.h). Not owned. Refused with a communicator of several ranks: each
  // would see the request at its own step, and the others would wait in their next all-reduce.
  const StopRequest* stop_request = nullptr;

  // The same fields by chained setters, in any order (designated initializers must follow the order above):
  // `model.fit(x, y, FitOptions().with_epochs(3).with_validation_split(0.1).with_batch_size(128))`.
  FitOptions& with_epochs(int v) { epochs = v; return *this; }
  FitOptions& with_initial_epoch(int v) { initial_epoch = v; return *this; }
  FitOptions& with_resume(std::optional<FitState> v) { resume = std::move(v); return *this; }
  FitOptions& with_batch_size(int64_t v) { batch_size = v; return *this; }
  FitOptions& with_validation_split(double v) { validation_split = v; return *this; }
  FitOptions& with_validation_batch_size(int64_t v) { validation_batch_size = v; return *this; }
  FitOptions& with_validation_data(Tensor x, Tensor y) {
    validation_data.emplace(std::move(x), std::move(y));
    return *this;
  }
  FitOptions& with_shuffle(bool v) { shuffle = v; return *this; }
  FitOptions& with_steps_per_epoch(int64_t v) { steps_per_epoch = v; return *this; }
  FitOptions& with_callbacks(std::vector<Callback*> v) { callbacks = std::move(v); return *this; }
  FitOptions& with_steps_per_log(int64_t v) { steps_per_log = v; return *this; }
  FitOptions& with_recovery(RecoveryGuard* v) { recovery = v; return *this; }
  FitOptions& with_communicator(Communicator* v) { communicator = v; return *this; }
  FitOptions& with_verbose(int v) { verbose = v; return *this; }
  FitOptions& with_verbose_out(std::ostream* v) { verbose_out = v; return *this; }
  FitOptions& with_stop_request(const StopRequest* v) { stop_request = v; return *this; }

  // The rows each of `ranks` processes evaluates at once: validation_batch_size, or batch_size / ranks.
  int64_t validation_rows_at_once(int64_t ranks) const {
    if (validation_batch_size > 0) return validation_batch_size;
    return std::max<int64_t>(1, batch_size / std::max<int64_t>(1, ranks));
  }
};

// Keras' validation_split: the last floor(n * fraction) rows (taken before shuffling) validate, the rest train.
struct ValidationSplit {
  Tensor x, y;          // training rows
  Tensor val_x, val_y;  // validation rows (undefined when fraction is 0)
};
// Number of training rows left by `fraction`; Error when a side would be empty.
int64_t training_rows(int64_t n, double fraction);
ValidationSplit split_validation(const Tensor& x, const Tensor& y, double fraction);

struct EvaluateResult {
  double loss = 0;
  double accuracy = 0;  // the accuracy metric's value, whatever name compile() gave it (0 without one)
  // Every compiled metric by its log name, in compile()'s order ("accuracy", "sparse_top_k_categorical_accuracy").
  Logs metrics;
};

// evaluate()'s options, Keras' evaluate(batch_size=, verbose=).
struct EvaluateOptions {
  int64_t batch_size = 256;
  // With several ranks, each evaluates its shard and every rank returns the combined result (not owned).
  Communicator* communicator = nullptr;
  // Keras' verbose: 1 (the default here, as Keras) prints one summary line "loss: L - accuracy: A" when done;
  // 0 prints nothing. Only rank 0 prints. The overload without options is silent (fit's validation uses it).
  int verbose = 1;
  std::ostream* verbose_out = nullptr;  // not owned; null: std::cout

  // Chained setters, in any order (FitOptions explains).
  EvaluateOptions& with_batch_size(int64_t v) { batch_size = v; return *this; }
  EvaluateOptions& with_communicator(Communicator* v) { communicator = v; return *this; }
  EvaluateOptions& with_verbose(int v) { verbose = v; return *this; }
  EvaluateOptions& with_verbose_out(std::ostream* v) { verbose_out = v; return *this; }
};

// compile()'s optional arguments after the optimizer and the loss, Keras' compile(metrics=, auto_scale_loss=).
struct CompileOptions {
  std::vector<std::string> metrics;
  bool auto_scale_loss = true;

  // Chained setters, in any order (FitOptions explains).
  CompileOptions& with_metrics(std::vector<std::string> v) { metrics = std::move(v); return *this; }
  CompileOptions& with_auto_scale_loss(bool v) { auto_scale_loss = v; return *this; }
};

// A Model is also what its recovery ladder acts on (RecoveryTarget, train/recovery.h).
class Model : public Network, public RecoveryTarget {
 public:
  // A stack. seed fixes initialisation, shuffling and dropout: two runs with one seed give identical weights.
  explicit Model(std::string name = "sequential", uint64_t seed = 0);
  // A stack from a list of layers, built for input_shape when one is given (else on first use): Keras'
  // Sequential([Input(shape), layer, ...]).
  //   Model model({make_layer<Dense>(64, "relu"), make_layer<Dense>(10)}, {784});
  Model(std::vector<std::shared_ptr<Layer>> layers, const Shape& input_shape = {}, std::string name = "sequential",
        uint64_t seed = 0);
  // A functional model from Input()s to outputs (Keras' Model(inputs, outputs)). fit() feeds its one input.
  Model(std::vector<SymbolicTensor> inputs, std::vector<SymbolicTensor> outputs, std::string name = "functional",
        uint64_t seed = 0);

  // Configures training. Under a float16 compute policy the optimizer is wrapped in a
  // LossScaleOptimizer (never twice) when auto_scale_loss is set, as Keras does. metrics (each at most once, all
  // need sparse_categorical_crossentropy's class-id labels): "accuracy" or "acc" (logged as "accuracy"),
  // "sparse_categorical_accuracy" (the same count, logged under that name), "sparse_top_k_categorical_accuracy"
  // (k = 5, as Keras: the rows whose label is among the 5 largest scores, ties counting for the label; see
  // ops::count_in_top_k). A null optimizer compiles for evaluation only: evaluate() and predict() work, fit() and
  // train_step() refuse.
  void compile(std::unique_ptr<Optimizer> optimizer, Loss loss, std::vector<std::string> metrics = {},
               bool auto_scale_loss = true);
  // Keras' compile(loss=, metrics=) without an optimizer: for evaluation only.
  void compile(Loss loss, std::vector<std::string> metrics = {}) {
    compile(nullptr, std::move(loss), std::move(metrics));
  }
  // The same with the optional arguments by name: `compile(opt, loss, CompileOptions().with_auto_scale_loss(false))`
  // (a braced `{.auto_scale_loss = false}` is ambiguous beside the metrics list: name the type,
  // `CompileOptions{...}`).
  void compile(std::unique_ptr<Optimizer> optimizer, Loss loss, const CompileOptions& options) {
    compile(std::move(optimizer), std::move(loss), options.metrics, options.auto_scale_loss);
  }
  // A braced metrics list (`{"accuracy"}`, `{}`) picks this one, not CompileOptions.
  void compile(std::unique_ptr<Optimizer> optimizer, Loss loss, std::initializer_list<std::string> metrics) {
    compile(std::move(optimizer), std::move(loss), std::vector<std::string>(metrics));
  }
  bool compiled() const override { return optimizer_ != nullptr; }
  // compile() was called, with or without an optimizer: evaluate() can run.
  bool compiled_for_evaluation() const { return loss_.has_value(); }
  // Top-k's k for "sparse_top_k_categorical_accuracy" (Keras' k).
  static constexpr int64_t kDefaultTopK = 5;
  Optimizer& optimizer() override { return *optimizer_; }
  // Wraps the optimizer in a dynamic LossScaleOptimizer unless it already is one (the recovery ladder's
  // first rung); the inner optimizer keeps its state.
  void enable_dynamic_loss_scaling() override;
  const Optimizer& optimizer() const { return *optimizer_; }
  const Loss& loss() const { return *loss_; }
  // The compiled metrics by their log names, in compile()'s order ("accuracy" where "acc" was given).
  std::vector<std::string> compiled_metrics() const;
  // Computes the output Dense and a sparse_categorical_crossentropy(from_logits) loss as one pass over chunks of
  // rows in train_step, fit and evaluate (Dense::fused_crossentropy, ops/linear_cross_entropy.h), so the (rows,
  // classes) float32 output never exists whole and backward keeps no logits. It applies where the one output layer is
  // a Dense that fuses (a linear activation, no regularizer, no float8), called once, the device has the kernel, no
  // top-k metric is compiled and no observer is in force; elsewhere the layers run as usual. predict() and generation
  // compute the output as before. The loss and gradients differ from the layers' by float32 rounding. chunk_rows: 0
  // for the op's default. Off by default; save() keeps it with the compile configuration, so a loaded model trains
  // as the saved one did.
  void set_fused_loss(bool on, int64_t chunk_rows = 0) {
    MIXTRAIN_CHECK(chunk_rows >= 0, "set_fused_loss: chunk_rows must be >= 0 (0: the default), got " << chunk_rows);
    fused_loss_ = on;
    fused_chunk_rows_ = chunk_rows;
  }
  bool fused_loss() const { return fused_loss_; }
  int64_t fused_loss_chunk_rows() const { return fused_chunk_rows_; }
  // Keras' model.save(path): architecture, compile configuration and state in one file; save_model
  // (train/model_file.h) describes it, load_model reads it.
  void save(const std::string& path);

  // Trains on x (N, features...) float32 and y (N,) int32 or (N, k) float.
  History fit(const Tensor& x, const Tensor& y, const FitOptions& options = {});
  // With a communicator of several ranks, each rank evaluates its shard of the rows and the results are combined
  // (every rank returns the same numbers).
  EvaluateResult evaluate(const Tensor& x, const Tensor& y, int64_t batch_size = 256, Communicator* comm = nullptr);
  // The same with Keras' verbose summary line (EvaluateOptions).
  EvaluateResult evaluate(const Tensor& x, const Tensor& y, const EvaluateOptions& options);
  // Model outputs for x in float32, computed batch by batch without recording gradients.
  Tensor predict(const Tensor& x, int64_t batch_size = 256);

  // One optimisation step on a batch; returns {"loss", "accuracy"?, "loss_scale"?}.
  // Data-parallel (comm with more than one rank): x and y are this rank's shard (possibly empty) of a global batch
  // of global_rows rows (0: x's rows times the rank count). After backward the gradients, each weighted by the
  // shard's share of the global batch, are summed over the ranks (distributed/data_parallel.h), so the optimizer sees
  // the global batch's mean gradient on every rank, and one non-finite element on one rank makes every rank's
  // loss-scale check skip the step. The logs are the global batch's (all ranks return the same). Every rank must
  // start from the same weights (fit() broadcasts them; a custom loop calls broadcast_variables).
  Logs train_step(const Tensor& x, const Tensor& y, Communicator* comm = nullptr, int64_t global_rows = 0);

  // Bytes per gradient all-reduce bucket in data-parallel steps (kDefaultBucketBytes unless set). A stack
  // model's buckets start during the backward pass, as soon as their gradients are final.
  void set_gradient_bucket_bytes(int64_t bytes) {
    MIXTRAIN_CHECK(bytes > 0, "set_gradient_bucket_bytes: must be positive, got " << bytes);
    bucket_bytes_ = bytes;
  }
  int64_t gradient_bucket_bytes() const { return bucket_bytes_; }
  // The dtype gradients travel in when train_step is given a communicator (FitOptions::grad_comm; fit() sets it):
  // float32 or bfloat16. Under bfloat16 the buckets are exchanged after the backward pass, not during it.
  void set_gradient_comm_dtype(DType wire);
  DType gradient_comm_dtype() const { return grad_comm_; }

  // Set by callbacks to end fit() after the current epoch (or step, for TerminateOnNaN).
  bool stop_training = false;
  // For the recovery ladder (RecoveryTarget): its way to set stop_training, and the network it measures.
  void request_stop() override { stop_training = true; }
  Network& network() override { return *this; }
  // While fit() runs (in callbacks): where it stands after the last completed step or epoch, for a checkpoint
  // to resume from (save_checkpoint writes it). Empty outside fit().
  std::optional<FitState> fit_state() const;
  uint64_t seed() const { return seed_; }
  // Builds with the model's initialisation stream if not built yet.
  void build_for(const Shape& sample_shape);

  // The three random streams (initialisation, shuffling, dropout). A checkpoint saves and restores their
  // states with the weights and optimizer state, so a resumed fit draws the same batches and masks.
  Rng& init_rng() { return init_rng_; }
  Rng& shuffle_rng() override { return shuffle_rng_; }
  Rng& dropout_rng() override { return dropout_rng_; }
  const Rng& init_rng() const { return init_rng_; }
  const Rng& shuffle_rng() const { return shuffle_rng_; }
  const Rng& dropout_rng() const { return dropout_rng_; }

 protected:
  // A custom loop's `call(x, {.training = true})` draws its masks where fit() does (and a checkpoint saves).
  Rng& training_call_rng() override { return dropout_rng_; }

 private:
  // A step's logs as it leaves them where it ran, in a float32 (kRecordSize,) tensor: the loss, the rows whose
  // arg-max matched the label (when accuracy is tracked), the loss scale the step used (when the loss is scaled),
  // the update's skip flag (when the update left the optimizer's count uncertain, see uncertain_update) and the
  // rows whose label is in the top k (when top-k accuracy is tracked).
  static constexpr int64_t kRecordSize = 5;
  static constexpr int64_t kTopKSlot = 4;
  struct QueuedStep {
    int64_t rows = 0;  // the rows the logs average over (the global batch's, data-parallel)
    // The predictions each row scores: 1 for a label per sample, T for a sequence's (B, T) labels, so that the
    // accuracy is a share of predictions (Keras' sparse_categorical_accuracy), as evaluate() reports it.
    int64_t labels_per_row = 1;
    bool scales_loss = false;
    // Data-parallel: the global batch's loss and accuracy, already combined over the ranks on the host.
    std::optional<double> global_loss, global_accuracy, global_top_k;
    // The update's ticket when the host could not see whether it was skipped (an arena on a device under loss
    // scaling): the record's skip flag resolves it (Optimizer::resolve_uncertain_update) when the logs are read.
    std::optional<uint64_t> uncertain_update;
  };
  // Tells the optimizer what a read record's skip flag says about its step's update.
  void resolve_update(const float* record, const QueuedStep& q);
  // train_step() without reading its logs: the step is queued on the model's device and writes its record there
  // (a record in host memory for a model on the CPU).
  QueuedStep queue_step(const Tensor& x, const Tensor& y, Communicator* comm, int64_t global_rows, Tensor& record);
  // The logs of a queued step from its record, read back to the host.
  Logs step_logs(const float* record, const QueuedStep& q) const;

  // queue_step's pieces (src/train/train_step.cpp). A step's share of a data-parallel global batch:
  struct StepShard {
    Communicator* comm = nullptr;  // null outside data parallelism
    int64_t rows = 0, global_rows = 0;
    float weight = 1.0f;  // rows / global_rows, by which this rank's gradients count in the sum over the ranks
  };
  // Synchronized BatchNormalization layers, each with whether the backward pass reaches it.
  using SynchronizedNorms = std::vector<std::pair<BatchNormalization*, bool>>;
  StepShard step_shard(const Tensor& x, Communicator* comm, int64_t global_rows) const;
  // Binds the trainable variables to the flat buffers when the optimizer takes them; false when it does not.
  bool bind_arena(const std::vector<Var>& vars);
  SynchronizedNorms connect_batch_norms(const StepShard& shard);
  // Starts the overlapped all-reduce of a stack's gradient buckets during backward, when it applies.
  bool start_overlapped_reduce(const StepShard& shard, bool flat, bool empty_shards);
  // One forward and backward pass of a batch or of one of its micro-batches (gradient accumulation), whose
  // gradients add to those already in the arena.
  struct MicroBatch {
    float weight = 1.0f;  // its rows' share of the batch's
    bool first = true, last = true;
  };
  void forward_backward(const Tensor& x, const Tensor& y, Rng* mask_rng, Tensor& record, const MicroBatch& mb);
  // The loss of a batch and, when accuracy is tracked, its correct rows: through the fused head where it applies
  // (fused_head(); the gradients made for seed, when recording), else the output (out) then the loss.
  struct ForwardLoss {
    Var loss, out;  // out: undefined through the fused head
    Tensor correct;
    int64_t scored = 0;  // the predictions scored (labels)
  };
  ForwardLoss forward_loss(const Tensor& x, const Tensor& y, const CallContext& ctx, const Tensor& seed);
  // The output Dense that set_fused_loss() computes with the loss, or null where the layers run as usual.
  Dense* fused_head() const;
  bool fused_loss_ = false;
  int64_t fused_chunk_rows_ = 0;
  // The passes of one update over x split into micro_rows (src/train/micro_batches.cpp); start_reduce() runs just
  // before the last pass (the gradients are final during it) and its result is returned.
  bool run_micro_batches(const Tensor& x, const Tensor& y, const std::vector<int64_t>& micro_rows, Rng* mask_rng,
                         Tensor& record, const std::function<bool()>& start_reduce);
  // On a rank without samples: zero logs, and the synchronized layers' exchanges the other ranks make.
  static void exchange_without_rows(const SynchronizedNorms& norms, Tensor& record);
  // One small all-reduce of which variables got a gradient and of the logs; returns the per-variable flags.
  std::vector<double> reduce_flags_and_logs(const StepShard& shard, const std::vector<Var>& vars, Tensor& record,
                                            QueuedStep& queued);
  void reduce_gradients(const StepShard& shard, const std::vector<Var>& vars, const std::vector<double>& got_grad,
                        bool flat, bool overlapped, std::vector<Tensor>& grads);
  void apply_update(const std::vector<Var>& vars, std::vector<Tensor>& grads, bool flat, Tensor& record,
                    QueuedStep& queued);

  // fit() on several ranks: checks the options, copies rank 0's weights and streams, derives per-rank dropout.
  void start_data_parallel(const FitOptions& options, Communicator& comm);
  std::shared_ptr<LayerBucketObserver> overlap_;  // data-parallel buckets started during backward
  int64_t bucket_bytes_ = kDefaultBucketBytes;
  DType grad_comm_ = DType::kFloat32;

  // fit()'s loop (src/train/fit_loop.h), while it runs (null otherwise), for fit_state().
  class FitLoop;
  const FitLoop* live_fit_ = nullptr;

  uint64_t seed_;
  Rng init_rng_, shuffle_rng_, dropout_rng_;
  std::unique_ptr<Optimizer> optimizer_;
  // The trainable weights' flat value and gradient buffers (bound by train_step).
  ParameterArena arena_;
  std::optional<Loss> loss_;
  bool track_accuracy_ = false;
  bool track_top_k_ = false;
  // The compiled metrics' log names in compile()'s order, and the count behind each: a record's slot.
  std::vector<std::pair<std::string, int64_t>> metric_slots_;
  // Forward pass and loss of evaluate(); the results before they are printed.
  EvaluateResult evaluate_batches(const Tensor& x, const Tensor& y, int64_t batch_size, Communicator* comm);
};

}  // namespace mixtrain
