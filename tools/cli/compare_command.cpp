// mixtrain compare: trains one model under several policies on identical data order, initial weights and
// dropout masks (one seed), plus float32 under --baseline-seeds K seeds (the others change only the initial
// weights, data order and dropout masks), and judges each policy against float32's seed-to-seed band.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "commands.h"
#include "policy_entry.h"
#include "mixtrain/core/file_checks.h"
#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/report/comparison.h"
#include "mixtrain/report/progress_bar.h"
#include "mixtrain/train/memory_plan.h"
#include "mixtrain/train/recovery.h"

namespace mixtrain::cli {

namespace {
PolicyRun to_policy_run(const std::string& policy, const RunConfig& cfg, const RunResult& r) {
  PolicyRun p;
  p.policy = policy;
  p.seed = cfg.seed;
  p.batch_size = cfg.batch_size;
  p.step_loss = r.history.step_loss;
  p.step_loss_scale = r.history.step_loss_scale;
  auto series = [&](const char* key) {
    auto it = r.history.history.find(key);
    return it == r.history.history.end() ? std::vector<double>() : it->second;
  };
  p.epoch_loss = series("loss");
  p.epoch_val_loss = series("val_loss");
  p.test_loss = r.test.loss;
  p.test_accuracy = r.test.accuracy;
  p.steps_per_second = r.steps_per_second;
  p.peak_memory_bytes = static_cast<double>(r.peak_memory_bytes);
  p.skipped_steps = r.skipped_steps;
  for (const RecoveryEvent& e : r.recovery) p.recovery.push_back({e.step, e.action, e.reason, e.layers, e.resume_step});
  p.layer_dtypes = r.layer_compute_dtypes;
  return p;
}

// The plan's parts bottom up, as the report draws them, and the run's whole measured peak.
void add_memory_plan(PolicyRun& p, const MemoryPlan& plan, const RunResult& r) {
  p.memory_plan = {{"weights", static_cast<double>(plan.weight_bytes)},
                   {"gradients", static_cast<double>(plan.gradient_bytes)},
                   {"optimizer state", static_cast<double>(plan.optimizer_state_bytes)},
                   {"compute copies", static_cast<double>(plan.compute_copy_bytes)}};
  if (plan.step_bytes >= plan.evaluation_bytes) p.memory_plan.emplace_back("step", static_cast<double>(plan.step_bytes));
  else p.memory_plan.emplace_back("validation batch", static_cast<double>(plan.evaluation_bytes));
  p.measured_memory_bytes = static_cast<double>(r.model_bytes + r.peak_memory_bytes);
}

Json number_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(); }

// The reference the recovery guard gets so that its drift check fires where a run's loss leaves float32's band
// by the tolerance that makes it "deviates": the band of the seeds' step losses on the guard's own smoothing,
// raised by that tolerance, turned into the curve the guard compares against (run_training builds the guard
// with the default drift tolerance). One seed: the float32 run itself, as the guard has always used it.
std::vector<double> recovery_reference(const std::vector<const RunResult*>& seeds) {
  if (seeds.size() == 1) return seeds.front()->history.step_loss;
  std::vector<std::vector<double>> smoothed;
  for (const RunResult* r : seeds) smoothed.push_back(drift_smoothed(r->history.step_loss));
  return drift_reference_for_ceiling(deviation_ceiling(series_band(smoothed)), RecoveryOptions{}.drift_tolerance);
}

// compare's flags: the shared ones (run_options.h) but --policy, and its own.
struct CompareOptions {
  RunOptions run;
  std::vector<std::string> policies;  // --policies' entries (policy_entry.h), in the order they are reported
  int seeds = kDefaultBaselineSeeds;  // --baseline-seeds: the baseline's runs, for its seed-to-seed band
  std::string out_dir;                // --out
  bool memory_plan = false;           // --memory-plan: each policy's plan before its run, measured after
};

CompareOptions compare_options_from(const std::vector<std::string>& argv) {
  std::set<std::string> flags = run_flags();
  flags.erase("policy");
  flags.insert({"policies", "out", "baseline-seeds", "device"});
  Args a(argv, flags, {"recover", "sync-batch-norm", "memory-plan"});
  CompareOptions o;
  o.memory_plan = a.has("memory-plan");
  o.policies = a.str_list("policies", {"float32", "mixed_float16", "mixed_bfloat16"});
  o.seeds = static_cast<int>(a.integer("baseline-seeds", kDefaultBaselineSeeds, 1, 64));
  o.run = run_options_from(a, "compare");
  for (const std::string& p : o.policies) {
    RunConfig c = o.run.run;
    apply_policy_entry(c, p);
    validate_run_config(c);
  }
  o.out_dir = a.has("out") ? a.path("out") : "out/compare";
  return o;
}

// The runs of a comparison: one per policy (in --policies' order), and the baseline's other seeds.
struct CompareRuns {
  size_t baseline = 0;  // float32 when it is among the policies, else the first policy
  std::vector<RunResult> results;
  std::vector<RunConfig> configs;
  std::vector<RunResult> seed_results;
  std::vector<RunConfig> seed_configs;
  std::vector<std::optional<MemoryPlan>> plans;  // per policy, with --memory-plan
};

// The baseline's other seeds: same data, batch size and everything else as its run c.
void run_baseline_seeds(const RunConfig& c, const CompareOptions& o, const DataSplits& data, CompareRuns& runs) {
  for (int k = 1; k < o.seeds; ++k) {
    RunConfig s = c;
    s.seed = o.run.run.seed + static_cast<uint64_t>(k);
    std::cout << "\n=== " << s.policy << " (seed " << s.seed << ", for the band) ===\n";
    runs.seed_configs[static_cast<size_t>(k - 1)] = s;
    runs.seed_results[static_cast<size_t>(k - 1)] = run_training(s, data, &std::cout, stdout_is_terminal());
    print_run_summary(runs.seed_results[static_cast<size_t>(k - 1)], loss_unit(s));
  }
}

// Trains every policy from base. The baseline runs first, with its other seeds, so that with --recover the others
// can be checked for leaving its band.
CompareRuns run_policies(const CompareOptions& o, const RunConfig& base, const DataSplits& data) {
  const std::vector<std::string>& policies = o.policies;
  CompareRuns runs;
  for (size_t i = 0; i < policies.size(); ++i)
    if (policies[i] == "float32") runs.baseline = i;
  const size_t baseline = runs.baseline;
  std::vector<size_t> run_order{baseline};
  for (size_t i = 0; i < policies.size(); ++i)
    if (i != baseline) run_order.push_back(i);
  runs.results.resize(policies.size());
  runs.configs.resize(policies.size());
  runs.plans.resize(policies.size());
  runs.seed_results.resize(static_cast<size_t>(o.seeds - 1));
  runs.seed_configs.resize(static_cast<size_t>(o.seeds - 1));
  std::vector<double> reference;
  for (size_t i : run_order) {
    RunConfig c = base;
    apply_policy_entry(c, policies[i]);
    std::cout << "\n=== " << policies[i] << (i == baseline && o.seeds > 1 ? " (seed " + std::to_string(c.seed) + ")" : "")
              << " ===\n";
    resolve_batch_size(c, o.run, data);  // per policy: 16-bit activations leave room for a larger batch
    if (c.recover && i != baseline && policies[baseline] == "float32" &&
        runs.configs[baseline].batch_size == c.batch_size)
      c.reference_step_loss = reference;
    runs.configs[i] = c;
    if (o.memory_plan) {
      runs.plans[i] = plan_run_memory(c, data);
      std::cout << memory_plan_text(*runs.plans[i]);
      if (o.run.memory_budget && !o.run.batch_size_auto)
        check_plan_within_budget(*runs.plans[i], *o.run.memory_budget, "--memory-budget");
    }
    runs.results[i] = run_training(c, data, &std::cout, stdout_is_terminal());
    print_run_summary(runs.results[i], loss_unit(c));
    if (runs.plans[i])
      std::cout << memory_measured_text(*runs.plans[i], runs.results[i].model_bytes + runs.results[i].peak_memory_bytes);
    if (i != baseline) continue;
    run_baseline_seeds(c, o, data, runs);
    std::vector<const RunResult*> band_runs{&runs.results[baseline]};
    for (const RunResult& r : runs.seed_results) band_runs.push_back(&r);
    reference = recovery_reference(band_runs);
  }
  return runs;
}

// The runs, the baseline's band, each policy judged against it, and the notes.
void fill_report(ComparisonReport& report, const CompareOptions& o, const CompareRuns& runs) {
  const std::vector<std::string>& policies = o.policies;
  const size_t baseline = runs.baseline;
  for (size_t i = 0; i < policies.size(); ++i) {
    report.runs.push_back(to_policy_run(policies[i], runs.configs[i], runs.results[i]));
    if (runs.plans[i]) add_memory_plan(report.runs.back(), *runs.plans[i], runs.results[i]);
  }
  for (size_t k = 0; k < runs.seed_results.size(); ++k)
    report.extra_seeds.push_back(to_policy_run(policies[baseline], runs.seed_configs[k], runs.seed_results[k]));
  std::vector<PolicyRun> band_runs{report.runs[baseline]};
  band_runs.insert(band_runs.end(), report.extra_seeds.begin(), report.extra_seeds.end());
  report.band = make_float32_band(band_runs);
  const PolicyRun base_run = report.runs[baseline];
  for (PolicyRun& r : report.runs) fill_comparison(r, base_run, report.band);
  if (policies[baseline] != "float32") report.notes.push_back("no float32 run: " + policies[baseline] + " is the baseline");
  if (o.seeds > 1) {
    std::string list;
    for (uint64_t s : report.band.seeds) list += (list.empty() ? "" : ", ") + std::to_string(s);
    report.notes.push_back(policies[baseline] + " band: " + std::to_string(o.seeds) + " runs with seeds " + list +
                           ", identical but for the initial weights, data order and dropout masks the seed draws");
  }
  for (size_t i = 0; i < runs.results.size(); ++i)
    if (i != baseline && !runs.results[i].recovery_timing.empty())
      report.notes.push_back(policies[i] + ": recovery on: " + runs.results[i].recovery_timing + " (scaled to its " +
                             std::to_string(runs.results[i].history.step_loss.size()) + " steps)");
  for (size_t i = 0; i < runs.results.size(); ++i)
    for (const RecoveryEvent& e : runs.results[i].recovery)
      report.notes.push_back(policies[i] + ": recovery at step " + std::to_string(e.step) + ": " + e.action + " — " +
                             e.reason);
}

// report.json: every run as `train --json` gives it, with its verdict against the baseline.
Json comparison_json(const CompareOptions& o, const CompareRuns& runs, const ComparisonReport& report) {
  const std::string& data_spec = o.run.data;
  Json j = Json::object();
  j["model"] = o.run.run.model;
  j["data"] = data_spec;
  j["seed"] = static_cast<double>(o.run.run.seed);
  j["epochs"] = report.epochs;
  j["baseline"] = o.policies[runs.baseline];
  j["baseline_seeds"] = o.seeds;
  Json policy_runs = Json::object();
  for (size_t i = 0; i < runs.results.size(); ++i) {
    Json r = run_to_json(runs.configs[i], data_spec, runs.results[i]);
    const PolicyRun& p = report.runs[i];
    r["verdict"] = p.verdict;
    r["verdict_reason"] = p.verdict_reason;
    r["numerics_verdict"] = p.numerics_verdict;
    r["fixed_threshold_verdict"] = p.fixed_threshold_verdict;
    r["speedup"] = number_or_null(p.speedup);
    r["memory_ratio"] = number_or_null(p.memory_ratio);
    r["max_loss_deviation"] = number_or_null(p.max_loss_deviation);
    r["accuracy_delta"] = number_or_null(p.accuracy_delta);
    policy_runs[o.policies[i]] = r;
  }
  j["policies"] = policy_runs;
  Json seed_runs = Json::array();
  for (size_t k = 0; k < runs.seed_results.size(); ++k)
    seed_runs.push_back(run_to_json(runs.seed_configs[k], data_spec, runs.seed_results[k]));
  j["baseline_seed_runs"] = seed_runs;
  j["comparison"] = comparison_to_json(report);
  return j;
}
}  // namespace

int compare_command(const std::vector<std::string>& argv) {
  CompareOptions o = compare_options_from(argv);
  RunConfig& base = o.run.run;
  const std::string& out_dir = o.out_dir;
  const std::string& data_spec = o.run.data;
  // Data-parallel (mpirun): every rank trains every run; rank 0 alone writes the report.
  Communicator* job = data_parallel_job_on(base.device);
  const bool writer = writes_outputs();
  if (!o.run.batch_size_auto) check_global_batch(base, job);
  base.communicator = job;
  std::error_code ec;
  if (writer) std::filesystem::create_directories(out_dir, ec);
  if (writer && (ec || !std::filesystem::is_directory(out_dir)))
    MIXTRAIN_FAIL(kIo, "cannot create the output directory '" << out_dir << "'", "pass a writable --out DIR");
  // The report's files are checked before the runs, so a FIFO or directory in their place is not found at the end.
  for (const char* name : {"/report.json", "/steps.csv", "/report.html"})
    if (writer) output_file_target(out_dir + name, "--out file");

  // The data (and a CSV's hold-out split, drawn from --seed) is loaded once: the float32 seeds differ only in
  // what the model's seed draws.
  DataSplits data = load_data(o.run, base);
  print_data_line(data_spec, data, token_unit(base));
  std::cout << resolve_default_steps(base, o.run, data);  // what a subword model's default steps are
  std::cout << "policies: ";
  for (const auto& p : o.policies) std::cout << p << " ";
  std::cout << "\n";

  ComparisonReport report;
  report.title = "mixtrain compare: " + base.model + " on " + data_spec;
  report.model = base.model;
  report.data = data_spec;
  report.seed = base.seed;
  report.epochs = base.steps > 0 ? base.fit_epochs() : base.epochs;
  report.batch_size_auto = o.run.batch_size_auto;
  // The precision warnings go to the report's notes as well as the terminal.
  set_precision_warning_sink([&](const std::string& w) {
    std::cerr << w << "\n";
    report.notes.push_back(w);
  });
  const CompareRuns runs = run_policies(o, base, data);
  set_precision_warning_sink(nullptr);
  fill_report(report, o, runs);

  std::cout << "\n" << format_comparison_table(report) << "\n";
  for (const PolicyRun& r : report.runs) std::cout << r.policy << ": " << r.verdict << " — " << r.verdict_reason << "\n";
  const Json j = comparison_json(o, runs, report);
  if (!writer) return 0;
  const std::string json_path = out_dir + "/report.json", csv_path = out_dir + "/steps.csv",
                    html_path = out_dir + "/report.html";
  write_file_atomically(json_path, j.dump(2) + "\n");
  write_steps_csv(csv_path, report);
  write_file_atomically(html_path, render_comparison_html(report));
  std::cout << "wrote " << json_path << ", " << csv_path << ", " << html_path << "\n";
  return 0;
}

}  // namespace mixtrain::cli
