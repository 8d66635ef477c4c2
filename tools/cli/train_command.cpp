#include <unistd.h>

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
#include "mixtrain/core/allocator.h"
#include "mixtrain/data/csv.h"
#include "mixtrain/data/image_dataset.h"
#include "mixtrain/data/normalize.h"
#include "mixtrain/data/text.h"
#include "mixtrain/dist/device_communicator.h"
#include "mixtrain/report/progress_bar.h"
#include "mixtrain/train/batch_size.h"

namespace mixtrain::cli {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
constexpr double kHoldoutFraction = 1.0 / 7;  // as Fashion-MNIST's 60,000 / 10,000 train/test ratio

Json number_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(); }
}  // namespace

bool is_text_data(const std::string& spec) { return spec == "moby-dick" || spec.rfind("text:", 0) == 0; }

// Whether text is a whole integer: an optional sign, then digits only.
bool is_integer_text(const std::string& text) {
  const size_t first = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
  return text.size() > first && text.find_first_not_of("0123456789", first) == std::string::npos;
}

bool is_csv_data(const std::string& spec) { return ends_with(spec, ".csv") || ends_with(spec, ".csv.gz"); }

CsvOptions csv_options_from(const Args& a) {
  CsvOptions o;
  const std::string spec = a.str("data", "fashion-mnist");
  for (const char* flag : {"csv-header", "label-column"})
    if (a.has(flag) && !is_csv_data(spec))
      MIXTRAIN_FAIL(kInvalidInput, "--" << flag << " applies to CSV data, not to --data " << spec,
                    "give a CSV file: --data FILE.csv or FILE.csv.gz");
  if (a.has("csv-header")) {
    const std::string v = a.str("csv-header", "");
    if (v != "auto" && v != "yes" && v != "no")
      MIXTRAIN_FAIL(kInvalidInput, "--csv-header must be auto, yes or no, got '" << v << "'",
                    "auto (the default) reads the first line as a header when one of its cells is not a number");
    o.header = parse_csv_header(v);
  }
  if (a.has("label-column")) {
    const std::string v = a.str("label-column", "");
    if (v.empty())
      MIXTRAIN_FAIL(kInvalidInput, "--label-column needs a column NAME from the header row or a 0-based INDEX, got ''",
                    "a negative INDEX counts from the end: -1 (the default) is the last column");
    // A whole integer is an index (a column literally named "3" is chosen by its position); anything else a name.
    if (is_integer_text(v))
      o.label_index = a.integer("label-column", -1);
    else
      o.label_column = v;
  }
  return o;
}

DataSplits load_data(const std::string& spec, const Args& a, RunConfig& cfg) {
  const std::string normalize = a.str("normalize", "");
  const CsvOptions csv = csv_options_from(a);
  const bool text = is_text_data(spec);
  MIXTRAIN_CHECK(text == (cfg.model == "transformer"),
                 (text ? "--data " + spec + " is text: train it with --model transformer"
                       : "--model transformer is a character language model: give it text with --data moby-dick or "
                         "--data text:PATH"));
  if (text) {
    MIXTRAIN_CHECK(normalize.empty(), "--normalize applies to features, not to text (--data " << spec << ")");
    const std::string path = spec == "moby-dick" ? moby_dick_path() : spec.substr(5);
    MIXTRAIN_CHECK(!path.empty(), "--data text:PATH needs a path after 'text:'");
    TextDatasetOptions o;
    o.context_length = cfg.context_length;
    TextDataset t = load_text_dataset(path, o);
    cfg.vocabulary.assign(t.vocabulary.code_points().begin(), t.vocabulary.code_points().end());
    return std::move(t.splits);
  }
  const uint64_t seed = cfg.seed;
  const bool is_csv = is_csv_data(spec);
  DataSplits d;
  if (spec == "fashion-mnist")
    d = load_fashion_mnist();
  else if (is_csv)
    d = load_csv_splits(spec, kHoldoutFraction, seed, csv);
  else
    d = load_idx_dataset(spec, kHoldoutFraction, seed);
  // Images arrive scaled to [0, 1]; CSV features are standardised unless told otherwise.
  const Normalization mode = parse_normalization(normalize.empty() ? (is_csv ? "standard" : "none") : normalize);
  const Normalizer norm = Normalizer::fit(d.train.x, mode);
  norm.apply(d.train.x);
  norm.apply(d.test.x);
  return d;
}

Json run_to_json(const RunConfig& cfg, const std::string& data_spec, const RunResult& r) {
  Json j = Json::object();
  j["model"] = cfg.model;
  j["data"] = data_spec;
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
  Json layers = Json::object();
  for (auto& [name, dtype] : r.layer_compute_dtypes) layers[name] = dtype;
  j["layer_compute_dtypes"] = layers;
  if (r.loss_scaled)
    j["loss_scale"] = Json::object({{"initial", r.initial_scale},
                                    {"final", r.final_scale},
                                    {"min_seen", r.min_scale_seen},
                                    {"skipped_steps", static_cast<double>(r.skipped_steps)}});
  return j;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
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
  std::filesystem::rename(tmp, path, ec);
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
  if (!job) return;
  MIXTRAIN_CHECK(cfg.batch_size % job->size() == 0,
                 "--batch-size " << cfg.batch_size << " is the global batch and must divide by the " << job->size()
                                 << " ranks of this job (each rank trains on batch-size / ranks rows per step); give "
                                 << (cfg.batch_size / job->size() + 1) * job->size() << " or "
                                 << std::max<int64_t>(1, cfg.batch_size / job->size()) * job->size());
  std::printf("data-parallel: %d ranks (%s), global batch %lld = %d x %lld rows per rank%s\n", job->size(),
              job->backend().c_str(), static_cast<long long>(cfg.batch_size), job->size(),
              static_cast<long long>(cfg.batch_size / job->size()),
              cfg.synchronized_batch_norm ? ", BatchNormalization synchronized over the ranks" : "");
}

const std::set<std::string>& run_flags() {
  static const std::set<std::string> flags = {
      "model",         "data",       "epochs",        "batch-size", "lr",         "optimizer",   "seed",
      "policy",        "normalize",  "hidden",        "validation-split",         "loss-scale",  "memory-budget",
      "steps",         "eval-every", "lr-schedule",   "warmup-steps", "weight-decay", "clipnorm", "context",
      "width",         "layers",     "heads",         "dropout",    "attention-logit-multiplier", "csv-header",
      "label-column"};
  return flags;
}

bool auto_batch_size(const Args& a) { return a.str("batch-size", "") == "auto"; }

void resolve_batch_size(RunConfig& cfg, const Args& a, const DataSplits& data) {
  if (!auto_batch_size(a)) return;
  // The default budget is a share of the device's free memory (the host's, or the GPU's as its driver reports it).
  int64_t budget = a.has("memory-budget") ? parse_memory_size(a.str("memory-budget", ""), "--memory-budget")
                                          : default_memory_budget(cfg.device);
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
  const BatchSizeSearch s = find_max_batch_size(cfg, data.train.num_features(),
                                                std::max(data.train.num_classes, data.test.num_classes), budget, rows);
  cfg.batch_size = smallest_over_ranks(s.batch_size);
  std::printf("batch size auto (%s): %lld rows, one step peaks at %.1f MiB of a %.1f MiB budget (%zu trial steps)%s\n",
              cfg.policy.c_str(), static_cast<long long>(s.batch_size), static_cast<double>(s.peak_bytes) / (1 << 20),
              static_cast<double>(budget) / (1 << 20), s.trials.size(),
              cfg.batch_size < s.batch_size ? "; another rank fits fewer, so every rank takes its batch" : "");
  // Data-parallel: the budget is each rank's; the global batch is the ranks' batches together.
  if (job != nullptr) cfg.batch_size *= job->size();
}

namespace {
// The flags of runs by steps and of the transformer, with the transformer's own defaults where the user gives
// none: AdamW, a cosine schedule with warm-up, clipping at norm 1 and batches of 32 windows, trained for
// kTransformerSteps steps (the usual recipe for small character models; Adam at a constant rate and no
// clipping trains them less well).
constexpr int64_t kTransformerSteps = 1000;
// The CNN's recipe where the user gives none: Adam at 3e-3 with a warm-up and cosine decay over the run.
// On Fashion-MNIST (5 epochs, batch 256, seed 1, float32) it lifts test accuracy from 0.9005 (Adam 1e-3,
// constant) to 0.9142; cosine at 1e-3 or 2e-3 without the warm-up reached 0.9086 and 0.9078.
void apply_cnn_recipe(RunConfig& cfg, const Args& a) {
  if (cfg.model != "cnn") return;
  if (!a.has("lr")) cfg.learning_rate = 3e-3f;
  if (!a.has("lr-schedule")) cfg.lr_schedule = "cosine";
}
void apply_sequence_flags(RunConfig& cfg, const Args& a) {
  const bool transformer = cfg.model == "transformer";
  apply_cnn_recipe(cfg, a);
  if (transformer) {
    if (!a.has("optimizer")) cfg.optimizer = "adamw";
    if (!a.has("batch-size")) cfg.batch_size = 32;
    if (!a.has("lr")) cfg.learning_rate = 2e-3f;
    cfg.lr_schedule = "cosine";
    cfg.clipnorm = 1.0f;
    cfg.weight_decay = 0.01f;
    if (!a.has("epochs")) cfg.steps = kTransformerSteps;
  }
  cfg.steps = a.integer("steps", cfg.steps);
  MIXTRAIN_CHECK(!(a.has("steps") && a.has("epochs")), "give --steps or --epochs, not both");
  cfg.eval_interval = a.integer("eval-every", cfg.eval_interval);
  cfg.lr_schedule = a.str("lr-schedule", cfg.lr_schedule);
  const bool auto_warmup = cfg.steps > 0 || cfg.model == "cnn";
  cfg.warmup_steps = a.integer("warmup-steps", auto_warmup ? RunConfig::kAutoWarmup : 0);
  MIXTRAIN_CHECK(!a.has("warmup-steps") || cfg.warmup_steps >= 0,
                 "--warmup-steps must be >= 0, got " << cfg.warmup_steps);
  cfg.weight_decay = static_cast<float>(a.number("weight-decay", cfg.weight_decay));
  cfg.clipnorm = static_cast<float>(a.number("clipnorm", cfg.clipnorm));
  cfg.context_length = a.integer("context", cfg.context_length);
  cfg.width = a.integer("width", cfg.width);
  cfg.num_layers = a.integer("layers", cfg.num_layers);
  cfg.num_heads = a.integer("heads", cfg.num_heads);
  cfg.dropout = static_cast<float>(a.number("dropout", cfg.dropout));
  cfg.attention_logit_multiplier =
      static_cast<float>(a.number("attention-logit-multiplier", cfg.attention_logit_multiplier));
  if (!transformer)
    for (const char* f : {"context", "width", "layers", "heads", "attention-logit-multiplier"})
      MIXTRAIN_CHECK(!a.has(f), "--" << f << " applies to --model transformer only");
}
}  // namespace

RunConfig run_config_from(const Args& a) {
  RunConfig cfg;
  cfg.model = a.str("model", cfg.model);
  cfg.epochs = static_cast<int>(a.integer("epochs", cfg.epochs));
  // "auto" is resolved once the data set is known (resolve_batch_size).
  cfg.batch_size = auto_batch_size(a) ? cfg.batch_size : a.integer("batch-size", cfg.batch_size);
  if (a.has("memory-budget")) {
    MIXTRAIN_CHECK(auto_batch_size(a), "--memory-budget needs --batch-size auto");
    parse_memory_size(a.str("memory-budget", ""), "--memory-budget");
  }
  // The run's tensors may hold at most 80% of the memory available now: a model or batch that cannot fit is
  // refused when it asks for the memory, with a message, instead of being killed by the system.
  set_memory_limit(default_memory_budget());
  cfg.learning_rate = static_cast<float>(a.number("lr", cfg.learning_rate));
  cfg.optimizer = a.str("optimizer", cfg.optimizer);
  const int64_t seed = a.integer("seed", static_cast<int64_t>(cfg.seed));
  MIXTRAIN_CHECK(seed >= 0, "--seed must be a non-negative integer, got " << seed);
  cfg.seed = static_cast<uint64_t>(seed);
  cfg.policy = a.str("policy", cfg.policy);
  cfg.hidden = a.int_list("hidden", cfg.hidden);
  cfg.validation_split = a.number("validation-split", cfg.validation_split);
  cfg.loss_scale = a.str("loss-scale", cfg.loss_scale);
  cfg.recover = a.has("recover");
  cfg.synchronized_batch_norm = a.has("sync-batch-norm");
  apply_sequence_flags(cfg, a);
  validate_run_config(cfg);  // before the (slow) data load, so a typo fails at once
  // The data flags too (load_data reads them again where it uses them).
  if (a.has("normalize")) parse_normalization(a.str("normalize", ""));
  csv_options_from(a);
  return cfg;
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
  const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec) || ::access(parent.c_str(), W_OK) != 0)
    MIXTRAIN_FAIL(kIo, flag << " " << path << ": the directory '" << parent.string() << "' does not exist or is not writable",
                  "give a path in a writable directory");
  if (fs::is_directory(path, ec)) MIXTRAIN_FAIL(kIo, flag << " " << path << " is a directory", "give a file path");
}

void print_data_line(const std::string& spec, const DataSplits& data) {
  if (data.train.x.dtype() == DType::kInt32) {
    std::cout << "data: " << spec << " (" << data.train.source << ") — " << data.train.size() << " training and "
              << data.test.size() << " validation windows of " << data.train.x.dim(1) << " characters, vocabulary of "
              << data.train.num_classes << " characters\n";
    return;
  }
  std::cout << "data: " << spec << " — " << data.train.size() << " training and " << data.test.size()
            << (data.test_from_files ? " test" : " held-out test") << " samples, " << data.train.num_features()
            << " features, " << data.train.num_classes << " classes\n";
}

void print_run_summary(const RunResult& r) {
  if (r.tokens_per_second > 0) {
    std::printf("validation: loss %.4f nats per character - accuracy %.4f\n", r.test.loss, r.test.accuracy);
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

int train_command(const std::vector<std::string>& argv) {
  std::set<std::string> flags = run_flags();
  flags.insert({"json", "save", "save-every", "resume", "device"});
  Args a(argv, flags, {"recover", "sync-batch-norm"});
  RunConfig cfg = run_config_from(a);
  cfg.device = usable_device_flag(a, "train");
  cfg.save_path = a.str("save", "");
  cfg.save_every = a.integer("save-every", 0);  // 1 to 2^63-1 (integer_range)
  if (a.has("save-every") && cfg.save_path.empty())
    MIXTRAIN_FAIL(kInvalidInput, "--save-every " << cfg.save_every << " needs --save PATH (the checkpoint it rewrites)",
                  "add --save CKPT; resume a killed run with the same flags plus --resume CKPT");
  cfg.resume_path = a.str("resume", "");
  const std::string data_spec = a.str("data", "fashion-mnist");
  const std::string json_path = a.str("json", "");

  // Data-parallel (mpirun): every rank trains; rank 0 alone writes the JSON and the checkpoints.
  Communicator* job = data_parallel_job_on(cfg.device);
  const bool writer = writes_outputs();
  if (!auto_batch_size(a)) check_global_batch(cfg, job);
  cfg.communicator = job;
  // Output paths are checked before the (long) training, not found unwritable after it.
  if (!json_path.empty() && writer) require_writable_output(json_path, "--json");
  if (!cfg.save_path.empty() && writer) require_writable_output(cfg.save_path, "--save");
  DataSplits data = load_data(data_spec, a, cfg);
  print_data_line(data_spec, data);
  resolve_batch_size(cfg, a, data);
  if (auto_batch_size(a)) check_global_batch(cfg, job);
  RunResult r = run_training(cfg, data, &std::cout, stdout_is_terminal());
  print_run_summary(r);
  if (!json_path.empty() && writer) {
    write_file_atomically(json_path, run_to_json(cfg, data_spec, r).dump(2) + "\n");
    std::cout << "wrote " << json_path << "\n";
  }
  if (r.initial_epoch >= cfg.fit_epochs())
    std::cerr << "mixtrain train: warning: nothing was trained: the checkpoint " << cfg.resume_path << " already holds "
              << r.initial_epoch << " of the " << cfg.fit_epochs() << " epochs asked for (raise --epochs or --steps)\n";
  const double last_loss = r.history.step_loss.empty() ? 0.0 : r.history.step_loss.back();
  if (!std::isfinite(last_loss) || !std::isfinite(r.test.loss)) {
    std::cerr << "mixtrain train: error: training ended with a non-finite loss (last step " << last_loss
              << ", test " << r.test.loss << ")"
              << (cfg.recover ? "; the recovery ladder gave up" : "; try --recover, or --policy float32") << "\n";
    return kExitDiverged;
  }
  return 0;
}

}  // namespace mixtrain::cli
