// mixtrain compare: trains one model under several policies on identical data order, initial weights and
// dropout masks (one seed), and reports how each tracks the float32 baseline.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/report/comparison.h"
#include "mixtrain/report/progress_bar.h"

namespace mixtrain::cli {

namespace {
PolicyRun to_policy_run(const std::string& policy, const RunResult& r) {
  PolicyRun p;
  p.policy = policy;
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
  return p;
}
}  // namespace

int compare_command(const std::vector<std::string>& argv) {
  std::set<std::string> flags = run_flags();
  flags.erase("policy");
  flags.insert({"policies", "out"});
  Args a(argv, flags, {"recover"});
  const std::vector<std::string> policies =
      a.str_list("policies", {"float32", "mixed_float16", "mixed_bfloat16"});
  RunConfig base = run_config_from(a);
  for (const std::string& p : policies) {
    RunConfig c = base;
    c.policy = p;
    validate_run_config(c);
  }
  const std::string out_dir = a.str("out", "out/compare");
  const std::string data_spec = a.str("data", "fashion-mnist");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec || !std::filesystem::is_directory(out_dir))
    MIXTRAIN_FAIL(kIo, "cannot create the output directory '" << out_dir << "'", "pass a writable --out DIR");

  DataSplits data = load_data(data_spec, a.str("normalize", ""), base);
  print_data_line(data_spec, data);
  std::cout << "policies: ";
  for (const auto& p : policies) std::cout << p << " ";
  std::cout << "\n";

  ComparisonReport report;
  report.title = "mixtrain compare: " + base.model + " on " + data_spec;
  report.model = base.model;
  report.data = data_spec;
  report.seed = base.seed;
  report.epochs = base.epochs;
  // The precision warnings go to the report's notes as well as the terminal.
  set_precision_warning_sink([&](const std::string& w) {
    std::cerr << w << "\n";
    report.notes.push_back(w);
  });
  // The baseline is float32 when it is among the policies, else the first policy. It runs first so that,
  // with --recover, the others can be checked for drifting away from its loss curve.
  size_t baseline = 0;
  for (size_t i = 0; i < policies.size(); ++i)
    if (policies[i] == "float32") baseline = i;
  std::vector<size_t> run_order{baseline};
  for (size_t i = 0; i < policies.size(); ++i)
    if (i != baseline) run_order.push_back(i);
  std::vector<RunResult> results(policies.size());
  std::vector<RunConfig> configs(policies.size());
  for (size_t i : run_order) {
    RunConfig c = base;
    c.policy = policies[i];
    std::cout << "\n=== " << c.policy << " ===\n";
    resolve_batch_size(c, a, data);  // per policy: 16-bit activations leave room for a larger batch
    if (c.recover && i != baseline && policies[baseline] == "float32" &&
        configs[baseline].batch_size == c.batch_size)
      c.reference_step_loss = results[baseline].history.step_loss;
    configs[i] = c;
    results[i] = run_training(c, data, &std::cout, stdout_is_terminal());
    print_run_summary(results[i]);
  }
  for (size_t i = 0; i < policies.size(); ++i) report.runs.push_back(to_policy_run(policies[i], results[i]));
  set_precision_warning_sink(nullptr);

  const PolicyRun base_run = report.runs[baseline];
  for (PolicyRun& r : report.runs) fill_comparison(r, base_run);
  if (policies[baseline] != "float32") report.notes.push_back("no float32 run: " + policies[baseline] + " is the baseline");
  for (size_t i = 0; i < results.size(); ++i)
    for (const RecoveryEvent& e : results[i].recovery)
      report.notes.push_back(policies[i] + ": recovery at step " + std::to_string(e.step) + ": " + e.action + " — " +
                             e.reason);

  std::cout << "\n" << format_comparison_table(report);

  Json j = Json::object();
  j["model"] = base.model;
  j["data"] = data_spec;
  j["seed"] = static_cast<double>(base.seed);
  j["epochs"] = base.epochs;
  j["baseline"] = policies[baseline];
  Json runs = Json::object();
  for (size_t i = 0; i < results.size(); ++i) {
    Json r = run_to_json(configs[i], data_spec, results[i]);
    const PolicyRun& p = report.runs[i];
    r["verdict"] = p.verdict;
    r["speedup"] = std::isfinite(p.speedup) ? Json(p.speedup) : Json();
    r["memory_ratio"] = std::isfinite(p.memory_ratio) ? Json(p.memory_ratio) : Json();
    r["max_loss_deviation"] = std::isfinite(p.max_loss_deviation) ? Json(p.max_loss_deviation) : Json();
    r["accuracy_delta"] = std::isfinite(p.accuracy_delta) ? Json(p.accuracy_delta) : Json();
    runs[policies[i]] = r;
  }
  j["policies"] = runs;
  j["comparison"] = comparison_to_json(report);
  const std::string json_path = out_dir + "/report.json", csv_path = out_dir + "/steps.csv",
                    html_path = out_dir + "/report.html";
  write_file_atomically(json_path, j.dump(2) + "\n");
  write_steps_csv(csv_path, report);
  write_file_atomically(html_path, render_comparison_html(report));
  std::cout << "wrote " << json_path << ", " << csv_path << ", " << html_path << "\n";
  return 0;
}

}  // namespace mixtrain::cli
