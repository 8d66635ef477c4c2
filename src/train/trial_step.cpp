#include "trial_step.h"

#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/train/run.h"

namespace mixtrain::detail {

std::unique_ptr<Model> build_trial_model(const RunConfig& cfg, int64_t num_features, int64_t num_classes,
                                         const StepSamples& samples) {
  set_precision_warning_sink([](const std::string&) {});
  std::unique_ptr<Model> model;
  try {
    model = build_model(cfg, num_features, num_classes, samples.sample_shape);
  } catch (...) {
    set_precision_warning_sink(nullptr);
    throw;
  }
  set_precision_warning_sink(nullptr);
  model->compile(make_run_optimizer(cfg, 1), Loss("sparse_categorical_crossentropy", true));
  model->to(cfg.device);  // the device's memory is what the batch must fit (train_step copies the batch there)
  return model;
}

void run_trial_step(Model& model, int64_t rows, int64_t num_features, const StepSamples& samples) {
  const bool ids = samples.label_per_position;
  const DType in_dtype = model.layers().front()->compute_dtype();
  Tensor x = Tensor::zeros({rows, num_features}, ids ? DType::kInt32 : in_dtype);
  Tensor y = ids ? Tensor::zeros({rows, num_features}, DType::kInt32) : Tensor::zeros({rows}, DType::kInt32);
  model.train_step(x, y);
}

}  // namespace mixtrain::detail
