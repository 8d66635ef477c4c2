// The run configuration a checkpoint stores, read back: the tokenizer's fields and the transformer's blocks.
#include <gtest/gtest.h>

#include "mixtrain/core/error.h"
#include "mixtrain/train/run.h"

namespace mixtrain {
namespace {

// A subword model's bytes (any bytes, NUL and 0xFF included) come back exactly; a character run's configuration
// has no tokenizer fields at all, so it reads as checkpoints written before them.
TEST(RunConfigJson, KeepsTheTokenizerModelBytes) {
  RunConfig cfg;
  cfg.model = "transformer";
  std::string model;
  for (int i = 0; i < 1000; ++i) model.push_back(static_cast<char>((i * 37) & 0xFF));
  cfg.tokenizer_model = model;
  cfg.tokenizer = "bpe:512";
  const RunConfig back = run_config_from_json(run_config_json(cfg), "test");
  EXPECT_EQ(back.tokenizer_model, model);
  EXPECT_EQ(back.tokenizer, "bpe:512");

  RunConfig chars;
  chars.model = "transformer";
  chars.vocabulary = {U'a', U'b'};
  const std::string text = run_config_json(chars);
  EXPECT_EQ(text.find("tokenizer"), std::string::npos) << text;
  const RunConfig chars_back = run_config_from_json(text, "test");
  EXPECT_TRUE(chars_back.tokenizer_model.empty());
  EXPECT_EQ(chars_back.tokenizer, "char");
  EXPECT_EQ(chars_back.vocabulary, chars.vocabulary);
}

// The transformer's blocks come back, so `generate` and --resume rebuild the same model; a default model's
// configuration has no block fields, so it reads as checkpoints written before them (and they read as the defaults).
TEST(RunConfigJson, KeepsTheTransformerBlocksAndLeavesDefaultsOut) {
  RunConfig cfg;
  cfg.model = "transformer";
  cfg.norm = "rms";
  cfg.mlp = "swiglu";
  cfg.positions = "rope";
  const RunConfig back = run_config_from_json(run_config_json(cfg), "test");
  EXPECT_EQ(back.norm, "rms");
  EXPECT_EQ(back.mlp, "swiglu");
  EXPECT_EQ(back.positions, "rope");

  RunConfig plain;
  plain.model = "transformer";
  const std::string text = run_config_json(plain);
  for (const char* key : {"\"norm\"", "\"mlp\"", "\"positions\""})
    EXPECT_EQ(text.find(key), std::string::npos) << key << " in " << text;
  const RunConfig plain_back = run_config_from_json(text, "test");
  EXPECT_EQ(plain_back.norm, "layer");
  EXPECT_EQ(plain_back.mlp, "gelu");
  EXPECT_EQ(plain_back.positions, "learned");
}

// --optimizer-state comes back (a resumed run rebuilds the same optimizer) and is absent by default. It is Adam's and
// AdamW's; stochastic rounding is allowed with bfloat16 state under mixed_bfloat16, and still refused without it.
TEST(RunConfigJson, KeepsTheOptimizerStateAndValidatesIt) {
  RunConfig cfg;
  cfg.policy = "mixed_bfloat16";
  cfg.optimizer = "adam";
  cfg.optimizer_state = "bfloat16";
  cfg.master_rounding = "stochastic";
  EXPECT_NO_THROW(validate_run_config(cfg));
  EXPECT_EQ(run_config_from_json(run_config_json(cfg), "test").optimizer_state, "bfloat16");
  EXPECT_EQ(run_config_json(RunConfig{}).find("optimizer_state"), std::string::npos);
  RunConfig nearest_only = cfg;
  nearest_only.optimizer_state = "float32";
  EXPECT_THROW(validate_run_config(nearest_only), Error);  // stochastic rounding of float32 weights and state
  RunConfig sgd = cfg;
  sgd.optimizer = "sgd";
  sgd.master_rounding = "nearest";
  EXPECT_THROW(validate_run_config(sgd), Error);
  RunConfig float16 = cfg;
  float16.optimizer_state = "float16";
  EXPECT_THROW(validate_run_config(float16), Error);
}

// --grad-comm: float32 or bfloat16, the bfloat16 exchange on the CPU only (MPI moves host memory; NCCL's exchange
// stays float32). Not a checkpoint's: a run resumes under either.
TEST(RunConfigJson, GradCommIsFloat32OrBfloat16OnTheCpuAndNotRecorded) {
  RunConfig cfg;
  EXPECT_EQ(cfg.grad_comm, "float32");
  cfg.grad_comm = "bfloat16";
  EXPECT_NO_THROW(validate_run_config(cfg));
  EXPECT_EQ(run_config_json(cfg), run_config_json(RunConfig{}));
  RunConfig on_gpu = cfg;
  on_gpu.device = Device::cuda(0);
  EXPECT_THROW(validate_run_config(on_gpu), Error);
  on_gpu.grad_comm = "float32";
  EXPECT_NO_THROW(validate_run_config(on_gpu));
  RunConfig float16 = cfg;
  float16.grad_comm = "float16";
  EXPECT_THROW(validate_run_config(float16), Error);
}

// The fused loss is recorded for a transformer either way; a checkpoint written before it (no key) trained the
// layers then the loss, and reads as off, though a new run's default is on.
TEST(RunConfigJson, KeepsTheFusedLossAndReadsAnOlderCheckpointAsOff) {
  RunConfig cfg;
  EXPECT_TRUE(cfg.fused_loss);
  cfg.model = "transformer";
  EXPECT_TRUE(run_config_from_json(run_config_json(cfg), "test").fused_loss);
  cfg.fused_loss = false;
  EXPECT_FALSE(run_config_from_json(run_config_json(cfg), "test").fused_loss);
  EXPECT_FALSE(run_config_from_json(R"({"model":"transformer","width":32})", "test").fused_loss);
  EXPECT_THROW(run_config_from_json(R"({"model":"transformer","fused_loss":"on"})", "test"), Error);
  RunConfig mlp;
  EXPECT_EQ(run_config_json(mlp).find("fused_loss"), std::string::npos);
}

// --remat blocks is recorded; none is not written, and a checkpoint without the key (older, or none) reads as none.
TEST(RunConfigJson, KeepsRematAndReadsItsAbsenceAsNone) {
  RunConfig cfg;
  cfg.model = "resnet";
  EXPECT_EQ(cfg.remat, "none");
  EXPECT_EQ(run_config_json(cfg).find("remat"), std::string::npos);
  cfg.remat = "blocks";
  EXPECT_EQ(run_config_from_json(run_config_json(cfg), "test").remat, "blocks");
  EXPECT_EQ(run_config_from_json(R"({"model":"transformer","width":32})", "test").remat, "none");
  EXPECT_THROW(run_config_from_json(R"({"model":"transformer","remat":"layers"})", "test"), Error);
  EXPECT_THROW(run_config_from_json(R"({"model":"mlp","remat":"blocks"})", "test"), Error);
}

TEST(RunConfigJson, RefusesATokenizerModelThatIsNotBase64) {
  try {
    run_config_from_json(R"({"model":"transformer","tokenizer_model":"ab!d"})", "'x.safetensors' (config)");
    ADD_FAILURE() << "read";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("'x.safetensors' (config) 'tokenizer_model' is not base64"), std::string::npos)
        << e.message();
  }
}

}  // namespace
}  // namespace mixtrain
