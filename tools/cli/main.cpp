// mixtrain: the command-line tool. The only place that turns errors into exit codes:
// 2 for bad input (files, flags), 1 for internal errors.
// Under an MPI launcher (mpirun -np N mixtrain train ...) every process runs the command as one rank of a
// data-parallel job; rank 0 alone prints to stdout and writes files.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/input_excerpt.h"
#include "mixtrain/distributed/communicator.h"
#include "mixtrain/precision/hardware_check.h"

namespace {
const char* kUsage =
    "usage: mixtrain <command> [flags]\n"
    "commands:\n"
    "  doctor   report the CPU, the GPUs and which dtype policy pays off on this machine,\n"
    "           measured with mixtrain's own GEMM (on each GPU too, with the CUDA backend)\n"
    "           --seconds S (measurement time, default 1) --json FILE\n"
    "  train    train a model on a data set and report its results\n"
    "           --model mlp|cnn|resnet|transformer --data fashion-mnist|PATH|moby-dick|text:PATH\n"
    "           --epochs N | --steps N [--eval-every N] --batch-size B|auto --memory-budget SIZE\n"
    "           --lr X --lr-schedule constant|cosine|linear --warmup-steps N --optimizer adam|adamw|sgd|rmsprop\n"
    "           --weight-decay X --clipnorm X --seed S --hidden 256,128\n"
    "           --accumulate N: each batch as N micro-batches whose gradients make one update\n"
    "           --optimizer-state float32|bfloat16: Adam's moments (default float32); --master-rounding\n"
    "           nearest|stochastic|kahan: how bfloat16 weights and moments round (kahan: a compensation\n"
    "           buffer for bfloat16 weights, docs/SCALING.md)\n"
    "           --policy float32|float16|bfloat16|mixed_float16|mixed_bfloat16|mixed_float8|mixed_float8_e4m3\n"
    "           --fp8-recipe delayed|current|block: the float8 policies' scales (default delayed; block: MXFP8,\n"
    "           docs/FP8.md)\n"
    "           --loss-scale dynamic|none|VALUE --normalize standard|minmax|none\n"
    "           CSV data (FILE.csv, or FILE.csv.gz gzip-compressed): --csv-header auto|yes|no (auto: a header\n"
    "           when a cell of the first line is not a number) --label-column NAME|INDEX (0-based, -1 the\n"
    "           last column: the default)\n"
    "           --validation-split F --json FILE --save CKPT --resume CKPT --recover\n"
    "           --memory-plan: where memory will go, said before training; the measured peak beside it after;\n"
    "           with --memory-budget SIZE and a batch given, a run whose plan exceeds SIZE is refused (exit 2)\n"
    "           --save-every N: also write CKPT after every N steps, so a killed run resumed with\n"
    "           --resume CKPT continues at the next batch and ends bit-identical to an uninterrupted run\n"
    "           transformer: --context T --width D --layers L --heads H --dropout X\n"
    "           --norm layer|rms --mlp gelu|swiglu --positions learned|rope (defaults: layer, gelu, learned)\n"
    "           --attention tiled|full: training's attention on the CPU past 128 positions, tiled (no T x T\n"
    "           tensor, the default) or full (keeps the probabilities)\n"
    "           --fused-loss on|off (transformer: logits and loss over chunks of rows; default on)\n"
    "           --remat blocks|activations|none (transformer, resnet: keep only each block's input and recompute\n"
    "           the block in backward; activations, transformer: make the GELU MLP's hidden values again from their\n"
    "           pre-activations; same gradients, less memory; default none)\n"
    "           --tokenizer char|bpe:N|unigram:N|FILE.model: the text's tokens (default char; text:PATH may be a\n"
    "           directory or PATH,PATH,...)\n"
    "           --device cpu|cuda|cuda:N: where the model trains (default cpu)\n"
    "  compare  train under several policies on identical data and weights and judge each against\n"
    "           float32: the train flags plus --policies float32,mixed_float16,mixed_bfloat16 --out DIR\n"
    "           (an entry POLICY:master-rounding=R:optimizer-state=S sets that run's optimizer alone)\n"
    "  inspect  per-layer ranges of inputs, activations and gradients against each layer's 16-bit\n"
    "           dtype: the train flags plus --steps N --json FILE\n"
    "  generate sample text from a transformer checkpoint: --checkpoint FILE --prompt TEXT --tokens N\n"
    "           --temperature X (0: greedy) --top-k K --seed S --device D\n"
    "  bench    gemm [--sizes 512,1024,2048] [--seconds S] [--json FILE] [--device cpu|cuda|cuda:N]:\n"
    "           GFLOP/s per dtype, on the CPU (the default) or a GPU through the CUDA backend; --float8\n"
    "           adds the CPU's FP8 GEMM (float8_e4m3fn, float8_e5m2 operands, docs/FP8.md)\n"
    "           step [--model mlp|cnn|resnet] [--hidden 4096,4096] [--batch-size 256] [--policy P]\n"
    "           [--accumulate N] [--optimizer-state float32|bfloat16] [--master-rounding nearest|stochastic|kahan]\n"
    "           [--remat blocks|activations|none] (transformer, resnet)\n"
    "           [--json FILE] [--device cpu|cuda|cuda:N] [--memory-plan [--memory-budget SIZE]]:\n"
    "           milliseconds per training step\n"
    "data-parallel: mpirun -np N mixtrain train|compare|bench step ... trains on N processes; --batch-size is\n"
    "           the global batch (divisible by N); rank 0 prints and writes files (docs/SCALING.md);\n"
    "           train|compare --sync-batch-norm: BatchNormalization with the global batch's statistics;\n"
    "           --zero 1: the optimizer state split over the ranks (ZeRO stage 1);\n"
    "           --grad-comm bfloat16: gradients sent in bfloat16, summed in float32\n";

// The job's communicator when an MPI launcher started this process (MPI starts only then), else null.
mixtrain::Communicator* job = nullptr;

// " (rank r)" in a job of several processes, so that a message says which one failed.
std::string rank_tag() {
  return job && job->size() > 1 ? " (rank " + std::to_string(job->rank()) + ")" : std::string();
}

// An error ends the whole job: the other ranks may be waiting for this one in a collective.
int fail(int code) {
  if (job && job->size() > 1) {
    std::fflush(stdout);
    std::fflush(stderr);
    job->abort(code);
  }
  return code;
}
// What to try after running out of memory: a smaller batch, unless the batch is already one sample (then the
// model itself, its weights, gradients and optimizer state, does not fit).
std::string out_of_memory_hint(const std::string& command, const std::vector<std::string>& args) {
  // Only these take --batch-size; the others are told what they can change.
  const bool bench = command == "bench";
  if (bench && !args.empty() && args[0] == "gemm") return "give smaller --sizes";
  const bool takes_batch_size = command == "train" || command == "compare" || command == "inspect" ||
                                (bench && !args.empty() && args[0] == "step");
  if (!takes_batch_size)
    return "this machine has too little memory free for it";
  std::string batch;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--batch-size" && i + 1 < args.size()) batch = args[i + 1];
    if (args[i].rfind("--batch-size=", 0) == 0) batch = args[i].substr(std::string("--batch-size=").size());
  }
  if (batch == "1")
    return "even at --batch-size 1: the model's weights, gradients and optimizer state do not fit; use fewer or "
           "narrower layers (--hidden) or a machine with more memory";
  if (batch == "auto") return "--batch-size auto found no batch that fits; use fewer or narrower layers (--hidden)";
  return "try a smaller --batch-size, or --batch-size auto to find the largest that fits";
}
int run_command(const std::string& command, const std::vector<std::string>& args) {
  if (command == "train") return mixtrain::cli::train_command(args);
  if (command == "doctor") return mixtrain::cli::doctor_command(args);
  if (command == "compare") return mixtrain::cli::compare_command(args);
  if (command == "inspect") return mixtrain::cli::inspect_command(args);
  if (command == "bench") return mixtrain::cli::bench_command(args);
  if (command == "generate") return mixtrain::cli::generate_command(args);
  std::cerr << "mixtrain: error: unknown command '" << mixtrain::printable_line(command, 80)
            << "' (valid commands: train, compare, inspect, generate, doctor, bench; see mixtrain --help)\n";
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (mixtrain::launched_by_mpi()) {
      job = &mixtrain::world_communicator();
      // One voice: the other ranks' stdout (progress, summaries) is dropped; their errors still reach stderr.
      if (job->rank() != 0 && !std::freopen("/dev/null", "w", stdout))
        std::cerr << "mixtrain: warning: rank " << job->rank() << " could not silence its output\n";
    }
    // The mixed-precision check's warning (several lines) is held and printed after the command, so that an error
    // is one line: a failed command drops it, one that ran shows it below its output.
    std::vector<std::string> held;
    mixtrain::set_precision_warning_sink([&held](const std::string& w) { held.push_back(w); });
    const int status = run_command(command, args);
    mixtrain::set_precision_warning_sink(nullptr);
    for (const std::string& w : held) std::cerr << w << "\n";
    return status;
  } catch (const mixtrain::cli::HelpRequested&) {
    // `mixtrain train --help` (or -h) asks for the usage, as of any other tool: printed by rank 0, exit 0.
    std::cout << kUsage;
    return 0;
  } catch (const mixtrain::Error& e) {
    // Every error line goes through one escape: whatever a message quotes, no control byte reaches the terminal.
    std::cerr << "mixtrain " << command << rank_tag() << ": error: " << mixtrain::printable_line(e.message());
    if (!e.hint().empty()) std::cerr << " (" << mixtrain::printable_line(e.hint()) << ")";
    std::cerr << "\n";
    return fail(e.kind() == mixtrain::ErrorKind::kInternal ? 1 : 2);
  } catch (const std::bad_alloc&) {
    std::cerr << "mixtrain " << command << rank_tag() << ": error: out of memory (" << out_of_memory_hint(command, args)
              << ")\n";
    return fail(1);
  } catch (const std::exception& e) {
    std::cerr << "mixtrain " << command << rank_tag() << ": internal error: " << mixtrain::printable_line(e.what())
              << "\n";
    return fail(1);
  }
}
