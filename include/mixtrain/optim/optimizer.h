// Optimizer: the base of SGD, Adam, AdamW and RMSprop. Variables and optimizer state are float32 (the "master
// weights"); gradients arrive as float32 tensors. Keras 3 semantics: one apply() is one update and advances
// iterations(); with a LearningRateSchedule the update uses schedule(iterations()).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mixtrain/autograd/var.h"
#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/fused_update.h"
#include "mixtrain/optim/parameter_arena.h"
#include "mixtrain/optim/schedules.h"
#include "mixtrain/optim/shard_group.h"

namespace mixtrain {

// Named tensors, as written to and read from checkpoints.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The loss-scaling state of a LossScaleOptimizer, read back to the host for logs and reports.
struct LossScaleReport {
  float scale = 1.0f;           // the current loss scale
  float min_scale_seen = 1.0f;  // the smallest scale used so far
  int64_t skipped_steps = 0;    // steps skipped for inf/NaN gradients
  int64_t good_steps_in_a_row = 0;
  bool last_step_skipped = false;
  bool stuck_at_floor = false;  // the floor alarm fired and no finite step followed
};

class Optimizer;
namespace optim_detail {
struct FlatPass;    // what apply_flat_gradients() hands to the update pass of the arena's device
struct FlatPasses;  // the CPU pass and the device pass (src/optim/flat_pass.h)
}  // namespace optim_detail

// What gates one fused update (Optimizer::apply_flat_gradients): a found_inf flag on the device, and whether a
// step it skips still advances iterations().
struct UpdateGate {
  const Tensor* found_inf = nullptr;
  bool skipped_steps_advance_iterations = false;
};

class Optimizer {
 public:
  explicit Optimizer(float learning_rate);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update: vars[i] -= f(grads[i]). grads[i] is float32 with vars[i]'s shape, or undefined (that variable is
  // left alone, like a None gradient in Keras). Variables must be floating and trainable; a float16 or bfloat16
  // variable is updated in float32 and rounded once. Calls bump_version() on
  // each updated variable so cached low-precision copies refresh. Throws Error on a mismatch before changing anything.
  virtual void apply(const std::vector<Tensor>& grads, const std::vector<Var>& vars);

  // The same update for every variable bound to `arena`, with each variable's gradient read from the arena
  // (variables without a gradient since the last zero_grad() are left alone), in one pass over each dtype's flat
  // buffer. Variable i is keyed like vars[i] in apply(arena.vars() ...), and the results (values, slots,
  // iterations, state()) are bit-identical to apply() with the gradients converted to float32. The pass also
  // refreshes the arena's compute copies of each updated variable and bumps its version. Optimizer slots of the
  // arena's variables move into flat float32 buffers with the arena's layout (state() is unchanged). Throws Error,
  // changing nothing, when the arena no longer matches its variables (rebind it) or on the checks of apply().
  virtual void apply_arena(ParameterArena& arena);
  // apply_arena() with dtype group g's gradients read from flat_grads[g] (g in the order of arena.dtypes())
  // instead of the arena's gradient buffers: each is 1-D with capacity(dtype) elements, in float32 or the
  // group's dtype (a LossScaleOptimizer passes float32 unscaled gradients for 16-bit groups). Whether a
  // variable is updated still follows its has_grad(). An empty flat_grads means the arena's own buffers.
  // With gate.found_inf (float32 (1,), on the arena's device) the pass reads the flag itself and, when it is
  // nonzero, changes nothing (values, compute copies, slots, versions): the step a LossScaleOptimizer skips.
  // iterations() then advances only when gate.skipped_steps_advance_iterations. So the skip decision is the
  // update kernel's, made on the device, and the host never branches on the flag.
  // An arena on a device (CUDA) is updated by the fused update op there (ops/fused_update.h), with the CPU's bits:
  // SGD, RMSprop, Adam and AdamW (an optimizer without fused_rule() refuses such an arena, naming itself). The flag
  // and the iteration count are read on the device; the host keeps the count's lower bound, learns each skip it
  // could not see from the step's logs (resolve_uncertain_update(), as Model::fit does), or else reads the
  // device's counter back when asked for it (iterations(), state(), learning_rate() under a schedule) or every
  // ops::kRateWindow such steps. Global clipping's norm stays on the device too.
  void apply_flat_gradients(ParameterArena& arena, const std::vector<Tensor>& flat_grads, const UpdateGate& gate = {});
  // Whether apply_arena() works for this optimizer (SGD, Adam, AdamW and RMSprop; a custom optimizer that overrides
  // only update() updates variables one by one through apply()).
  virtual bool supports_arena() const { return updates_spans(); }

  // ---- Loss scaling (a LossScaleOptimizer overrides these; a training step calls them on any optimizer) ----
  // Whether this optimizer scales the loss (and unscales the gradients it receives).
  virtual bool scales_loss() const { return false; }
  // The loss multiplied by the current loss scale; the loss itself for an optimizer that does not scale.
  // A training step seeds backward with scale_loss(ones): the gradient of the scaled loss.
  virtual Tensor scale_loss(const Tensor& loss) const { return loss; }
  // The same on a recorded loss, differentiably (Keras' optimizer.scale_loss(loss) in a custom loop): the
  // gradients of the result, e.g. from a GradientTape, are those of the scaled loss, which apply() unscales.
  virtual Var scale_loss(const Var& loss) const { return loss; }
  // The current loss scale read back to the host, for logs (1 when the loss is not scaled).
  virtual float loss_scale_for_logs() const { return 1.0f; }
  // The current loss scale as a float32 (1,) view of the state on `device` (moved there if it lives elsewhere),
  // for logs that a step on a GPU keeps there until they are read; undefined when the loss is not scaled.
  virtual Tensor loss_scale_on(const Device& device) const {
    (void)device;
    return Tensor();
  }
  // The loss-scaling state read back to the host, for logs and reports; nullopt when the loss is not scaled.
  virtual std::optional<LossScaleReport> loss_scale_report() const { return std::nullopt; }
  // Starts dynamic loss scaling over from its initial scale (recovery, once the layers whose overflows drove the
  // scale down compute in float32); nothing for an optimizer that does not scale.
  virtual void restart_loss_scale() {}
  // The optimizer that owns the update rule and its slots: this one, or the one a wrapper wraps.
  virtual Optimizer& inner_optimizer() { return *this; }
  virtual const Optimizer& inner_optimizer() const { return *this; }
  // The name checkpoints record: the update rule's ("adam" under a loss-scaling wrapper as well).
  std::string checkpoint_name() const { return inner_optimizer().name(); }

  // The learning rate the next update uses: schedule(iterations()) when a schedule is set (Keras evaluates it at
  // optimizer.iterations), else the fixed rate. During an update, the rate that update uses.
  virtual float learning_rate() const;
  // Sets the fixed rate (finite, >= 0). Throws Error while a schedule is set, as Keras does: the schedule owns
  // the rate (remove it with set_learning_rate_schedule(nullptr) first).
  virtual void set_learning_rate(float learning_rate);
  // Makes every update use schedule(iterations()) (keras.optimizers.schedules, optim/schedules.h). nullptr
  // removes the schedule and fixes the rate at the value it had reached. Checkpoints keep the position through
  // "iterations"; the schedule itself is configuration, set again before load_state().
  virtual void set_learning_rate_schedule(std::shared_ptr<const LearningRateSchedule> schedule);
  // The schedule set, or nullptr.
  virtual std::shared_ptr<const LearningRateSchedule> learning_rate_schedule() const { return schedule_; }

  // Number of applied updates (Adam's bias correction and learning-rate schedules read it). After updates of an
  // arena on a device that the host could not see skipped or not (and did not resolve), reads the device's counter
  // (a synchronisation).
  virtual int64_t iterations() const { return settled_iterations(); }
  // Sets the update count, for resuming and for wrappers that count skipped steps as iterations.
  virtual void set_iterations(int64_t iterations);
  // An update of an arena on a device whose skip flag the host could not see leaves the device's iteration
  // counter one of two values (it advanced or not). last_uncertain_update() names the last update when it did so
  // (a ticket; nullopt otherwise); resolve_uncertain_update() tells the host what the flag said once it has read it
  // anyway (Model::fit reads it with the step's logs), so iterations() and the rates of later updates need no read
  // of the counter. A ticket of an update already accounted for (the counter was read back or replaced since) is
  // ignored.
  std::optional<uint64_t> last_uncertain_update() const { return device_iterations_.last_uncertain; }
  void resolve_uncertain_update(uint64_t ticket, bool advanced);
  // The skip flag of the last update where it ran: float32 (1,), nonzero when the update was skipped (a
  // non-finite gradient under loss scaling); undefined for an optimizer that never skips.
  virtual Tensor last_skip_flag() const { return Tensor(); }

  // When set, gradients are rescaled so their global L2 norm is at most this value before each update
  // (Keras global_clipnorm). The gradients given to apply() must already be unscaled.
  virtual std::optional<float> global_clipnorm() const { return global_clipnorm_; }
  virtual void set_global_clipnorm(std::optional<float> clip_norm);

  // Keras 3's gradient_accumulation_steps: Model's training step splits each batch into this many micro-batches
  // (as even as possible, never an empty one), sums their scaled gradients in float32 in the gradient arena and
  // makes one update of the batch's mean gradient: one unscale and finite check, one iterations() advance, one
  // all-reduce data-parallel. 1 (the default): one backward pass per batch. The optimizer's apply() and
  // apply_arena() stay one update each; configuration, not state() (set it again before resuming).
  virtual int64_t gradient_accumulation_steps() const { return accumulation_steps_; }
  // Throws Error unless steps >= 1.
  virtual void set_gradient_accumulation_steps(int64_t steps);

  // ---- ZeRO stage 1 (optim/shard_group.h) ----
  // Splits the slots of the arena's variables across group's ranks: each keeps the slots of its buffer_share() of
  // every dtype group and its update pass (apply_arena / apply_flat_gradients, on the CPU) updates only that share,
  // with the gradients there already summed over the ranks (distributed/zero.h's reduce_scatter_gradients), then
  // all-gathers the updated values and compute copies. The skip flag and global clipping's norm are summed over
  // the ranks first, so every rank skips, clips and counts iterations as one process would. Every rank must call
  // the update with the same variables, gradients written and gate. nullptr (the default) keeps everything on
  // every rank; a group of one rank is taken as nullptr. Throws Error for a rule that rounds stochastically (its
  // random bits follow the element's offset in the whole buffer) or one without update_span().
  void set_shard_group(std::shared_ptr<ShardGroup> group);
  bool sharded() const { return shard_ != nullptr; }
  // Sharded: collects every rank's slots so that state() holds the whole state on every rank, as unsharded (the
  // checkpoint format does not change). A collective: every rank calls it at the same point. The next update
  // drops the other ranks' slots again. Nothing when not sharded.
  void gather_shards();

  // "sgd", "adam", "adamw", "rmsprop".
  virtual std::string name() const = 0;

  // The dtype of the slots: float32, or bfloat16 for Adam's moments under AdamOptions::optimizer_state (kept in
  // the arena's flat buffers, so only apply_arena() updates them). state() and load_state() use it.
  virtual DType state_dtype() const { return DType::kFloat32; }
  // The dtype of the slot named `slot` (state_dtype(), but Adam's Kahan compensation "kahan", always bfloat16).
  virtual DType slot_dtype(const std::string& slot) const {
    (void)slot;
    return state_dtype();
  }
  // Whether this optimizer keeps a slot of that name per variable ("m"; "kahan" only under Kahan summation).
  bool keeps_slot(const std::string& slot) const;

  // Everything needed to resume bit-identically: "iterations" (int32, shape (1,)), "learning_rate" (float32, (1,):
  // learning_rate(), the scheduled value when a schedule is set), and one tensor of state_dtype() per slot keyed
  // "<variable name>/<slot name>", e.g. "dense/kernel/m". A variable without a name is keyed "var_<i>" by its
  // position i in the vars given to apply(). Tensors are copies.
  virtual NamedTensors state() const;
  // Restores state(); slots for variables not updated yet are kept until their first update. With a schedule set,
  // the stored "learning_rate" is checked but not applied: the restored iterations() put the schedule where it
  // was. Throws Error on an unknown slot name, a missing "iterations" entry or a slot not of state_dtype(); the
  // optimizer is unchanged when it throws.
  virtual void load_state(const NamedTensors& state);

 protected:
  // The update rule for one variable: `value` and `grad` are float32 with n elements; slot(var_key, ...) gives its
  // state. Called once per variable per apply(), after validation and clipping, with iterations() not yet advanced.
  // The default calls update_span() with the variable's slots and update_class().
  virtual void update(float* value, const float* grad, int64_t n, const std::string& var_key);
  // The update rule on n consecutive float32 elements of one or more variables of class `cls` (see
  // update_class()); slots[k] points at the same elements of slot slot_names()[k]. Element-wise, so any split of
  // a buffer gives the same bits. apply_arena() calls it on blocks of the flat buffers from several threads.
  virtual void update_span(float* value, const float* grad, float* const* slots, int64_t n, int cls);
  // Whether update_span() is implemented (apply_arena() requires it).
  virtual bool updates_spans() const { return false; }
  // Variables of one class follow the same rule and may share an update_span() call (AdamW: decayed or not).
  virtual int update_class(const std::string& var_key) const;
  // Slot names this optimizer keeps per variable ("momentum"; "m", "v"). apply() creates them as zeros with the
  // variable's shape before the first update; load_state() accepts only these names.
  virtual std::vector<std::string> slot_names() const = 0;

  // The float32 slot `slot` of the variable keyed var_key (it has the variable's element count).
  float* slot(const std::string& var_key, const std::string& slot);

  // Refuses an update of no variables (apply(), apply_arena()): nothing would train, silently (the usual cause is
  // a variable list gathered from layers before they were built).
  void check_has_variables(const std::vector<Var>& vars) const;

  // Name of variable i in checkpoints: its own name, or "var_<i>" when it has none.
  static std::string var_key(const Var& var, size_t index);

  // The rule the fused update of an arena on a device runs (ops/fused_update.h): its constants, rounded to float32
  // as update_span() rounds them. SGD, RMSprop, Adam and AdamW return theirs; nullopt (the default) keeps a rule
  // on the CPU. A subclass that changes update_span() must return nullopt or constants that describe its rule.
  virtual std::optional<ops::UpdateConstants> fused_rule() const { return std::nullopt; }
  // The per-step rates of that rule for the update after `iterations` completed ones at learning rate lr (what
  // update_span() would compute then): lr itself; Adam adds its bias-corrected alpha.
  virtual ops::UpdateRates fused_rates(float lr, int64_t /*iterations*/) const { return {0.0f, lr}; }

 private:
  friend struct optim_detail::FlatPasses;

  // Evaluates the schedule once when an update starts and holds the value until it ends (see learning_rate()).
  class StepRatePin {
   public:
    explicit StepRatePin(Optimizer& opt) : opt_(opt) {
      if (opt.schedule_) opt.step_rate_ = opt.scheduled_rate();
    }
    ~StepRatePin() { opt_.step_rate_.reset(); }
    StepRatePin(const StepRatePin&) = delete;
    StepRatePin& operator=(const StepRatePin&) = delete;

   private:
    Optimizer& opt_;
  };

  // apply()'s checks of every variable and its gradient (device, dtype, trainable, shape, unique name, restored slot
  // sizes), before anything changes: the variables' keys (var_key()).
  std::vector<std::string> checked_keys(const std::vector<Tensor>& grads, const std::vector<Var>& vars) const;
  // apply() refuses bfloat16 variables when the rule rounds them stochastically (the arena update alone draws
  // by element offset; see AdamOptions::stochastic_rounding).
  void refuse_stochastic_rounding(const std::vector<Var>& vars) const;
  // apply() refuses 16-bit state and Kahan compensation: its update variable by variable reads float32 slots.
  void refuse_16bit_state() const;
  // load_state() refuses moments without their Kahan compensation when this optimizer keeps one.
  void check_kahan_slots(const std::map<std::string, Tensor>& slots) const;

  // The schedule's value at iterations_ (without reading a device counter back), checked to be finite and >= 0.
  float scheduled_rate() const { return scheduled_rate_at(iterations_); }
  float scheduled_rate_at(int64_t iterations) const;
  // The rate of an update that follows `iterations` completed ones: the schedule's, or the fixed rate.
  float rate_at(int64_t iterations) const { return schedule_ ? scheduled_rate_at(iterations) : learning_rate_; }

  float learning_rate_;
  std::shared_ptr<const LearningRateSchedule> schedule_;
  // The rate of the update in progress, so every variable and thread of one update reads the same value.
  std::optional<float> step_rate_;
  // Completed updates; while device_iterations_.uncertain > 0, the smallest count the device's counter may hold.
  mutable int64_t iterations_ = 0;
  // The iteration counter of updates on a device (int64 (1,)), advanced by the fused update there. The host knows
  // it lies in [iterations_, iterations_ + uncertain]: each gated step whose skipped steps do not count may or may
  // not have advanced it. Undefined until the first device update, and again whenever the host changes
  // iterations_ (set_iterations, load_state, a CPU update): the next device update uploads it.
  struct DeviceIterations {
    Tensor counter;
    int64_t uncertain = 0;
    // Advanced whenever the uncertain updates are accounted for at once (the counter read back, or dropped): the
    // ticket of every update uncertain now.
    uint64_t generation = 0;
    std::optional<uint64_t> last_uncertain;  // the last update's ticket, when it was uncertain
  };
  mutable DeviceIterations device_iterations_;
  // iterations_, exact: reads the device's counter back when it is uncertain.
  int64_t settled_iterations() const;
  // After the host changed iterations_: the device's counter no longer holds it.
  void drop_device_counter() {
    device_iterations_ = DeviceIterations{Tensor(), 0, device_iterations_.generation + 1, std::nullopt};
  }
  std::optional<float> global_clipnorm_;
  int64_t accumulation_steps_ = 1;
  // Moves the slots of the arena's variables into flat buffers with its layout (see apply_arena()).
  void bind_flat_slots(const ParameterArena& arena, const std::vector<std::string>& keys);

  std::map<std::string, Tensor> slots_;  // key "<var key>/<slot>"; sorted, so state() order is stable
  // Incremented whenever slots_ gains or replaces tensors outside apply_arena(), so flat slots are rebuilt.
  uint64_t slots_generation_ = 0;
  // The flat slot buffers (state_dtype(), one per slot name, per arena dtype group) of the last arena applied.
  struct FlatSlots {
    uint64_t layout_id = 0;
    uint64_t generation = 0;
    std::vector<DType> dtypes;
    std::vector<std::vector<Tensor>> buffers;  // [group][slot], each (capacity,)
    // The device update's runs per group (begin, count, class rows) and their int64 (runs, 3) tensor on the
    // arena's device, uploaded again only when the runs change.
    std::vector<std::vector<int64_t>> run_rows;
    std::vector<Tensor> run_tensors;
    // Sharded (set_shard_group): each group's share (its slot buffers hold only that), each group's capacity, and
    // per arena variable its place, key and shape, and whether its slots exist (it has been updated or loaded).
    std::vector<BufferShare> shares;
    std::vector<int64_t> capacities;
    std::vector<ParameterArena::Entry> entries;
    std::vector<std::string> keys;
    std::vector<Shape> shapes;
    std::vector<char> created;
  };
  FlatSlots flat_;
  std::shared_ptr<ShardGroup> shard_;
  // Sharded: the share of one group of the arena, and the flat slots' binding that keeps only it.
  void bind_sharded_slots(const ParameterArena& arena, const std::vector<std::string>& keys, FlatSlots& flat);
  // Sharded: refuses state() while a created slot lives on another rank only.
  void check_state_gathered() const;
};

// Creates "sgd", "adam", "adamw" or "rmsprop" with default hyperparameters and the given learning rate.
// Throws Error (kInvalidInput) listing the valid names otherwise.
std::unique_ptr<Optimizer> make_optimizer(std::string_view name, float learning_rate);

// The global L2 norm sqrt(sum of g^2 over all tensors), accumulated in double. Accepts float32, float16 and bfloat16
// tensors; undefined tensors are skipped. Infinite or NaN if any element is.
float global_norm(const std::vector<Tensor>& grads);

// When global_norm(grads) > clip_norm, replaces each tensor by a new float32 tensor g * (clip_norm / norm); the
// caller's original storage is never written. A non-finite norm turns every gradient to NaN (as Keras does), so a
// loss-scaling wrapper or the caller sees the overflow instead of a silently clipped step.
void clip_by_global_norm(std::vector<Tensor>& grads, float clip_norm);

}  // namespace mixtrain
