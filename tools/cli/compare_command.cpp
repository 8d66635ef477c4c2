// mixtrain compare: trains one model under several policies on identical data order, initial weights and
// dropout masks (one seed), plus float32 under --baseline-seeds K seeds (the others change only the initial
// weights, data order and dropout masks), and judges each policy against float32's seed-to-seed band.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/report/comparison.h"
#include "mixtrain/report/progress_bar.h"
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
}  // namespace

int compare_command(const std::vector<std::string>& argv) {
  std::set<std::string> flags = run_flags();
  flags.erase("policy");
  flags.insert({"policies", "out", "baseline-seeds", "device"});
  Args a(argv, flags, {"recover", "sync-batch-norm"});
  const std::vector<std::string> policies =
      a.str_list("policies", {"float32", "mixed_float16", "mixed_bfloat16"});
  const int seeds = static_cast<int>(a.integer("baseline-seeds", kDefaultBaselineSeeds, 1, 64));
  RunConfig base = run_config_from(a);
  base.device = usable_device_flag(a, "compare");
  for (const std::string& p : policies) {
    RunConfig c = base;
    c.policy = p;
    validate_run_config(c);
  }
  const std::string out_dir = a.str("out", "out/compare");
  const std::string data_spec = a.str("data", "fashion-mnist");
  // Data-parallel (mpirun): every rank trains every run; rank 0 alone writes the report.
  Communicator* job = data_parallel_job_on(base.device);
  const bool writer = writes_outputs();
  if (a.str("batch-size", "") != "auto") check_global_batch(base, job);
  base.communicator = job;
  std::error_code ec;
  if (writer) std::filesystem::create_directories(out_dir, ec);
  if (writer && (ec || !std::filesystem::is_directory(out_dir)))
    MIXTRAIN_FAIL(kIo, "cannot create the output directory '" << out_dir << "'", "pass a writable --out DIR");

  // The data (and a CSV's hold-out split, drawn from --seed) is loaded once: the float32 seeds differ only in
  // what the model's seed draws.
  DataSplits data = load_data(data_spec, a, base);
  print_data_line(data_spec, data);
  std::cout << "policies: ";
  for (const auto& p : policies) std::cout << p << " ";
  std::cout << "\n";

  ComparisonReport report;
  report.title = "mixtrain compare: " + base.model + " on " + data_spec;
  report.model = base.model;
  report.data = data_spec;
  report.seed = base.seed;
  report.epochs = base.steps > 0 ? base.fit_epochs() : base.epochs;
  report.batch_size_auto = a.str("batch-size", "") == "auto";
  // The precision warnings go to the report's notes as well as the terminal.
  set_precision_warning_sink([&](const std::string& w) {
    std::cerr << w << "\n";
    report.notes.push_back(w);
  });
  // The baseline is float32 when it is among the policies, else the first policy. It runs first, with its
  // other seeds, so that with --recover the others can be checked for leaving its band.
  size_t baseline = 0;
  for (size_t i = 0; i < policies.size(); ++i)
    if (policies[i] == "float32") baseline = i;
  std::vector<size_t> run_order{baseline};
  for (size_t i = 0; i < policies.size(); ++i)
    if (i != baseline) run_order.push_back(i);
  std::vector<RunResult> results(policies.size());
  std::vector<RunConfig> configs(policies.size());
  std::vector<RunResult> seed_results(static_cast<size_t>(seeds - 1));
  std::vector<RunConfig> seed_configs(static_cast<size_t>(seeds - 1));
  std::vector<double> reference;
  for (size_t i : run_order) {
    RunConfig c = base;
    c.policy = policies[i];
    std::cout << "\n=== " << c.policy << (i == baseline && seeds > 1 ? " (seed " + std::to_string(c.seed) + ")" : "")
              << " ===\n";
    resolve_batch_size(c, a, data);  // per policy: 16-bit activations leave room for a larger batch
    if (c.recover && i != baseline && policies[baseline] == "float32" && configs[baseline].batch_size == c.batch_size)
      c.reference_step_loss = reference;
    configs[i] = c;
    results[i] = run_training(c, data, &std::cout, stdout_is_terminal());
    print_run_summary(results[i]);
    if (i != baseline) continue;
    // float32's other seeds: same data, batch size and everything else.
    for (int k = 1; k < seeds; ++k) {
      RunConfig s = c;
      s.seed = base.seed + static_cast<uint64_t>(k);
      std::cout << "\n=== " << s.policy << " (seed " << s.seed << ", for the band) ===\n";
      seed_configs[static_cast<size_t>(k - 1)] = s;
      seed_results[static_cast<size_t>(k - 1)] = run_training(s, data, &std::cout, stdout_is_terminal());
      print_run_summary(seed_results[static_cast<size_t>(k - 1)]);
    }
    std::vector<const RunResult*> band_runs{&results[baseline]};
    for (const RunResult& r : seed_results) band_runs.push_back(&r);
    reference = recovery_reference(band_runs);
  }
  for (size_t i = 0; i < policies.size(); ++i) report.runs.push_back(to_policy_run(policies[i], configs[i], results[i]));
  for (size_t k = 0; k < seed_results.size(); ++k)
    report.extra_seeds.push_back(to_policy_run(policies[baseline], seed_configs[k], seed_results[k]));
  set_precision_warning_sink(nullptr);

  std::vector<PolicyRun> band_runs{report.runs[baseline]};
  band_runs.insert(band_runs.end(), report.extra_seeds.begin(), report.extra_seeds.end());
  report.band = make_float32_band(band_runs);
  const PolicyRun base_run = report.runs[baseline];
  for (PolicyRun& r : report.runs) fill_comparison(r, base_run, report.band);
  if (policies[baseline] != "float32") report.notes.push_back("no float32 run: " + policies[baseline] + " is the baseline");
  if (seeds > 1) {
    std::string list;
    for (uint64_t s : report.band.seeds) list += (list.empty() ? "" : ", ") + std::to_string(s);
    report.notes.push_back(policies[baseline] + " band: " + std::to_string(seeds) + " runs with seeds " + list +
                           ", identical but for the initial weights, data order and dropout masks the seed draws");
  }
  for (size_t i = 0; i < results.size(); ++i)
    for (const RecoveryEvent& e : results[i].recovery)
      report.notes.push_back(policies[i] + ": recovery at step " + std::to_string(e.step) + ": " + e.action + " — " +
                             e.reason);

  std::cout << "\n" << format_comparison_table(report) << "\n";
  for (const PolicyRun& r : report.runs) std::cout << r.policy << ": " << r.verdict << " — " << r.verdict_reason << "\n";

  Json j = Json::object();
  j["model"] = base.model;
  j["data"] = data_spec;
  j["seed"] = static_cast<double>(base.seed);
  j["epochs"] = report.epochs;
  j["baseline"] = policies[baseline];
  j["baseline_seeds"] = seeds;
  Json runs = Json::object();
  for (size_t i = 0; i < results.size(); ++i) {
    Json r = run_to_json(configs[i], data_spec, results[i]);
    const PolicyRun& p = report.runs[i];
    r["verdict"] = p.verdict;
    r["verdict_reason"] = p.verdict_reason;
    r["numerics_verdict"] = p.numerics_verdict;
    r["fixed_threshold_verdict"] = p.fixed_threshold_verdict;
    r["speedup"] = number_or_null(p.speedup);
    r["memory_ratio"] = number_or_null(p.memory_ratio);
    r["max_loss_deviation"] = number_or_null(p.max_loss_deviation);
    r["accuracy_delta"] = number_or_null(p.accuracy_delta);
    runs[policies[i]] = r;
  }
  j["policies"] = runs;
  Json seed_runs = Json::array();
  for (size_t k = 0; k < seed_results.size(); ++k) seed_runs.push_back(run_to_json(seed_configs[k], data_spec, seed_results[k]));
  j["baseline_seed_runs"] = seed_runs;
  j["comparison"] = comparison_to_json(report);
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
