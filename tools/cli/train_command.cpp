#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "args.h"
#include "commands.h"
#include "run_options.h"
#include "stop_signals.h"
#include "mixtrain/core/allocator.h"
#include "mixtrain/core/file_checks.h"
#include "mixtrain/core/output_lock.h"
#include "mixtrain/core/pending_temp_file.h"
#include "mixtrain/data/csv.h"
#include "mixtrain/data/image_dataset.h"
#include "mixtrain/data/normalize.h"
#include "mixtrain/data/text.h"
#include "mixtrain/data/token_text.h"
#include "mixtrain/distributed/device_communicator.h"
#include "mixtrain/report/progress_bar.h"
#include "mixtrain/train/batch_size.h"
#include "mixtrain/train/memory_plan.h"

namespace mixtrain::cli {

namespace {
constexpr double kHoldoutFraction = 1.0 / 7;  // as Fashion-MNIST's 60,000 / 10,000 train/test ratio

Json number_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(); }
}  // namespace

DataSplits load_data(const RunOptions& o, RunConfig& cfg) {
  const std::string& spec = o.data;
  const bool text = is_text_data(spec);
  MIXTRAIN_CHECK(text == (cfg.model == "transformer"),
                 (text ? "--data " + spec + " is text: train it with --model transformer"
                       : "--model transformer is a character language model: give it text with --data moby-dick or "
                         "--data text:PATH"));
  if (text) {
    MIXTRAIN_CHECK(!o.normalize, "--normalize applies to features, not to text (--data " << spec << ")");
    const std::string path = spec == "moby-dick" ? moby_dick_path() : spec.substr(5);
    MIXTRAIN_CHECK(!path.empty(), "--data text:PATH needs a path after 'text:'");
    TextDatasetOptions windows;
    windows.context_length = cfg.context_length;
    const auto start = std::chrono::steady_clock::now();
    TextDataset t = load_token_text_dataset(path, windows, o.tokenizer);
    cfg.vocabulary.assign(t.vocabulary.code_points().begin(), t.vocabulary.code_points().end());
    cfg.tokenizer = o.tokenizer.text.empty() ? "char" : o.tokenizer.text;
    cfg.tokenizer_model = t.tokenizer->serialized_model();
    if (!cfg.tokenizer_model.empty() && writes_outputs())
      std::printf("tokenizer: %s, %lld subword pieces (%s in %.1f s)\n", cfg.tokenizer.c_str(),
                  static_cast<long long>(t.tokenizer->size()),
                  o.tokenizer.kind == TokenizerSpec::Kind::kModelFile ? "loaded and applied" : "trained and applied",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return std::move(t.splits);
  }
  const uint64_t seed = cfg.seed;
  const bool is_csv = is_csv_data(spec);
  DataSplits d;
  if (spec == "fashion-mnist")
    d = load_fashion_mnist();
  else if (is_csv)
    d = load_csv_splits(spec, kHoldoutFraction, seed, o.csv);
  else
    d = load_idx_dataset(spec, kHoldoutFraction, seed);
  // Images arrive scaled to [0, 1]; CSV features are standardised unless told otherwise.
  const Normalization mode = o.normalize.value_or(is_csv ? Normalization::kStandard : Normalization::kNone);
  const Normalizer norm = Normalizer::fit(d.train.x, mode);
  norm.apply(d.train.x);
  norm.apply(d.test.x);
  return d;
}

Json run_to_json(const RunConfig& cfg, const std::string& data_spec, const RunResult& r) {
  Json j = Json::object();
  j["model"] = cfg.model;
  j["data"] = data_spec;
  if (!cfg.tokenizer_model.empty()) j["tokenizer"] = cfg.tokenizer;  // only when not characters, as before
  j["policy"] = cfg.policy;
  j["seed"] = static_cast<double>(cfg.seed);
  j["batch_size"] = cfg.batch_size;
  j["device"] = cfg.device.str();
  if (cfg.steps > 0) j["steps"] = cfg.steps;
  if (cfg.communicator) {
    j["ranks"] = cfg.communicator->size();
    j["communicator"] = cfg.communicator->backend();  // "mpi", or "mpi+nccl" on GPUs with NCCL
    j["synchronized_batch_norm"] = cfg.synchronized_batch_norm;
    j["communication_seconds"] = cfg.communicator->stats().seconds;
    j["communication_bytes_per_rank"] = static_cast<double>(cfg.communicator->stats().bytes);
  }
  Json epochs = Json::array();
  const auto& h = r.history.history;
  auto at = [&](const char* key, size_t i) {
    auto it = h.find(key);
    return it != h.end() && i < it->second.size() ? number_or_null(it->second[i]) : Json();
  };
  for (size_t i = 0; i < r.history.epoch.size(); ++i) {
    Json e = Json::object();
    e["epoch"] = r.history.epoch[i] + 1;
    // A run by steps evaluates every steps_per_epoch() steps: the step count at this evaluation.
    if (cfg.steps > 0) e["step"] = std::min<int64_t>((r.history.epoch[i] + 1) * cfg.steps_per_epoch(), cfg.fit_epochs() * cfg.steps_per_epoch());
    e["loss"] = at("loss", i);
    e["accuracy"] = at("accuracy", i);
    e["val_loss"] = at("val_loss", i);
    e["val_accuracy"] = at("val_accuracy", i);
    e["seconds"] = r.history.epoch_seconds[i];
    if (r.loss_scaled) e["loss_scale"] = at("loss_scale", i);
    epochs.push_back(e);
  }
  j["epochs"] = epochs;
  Json steps = Json::array();
  for (double v : r.history.step_loss) steps.push_back(number_or_null(v));
  j["step_loss"] = steps;
  if (!r.history.step_loss_scale.empty()) {
    // The scale each step used: a halving marks a skipped (non-finite) step.
    Json scales = Json::array();
    for (double v : r.history.step_loss_scale) scales.push_back(number_or_null(v));
    j["step_loss_scale"] = scales;
  }
  j["test"] = Json::object({{"loss", number_or_null(r.test.loss)}, {"accuracy", number_or_null(r.test.accuracy)}});
  j["steps_per_second"] = r.steps_per_second;
  j["samples_per_second"] = r.samples_per_second;
  if (r.tokens_per_second > 0) j["tokens_per_second"] = r.tokens_per_second;
  j["peak_memory_bytes"] = static_cast<double>(r.peak_memory_bytes);
  j["recovery"] = recovery_to_json(r.recovery);
  if (!r.recovery_timing.empty()) j["recovery_timing"] = r.recovery_timing;
  Json layers = Json::object();
  for (auto& [name, dtype] : r.layer_compute_dtypes) layers[name] = dtype;
  j["layer_compute_dtypes"] = layers;
  Json policies = Json::object();
  for (auto& [name, policy] : r.layer_policies) policies[name] = policy;
  j["layer_policies"] = policies;
  if (r.loss_scaled)
    j["loss_scale"] = Json::object({{"initial", r.initial_scale},
                                    {"final", r.final_scale},
                                    {"min_seen", r.min_scale_seen},
                                    {"skipped_steps", static_cast<double>(r.skipped_steps)}});
  return j;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  // A link's target is replaced, not the link; a FIFO, device or directory at path is refused, not replaced.
  const std::string target = output_file_target(path, "output file");
  const std::string tmp = target + ".tmp." + std::to_string(::getpid());
  const PendingTempFile pending(tmp);  // removed by a second stop signal (stop_signals.h)
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) MIXTRAIN_FAIL(kIo, "cannot write '" << path << "'", "check that the directory exists and is writable");
    f << text;
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      MIXTRAIN_FAIL(kIo, "writing '" << path << "' failed", "check free disk space");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::remove(tmp.c_str());
    MIXTRAIN_FAIL(kIo, "cannot replace '" << path << "': " << ec.message(), "");
  }
}

Communicator* data_parallel_job() {
  if (!launched_by_mpi()) return nullptr;
  Communicator& world = world_communicator();
  return world.size() > 1 ? &world : nullptr;
}

Communicator* data_parallel_job_on(const Device& device) {
  Communicator* job = data_parallel_job();
  if (job == nullptr || device.is_cpu()) return job;
  // Made once per process, collectively (every rank of the job comes here with its own GPU), and kept to the end.
  static std::unique_ptr<Communicator> on_device;
  static std::optional<Device> tried;
  if (!tried) {
    tried = device;
    std::string why;
    on_device = device_communicator(*job, device, &why);
    if (!on_device && job->rank() == 0)
      std::printf("data-parallel on %s without NCCL (%s): device memory goes through host copies, a wait per step\n",
                  device.str().c_str(), why.c_str());
  }
  MIXTRAIN_CHECK(*tried == device, "data-parallel: this process already runs on " << tried->str() << ", not "
                                                                                    << device.str());
  return on_device ? on_device.get() : job;
}

bool writes_outputs() {
  const Communicator* job = data_parallel_job();
  return !job || job->rank() == 0;
}

void check_global_batch(const RunConfig& cfg, Communicator* job) {
  // --zero 1 on one process: nothing to split, and the run is a plain one (so a checkpoint moves between both).
  if (!job && cfg.zero_stage == 1) std::printf("--zero 1: one process, nothing to split; training as without it\n");
  if (!job && cfg.grad_comm == "bfloat16")
    std::printf("--grad-comm bfloat16: one process, no gradients to exchange; training as without it\n");
  if (!job) return;
  MIXTRAIN_CHECK(cfg.batch_size % job->size() == 0,
                 "--batch-size " << cfg.batch_size << " is the global batch and must divide by the " << job->size()
                                 << " ranks of this job (each rank trains on batch-size / ranks rows per step); give "
                                 << (cfg.batch_size / job->size() + 1) * job->size() << " or "
                                 << std::max<int64_t>(1, cfg.batch_size / job->size()) * job->size());
  std::printf("data-parallel: %d ranks (%s), global batch %lld = %d x %lld rows per rank%s%s%s\n", job->size(),
              job->backend().c_str(), static_cast<long long>(cfg.batch_size), job->size(),
              static_cast<long long>(cfg.batch_size / job->size()),
              cfg.synchronized_batch_norm ? ", BatchNormalization synchronized over the ranks" : "",
              cfg.zero_stage == 1 ? ", ZeRO-1: optimizer state split over the ranks" : "",
              cfg.grad_comm == "bfloat16" ? ", gradients exchanged in bfloat16" : "");
}

void resolve_batch_size(RunConfig& cfg, const RunOptions& o, const DataSplits& data) {
  if (!o.batch_size_auto) return;
  // The default budget is a share of the device's free memory (the host's, or the GPU's as its driver reports it).
  int64_t budget = o.memory_budget ? *o.memory_budget : default_memory_budget(cfg.device);
  // Data-parallel: every rank must train the same batch, but each one's free memory (and what its device can hold)
  // may differ: the ranks search within the smallest budget and take the smallest batch any of them found.
  Communicator* job = data_parallel_job();
  const auto smallest_over_ranks = [job](int64_t v) {
    if (job == nullptr) return v;
    double d = static_cast<double>(v);
    job->all_reduce(&d, 1, ReduceOp::kMin);
    return static_cast<int64_t>(d);
  };
  budget = smallest_over_ranks(budget);
  const int64_t rows = training_rows(data.train.size(), cfg.validation_split);
  // Windows of ids (the transformer's data) have a target per position; a trial step must see them so.
  const StepSamples samples{data.train.sample_shape, data.train.y.rank() == 2};
  const BatchSizeSearch s = find_max_batch_size(cfg, data.train.num_features(),
                                                std::max(data.train.num_classes, data.test.num_classes), budget, rows,
                                                samples);
  cfg.batch_size = smallest_over_ranks(s.batch_size);
  std::printf("batch size auto (%s): %lld rows, one step peaks at %.1f MiB of a %.1f MiB budget (%zu trial steps)%s\n",
              cfg.policy.c_str(), static_cast<long long>(s.batch_size), static_cast<double>(s.peak_bytes) / (1 << 20),
              static_cast<double>(budget) / (1 << 20), s.trials.size(),
              cfg.batch_size < s.batch_size ? "; another rank fits fewer, so every rank takes its batch" : "");
  // Data-parallel: the budget is each rank's; the global batch is the ranks' batches together.
  if (job != nullptr) cfg.batch_size *= job->size();
}

Json recovery_to_json(const std::vector<RecoveryEvent>& events) {
  Json arr = Json::array();
  for (const RecoveryEvent& e : events) {
    Json layers = Json::array();
    for (const std::string& l : e.layers) layers.push_back(l);
    arr.push_back(Json::object(
        {{"step", static_cast<double>(e.step)}, {"action", e.action}, {"reason", e.reason}, {"layers", layers}}));
  }
  return arr;
}

void require_writable_output(const std::string& path, const char* flag) {
  namespace fs = std::filesystem;
  const fs::path target = output_file_target(path, flag);  // a FIFO, device or directory is refused here
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec) || ::access(parent.c_str(), W_OK) != 0)
    MIXTRAIN_FAIL(kIo, flag << " " << path << ": the directory '" << parent.string() << "' does not exist or is not writable",
                  "give a path in a writable directory");
}

namespace {

// Refuses an output path (out) that names the same file as other, an input or another output of the run.
void require_distinct_paths(const std::string& out, const char* out_flag, const std::string& other,
                            const char* other_flag) {
  if (out.empty() || other.empty() || !same_file(output_file_target(out, out_flag), other)) return;
  MIXTRAIN_FAIL(kInvalidInput, out_flag << " " << out << " is the same file as " << other_flag << " " << other
                                        << "; writing it would destroy it",
                std::string("give ") + out_flag + " a path of its own");
}

// The file a --data spec reads ("" for the built-in Fashion-MNIST; an IDX spec's labels file is not counted).
std::string data_file_of(const std::string& spec) {
  if (spec == "fashion-mnist") return "";
  if (spec == "moby-dick") return moby_dick_path();
  return is_text_data(spec) ? spec.substr(5) : spec;
}

// The one line of a run stopped by a signal (RunResult::interrupted), and its exit status.
int report_interrupted(const RunConfig& cfg, const RunResult& r, int sig) {
  std::cerr << "mixtrain train: stopped by " << signal_name(sig) << " after step " << r.history.step_loss.size()
            << (r.interrupted ? "" : ", the last (the run is complete)");
  if (!r.checkpoint.empty())
    std::cerr << "; checkpoint saved to " << r.checkpoint << " (continue with the same flags and --resume "
              << r.checkpoint << ")\n";
  else if (!cfg.save_path.empty())  // nothing left to train, or the state held NaN or Inf (warned above)
    std::cerr << "; this run wrote no checkpoint"
              << (cfg.resume_path.empty() ? "" : " (continue from " + cfg.resume_path + ")") << "\n";
  else
    std::cerr << "; no checkpoint was asked for (give --save PATH to keep a stopped run's progress)\n";
  return exit_status_for_signal(sig);
}

// After a run that ended non-finite: what the recovery ladder did about it, or what to try.
std::string recovery_outcome(const RunConfig& cfg, const RunResult& r) {
  if (!cfg.recover) return "; try --recover, or --policy float32";
  for (const RecoveryEvent& e : r.recovery)
    if (e.action == "give_up") return "; the recovery ladder gave up";
  return "; the recovery ladder took no action (" + r.recovery_timing + "): try --policy float32";
}

}  // namespace

void print_data_line(const std::string& spec, const DataSplits& data, const std::string& unit) {
  if (data.train.x.dtype() == DType::kInt32) {
    std::cout << "data: " << spec << " (" << data.train.source << ") — " << data.train.size() << " training and "
              << data.test.size() << " validation windows of " << data.train.x.dim(1) << " " << unit
              << ", vocabulary of " << data.train.num_classes << " " << unit << "\n";
    return;
  }
  std::cout << "data: " << spec << " — " << data.train.size() << " training and " << data.test.size()
            << (data.test_from_files ? " test" : " held-out test") << " samples, " << data.train.num_features()
            << " features, " << data.train.num_classes << " classes\n";
}

void print_run_summary(const RunResult& r, const char* unit) {
  if (r.tokens_per_second > 0) {
    std::printf("validation: loss %.4f nats per %s - accuracy %.4f\n", r.test.loss, unit, r.test.accuracy);
    std::printf("speed: %.1f steps/s, %.0f tokens/s; peak memory %.1f MiB (%s compute)\n", r.steps_per_second,
                r.tokens_per_second, static_cast<double>(r.peak_memory_bytes) / (1 << 20), r.compute_dtype.c_str());
  } else {
    std::printf("test: loss %.4f - accuracy %.4f\n", r.test.loss, r.test.accuracy);
    std::printf("speed: %.1f steps/s, %.0f samples/s; peak memory %.1f MiB (%s compute)\n", r.steps_per_second,
                r.samples_per_second, static_cast<double>(r.peak_memory_bytes) / (1 << 20), r.compute_dtype.c_str());
  }
  if (r.loss_scaled)
    std::printf("loss scale: initial %g, final %g, min seen %g, skipped steps %lld\n", r.initial_scale, r.final_scale,
                r.min_scale_seen, static_cast<long long>(r.skipped_steps));
  if (!r.recovery.empty()) {
    std::printf("recovery: %zu actions; layers now:", r.recovery.size());
    for (auto& [name, dtype] : r.layer_compute_dtypes) std::printf(" %s=%s", name.c_str(), dtype.c_str());
    std::printf("\n");
  }
}

// --memory-plan: before training, where memory will go, for this rank's share of the batch. With --memory-budget
// and a batch given, a plan over the budget is refused before the model is built (with auto, the budget was the
// batch search's, which the plan's batch already fits).
std::optional<MemoryPlan> plan_memory(const Args& a, const RunOptions& o, const RunConfig& cfg, const DataSplits& data,
                                      bool writer) {
  if (!a.has("memory-plan")) return std::nullopt;
  MemoryPlan plan = plan_run_memory(cfg, data);
  if (writer) std::cout << memory_plan_text(plan) << std::flush;
  if (o.memory_budget && !o.batch_size_auto) check_plan_within_budget(plan, *o.memory_budget, "--memory-budget");
  return plan;
}

int train_command(const std::vector<std::string>& argv) {
  std::set<std::string> flags = run_flags();
  flags.insert({"json", "save", "save-every", "resume", "device"});
  Args a(argv, flags, {"recover", "sync-batch-norm", "memory-plan"});
  const RunOptions o = run_options_from(a, "train");
  RunConfig cfg = o.run;
  cfg.save_path = a.path("save");
  cfg.save_every = a.integer("save-every", 0);  // 1 to 2^63-1 (integer_range)
  if (a.has("save-every") && cfg.save_path.empty())
    MIXTRAIN_FAIL(kInvalidInput, "--save-every " << cfg.save_every << " needs --save PATH (the checkpoint it rewrites)",
                  "add --save CKPT; resume a killed run with the same flags plus --resume CKPT");
  cfg.resume_path = a.path("resume");
  const std::string& data_spec = o.data;
  const std::string json_path = a.path("json");

  // Data-parallel (mpirun): every rank trains; rank 0 alone writes the JSON and the checkpoints.
  Communicator* job = data_parallel_job_on(cfg.device);
  const bool writer = writes_outputs();
  // SIGTERM, SIGINT, SIGHUP: stop after the step, save, exit 128 + the signal. Not data-parallel: the ranks
  // would stop at different steps (mpirun's signals kill the job; --save-every bounds what is lost).
  static StopRequest stop;
  if (!job) {
    install_stop_signals(stop);
    cfg.stop_request = &stop;
  }
  if (!o.batch_size_auto) check_global_batch(cfg, job);
  cfg.communicator = job;
  // Output paths are checked before the (long) training, not found unwritable after it.
  if (!json_path.empty() && writer) require_writable_output(json_path, "--json");
  if (!cfg.save_path.empty() && writer) require_writable_output(cfg.save_path, "--save");
  // Held to the end of the run: a second run saving to the same checkpoint is refused, naming this one.
  std::optional<OutputLock> save_lock;
  if (!cfg.save_path.empty() && writer) save_lock.emplace(cfg.save_path, "--save");
  // A checkpoint to resume that is a FIFO or device is refused before the data is read (a missing one is the
  // loader's to report, with its own message).
  if (std::error_code ec; !cfg.resume_path.empty() && std::filesystem::exists(cfg.resume_path, ec))
    require_regular_file(cfg.resume_path, "--resume checkpoint");
  // An output never overwrites an input or the other output; --save may be --resume (resume and save back).
  require_distinct_paths(json_path, "--json", cfg.save_path, "--save");
  require_distinct_paths(json_path, "--json", cfg.resume_path, "--resume");
  require_distinct_paths(json_path, "--json", data_file_of(data_spec), "--data");
  require_distinct_paths(cfg.save_path, "--save", data_file_of(data_spec), "--data");
  // Before the JSON report labels its evaluations with the run's interval.
  adopt_resumed_eval_interval(cfg, writer ? &std::cout : nullptr);
  DataSplits data = load_data(o, cfg);
  print_data_line(data_spec, data, token_unit(cfg));
  std::cout << resolve_default_steps(cfg, o, data);  // what a subword model's default steps are
  resolve_batch_size(cfg, o, data);
  if (o.batch_size_auto) check_global_batch(cfg, job);
  const std::optional<MemoryPlan> plan = plan_memory(a, o, cfg, data, writer);
  RunResult r = run_training(cfg, data, &std::cout, stdout_is_terminal());
  if (r.interrupted) return report_interrupted(cfg, r, stop.reason());
  print_run_summary(r, loss_unit(cfg));
  if (plan && writer) std::cout << memory_measured_text(*plan, r.model_bytes + r.peak_memory_bytes);
  if (!json_path.empty() && writer) {
    Json report = run_to_json(cfg, data_spec, r);
    if (plan) report["memory_plan"] = memory_plan_json(*plan, r.model_bytes + r.peak_memory_bytes);
    write_file_atomically(json_path, report.dump(2) + "\n");
    std::cout << "wrote " << json_path << "\n";
  }
  if (r.initial_epoch >= cfg.fit_epochs())
    std::cerr << "mixtrain train: warning: nothing was trained: the checkpoint " << cfg.resume_path << " already holds "
              << r.initial_epoch << " of the " << cfg.fit_epochs() << " epochs asked for (raise --epochs or --steps)\n";
  close_stop_signals();  // the status is chosen from here on: a later signal is ignored
  const double last_loss = r.history.step_loss.empty() ? 0.0 : r.history.step_loss.back();
  if (!std::isfinite(last_loss) || !std::isfinite(r.test.loss)) {
    std::cerr << "mixtrain train: error: training ended with a non-finite loss (last step " << last_loss
              << ", test " << r.test.loss << ")"
              << recovery_outcome(cfg, r) << "\n";
    return kExitDiverged;
  }
  // A stop signal after the last step: the run finished its report, and still says it was asked to stop.
  if (stop.requested()) return report_interrupted(cfg, r, stop.reason());
  return 0;
}

}  // namespace mixtrain::cli
