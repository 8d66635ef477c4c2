// mixtrain inspect: per-layer numerics under a policy — how activations and gradients fit the compute dtype.
#include <iostream>
#include <optional>

#include "commands.h"
#include "mixtrain/train/inspect.h"
#include "mixtrain/train/memory_plan.h"

namespace mixtrain::cli {

namespace {

// Each layer's measurements in --json.
Json layers_json(const std::vector<LayerInspection>& layers) {
  auto stats_json = [](const RangeStats& s) {
    return Json::object({{"max_abs", s.max_abs},
                         {"overflow_fraction", s.overflow_fraction()},
                         {"underflow_fraction", s.underflow_fraction()},
                         {"nan", static_cast<double>(s.nan)},
                         {"inf", static_cast<double>(s.inf)},
                         {"count", static_cast<double>(s.count)}});
  };
  Json arr = Json::array();
  for (const LayerInspection& l : layers) {
    Json internals = Json::object();
    for (const auto& [what, stats] : l.internals) internals[what] = stats_json(stats);
    Json fp8 = Json::array();
    for (const Fp8TensorInspection& f : l.fp8)
      fp8.push_back(Json::object({{"tensor", f.tensor},
                                  {"format", dtype_name(f.format)},
                                  {"amax", static_cast<double>(f.stats.amax)},
                                  {"scale", static_cast<double>(f.scale)},
                                  {"saturated_fraction", f.stats.saturated_fraction()},
                                  {"flushed_fraction", f.stats.flushed_fraction()},
                                  {"count", static_cast<double>(f.stats.count)}}));
    arr.push_back(Json::object({{"layer", l.layer},
                                {"class", l.class_name},
                                {"compute_dtype", dtype_name(l.compute_dtype)},
                                {"inputs", stats_json(l.inputs)},
                                {"activations", stats_json(l.activations)},
                                {"gradients", stats_json(l.gradients)},
                                {"internals", internals},
                                {"fp8", fp8}}));
  }
  return arr;
}

}  // namespace

int inspect_command(const std::vector<std::string>& argv) {
  std::set<std::string> flags = run_flags();
  flags.insert({"steps", "json", "device"});
  Args a(argv, flags, {"memory-plan"});
  const RunOptions o = run_options_from(a, "inspect");
  RunConfig cfg = o.run;
  // --steps (a shared flag, read once there): the batches inspected here.
  const int64_t steps = o.steps_given ? cfg.steps : 10;
  MIXTRAIN_CHECK(steps > 0, "--steps must be a positive integer, got " << steps);
  const std::string& data_spec = o.data;
  const bool train_first = o.epochs_given;
  DataSplits data = load_data(o, cfg);
  // --memory-plan: where training this model as `train` would will put its memory (train/memory_plan.h).
  std::optional<MemoryPlan> plan;
  if (a.has("memory-plan")) {
    plan = plan_run_memory(cfg, data);
    std::cout << memory_plan_text(*plan) << "\n";
    if (o.memory_budget && !o.batch_size_auto) check_plan_within_budget(*plan, *o.memory_budget, "--memory-budget");
  }

  auto model = build_model(cfg, data.train.num_features(), data.train.num_classes, data.train.sample_shape);
  model->to(cfg.device);
  model->compile(make_optimizer(cfg.optimizer, cfg.learning_rate),
                 Loss("sparse_categorical_crossentropy", /*from_logits=*/true), {"accuracy"});
  if (train_first) {
    // Inspect the model as it is after --epochs of training rather than at initialisation.
    FitOptions fo;
    fo.epochs = cfg.epochs;
    fo.batch_size = cfg.batch_size;
    fo.verbose = 0;  // the report below is the output; training progress would bury it
    model->fit(data.train.x, data.train.y, fo);
  }
  const std::vector<LayerInspection> layers =
      inspect_layers(*model, data.train.x, data.train.y, steps, cfg.batch_size);
  std::cout << "policy " << cfg.policy << ", " << steps << " batches of " << cfg.batch_size
            << (train_first ? " after " + std::to_string(cfg.epochs) + " epochs" : " at initialisation")
            << "; values measured in float32 against each layer's compute dtype\n"
            << "(overflow: rounds to inf; underflow: non-zero but below the smallest normal, so subnormal or zero)\n\n"
            << format_inspection(layers);
  const std::vector<std::string> broken = layers_that_break(layers);
  if (!broken.empty()) {
    std::cout << "\nlayers that do not fit their compute dtype:";
    for (const auto& b : broken) std::cout << " " << b;
    std::cout << " (train with --recover, or create them with dtype float32)\n";
  }
  const std::string json_path = a.path("json");
  if (!json_path.empty()) {
    Json arr = layers_json(layers);
    Json j = Json::object({{"policy", cfg.policy}, {"data", data_spec}, {"steps", static_cast<double>(steps)},
                           {"layers", arr}});
    if (plan) j["memory_plan"] = memory_plan_json(*plan);
    write_file_atomically(json_path, j.dump(2) + "\n");
    std::cout << "wrote " << json_path << "\n";
  }
  return 0;
}

}  // namespace mixtrain::cli
