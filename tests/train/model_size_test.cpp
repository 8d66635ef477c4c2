// The size estimates of the registered models and the memory check that uses them before a model is built:
// the estimate equals the built model's weight count where the architecture is exact (mlp, resnet) and never
// exceeds it where it is a lower bound (cnn, transformer); a model past the limit is refused without allocating.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "mixtrain/core/allocator.h"
#include "mixtrain/distributed/communicator.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/model_registry.h"
#include "mixtrain/train/run.h"

namespace mixtrain {
namespace {

// Restores the process's memory limit after a test.
class LimitGuard {
 public:
  explicit LimitGuard(int64_t bytes) : saved_(memory_limit()) { set_memory_limit(bytes); }
  ~LimitGuard() { set_memory_limit(saved_); }
  LimitGuard(const LimitGuard&) = delete;
  LimitGuard& operator=(const LimitGuard&) = delete;

 private:
  int64_t saved_;
};

TEST(ModelFitsMemory, TheMlpEstimateIsItsExactWeightCount) {
  RunConfig cfg;
  cfg.model = "mlp";
  cfg.hidden = {17, 31};
  const ModelInputSpec in{7, {}, 3};
  const std::optional<ModelSizeEstimate> e = estimate_model_size(cfg, in);
  ASSERT_TRUE(e.has_value());
  const auto model = build_model(cfg, 7, 3);
  EXPECT_EQ(e->weights, static_cast<double>(model->count_params()));
  EXPECT_EQ(e->activations_per_sample, 17 + 31 + 3);
  EXPECT_EQ(e->largest_activation_per_sample, 31);
}

TEST(ModelFitsMemory, ConvolutionalAndTransformerEstimatesAreLowerBounds) {
  RunConfig cnn;
  cnn.model = "cnn";
  cnn.hidden = {64};
  const std::optional<ModelSizeEstimate> ce = estimate_model_size(cnn, ModelInputSpec{784, {28, 28}, 10});
  ASSERT_TRUE(ce.has_value());
  const double cnn_params = static_cast<double>(build_model(cnn, 784, 10, {28, 28})->count_params());
  EXPECT_LE(ce->weights, cnn_params);
  EXPECT_GE(ce->weights, 0.9 * cnn_params);  // the dense head is most of it

  RunConfig lm;
  lm.model = "transformer";
  lm.width = 32;
  lm.num_layers = 2;
  lm.num_heads = 2;
  const std::optional<ModelSizeEstimate> le = estimate_model_size(lm, ModelInputSpec{16, {16}, 29});
  ASSERT_TRUE(le.has_value());
  const double lm_params = static_cast<double>(build_model(lm, 16, 29, {16})->count_params());
  EXPECT_LE(le->weights, lm_params);
  EXPECT_GE(le->weights, 0.8 * lm_params);
  // A window's logits (16 positions x 1,000 characters) are counted: they are the widest output and most of it.
  const std::optional<ModelSizeEstimate> wide = estimate_model_size(lm, ModelInputSpec{16, {16}, 1000});
  ASSERT_TRUE(wide.has_value());
  EXPECT_EQ(wide->largest_activation_per_sample, 16 * 1000);
  EXPECT_EQ(wide->activations_per_sample, 2 * 16 * 32 + 16 * 1000);

}

TEST(ModelFitsMemory, TheResnetEstimateIsItsExactWeightCount) {
  RunConfig res;
  res.model = "resnet";
  for (const ModelInputSpec& in : {ModelInputSpec{784, {28, 28}, 10}, ModelInputSpec{3 * 15 * 13, {15, 13, 3}, 4}}) {
    const std::optional<ModelSizeEstimate> e = estimate_model_size(res, in);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->weights, static_cast<double>(build_model(res, in.num_features, in.num_classes, in.sample_shape)
                                                  ->count_params()));
    EXPECT_EQ(e->largest_activation_per_sample, static_cast<double>(in.sample_shape[0] * in.sample_shape[1] * 32));
  }
}

TEST(ModelFitsMemory, RefusesBeforeBuildingAndSaysWhatFits) {
  RunConfig cfg;
  cfg.model = "mlp";
  cfg.hidden = {1000000};  // 7 million weights on 4 features and 2 classes: 107 MiB with Adam
  const ModelInputSpec in{4, {}, 2};
  const LimitGuard limit(int64_t{64} << 20);
  const int64_t live = memory_stats().live_bytes;
  try {
    (void)build_model(cfg, 4, 2);
    FAIL() << "a model of 107 MiB built under a 64 MiB limit";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model 'mlp' does not fit in memory: its 7000002 weights need at least 106.8 MiB"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("weights fit: use fewer or narrower layers"), std::string::npos) << msg;
  }
  EXPECT_EQ(memory_stats().live_bytes, live);  // nothing was allocated

  // 100,000 units: 10.7 MiB of weights and state fit; 781 KiB of float32 activations per sample, so a batch of
  // 100 does not, and one of 8 does.
  cfg.hidden = {100000};
  EXPECT_NO_THROW(check_model_fits_memory(cfg, in, 0));
  try {
    check_model_fits_memory(cfg, in, 100);
    FAIL() << "a batch of 100 passed";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("per sample of activations (100 per batch)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("use --batch-size "), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(check_model_fits_memory(cfg, in, 8));
  // No limit: no check.
  const LimitGuard none(0);
  cfg.hidden = {2147483647};
  EXPECT_NO_THROW(check_model_fits_memory(cfg, in, 1000));
}

// Adam's moments in bfloat16 take 12 bytes per weight instead of 16: 7 million weights need 80.1 MiB, not 106.8.
TEST(ModelFitsMemory, CountsBfloat16OptimizerStateAtTwoBytesPerSlot) {
  RunConfig cfg;
  cfg.model = "mlp";
  cfg.optimizer = "adam";
  cfg.hidden = {1000000};
  const ModelInputSpec in{4, {}, 2};
  const LimitGuard limit(int64_t{96} << 20);
  EXPECT_THROW(check_model_fits_memory(cfg, in, 0), Error);
  cfg.optimizer_state = "bfloat16";
  EXPECT_NO_THROW(check_model_fits_memory(cfg, in, 0));
  const LimitGuard tighter(int64_t{72} << 20);
  try {
    check_model_fits_memory(cfg, in, 0);
    FAIL() << "80 MiB of weights and state passed a 72 MiB limit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need at least 80.1 MiB"), std::string::npos) << e.what();
  }
}

// Rank 0 of two, for the check's arithmetic only: nothing is exchanged.
class FirstOfTwoRanks : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "test"; }
  void all_reduce(float*, int64_t, ReduceOp) override {}
  void all_reduce(double*, int64_t, ReduceOp) override {}
  std::unique_ptr<Request> start_all_reduce(float*, int64_t, ReduceOp) override { return nullptr; }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

// With --zero 1 a rank keeps half of Adam's slots on two ranks: 12 bytes a weight instead of 16.
TEST(ModelFitsMemory, CountsARanksShareOfTheSlotsUnderZero1) {
  RunConfig cfg;
  cfg.model = "mlp";
  cfg.optimizer = "adam";
  cfg.hidden = {1000000};
  const ModelInputSpec in{4, {}, 2};
  FirstOfTwoRanks two;
  cfg.communicator = &two;
  const LimitGuard limit(int64_t{96} << 20);
  EXPECT_THROW(check_model_fits_memory(cfg, in, 0), Error);  // 7 million weights at 16 bytes: 106.8 MiB
  cfg.zero_stage = 1;
  EXPECT_NO_THROW(check_model_fits_memory(cfg, in, 0));      // at 12 bytes: 80.1 MiB
  cfg.communicator = nullptr;                                  // one process: nothing is split
  EXPECT_THROW(check_model_fits_memory(cfg, in, 0), Error);
}

// --remat blocks keeps each residual block's input and output, and one block's activations at a time while its
// backward step recomputes it: a batch refused with every activation counted is accepted under the same limit.
TEST(ModelFitsMemory, CountsOneResidualBlockAtATimeUnderRemat) {
  RunConfig cfg;
  cfg.model = "resnet";
  const ModelInputSpec in{784, {28, 28}, 10};
  const std::optional<ModelSizeEstimate> kept = estimate_model_size(cfg, in);
  cfg.remat = "blocks";
  const std::optional<ModelSizeEstimate> recomputed = estimate_model_size(cfg, in);
  ASSERT_TRUE(kept && recomputed);
  EXPECT_EQ(recomputed->weights, kept->weights);
  EXPECT_LT(recomputed->activations_per_sample, kept->activations_per_sample);
  // A limit halfway between the two estimates' needs at 1,000 samples (float32: 4 bytes an element).
  const double state = kept->weights * 16.0;  // value, gradient, Adam's two slots
  const auto need = [&](const ModelSizeEstimate& e) {
    return state + 1000.0 * 4.0 * (e.activations_per_sample + e.largest_activation_per_sample);
  };
  const LimitGuard limit(static_cast<int64_t>((need(*kept) + need(*recomputed)) / 2));
  EXPECT_NO_THROW(check_model_fits_memory(cfg, in, 1000));
  cfg.remat = "none";
  EXPECT_THROW(check_model_fits_memory(cfg, in, 1000), Error);

  // Still a lower bound: a recomputing step of 16 images holds at least the activations the estimate counts.
  cfg.remat = "blocks";
  const LimitGuard none(0);
  auto model = build_model(cfg, 784, 10, {28, 28});
  model->compile(make_optimizer("sgd", 0.01f), Loss("sparse_categorical_crossentropy", true));
  const Tensor x = Tensor::full({16, 784}, DType::kFloat32, 0.5f);
  Tensor y = Tensor::zeros({16}, DType::kInt32);
  model->train_step(x, y);  // builds the model, binds the arena
  const int64_t live = memory_stats().live_bytes;
  reset_peak_memory();
  model->train_step(x, y);
  const double step_peak = static_cast<double>(memory_stats().peak_bytes - live);
  EXPECT_GE(step_peak, 16.0 * 4.0 * recomputed->activations_per_sample);
  std::cout << "resnet, 16 images, --remat blocks: step peak " << step_peak << " bytes, estimate "
            << 16.0 * 4.0 * recomputed->activations_per_sample << "\n";
}

}  // namespace
}  // namespace mixtrain
