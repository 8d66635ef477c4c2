#include "mixtrain/train/checkpoint.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "mixtrain/core/json.h"
#include "mixtrain/io/safetensors.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/model.h"
#include "blobs.h"

extern char** environ;

namespace mixtrain {
namespace {

namespace fs = std::filesystem;

using train_test::blobs;

// The model of every test here. scenario: "adam_f32" (float32, Adam), "mixed_auto" (mixed_float16, the
// LossScaleOptimizer added by compile), "mixed_growing" (mixed_float16, a scaler that doubles after 5 finite steps so
// the scale moves and overflows are skipped). The output layer computes in float32, as Keras advises.
std::unique_ptr<Model> make_model(const std::string& scenario, uint64_t seed, bool compile = true) {
  const bool mixed = scenario != "adam_f32";
  const DTypeArg hidden = dtype_arg(mixed ? "mixed_float16" : "float32");
  auto m = std::make_unique<Model>("mlp", seed);
  m->emplace<Dense>(16, "relu", hidden);
  m->emplace<Dropout>(0.3f, hidden);
  m->emplace<Dense>(3, "linear", dtype_arg("float32"));
  if (!compile) return m;
  std::unique_ptr<Optimizer> opt = make_optimizer("adam", 0.01f);
  if (scenario == "mixed_growing") {
    LossScaleOptions o;
    o.dynamic_growth_steps = 5;
    opt = std::make_unique<LossScaleOptimizer>(std::move(opt), o);
  }
  m->compile(std::move(opt), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  return m;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh directory under the system temp dir, removed on destruction.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("mixtrain_ckpt_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Everything a checkpoint restores, copied, so tests can check that a failed load changed nothing.
struct Snapshot {
  NamedTensors weights, optimizer;
  std::vector<std::vector<uint64_t>> rngs;
};

Snapshot snapshot(Model& m) {
  Snapshot s;
  if (m.built())  // an unbuilt model has no weights yet (and weights() says so)
    for (const Var& w : m.weights()) s.weights.emplace_back(w.name(), w.value().clone());
  s.optimizer = m.optimizer().state();
  s.rngs = {m.init_rng().state(), m.shuffle_rng().state(), m.dropout_rng().state()};
  return s;
}

void expect_same_named(const NamedTensors& a, const NamedTensors& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first) << what;
    EXPECT_TRUE(same_bytes(a[i].second, b[i].second)) << what << ": '" << a[i].first << "' differs";
  }
}

void expect_same(const Snapshot& a, const Snapshot& b) {
  expect_same_named(a.weights, b.weights, "weights");
  expect_same_named(a.optimizer, b.optimizer, "optimizer state");
  EXPECT_EQ(a.rngs, b.rngs);
}

FitOptions fit_options(int epochs, int initial_epoch = 0) {
  FitOptions o;
  o.epochs = epochs;
  o.initial_epoch = initial_epoch;
  o.batch_size = 16;
  o.validation_split = 0.25;
  return o;
}

// ---- Resume in a fresh process ----------------------------------------------------------------------------------
// Layer names are unique per process ("dense", "dense_1", ...) and checkpoints match weights by name, so each run
// of the resume test is this test binary started again with CheckpointChild.Run selected and its role in the
// environment. The runs leave their results in files the parent compares.

constexpr const char* kRoleEnv = "MIXTRAIN_CKPT_TEST_ROLE";
constexpr const char* kScenarioEnv = "MIXTRAIN_CKPT_TEST_SCENARIO";
constexpr const char* kDirEnv = "MIXTRAIN_CKPT_TEST_DIR";
constexpr int kEpochs = 4;
constexpr int kResumeAt = 2;

// Doubles stored losslessly as their bytes (U8), so the parent compares exact values.
Tensor doubles_tensor(const std::vector<double>& v) {
  Tensor t = Tensor::zeros(Shape{static_cast<int64_t>(v.size() * sizeof(double))}, DType::kUInt8);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(double));
  return t;
}
std::vector<double> tensor_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()) / sizeof(double));
  if (!v.empty()) std::memcpy(v.data(), t.raw(), v.size() * sizeof(double));
  return v;
}

void save_history(const std::string& path, const History& h) {
  NamedTensors t;
  std::vector<int32_t> epochs(h.epoch.begin(), h.epoch.end());
  t.emplace_back("epoch", Tensor::from_ints({static_cast<int64_t>(epochs.size())}, epochs));
  for (const auto& [k, v] : h.history) t.emplace_back("history/" + k, doubles_tensor(v));
  t.emplace_back("step_loss", doubles_tensor(h.step_loss));
  t.emplace_back("step_loss_scale", doubles_tensor(h.step_loss_scale));
  save_safetensors(path, t);
}

TEST(CheckpointChild, Run) {
  const char* role_env = std::getenv(kRoleEnv);
  if (!role_env) GTEST_SKIP() << "helper process of the resume tests; runs only when they start it";
  const std::string role = role_env, scenario = std::getenv(kScenarioEnv), dir = std::getenv(kDirEnv);
  auto [x, y] = blobs(240, 3);
  auto m = make_model(scenario, 42, /*compile=*/role != "infer");
  if (role == "full") {
    CheckpointCallback cb(dir + "/full-{epoch}.safetensors", 1, "full run");
    FitOptions o = fit_options(kEpochs);
    o.callbacks = {&cb};
    History h = m->fit(x, y, o);
    EXPECT_EQ(cb.saves(), kEpochs);
    save_history(dir + "/full-history.safetensors", h);
  } else if (role == "part") {
    m->fit(x, y, fit_options(kResumeAt));
    CheckpointInfo info;
    info.epoch = kResumeAt;
    info.config = "{\"epochs\": 4}";
    save_checkpoint(dir + "/part.safetensors", *m, info);
  } else if (role == "resume") {
    // Loaded before the first optimizer step: the slots are created from the checkpoint.
    ASSERT_EQ(m->optimizer().iterations(), 0);
    CheckpointInfo info = load_checkpoint(dir + "/part.safetensors", *m);
    EXPECT_EQ(info.epoch, kResumeAt);
    EXPECT_EQ(info.config, "{\"epochs\": 4}");
    EXPECT_EQ(info.seed, 42u);
    History h = m->fit(x, y, fit_options(kEpochs, info.epoch));
    CheckpointInfo done;
    done.epoch = kEpochs;
    save_checkpoint(dir + "/resumed.safetensors", *m, done);
    save_history(dir + "/resumed-history.safetensors", h);
  } else if (role == "infer") {
    // Neither compiled nor built: built for the saved input shape, weights and Rngs restored, optimizer skipped.
    ASSERT_FALSE(m->built());
    CheckpointInfo info = load_checkpoint(dir + "/full-" + std::to_string(kEpochs) + ".safetensors", *m);
    EXPECT_TRUE(m->built());
    EXPECT_EQ(info.epoch, kEpochs);
    save_checkpoint(dir + "/infer.safetensors", *m, info);
  } else {
    FAIL() << "unknown role " << role;
  }
}

// Runs CheckpointChild.Run in a new process of this binary; returns its exit status, and its output in *log.
int run_child(const std::string& role, const std::string& scenario, const TempDir& dir, std::string* log) {
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  const std::string log_path = dir.file(role + ".log");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string_view kv(*e);
    // The parent's gtest settings (filters, sharding, XML output) must not reach the child.
    if (kv.substr(0, 6) == "GTEST_" || kv.substr(0, 15) == "MIXTRAIN_CKPT_T") continue;
    env_strings.emplace_back(kv);
  }
  env_strings.push_back(std::string(kRoleEnv) + "=" + role);
  env_strings.push_back(std::string(kScenarioEnv) + "=" + scenario);
  env_strings.push_back(std::string(kDirEnv) + "=" + dir.path.string());
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=CheckpointChild.Run";
  std::vector<char*> argv{const_cast<char*>(exe.c_str()), filter.data(), nullptr};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    *log = std::string("posix_spawn failed: ") + std::strerror(rc);
    return -1;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  *log = read_bytes(log_path);
  // A skipped child (the role did not arrive) would exit 0 without results; the result files are checked too.
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void check_resume_is_bit_identical(const std::string& scenario) {
  TempDir dir;
  for (const char* role : {"full", "part", "resume"}) {
    std::string log;
    ASSERT_EQ(run_child(role, scenario, dir, &log), 0) << role << " run failed:\n" << log;
  }
  // Uninterrupted == interrupted + resumed: every tensor (weights, optimizer slots and counters, loss-scale
  // state, Rng states) byte for byte.
  const SafetensorsFile full = load_safetensors(dir.file("full-" + std::to_string(kEpochs) + ".safetensors"));
  const SafetensorsFile resumed = load_safetensors(dir.file("resumed.safetensors"));
  expect_same_named(full.tensors, resumed.tensors, "final checkpoint");
  // Saving after fit() returned equals saving from the callback at the end of that epoch.
  const SafetensorsFile full_k = load_safetensors(dir.file("full-" + std::to_string(kResumeAt) + ".safetensors"));
  const SafetensorsFile part = load_safetensors(dir.file("part.safetensors"));
  expect_same_named(full_k.tensors, part.tensors, "checkpoint at the resume epoch");
  EXPECT_EQ(full.metadata.at("epoch"), std::to_string(kEpochs));

  const SafetensorsFile fh = load_safetensors(dir.file("full-history.safetensors"));
  const SafetensorsFile rh = load_safetensors(dir.file("resumed-history.safetensors"));
  EXPECT_EQ(fh.get("epoch").to_ints(), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(rh.get("epoch").to_ints(), (std::vector<int32_t>{2, 3}));
  for (const char* key : {"history/loss", "history/accuracy", "history/val_loss", "history/val_accuracy"}) {
    const std::vector<double> f = tensor_doubles(fh.get(key)), r = tensor_doubles(rh.get(key));
    ASSERT_EQ(f.size(), static_cast<size_t>(kEpochs)) << key;
    EXPECT_EQ(std::vector<double>(f.begin() + kResumeAt, f.end()), r) << key;
  }
  for (const char* key : {"step_loss", "step_loss_scale"}) {
    const std::vector<double> f = tensor_doubles(fh.get(key)), r = tensor_doubles(rh.get(key));
    ASSERT_EQ(f.size() % kEpochs, 0u);
    EXPECT_EQ(std::vector<double>(f.begin() + static_cast<int64_t>(f.size() / kEpochs * kResumeAt), f.end()), r)
        << key;
  }
  if (scenario == "adam_f32") {
    std::string log;
    ASSERT_EQ(run_child("infer", scenario, dir, &log), 0) << "infer run failed:\n" << log;
    const SafetensorsFile infer = load_safetensors(dir.file("infer.safetensors"));
    EXPECT_EQ(infer.metadata.at("optimizer"), "");
    NamedTensors without_optimizer;
    for (const auto& [k, t] : full.tensors)
      if (k.rfind("optimizer/", 0) != 0) without_optimizer.emplace_back(k, t);
    expect_same_named(without_optimizer, infer.tensors, "weights and Rngs loaded for inference");
  } else {
    EXPECT_EQ(full.metadata.at("loss_scale_optimizer"), "true");
    EXPECT_TRUE(full.contains("optimizer/loss_scale/scale"));
  }
  if (scenario == "mixed_growing") {
    // The scale really moved during the resumed epochs, so its state had to be restored exactly.
    const std::vector<double> s = tensor_doubles(rh.get("step_loss_scale"));
    ASSERT_FALSE(s.empty());
    EXPECT_NE(*std::min_element(s.begin(), s.end()), *std::max_element(s.begin(), s.end()));
  }
}

TEST(Checkpoint, ResumeIsBitIdenticalAdamFloat32) { check_resume_is_bit_identical("adam_f32"); }
TEST(Checkpoint, ResumeIsBitIdenticalMixedFloat16) { check_resume_is_bit_identical("mixed_auto"); }
TEST(Checkpoint, ResumeIsBitIdenticalWithMovingLossScale) { check_resume_is_bit_identical("mixed_growing"); }

// ---- In-process tests -----------------------------------------------------------------------------------------

TEST(Checkpoint, RoundTripRestoresWeightsOptimizerScalerAndRngsBitExactly) {
  TempDir dir;
  auto [x, y] = blobs(120, 5);
  auto m = make_model("mixed_growing", 9);
  m->fit(x, y, fit_options(1));
  CheckpointInfo info;
  info.epoch = 1;
  info.config = "{\"model\": \"mlp\"}";
  save_checkpoint(dir.file("a.safetensors"), *m, info);
  const Snapshot saved = snapshot(*m);
  auto& scaler = dynamic_cast<LossScaleOptimizer&>(m->optimizer());
  const float saved_scale = scaler.loss_scale();

  m->fit(x, y, fit_options(3, 1));  // moves weights, slots, iterations, the scale and the Rngs
  ASSERT_FALSE(same_bytes(saved.weights[0].second, m->weights()[0].value()));
  ASSERT_NE(saved.rngs, snapshot(*m).rngs);

  CheckpointInfo loaded = load_checkpoint(dir.file("a.safetensors"), *m);
  expect_same(saved, snapshot(*m));
  EXPECT_EQ(scaler.loss_scale(), saved_scale);
  EXPECT_EQ(loaded.epoch, 1);
  EXPECT_EQ(loaded.config, info.config);
  EXPECT_EQ(loaded.seed, 9u);
  EXPECT_EQ(loaded.optimizer, "adam");
  EXPECT_TRUE(loaded.loss_scale_optimizer);
}

TEST(Checkpoint, FileIsPlainSafetensorsWithMetadata) {
  TempDir dir;
  auto [x, y] = blobs(60, 6);
  auto m = make_model("mixed_auto", 3);
  m->fit(x, y, fit_options(1));
  CheckpointInfo info;
  info.epoch = 1;
  info.config = "cfg";
  save_checkpoint(dir.file("c.safetensors"), *m, info);

  const SafetensorsFile f = load_safetensors(dir.file("c.safetensors"));
  EXPECT_EQ(f.metadata.at("format"), "mixtrain-checkpoint-1");
  EXPECT_EQ(f.metadata.at("epoch"), "1");
  EXPECT_EQ(f.metadata.at("seed"), "3");
  EXPECT_EQ(f.metadata.at("config"), "cfg");
  EXPECT_EQ(f.metadata.at("optimizer"), "adam");
  EXPECT_EQ(f.metadata.at("loss_scale_optimizer"), "true");
  EXPECT_EQ(f.metadata.at("input_shape"), "[8]");
  for (const auto& l : m->layers())
    EXPECT_EQ(f.metadata.at("layer/" + l->name() + "/policy"), l->dtype_policy().name()) << l->name();
  EXPECT_EQ(f.metadata.at("layer/" + m->layers()[0]->name() + "/policy"), "mixed_float16");
  EXPECT_EQ(f.metadata.at("layer/" + m->layers()[2]->name() + "/policy"), "float32");
  for (const Var& w : m->weights()) {
    ASSERT_TRUE(f.contains(w.name())) << w.name();
    EXPECT_TRUE(same_bytes(f.get(w.name()), w.value())) << w.name();
  }
  const std::string kernel = m->weights()[0].name();
  EXPECT_EQ(f.get("optimizer/" + kernel + "/m").shape(), m->weights()[0].shape());
  EXPECT_EQ(f.get("optimizer/iterations").dtype(), DType::kInt32);
  EXPECT_EQ(f.get("optimizer/loss_scale/scale").item(), 32768.0f);
  const Tensor& rng = f.get("rng/shuffle");
  EXPECT_EQ(rng.dtype(), DType::kUInt8);
  EXPECT_EQ(rng.shape(), (Shape{4, 8}));
  std::vector<uint64_t> words(4);
  std::memcpy(words.data(), rng.raw(), 32);  // little-endian bytes read back as uint64 words
  EXPECT_EQ(words, m->shuffle_rng().state());
  EXPECT_TRUE(f.contains("rng/init"));
  EXPECT_TRUE(f.contains("rng/dropout"));
}

// Writes a copy of the checkpoint at src with edit applied to its tensors and metadata.
void write_edited(const std::string& src, const std::string& dst,
                  const std::function<void(NamedTensors&, std::map<std::string, std::string>&)>& edit) {
  SafetensorsFile f = load_safetensors(src);
  edit(f.tensors, f.metadata);
  save_safetensors(dst, f.tensors, f.metadata);
}

void expect_load_fails(const std::string& path, Model& m, const std::string& needle) {
  const Snapshot before = snapshot(m);
  try {
    load_checkpoint(path, m);
    ADD_FAILURE() << "loading " << path << " should fail with '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  expect_same(before, snapshot(m));  // nothing half-applied
}

// The error load_checkpoint throws for path, which must be kInvalidInput (exit status 2 in the CLI) and name the
// file and needle; the model must be left as it was.
void expect_refused(const std::string& path, Model& m, const std::string& needle) {
  const Snapshot before = snapshot(m);
  try {
    load_checkpoint(path, m);
    ADD_FAILURE() << "loading " << path << " should fail with '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
    EXPECT_NE(e.message().find(path), std::string::npos) << e.what();
    EXPECT_NE(e.message().find(needle), std::string::npos) << e.what();
  }
  expect_same(before, snapshot(m));
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

// The byte offset in the file of tensor name's first data byte.
uint64_t data_offset_of(const std::string& bytes, const std::string& name) {
  const uint64_t n = header_length(bytes);
  const Json header = Json::parse(std::string_view(bytes).substr(8, n), "test");
  for (const auto& [key, value] : header.as_object())
    if (key == name) return 8 + n + static_cast<uint64_t>(value.at("data_offsets").at(size_t{0}).as_int64());
  ADD_FAILURE() << "no tensor " << name;
  return 0;
}

// The file bytes with edit applied to the parsed header (the data block is kept as it is).
std::string with_header(const std::string& bytes, const std::function<void(Json&)>& edit) {
  const uint64_t n = header_length(bytes);
  Json header = Json::parse(std::string_view(bytes).substr(8, n), "test");
  edit(header);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  return out + text + bytes.substr(8 + n);
}

// The checkpoint as a mixtrain without checksums wrote it: the same header minus the checksum/ entries.
std::string without_checksums(const std::string& bytes) {
  return with_header(bytes, [](Json& header) {
    for (auto& [key, value] : header.as_object())
      if (key == "__metadata__")
        std::erase_if(value.as_object(), [](const auto& e) { return e.first.rfind("checksum/", 0) == 0; });
  });
}

// Damage a checksum catches, and damage a loader must catch before allocating, is refused with kInvalidInput
// naming the file (and the tensor where one is at fault); the model is left untouched.
TEST(Checkpoint, DamagedFilesAreRefusedNamingFileAndTensor) {
  TempDir dir;
  auto [x, y] = blobs(60, 7);
  auto m = make_model("adam_f32", 4);
  m->fit(x, y, fit_options(1));
  const std::string good = dir.file("good.safetensors");
  CheckpointInfo info;
  info.epoch = 1;
  save_checkpoint(good, *m, info);
  const std::string bytes = read_bytes(good);
  const std::string kernel = m->weights()[0].name();

  // One flipped bit in a kernel element, and in the learning rate (0.001 once became 0.256 this way).
  for (const std::string& name : {kernel, std::string("optimizer/learning_rate"), std::string("rng/shuffle")}) {
    std::string flipped = bytes;
    flipped[data_offset_of(bytes, name) + 1] ^= 0x20;
    const std::string path = dir.file("flipped.safetensors");
    write_file(path, flipped);
    expect_refused(path, *m, "tensor '" + name + "' fails its checksum");
  }
  // A changed digit in the saved epoch would silently re-train an epoch.
  std::string epoch = bytes;
  const auto at = epoch.find("\"epoch\":\"1\"");
  ASSERT_NE(at, std::string::npos);
  epoch[at + 9] = '2';
  write_file(dir.file("epoch.safetensors"), epoch);
  expect_refused(dir.file("epoch.safetensors"), *m, "__metadata__ fails its checksum");
  // Truncated: the last tensor's data runs past the end.
  write_file(dir.file("truncated.safetensors"), bytes.substr(0, bytes.size() - 7));
  expect_refused(dir.file("truncated.safetensors"), *m, "run past the end of the data");
  // A header claiming sizes past the file: its length field one byte past the end, and a tensor's offsets past it.
  std::string claims = bytes;
  const uint64_t too_long = bytes.size() - 8 + 1;
  for (int i = 0; i < 8; ++i) claims[i] = static_cast<char>(too_long >> (8 * i));
  write_file(dir.file("claims.safetensors"), claims);
  expect_refused(dir.file("claims.safetensors"), *m, "runs past the end of the file");
  const std::string offsets = with_header(bytes, [&](Json& header) {
    const int64_t past = static_cast<int64_t>(bytes.size());  // beyond the data block, which is smaller than the file
    for (auto& [key, value] : header.as_object())
      if (key == "optimizer/learning_rate") value["data_offsets"] = Json::array({past, past + 4});
  });
  write_file(dir.file("offsets.safetensors"), offsets);
  expect_refused(dir.file("offsets.safetensors"), *m, "tensor 'optimizer/learning_rate': data_offsets [");
  expect_refused(dir.file("offsets.safetensors"), *m, "run past the end of the data");
  // NaN with valid checksums (as an editing tool would write it): save_checkpoint never writes NaN.
  write_edited(good, dir.file("nan.safetensors"), [&](NamedTensors& t, std::map<std::string, std::string>&) {
    for (auto& [name, v] : t)
      if (name == kernel) v.data<float>()[0] = std::nanf("");
  });
  expect_refused(dir.file("nan.safetensors"), *m, "'" + kernel + "' holds NaN or Inf");

  EXPECT_TRUE(load_checkpoint(good, *m).checksums_verified);
}

// Found by fuzz/checkpoint_fuzz.cpp (fuzz/corpus/checkpoint/huge_input_shape): an unbuilt model was built for
// whatever input_shape the file held, so [2^52] asked for 2^56 bytes and [2, 2^30] for gigabytes before any weight
// was compared. The shape is now checked first (each edit below keeps the checksums valid, as an editing tool
// would), and the model stays unbuilt.
TEST(Checkpoint, AHostileInputShapeIsRefusedBeforeTheModelIsBuilt) {
  TempDir dir;
  auto [x, y] = blobs(60, 7);
  auto trained = make_model("adam_f32", 4);
  trained->fit(x, y, fit_options(1));
  const std::string good = dir.file("good.safetensors");
  save_checkpoint(good, *trained, CheckpointInfo{});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[4503599627370496]", "asks for more than 1048576 elements per sample"},
      {"[2,1073741824]", "asks for more than 1048576 elements per sample"},
      {"[1048576,2]", "asks for more than 1048576 elements per sample"},
      {"[]", "is not an array of 1 to 7 dimensions"},
      {"[1,1,1,1,1,1,1,8]", "is not an array of 1 to 7 dimensions"},
      {"{\"a\":8}", "is not an array of 1 to 7 dimensions"},
      {"[8", "is not JSON"},
      {"[0]", "holds 0 where a positive integer dimension belongs"},
      {"[-8]", "holds -8 where a positive integer dimension belongs"},
      {"[2.5]", "holds 2.5 where a positive integer dimension belongs"},
      {"[\"8\"]", "holds \"8\" where a positive integer dimension belongs"},
  };
  for (const auto& c : cases) {
    const std::string& shape = c.first;
    const std::string path = dir.file("shape.safetensors");
    write_edited(good, path, [&](NamedTensors&, std::map<std::string, std::string>& meta) { meta["input_shape"] = shape; });
    auto fresh = make_model("adam_f32", 4);
    expect_refused(path, *fresh, "'input_shape' metadata '" + shape + "' " + c.second);
    EXPECT_FALSE(fresh->built()) << shape;
  }
  auto fresh = make_model("adam_f32", 4);
  load_checkpoint(good, *fresh);
  EXPECT_TRUE(fresh->built());
  expect_same(snapshot(*trained), snapshot(*fresh));
}

// A checkpoint saved before checksums were added loads (after every other check) with a warning naming the file.
TEST(Checkpoint, CheckpointWithoutChecksumsLoadsWithAWarning) {
  TempDir dir;
  auto [x, y] = blobs(60, 7);
  auto m = make_model("adam_f32", 4);
  m->fit(x, y, fit_options(1));
  const std::string good = dir.file("good.safetensors");
  save_checkpoint(good, *m, CheckpointInfo{});
  const Snapshot saved = snapshot(*m);
  const std::string old = dir.file("old.safetensors");
  write_file(old, without_checksums(read_bytes(good)));
  ASSERT_FALSE(load_safetensors(old).checksums_verified);
  m->fit(x, y, fit_options(2, 1));

  ::testing::internal::CaptureStderr();
  const CheckpointInfo info = load_checkpoint(old, *m);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(info.checksums_verified);
  EXPECT_NE(err.find("warning: checkpoint '" + old + "' has no checksums"), std::string::npos) << err;
  expect_same(saved, snapshot(*m));

  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(load_checkpoint(good, *m).checksums_verified);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(Checkpoint, MismatchesAreRefusedAndLeaveTheModelUnchanged) {
  TempDir dir;
  auto [x, y] = blobs(60, 7);
  auto m = make_model("adam_f32", 4);
  m->fit(x, y, fit_options(1));
  const std::string good = dir.file("good.safetensors");
  save_checkpoint(good, *m, CheckpointInfo{});
  m->fit(x, y, fit_options(2, 1));  // the model now differs from the file
  const std::string kernel = m->weights()[0].name(), bias = m->weights()[1].name();
  int n = 0;
  auto edited = [&](const std::function<void(NamedTensors&, std::map<std::string, std::string>&)>& edit) {
    const std::string path = dir.file("bad" + std::to_string(n++) + ".safetensors");
    write_edited(good, path, edit);
    return path;
  };
  auto find = [](NamedTensors& t, const std::string& name) -> Tensor& {
    for (auto& [k, v] : t)
      if (k == name) return v;
    throw std::runtime_error("no " + name);
  };

  expect_load_fails(edited([](auto&, auto& meta) { meta["format"] = "mixtrain-checkpoint-0"; }), *m,
                    "mixtrain-checkpoint-0");
  expect_load_fails(edited([](auto&, auto& meta) { meta.erase("format"); }), *m, "not a mixtrain checkpoint");
  expect_load_fails(edited([&](auto& t, auto&) { find(t, kernel) = Tensor::zeros({8, 17}, DType::kFloat32); }), *m,
                    "weight '" + kernel + "'");
  expect_load_fails(edited([&](auto& t, auto&) { find(t, bias) = Tensor::zeros({16}, DType::kFloat16); }), *m,
                    "float16");
  expect_load_fails(edited([&](auto& t, auto&) {
                      std::erase_if(t, [&](const auto& kv) { return kv.first == bias; });
                    }),
                    *m, "no weight '" + bias + "'");
  expect_load_fails(edited([](auto& t, auto&) { t.emplace_back("extra/kernel", Tensor::zeros({2}, DType::kFloat32)); }),
                    *m, "extra/kernel");
  expect_load_fails(edited([](auto&, auto& meta) { meta["optimizer"] = "sgd"; }), *m, "sgd");
  expect_load_fails(edited([](auto&, auto& meta) { meta["loss_scale_optimizer"] = "true"; }), *m,
                    "loss_scale_optimizer(adam)");
  expect_load_fails(edited([&](auto& t, auto&) {
                      find(t, "optimizer/" + kernel + "/m") = Tensor::zeros({16, 8}, DType::kFloat32);
                    }),
                    *m, "optimizer entry '" + kernel + "/m'");
  expect_load_fails(edited([](auto& t, auto&) { t.emplace_back("optimizer/ghost/m", Tensor::zeros({1}, DType::kFloat32)); }),
                    *m, "ghost/m");
  // Accepted by our checks, refused by the optimizer itself: still nothing applied.
  expect_load_fails(edited([&](auto& t, auto&) {
                      t.emplace_back("optimizer/" + kernel + "/momentum", Tensor::zeros({8, 16}, DType::kFloat32));
                    }),
                    *m, "momentum");
  expect_load_fails(edited([&](auto& t, auto&) { find(t, "rng/dropout") = Tensor::zeros({4, 8}, DType::kUInt8); }),
                    *m, "rng/dropout");
  expect_load_fails(edited([&](auto& t, auto&) { find(t, "rng/init") = Tensor::zeros({32}, DType::kInt32); }), *m,
                    "rng/init");
  expect_load_fails(edited([&](auto&, auto& meta) { meta["layer/" + m->layers()[0]->name() + "/policy"] = "float16"; }),
                    *m, "policy");

  // Another model: different layers (and here a different architecture).
  auto other = std::make_unique<Model>("mlp", 4);
  other->emplace<Dense>(32, "relu");
  other->emplace<Dense>(3);
  other->compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true));
  other->build_for(Shape{8});
  expect_load_fails(good, *other, "differ from the model's");

  // The same model recompiled with another optimizer.
  m->compile(make_optimizer("sgd", 0.01f), Loss("sparse_categorical_crossentropy", true));
  m->fit(x, y, fit_options(1));
  expect_load_fails(good, *m, "saved optimizer adam differs from the model's sgd");

  // Not a checkpoint at all.
  save_safetensors(dir.file("plain.safetensors"), {{"w", Tensor::zeros({2}, DType::kFloat32)}});
  expect_load_fails(dir.file("plain.safetensors"), *m, "not a mixtrain checkpoint");
}

// Sets a weight to NaN at the end of one epoch, before the checkpoint callback runs (callbacks run in order).
class InjectNaN : public Callback {
 public:
  InjectNaN(int at_epoch, std::string watched) : at_epoch_(at_epoch), watched_(std::move(watched)) {}
  void on_epoch_end(int epoch, const Logs&) override {
    if (epoch != at_epoch_) return;
    bytes_before = read_bytes(watched_);
    Var w = model_->weights()[0];
    w.mutable_value().data<float>()[3] = std::nanf("");
    w.bump_version();
  }
  std::string bytes_before;

 private:
  int at_epoch_;
  std::string watched_;
};

TEST(Checkpoint, CallbackNeverSavesNaNAndKeepsThePreviousFile) {
  TempDir dir;
  auto [x, y] = blobs(60, 8);
  auto m = make_model("adam_f32", 6);
  const std::string path = dir.file("last.safetensors");
  CheckpointCallback ckpt(path);
  InjectNaN nan(1, path);
  FitOptions o = fit_options(3);
  o.callbacks = {&nan, &ckpt};
  ::testing::internal::CaptureStderr();
  m->fit(x, y, o);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(ckpt.saves(), 1);
  EXPECT_EQ(ckpt.skipped_saves(), 2);
  EXPECT_NE(err.find("NaN or Inf"), std::string::npos) << err;
  ASSERT_FALSE(nan.bytes_before.empty());
  EXPECT_EQ(read_bytes(path), nan.bytes_before);  // the epoch-1 file, byte for byte
  EXPECT_EQ(load_safetensors(path).metadata.at("epoch"), "1");
  EXPECT_FALSE(checkpoint_state_is_finite(*m));
  // Saving directly refuses too, and writes nothing.
  EXPECT_THROW(save_checkpoint(dir.file("direct.safetensors"), *m, CheckpointInfo{}), Error);
  EXPECT_FALSE(fs::exists(dir.file("direct.safetensors")));
  EXPECT_EQ(read_bytes(path), nan.bytes_before);
}

TEST(Checkpoint, CallbackPeriodAndEpochInPath) {
  TempDir dir;
  auto [x, y] = blobs(60, 9);
  auto m = make_model("adam_f32", 7);
  CheckpointCallback ckpt(dir.file("ckpt-{epoch}.safetensors"), 2, "cfg");
  FitOptions o = fit_options(5);
  o.callbacks = {&ckpt};
  m->fit(x, y, o);
  EXPECT_EQ(ckpt.saves(), 2);
  EXPECT_FALSE(fs::exists(dir.file("ckpt-1.safetensors")));
  EXPECT_TRUE(fs::exists(dir.file("ckpt-2.safetensors")));
  EXPECT_FALSE(fs::exists(dir.file("ckpt-3.safetensors")));
  EXPECT_EQ(ckpt.last_saved_path(), dir.file("ckpt-4.safetensors"));
  const SafetensorsFile f = load_safetensors(dir.file("ckpt-4.safetensors"));
  EXPECT_EQ(f.metadata.at("epoch"), "4");
  EXPECT_EQ(f.metadata.at("config"), "cfg");
  EXPECT_THROW(CheckpointCallback("x", 0), Error);
}

TEST(Checkpoint, FitWithInitialEpochRunsTheRemainingEpochs) {
  auto [x, y] = blobs(60, 10);
  auto m = make_model("adam_f32", 8);
  History h = m->fit(x, y, fit_options(5, 3));
  EXPECT_EQ(h.epoch, (std::vector<int>{3, 4}));
  EXPECT_EQ(h.history["loss"].size(), 2u);
  History none = m->fit(x, y, fit_options(3, 3));
  EXPECT_TRUE(none.epoch.empty());
  EXPECT_THROW(m->fit(x, y, fit_options(3, -1)), Error);
}

TEST(Checkpoint, LoadRefreshesCachedFloat16Weights) {
  TempDir dir;
  auto [x, y] = blobs(60, 11);
  auto m = make_model("mixed_auto", 10);
  m->fit(x, y, fit_options(1));
  save_checkpoint(dir.file("w.safetensors"), *m, CheckpointInfo{});
  const Tensor expected = m->predict(x);
  // The float16 copy of the kernel cached by the first layer must follow the loaded float32 value.
  Var w = m->weights()[0];
  w.mutable_value().data<float>()[0] += 1.0f;
  w.bump_version();
  ASSERT_FALSE(same_bytes(m->predict(x), expected));  // caches the float16 cast of the changed kernel
  load_checkpoint(dir.file("w.safetensors"), *m);
  EXPECT_TRUE(same_bytes(m->predict(x), expected));
}

}  // namespace
}  // namespace mixtrain
