#include "run_options.h"

#include <algorithm>
#include <charconv>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/error.h"
#include "mixtrain/train/batch_size.h"
#include "mixtrain/train/mlp_outliers.h"

namespace mixtrain::cli {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Whether text is a whole integer: an optional sign, then digits only.
bool is_integer_text(const std::string& text) {
  const size_t first = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
  return text.size() > first && text.find_first_not_of("0123456789", first) == std::string::npos;
}

// --csv-header auto|yes|no and --label-column NAME|INDEX, for CSV data only.
CsvOptions csv_options_from(const Args& a, const std::string& spec) {
  CsvOptions o;
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

// --batch-size B|auto and --memory-budget SIZE: with auto the budget of the batch search; with --memory-plan the
// budget the plan must fit (a run whose plan exceeds it is refused); alone it would do nothing, so it is refused.
void parse_batch_size(RunOptions& o, const Args& a) {
  o.batch_size_auto = a.str("batch-size", "") == "auto";
  // "auto" is resolved once the data set is known (resolve_batch_size).
  if (!o.batch_size_auto) o.run.batch_size = a.integer("batch-size", o.run.batch_size);
  if (a.has("memory-budget")) {
    MIXTRAIN_CHECK(o.batch_size_auto || a.has("memory-plan"),
                   "--memory-budget needs --batch-size auto (the largest batch within it) or --memory-plan (a run "
                   "whose plan exceeds it is refused)");
    o.memory_budget = parse_memory_size(a.str("memory-budget", ""), "--memory-budget");
  }
}

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
// A transformer over subword tokens without --batch-size takes the main job's tokens per step, 32 windows of 64,
// in windows of --context (8 at 256): a step's cost and the number of updates a pass over the text makes stay those
// of the character model's recipe; at 32 windows of 256, 88 updates made two passes over Moby Dick's bpe:2048
// tokens and the validation loss had not left the unigram plateau (6.26 nats per token, seed 1).
constexpr int64_t kTransformerTokensPerStep = 32 * 64;
void apply_subword_batch(RunOptions& o, const Args& a) {
  if (o.run.model != "transformer" || o.tokenizer.kind == TokenizerSpec::Kind::kChar || a.has("batch-size")) return;
  o.run.batch_size = std::max<int64_t>(1, kTransformerTokensPerStep / std::max<int64_t>(1, o.run.context_length));
}

// --mlp-outliers STEP[:LOG2[:RISE]] into cfg: the update the jump starts at, the factor's power of two, and the
// power it climbs by an update (0: a jump).
void mlp_outliers_from(const std::string& text, RunConfig& cfg) {
  const size_t colon = text.find(':');
  const size_t second = colon == std::string::npos ? colon : text.find(':', colon + 1);
  auto integer = [](const std::string& s, int64_t& out) {
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return !s.empty() && ec == std::errc() && ptr == s.data() + s.size();
  };
  int64_t step = 0, log2 = kMlpOutlierLog2, rise = 0;
  MIXTRAIN_CHECK(integer(text.substr(0, colon), step) && step >= 0,
                 "--mlp-outliers must be a step >= 0, optionally :LOG2[:RISE], got '" << text << "'");
  MIXTRAIN_CHECK(colon == std::string::npos ||
                     (integer(text.substr(colon + 1, second - colon - 1), log2) && log2 >= 1 &&
                      log2 <= kMlpOutlierMaxLog2),
                 "--mlp-outliers STEP:LOG2: LOG2 must be an integer from 1 to " << kMlpOutlierMaxLog2 << ", got '"
                                                                                << text << "'");
  MIXTRAIN_CHECK(second == std::string::npos || (integer(text.substr(second + 1), rise) && rise >= 1 && rise <= log2),
                 "--mlp-outliers STEP:LOG2:RISE: RISE must be an integer from 1 to LOG2, got '" << text << "'");
  cfg.mlp_outliers_from = step;
  cfg.mlp_outliers_log2 = static_cast<int>(log2);
  cfg.mlp_outliers_rise = static_cast<int>(rise);
}

void apply_sequence_flags(RunOptions& o, const Args& a) {
  RunConfig& cfg = o.run;
  const bool transformer = cfg.model == "transformer";
  apply_cnn_recipe(cfg, a);
  if (transformer) {
    if (!a.has("optimizer")) cfg.optimizer = "adamw";
    if (!a.has("batch-size")) cfg.batch_size = 32;
    if (!a.has("lr")) cfg.learning_rate = 2e-3f;
    cfg.lr_schedule = "cosine";
    cfg.clipnorm = 1.0f;
    cfg.weight_decay = 0.01f;
    if (!o.epochs_given) cfg.steps = kTransformerSteps;
  }
  o.steps_given = a.has("steps");
  cfg.steps = a.integer("steps", cfg.steps);
  MIXTRAIN_CHECK(!(o.steps_given && o.epochs_given), "give --steps or --epochs, not both");
  cfg.eval_interval = a.integer("eval-every", cfg.eval_interval);
  cfg.lr_schedule = a.str("lr-schedule", cfg.lr_schedule);
  const bool auto_warmup = cfg.steps > 0 || cfg.model == "cnn";
  cfg.warmup_steps = a.integer("warmup-steps", auto_warmup ? RunConfig::kAutoWarmup : 0);
  MIXTRAIN_CHECK(!a.has("warmup-steps") || cfg.warmup_steps >= 0,
                 "--warmup-steps must be >= 0, got " << cfg.warmup_steps);
  cfg.weight_decay = static_cast<float>(a.number("weight-decay", cfg.weight_decay));
  cfg.clipnorm = static_cast<float>(a.number("clipnorm", cfg.clipnorm));
  cfg.gradient_accumulation_steps = a.integer("accumulate", cfg.gradient_accumulation_steps);
  cfg.zero_stage = static_cast<int>(a.integer("zero", cfg.zero_stage));
  cfg.grad_comm = a.str("grad-comm", cfg.grad_comm);
  cfg.master_rounding = a.str("master-rounding", cfg.master_rounding);
  cfg.optimizer_state = a.str("optimizer-state", cfg.optimizer_state);
  cfg.context_length = a.integer("context", cfg.context_length);
  cfg.width = a.integer("width", cfg.width);
  cfg.num_layers = a.integer("layers", cfg.num_layers);
  cfg.num_heads = a.integer("heads", cfg.num_heads);
  cfg.dropout = static_cast<float>(a.number("dropout", cfg.dropout));
  cfg.attention_logit_multiplier =
      static_cast<float>(a.number("attention-logit-multiplier", cfg.attention_logit_multiplier));
  cfg.norm = a.str("norm", cfg.norm);
  cfg.mlp = a.str("mlp", cfg.mlp);
  cfg.positions = a.str("positions", cfg.positions);
  cfg.attention = a.str("attention", cfg.attention);
  cfg.fused_loss = a.on_off("fused-loss", cfg.fused_loss);
  cfg.remat = a.str("remat", cfg.remat);
  // A test and diagnostic switch (docs/FP8.md, "The hostile case"): a value below 0 is refused, not read as off.
  if (a.has("mlp-outliers")) mlp_outliers_from(a.str("mlp-outliers", ""), cfg);
  if (!transformer)
    for (const char* f : {"context", "width", "layers", "heads", "attention-logit-multiplier", "norm", "mlp",
                          "positions", "attention", "fused-loss", "mlp-outliers"})
      MIXTRAIN_CHECK(!a.has(f), "--" << f << " applies to --model transformer only");
}
}  // namespace

std::string resolve_default_steps(RunConfig& cfg, const RunOptions& o, const DataSplits& data) {
  if (cfg.model != "transformer" || cfg.tokenizer_model.empty() || o.steps_given || o.epochs_given) return "";
  const int64_t windows = data.train.size(), batch = std::max<int64_t>(1, cfg.batch_size);
  const int64_t two_passes = (windows + 2 * batch - 1) / (2 * batch);
  if (two_passes >= kTransformerSteps) return "";
  cfg.steps = std::max<int64_t>(1, two_passes);
  return "steps: " + std::to_string(cfg.steps) + ", two passes over the training tokens in batches of " +
         std::to_string(batch) + " windows (--steps N to change)\n";
}

bool is_text_data(const std::string& spec) { return spec == "moby-dick" || spec.rfind("text:", 0) == 0; }

bool is_csv_data(const std::string& spec) { return ends_with(spec, ".csv") || ends_with(spec, ".csv.gz"); }

const std::set<std::string>& run_flags() {
  static const std::set<std::string> flags = {
      "model",         "data",       "epochs",        "batch-size", "lr",         "optimizer",   "seed",
      "policy",        "normalize",  "hidden",        "validation-split",         "loss-scale",  "memory-budget",
      "steps",         "eval-every", "lr-schedule",   "warmup-steps", "weight-decay", "clipnorm", "context",
      "width",         "layers",     "heads",         "dropout",    "attention-logit-multiplier", "csv-header",
      "label-column", "accumulate", "tokenizer", "master-rounding", "fp8-recipe", "norm", "mlp", "positions",
      "optimizer-state", "attention", "fused-loss", "zero", "remat", "grad-comm", "mlp-outliers"};
  return flags;
}

RunOptions run_options_from(const Args& a, const char* command) {
  RunOptions o;
  RunConfig& cfg = o.run;
  cfg.model = a.str("model", cfg.model);
  o.epochs_given = a.has("epochs");
  cfg.epochs = static_cast<int>(a.integer("epochs", cfg.epochs));
  parse_batch_size(o, a);
  // The run's tensors may hold at most 80% of the memory available now: a model or batch that cannot fit is
  // refused when it asks for the memory, with a message, instead of being killed by the system.
  set_memory_limit(default_memory_budget());
  cfg.learning_rate = static_cast<float>(a.number("lr", cfg.learning_rate));
  cfg.optimizer = a.str("optimizer", cfg.optimizer);
  const int64_t seed = a.integer("seed", static_cast<int64_t>(cfg.seed));
  MIXTRAIN_CHECK(seed >= 0, "--seed must be a non-negative integer, got " << seed);
  cfg.seed = static_cast<uint64_t>(seed);
  cfg.policy = a.str("policy", cfg.policy);
  cfg.fp8_recipe = a.str("fp8-recipe", cfg.fp8_recipe);
  MIXTRAIN_CHECK(!a.has("fp8-recipe") || DTypePolicy::from_name(cfg.policy).uses_float8() || !a.has("policy"),
                 "--fp8-recipe applies to the float8 policies (mixed_float8, mixed_float8_e4m3), not to --policy "
                     << cfg.policy);
  cfg.hidden = a.int_list("hidden", cfg.hidden);
  cfg.validation_split = a.number("validation-split", cfg.validation_split);
  cfg.loss_scale = a.str("loss-scale", cfg.loss_scale);
  cfg.recover = a.has("recover");
  cfg.synchronized_batch_norm = a.has("sync-batch-norm");
  apply_sequence_flags(o, a);
  validate_run_config(cfg);  // before the (slow) data load, so a typo fails at once
  if (a.has("normalize")) o.normalize = parse_normalization(a.str("normalize", ""));
  o.data = a.str("data", o.data);
  o.csv = csv_options_from(a, o.data);
  if (a.has("tokenizer")) {
    MIXTRAIN_CHECK(is_text_data(o.data), "--tokenizer applies to text (--data moby-dick or text:PATH), not to --data "
                                             << o.data);
    o.tokenizer = parse_tokenizer_spec(a.str("tokenizer", ""));
  }
  apply_subword_batch(o, a);
  cfg.device = usable_device_flag(a, command);
  return o;
}

}  // namespace mixtrain::cli
