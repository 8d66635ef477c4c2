// Fuzzes the command-line parser: the input is argv after the subcommand, one argument per line, read with the
// flags of `mixtrain train`. Every flag is then read as each kind of value; a value returned must be inside the
// range its flag promises. A request for the usage (--help or -h where a flag may stand) ends the parse.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "args.h"
#include "fuzz_input.h"

namespace {

const std::set<std::string> kFlags = {
    "model", "data",   "epochs",      "batch-size", "lr",        "optimizer", "seed",       "policy",
    "hidden", "steps", "eval-every",  "context",    "memory-budget", "dropout", "json",     "save",
    "save-every"};
const std::set<std::string> kSwitches = {"recover"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> argv;
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      argv.push_back(current);
      current.clear();
    } else {
      current += static_cast<char>(data[i]);
    }
  }
  if (!current.empty()) argv.push_back(current);

  using mixtrain::fuzz::refuse_or_accept;
  refuse_or_accept([&] {
    std::optional<mixtrain::cli::Args> parsed;
    try {
      parsed.emplace(argv, kFlags, kSwitches);
    } catch (const mixtrain::cli::HelpRequested&) {
      return;  // --help or -h where a flag may stand: the CLI prints its usage, an expected outcome
    }
    const mixtrain::cli::Args& args = *parsed;
    std::set<std::string> all = kFlags;
    all.insert(kSwitches.begin(), kSwitches.end());
    for (const std::string& flag : all) {
      const mixtrain::cli::IntRange range = mixtrain::cli::integer_range(flag);
      refuse_or_accept([&] {
        const int64_t v = args.integer(flag, range.min);
        if (v < range.min || v > range.max) std::abort();
      });
      refuse_or_accept([&] { (void)args.number(flag, 0.0); });
      refuse_or_accept([&] {
        for (int64_t v : args.int_list(flag, {}))
          if (v < 1 || v > range.max) std::abort();
      });
      refuse_or_accept([&] { (void)args.str_list(flag, {}); });
      (void)args.str(flag, "");
    }
  });
  return 0;
}
