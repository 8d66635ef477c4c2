// mixtrain: the command-line tool. The only place that turns errors into exit codes:
// 2 for bad input (files, flags), 1 for internal errors.
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "mixtrain/core/error.h"

namespace {
const char* kUsage =
    "usage: mixtrain <command> [flags]\n"
    "commands:\n"
    "  doctor   report the CPU, the GPUs and which dtype policy pays off on this machine,\n"
    "           measured with mixtrain's own GEMM\n"
    "           --seconds S (measurement time, default 1) --json FILE\n"
    "  train    train a model on a data set and report its results\n"
    "           --model mlp|cnn|resnet|transformer --data fashion-mnist|PATH|moby-dick|text:PATH\n"
    "           --epochs N | --steps N [--eval-every N] --batch-size B|auto --memory-budget SIZE\n"
    "           --lr X --lr-schedule constant|cosine|linear --warmup-steps N --optimizer adam|adamw|sgd|rmsprop\n"
    "           --weight-decay X --clipnorm X --seed S --hidden 256,128\n"
    "           --policy float32|float16|bfloat16|mixed_float16|mixed_bfloat16\n"
    "           --loss-scale dynamic|none|VALUE --normalize standard|minmax|none\n"
    "           --validation-split F --json FILE --save CKPT --resume CKPT --recover\n"
    "           transformer: --context T --width D --layers L --heads H --dropout X\n"
    "  compare  train under several policies on identical data and weights and judge each against\n"
    "           float32: the train flags plus --policies float32,mixed_float16,mixed_bfloat16 --out DIR\n"
    "  inspect  per-layer ranges of inputs, activations and gradients against each layer's 16-bit\n"
    "           dtype: the train flags plus --steps N --json FILE\n"
    "  generate sample text from a transformer checkpoint: --checkpoint FILE --prompt TEXT --tokens N\n"
    "           --temperature X (0: greedy) --top-k K --seed S\n"
    "  bench    gemm [--sizes 512,1024,2048] [--json FILE]: GFLOP/s per dtype\n"
    "           step [--model mlp|cnn|resnet] [--hidden 4096,4096] [--batch-size 256] [--policy P]\n"
    "           [--json FILE]: milliseconds per training step\n";
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (command == "train") return mixtrain::cli::train_command(args);
    if (command == "doctor") return mixtrain::cli::doctor_command(args);
    if (command == "compare") return mixtrain::cli::compare_command(args);
    if (command == "inspect") return mixtrain::cli::inspect_command(args);
    if (command == "bench") return mixtrain::cli::bench_command(args);
    if (command == "generate") return mixtrain::cli::generate_command(args);
    std::cerr << "mixtrain: error: unknown command '" << command
              << "' (valid commands: train, compare, inspect, generate, doctor, bench; see mixtrain --help)\n";
    return 2;
  } catch (const mixtrain::Error& e) {
    std::cerr << "mixtrain " << command << ": error: " << e.message();
    if (!e.hint().empty()) std::cerr << " (" << e.hint() << ")";
    std::cerr << "\n";
    return e.kind() == mixtrain::ErrorKind::kInternal ? 1 : 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "mixtrain " << command << ": error: out of memory (try a smaller --batch-size)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "mixtrain " << command << ": internal error: " << e.what() << "\n";
    return 1;
  }
}
