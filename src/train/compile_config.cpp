// A model's compile() arguments as JSON and back: what load_model needs to go on training.
#include "mixtrain/precision/optimizer_config.h"
#include "model_config.h"

namespace mixtrain::detail {

Json compile_configuration(const Model& model) {
  if (!model.compiled_for_evaluation()) return Json();
  Json metrics = Json::array();
  for (const std::string& m : model.compiled_metrics()) metrics.push_back(m);
  return Json::object(
      {{"optimizer", model.compiled() ? optimizer_config(model.optimizer()) : Json()},
       {"loss", Json::object({{"name", model.loss().name()}, {"from_logits", model.loss().from_logits()}})},
       {"metrics", metrics},
       // Absent from files saved before the setting was kept: those load unfused, as they were saved.
       {"fused_loss", model.fused_loss() ? Json::object({{"chunk_rows", model.fused_loss_chunk_rows()}}) : Json()}});
}

void compile_from_configuration(Model& model, const Json& compile) {
  if (compile.is_null()) return;
  const Json& optimizer = compile.at("optimizer");
  const Json& loss = compile.at("loss");
  std::vector<std::string> metrics;
  for (const Json& m : compile.at("metrics").as_array()) metrics.push_back(m.as_string());
  // The optimizer comes back exactly as it was, loss-scale wrapper included: compile must not wrap it again.
  model.compile(optimizer.is_null() ? nullptr : optimizer_from_config(optimizer),
                Loss(loss.at("name").as_string(), loss.at("from_logits").as_bool()), std::move(metrics),
                /*auto_scale_loss=*/false);
  const Json* fused = compile.find("fused_loss");
  if (fused && !fused->is_null()) model.set_fused_loss(true, fused->at("chunk_rows").as_int64());
}

}  // namespace mixtrain::detail
