// The subcommands of the mixtrain tool. Each returns the process exit status; errors are thrown as
// mixtrain::Error and turned into a message and status 2 (bad input) by main().
#pragma once

#include <set>
#include <string>
#include <vector>

#include "args.h"
#include "run_options.h"

#include "mixtrain/core/json.h"
#include "mixtrain/data/csv.h"
#include "mixtrain/data/dataset.h"
#include "mixtrain/distributed/communicator.h"
#include "mixtrain/train/run.h"

namespace mixtrain::cli {

int train_command(const std::vector<std::string>& args);
// Prints what this machine offers for mixed precision; --json FILE also writes it as JSON.
int doctor_command(const std::vector<std::string>& args);

int compare_command(const std::vector<std::string>& args);
int inspect_command(const std::vector<std::string>& args);
int bench_command(const std::vector<std::string>& args);
// Samples text from a transformer checkpoint.
int generate_command(const std::vector<std::string>& args);

// With --batch-size auto (options.batch_size_auto): sets cfg.batch_size to the largest batch whose step fits
// options.memory_budget (default: a share of the device's free memory), for cfg's policy; else nothing.
void resolve_batch_size(RunConfig& cfg, const RunOptions& options, const DataSplits& data);
Json recovery_to_json(const std::vector<RecoveryEvent>& events);
// The run's closing lines; a language model's loss is in nats per unit ("character", or "token" under a subword
// tokenizer: loss_unit).
void print_run_summary(const RunResult& r, const char* unit = "character");

// options.data: fashion-mnist | PATH (IDX images or CSV), normalised (options.normalize) with statistics of the
// training split; or text for the transformer: moby-dick | text:PATH, windows of cfg.context_length tokens under
// options.tokenizer (cfg.vocabulary is set for characters, cfg.tokenizer_model for a subword tokenizer). A CSV (FILE.csv, or FILE.csv.gz gzip-compressed) is read as options.csv says.
DataSplits load_data(const RunOptions& options, RunConfig& cfg);
// Exit status of a run whose loss ended non-finite (2 is bad input, 1 an internal error).
inline constexpr int kExitDiverged = 3;
// Error (kIo, exit 2) unless path can be created: its directory exists and is writable, and it is no directory.
void require_writable_output(const std::string& path, const char* flag);
// One line saying what was loaded; unit names a text's tokens ("characters", or "tokens" under a subword tokenizer).
void print_data_line(const std::string& spec, const DataSplits& data, const std::string& unit = "characters");
inline const char* token_unit(const RunConfig& cfg) { return cfg.tokenizer_model.empty() ? "characters" : "tokens"; }
inline const char* loss_unit(const RunConfig& cfg) { return cfg.tokenizer_model.empty() ? "character" : "token"; }
// The `train --json` object for one run.
Json run_to_json(const RunConfig& cfg, const std::string& data_spec, const RunResult& r);
// Writes text to path through a temporary file and a rename, so a failure never leaves a partial file.
void write_file_atomically(const std::string& path, const std::string& text);

// The data-parallel job this process is a rank of (started by mpirun with more than one process), else null.
Communicator* data_parallel_job();
// The job's communicator for training on `device`: on a GPU, one that all-reduces device memory there through
// NCCL (made on the first call; every rank must call it), else the job's own, which stages it through the host.
Communicator* data_parallel_job_on(const Device& device);
// Whether this process prints results and writes files: one process, or rank 0 of a job.
bool writes_outputs();
// With a job: --batch-size is the global batch and must divide by the rank count (Error, exit 2); prints how
// the batch splits.
void check_global_batch(const RunConfig& cfg, Communicator* job);

}  // namespace mixtrain::cli
