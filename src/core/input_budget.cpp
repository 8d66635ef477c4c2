#include "mixtrain/core/input_budget.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <string>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/environment.h"
#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {

constexpr int64_t kMinInputBudget = int64_t{64} << 20;
std::atomic<int64_t> g_input_budget{0};

constexpr const char* kBudgetHint =
    "an input this large in memory is damaged or hostile; if it is real data, raise the budget with "
    "MIXTRAIN_INPUT_BUDGET=SIZE, e.g. 16G (docs/RELIABILITY.md)";

// The least of what this process may use: the allocator's limit, the address-space limit and physical memory.
int64_t usable_memory() {
  int64_t least = INT64_MAX;
  if (memory_limit() > 0) least = memory_limit();
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    least = std::min<int64_t>(least, static_cast<int64_t>(std::min<rlim_t>(as.rlim_cur, INT64_MAX)));
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) least = std::min(least, static_cast<int64_t>(pages) * page);
  return least == INT64_MAX ? int64_t{4} << 30 : least;
}

}  // namespace

int64_t parse_byte_size(std::string_view text, std::string_view source) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  std::string_view suffix(end, static_cast<size_t>(text.data() + text.size() - end));
  int shift = 0;
  if (!suffix.empty()) {
    const std::string_view units = "KMGT";
    const size_t u = units.find(static_cast<char>(suffix[0] & ~0x20));  // k, m, g, t as well
    if (u != std::string_view::npos) {
      shift = 10 * static_cast<int>(u + 1);
      suffix.remove_prefix(1);
    }
    if (suffix == "iB" || suffix == "B") suffix = {};
  }
  if (ec != std::errc() || !suffix.empty() || v == 0 || (v >> (62 - shift)) != 0)
    MIXTRAIN_FAIL(kInvalidInput, source << " expects a positive size such as 512M or 8G",
                  "digits with an optional K, M, G or T");
  return static_cast<int64_t>(v << shift);
}

int64_t input_budget() {
  if (const auto env = env::mixtrain_input_budget(); env && !env->empty())
    return parse_byte_size(*env, "MIXTRAIN_INPUT_BUDGET");
  if (const int64_t set = g_input_budget.load(); set > 0) return set;
  return std::max(kMinInputBudget, usable_memory() / 4);
}

void set_input_budget(int64_t bytes) { g_input_budget.store(std::max<int64_t>(bytes, 0)); }

void check_input_budget(std::string_view input, std::string_view what, int64_t bytes) {
  const int64_t budget = input_budget();
  if (bytes <= budget) return;
  std::string need = format_bytes(static_cast<double>(bytes));
  std::string have = format_bytes(static_cast<double>(budget));
  if (need == have) {  // rounded alike: the exact counts say which is larger
    need += " (" + std::to_string(bytes) + " bytes)";
    have += " (" + std::to_string(budget) + " bytes)";
  }
  MIXTRAIN_FAIL(kInvalidInput,
                "'" << input << "': " << what << " would take " << need << " in memory, more than the input budget of "
                    << have,
                kBudgetHint);
}

}  // namespace mixtrain
