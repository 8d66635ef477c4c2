// The flags the training commands share (train, compare, inspect), parsed once, here, into typed fields: each
// flag is read and checked in one place, before any data is loaded, and the commands read the fields, never the
// flag text again.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "args.h"
#include "mixtrain/data/csv.h"
#include "mixtrain/data/normalize.h"
#include "mixtrain/data/tokenizer.h"
#include "mixtrain/train/run.h"

namespace mixtrain::cli {

struct RunOptions {
  // The run: --model, --epochs, --batch-size, --lr, --optimizer, --seed, --policy, --hidden, --validation-split,
  // --loss-scale, --recover, --sync-batch-norm, --accumulate, the flags of runs by steps and of the transformer,
  // and --device; each model's recipe where the flags give none (the CNN's schedule, the transformer's AdamW, ...).
  // Validated.
  RunConfig run;
  // --data: fashion-mnist | PATH | moby-dick | text:PATH (PATH a file, a directory or several, data/text_sources.h)
  std::string data = "fashion-mnist";
  TokenizerSpec tokenizer;                 // --tokenizer char|bpe:N|unigram:N|FILE.model (text data only)
  // --batch-size auto: run.batch_size is resolved once the data set is known (resolve_batch_size), per policy.
  bool batch_size_auto = false;
  std::optional<int64_t> memory_budget;    // --memory-budget in bytes (with batch_size_auto or --memory-plan)
  std::optional<Normalization> normalize;  // --normalize; unset: standard for CSV data, none otherwise
  CsvOptions csv;                          // --csv-header, --label-column (CSV data only)
  bool epochs_given = false;               // --epochs was given (inspect then trains first)
  bool steps_given = false;                // --steps was given (run.steps also holds the transformer's default)
};

// The names of the shared flags, for Args.
const std::set<std::string>& run_flags();
// Parses and checks the shared flags (Error naming the flag), then --device for `command` (usable_device_flag).
// Also sets the process's memory limit (set_memory_limit) to 80% of the memory available now.
RunOptions run_options_from(const Args& args, const char* command);
// Once the text is loaded: a transformer trained with a subword tokenizer and neither --steps nor --epochs runs for
// the default 1,000 steps or for two passes over its training tokens (half an epoch of the windows, which overlap by
// three quarters), whichever is fewer, counted in batches of cfg.batch_size windows. Two passes are what the main
// job's 1,000 steps of 32 windows of 64 characters make over Moby Dick; its 360,000 bpe:2048 tokens in windows of 256
// would go by 23 times in 1,000 steps of 32 windows. Characters keep the 1,000 steps. Returns the line saying so when
// the steps were set here, else an empty string.
std::string resolve_default_steps(RunConfig& cfg, const RunOptions& options, const DataSplits& data);

// Whether --data names a CSV file (.csv or .csv.gz), or text for the transformer (moby-dick, text:PATH).
bool is_csv_data(const std::string& spec);
bool is_text_data(const std::string& spec);

}  // namespace mixtrain::cli
