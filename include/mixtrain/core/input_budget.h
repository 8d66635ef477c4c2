// One budget for what any input file may expand to in memory: a CSV's decompressed text, its lines' cells and
// its rows x columns, a text's distinct characters, a safetensors header and its entries. Each reader works out
// what it is about to hold and calls check_input_budget BEFORE allocating it, so a small hostile file (a 39 KB
// gzip of one 20-million-cell line) is refused at once, naming the input and the limit, instead of taking the
// machine's memory.
#pragma once

#include <cstdint>
#include <string_view>

namespace mixtrain {

// The budget in bytes: MIXTRAIN_INPUT_BUDGET (a size such as 512M or 8G) when set; else set_input_budget's
// value; else a quarter of the least of the process's memory limit (set_memory_limit), its address-space limit
// (ulimit -v) and the machine's physical memory: the input, the data set made from it and the model with its
// batches must all fit in what the run may use. Never below 64 MiB.
int64_t input_budget();
// Sets the budget (0: back to the default); MIXTRAIN_INPUT_BUDGET still wins over it.
void set_input_budget(int64_t bytes);

// Throws Error (kInvalidInput) when `bytes` (what `what` of `input` would take in memory) is past the budget:
// "'<input>': <what> would take 2.1 GiB in memory, more than the input budget of 512.0 MiB".
void check_input_budget(std::string_view input, std::string_view what, int64_t bytes);

// Parses a size: digits with an optional K, M, G or T (powers of 1024) and an optional iB/B; Error naming
// `source` when malformed or not positive.
int64_t parse_byte_size(std::string_view text, std::string_view source);

}  // namespace mixtrain
