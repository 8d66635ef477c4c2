// Whole-model files (train/model_file.h): a model saved with save_model and rebuilt by load_model from the file
// alone predicts the same bits, keeps every layer's dtype policy, and goes on training as the saved model would.
#include "mixtrain/train/model_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mixtrain/io/safetensors.h"
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layer_registry.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/nn/swiglu.h"
#include "mixtrain/nn/transformer_layers.h"
#include "mixtrain/optim/sgd.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"
#include "blobs.h"

extern char** environ;

namespace mixtrain {
namespace {

namespace fs = std::filesystem;
using train_test::blobs;

// A layer of the test's own: y = x * factor + offset, offset a trainable vector, factor a constructor argument.
class Scale : public Layer {
 public:
  explicit Scale(float factor, DTypeArg dtype = std::nullopt, const std::string& name = {})
      : Layer("scale", dtype, name), factor_(factor) {}
  std::string class_name() const override { return "Scale"; }
  Json get_config() const override {
    Json c = Layer::get_config();
    c["factor"] = factor_;
    return c;
  }
  static std::shared_ptr<Scale> from_config(const Json& c) {
    const LayerBaseArgs b = layer_base_args(c);
    return std::make_shared<Scale>(static_cast<float>(c.at("factor").as_number()), b.dtype, b.name);
  }
  float factor() const { return factor_; }

 protected:
  void build_impl(const Shape& input_shape, Rng& rng) override {
    offset_ = add_weight("offset", Shape{input_shape[-1]}, Initializer::kGlorotUniform, rng);
  }
  Var call(const Var& x, const CallContext&) override {
    return bias_add(scale(x, factor_), offset_);
  }

 private:
  float factor_;
  Var offset_;
};
MIXTRAIN_REGISTER_LAYER(Scale, "model_file_test>Scale");

// The same layer, registered under no name: its files name a class the loading program does not know.
class Unregistered : public Scale {
 public:
  using Scale::Scale;
  std::string class_name() const override { return "Unregistered"; }
};

// A subclass of a built-in layer that still calls itself "Dense": saving it as a Dense would load the wrong type.
class MyDense : public Dense {
 public:
  using Dense::Dense;
};

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("mixtrain_model_file_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Tensor random_floats(const Shape& shape, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& f : v) f = r.normal();
  return Tensor::from_floats(shape, v);
}

// The loaded model has the saved one's layers, in order, with their classes, names and dtype policies.
void expect_same_layers(const Model& a, const Model& b) {
  ASSERT_EQ(a.layers().size(), b.layers().size());
  EXPECT_EQ(a.name(), b.name());
  EXPECT_EQ(a.is_functional(), b.is_functional());
  for (size_t i = 0; i < a.layers().size(); ++i) {
    const Layer& x = *a.layers()[i];
    const Layer& y = *b.layers()[i];
    EXPECT_EQ(typeid(x), typeid(y)) << x.name();
    EXPECT_EQ(x.name(), y.name());
    EXPECT_EQ(x.compute_dtype(), y.compute_dtype()) << x.name();
    EXPECT_EQ(x.variable_dtype(), y.variable_dtype()) << x.name();
    EXPECT_EQ(x.get_config(), y.get_config()) << x.name();
  }
  ASSERT_EQ(a.weights().size(), b.weights().size());
  for (size_t i = 0; i < a.weights().size(); ++i) {
    EXPECT_EQ(a.weights()[i].name(), b.weights()[i].name());
    EXPECT_TRUE(same_bytes(a.weights()[i].value(), b.weights()[i].value())) << a.weights()[i].name();
  }
}

// Saves, loads and compares the layers and the predictions on x, bit for bit.
std::unique_ptr<Model> round_trip(Model& m, const Tensor& x, const std::string& path) {
  m.save(path);
  std::unique_ptr<Model> loaded = load_model(path);
  expect_same_layers(m, *loaded);
  EXPECT_TRUE(same_bytes(m.predict(x), loaded->predict(x)));
  return loaded;
}

TEST(ModelFile, SequentialUnderMixedPoliciesPredictsTheSameBits) {
  TempDir dir;
  auto [x, y] = blobs(64, 3);
  Model m("mlp", 11);
  m.emplace<Dense>(16, "relu", dtype_arg("mixed_bfloat16"))->set_kernel_regularizer(L2(1e-3f));
  m.emplace<BatchNormalization>(0.9f, 1e-3f, dtype_arg("mixed_bfloat16"));
  m.emplace<Dropout>(0.25f, dtype_arg("mixed_float16"));
  m.emplace<Dense>(12, "gelu", dtype_arg("mixed_float16"), false);
  m.emplace<Activation>("tanh");
  m.emplace<Dense>(3, "softmax", dtype_arg("float32"));
  m.compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy"), {"accuracy"});
  m.fit(x, y, {.epochs = 1, .batch_size = 16, .verbose = 0});
  std::unique_ptr<Model> loaded = round_trip(m, x, dir.file("mlp.safetensors"));
  EXPECT_EQ(loaded->layers()[0]->compute_dtype(), DType::kBFloat16);
  EXPECT_EQ(loaded->layers()[0]->variable_dtype(), DType::kFloat32);
  EXPECT_EQ(static_cast<Dense&>(*loaded->layers()[0]).kernel_regularizer().l2, 1e-3f);
  ASSERT_TRUE(loaded->compiled());
  EXPECT_EQ(loaded->compiled_metrics(), std::vector<std::string>{"accuracy"});
  EXPECT_EQ(loaded->optimizer().name(), m.optimizer().name());
  EXPECT_EQ(loaded->evaluate(x, y).loss, m.evaluate(x, y).loss);
}

TEST(ModelFile, FunctionalGraphWithBranchesAndMergesPredictsTheSameBits) {
  TempDir dir;
  Tensor x = random_floats(Shape{9, 12}, 5);
  auto in = Input({12});
  auto a = (*make_layer<Dense>(8, "relu", dtype_arg("mixed_float16")))(in);
  auto b = (*make_layer<SwiGLU>(6, 8))(in);
  auto sum = (*make_layer<Add>())({a, b});
  auto gated = (*make_layer<Multiply>(dtype_arg("mixed_bfloat16")))({sum, (*make_layer<Activation>("sigmoid"))(b)});
  auto shared = make_layer<LayerNormalization>(1e-5f);  // called twice: one layer, two nodes
  auto joined = (*make_layer<Concatenate>(-1))({(*shared)(gated), (*shared)(a), (*make_layer<RMSNormalization>())(b)});
  auto r = (*make_layer<Reshape>(std::vector<int64_t>{4, 6}))(joined);
  auto out = (*make_layer<Softmax>(dtype_arg("float32")))((*make_layer<Flatten>())(r));
  Model m({in}, {out}, "branches", 3);
  round_trip(m, x, dir.file("graph.safetensors"));
}

TEST(ModelFile, ConvolutionAndTransformerLayersRoundTrip) {
  TempDir dir;
  Model cnn("cnn", 2);
  cnn.emplace<Conv2D>(4, ops::Size2{3, 2}, 1, "same", "relu", true, dtype_arg("mixed_bfloat16"))
      ->set_kernel_initializer("he_normal");
  cnn.emplace<MaxPooling2D>(2);
  cnn.emplace<AveragePooling2D>(ops::Size2{2, 1}, ops::Size2{1, 1}, "same");
  cnn.emplace<GlobalAveragePooling2D>();
  cnn.emplace<Dense>(3);
  cnn.build_for(Shape{8, 8, 2});
  round_trip(cnn, random_floats(Shape{3, 8, 8, 2}, 7), dir.file("cnn.safetensors"));

  const int64_t T = 6, V = 11;
  auto ids = Input({T}, DType::kInt32, "ids");
  auto h = (*make_layer<PositionEmbedding>(8))((*make_layer<Embedding>(V, 8))(ids));
  auto att = (*make_layer<MultiHeadAttention>(MultiHeadAttentionOptions{.num_heads = 2, .key_dim = 4,
                                                                         .causal = true, .name = "attention"}))(h);
  auto logits = (*make_layer<Dense>(V))((*make_layer<LayerNormalization>())((*make_layer<Add>())({h, att})));
  Model lm({ids}, {logits}, "lm", 4);
  std::vector<int32_t> tokens(3 * T);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7) % V);
  round_trip(lm, Tensor::from_ints({3, T}, tokens), dir.file("lm.safetensors"));
}

// The saved model and the loaded one, trained on from the same point with the same data, stay bit-identical:
// weights, optimizer slots, loss scale and the random streams of shuffling and dropout all came back.
TEST(ModelFile, LoadedModelGoesOnTrainingAsTheSavedOne) {
  for (const std::string optimizer : {"adam", "sgd"}) {
    SCOPED_TRACE(optimizer);
    TempDir dir;
    auto [x, y] = blobs(96, 9);
    Model m("trained", 21);
    m.emplace<Dense>(16, "relu", dtype_arg("mixed_float16"));
    m.emplace<Dropout>(0.3f, dtype_arg("mixed_float16"));
    m.emplace<Dense>(3, "linear", dtype_arg("float32"));
    std::unique_ptr<Optimizer> opt = optimizer == "adam" ? make_optimizer("adam", 0.01f)
                                                         : std::unique_ptr<Optimizer>(new Sgd(0.05f, 0.9f, true));
    opt->set_global_clipnorm(1.0f);
    m.compile(std::move(opt), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
    const FitOptions options{.epochs = 2, .batch_size = 16, .validation_split = 0.25, .verbose = 0};
    m.fit(x, y, options);
    m.save(dir.file("m.safetensors"));
    std::unique_ptr<Model> loaded = load_model(dir.file("m.safetensors"));
    EXPECT_TRUE(loaded->optimizer().scales_loss());  // the LossScaleOptimizer compile added under mixed_float16
    const History original = m.fit(x, y, options);
    const History resumed = loaded->fit(x, y, options);
    EXPECT_EQ(original.step_loss, resumed.step_loss);
    EXPECT_EQ(original.history, resumed.history);
    for (size_t i = 0; i < m.weights().size(); ++i)
      EXPECT_TRUE(same_bytes(m.weights()[i].value(), loaded->weights()[i].value())) << m.weights()[i].name();
    const NamedTensors a = m.optimizer().state(), b = loaded->optimizer().state();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bytes(a[i].second, b[i].second)) << a[i].first;
  }
}

// The fused loss (Model::set_fused_loss) is a training setting the file keeps: without it the loaded model would
// train unfused, and its losses would differ from the saved model's in the last float32 bits.
TEST(ModelFile, LoadedModelKeepsTheFusedLossAndItsChunkRows) {
  TempDir dir;
  auto [x, y] = blobs(96, 9);
  Model m("fused", 23);
  m.emplace<Dense>(32, "relu", dtype_arg("mixed_bfloat16"));
  m.emplace<Dense>(3, "linear", dtype_arg("float32"));
  m.compile(make_optimizer("adam", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  m.set_fused_loss(true, 5);
  const FitOptions options{.epochs = 2, .batch_size = 16, .verbose = 0};
  m.fit(x, y, options);
  m.save(dir.file("m.safetensors"));
  std::unique_ptr<Model> loaded = load_model(dir.file("m.safetensors"));
  EXPECT_TRUE(loaded->fused_loss());
  EXPECT_EQ(loaded->fused_loss_chunk_rows(), 5);
  const History original = m.fit(x, y, options);
  const History resumed = loaded->fit(x, y, options);
  EXPECT_EQ(original.step_loss, resumed.step_loss);
  for (size_t i = 0; i < m.weights().size(); ++i)
    EXPECT_TRUE(same_bytes(m.weights()[i].value(), loaded->weights()[i].value())) << m.weights()[i].name();

  m.set_fused_loss(false);  // unfused models save as before and load unfused
  m.save(dir.file("plain.safetensors"));
  EXPECT_FALSE(load_model(dir.file("plain.safetensors"))->fused_loss());
}

TEST(ModelFile, CustomLayerRoundTripsThroughTheRegistry) {
  TempDir dir;
  Tensor x = random_floats(Shape{5, 4}, 1);
  Model m("custom", 8);
  m.emplace<Dense>(6);
  m.emplace<Scale>(2.5f, dtype_arg("mixed_bfloat16"));
  m.build_for(Shape{4});
  std::unique_ptr<Model> loaded = round_trip(m, x, dir.file("custom.safetensors"));
  EXPECT_EQ(dynamic_cast<Scale&>(*loaded->layers()[1]).factor(), 2.5f);
}

TEST(ModelFile, UnknownLayerClassIsRefusedNamingItAndHowToRegister) {
  TempDir dir;
  Model m("custom", 8);
  m.emplace<Unregistered>(2.0f, std::nullopt, "odd");
  m.build_for(Shape{4});
  m.save(dir.file("unregistered.safetensors"));
  try {
    load_model(dir.file("unregistered.safetensors"));
    FAIL() << "an unregistered layer class loaded";
  } catch (const Error& e) {
    const std::string what = std::string(e.what()) + " " + e.hint();
    EXPECT_NE(what.find("layer 'odd'"), std::string::npos) << what;
    EXPECT_NE(what.find("unknown layer class 'Unregistered'"), std::string::npos) << what;
    EXPECT_NE(what.find("MIXTRAIN_REGISTER_LAYER(MyLayer, \"Unregistered\")"), std::string::npos) << what;
  }
  // A subclass of Dense calling itself "Dense" is refused at save, before it could load as a plain Dense.
  Model sub("sub", 1);
  sub.emplace<MyDense>(3);
  sub.build_for(Shape{4});
  const std::string path = dir.file("sub.safetensors");
  EXPECT_THROW(sub.save(path), Error);
  EXPECT_FALSE(fs::exists(path));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void expect_load_refused(const std::string& path, const std::string& expected) {
  try {
    load_model(path);
    FAIL() << "loaded " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST(ModelFile, DamagedFilesAndCheckpointsAreRefused) {
  TempDir dir;
  Model m("mlp", 5);
  m.emplace<Dense>(4);
  m.build_for(Shape{3});
  const std::string good = dir.file("good.safetensors");
  m.save(good);
  const std::string bytes = read_bytes(good);
  // One bit of the last tensor's data (the random streams' bytes end the file), and one in the architecture.
  std::string flipped = bytes;
  flipped[flipped.size() - 3] ^= 0x10;
  std::ofstream(dir.file("flipped.safetensors"), std::ios::binary) << flipped;
  expect_load_refused(dir.file("flipped.safetensors"), "fails its checksum");
  std::string arch = bytes;
  const size_t at = arch.find("\\\"units\\\":4");
  ASSERT_NE(at, std::string::npos);
  arch[at + 10] = '5';
  std::ofstream(dir.file("arch.safetensors"), std::ios::binary) << arch;
  expect_load_refused(dir.file("arch.safetensors"), "__metadata__ fails its checksum");
  // A checkpoint has no architecture to build from.
  save_checkpoint(dir.file("ckpt.safetensors"), m, CheckpointInfo{});
  expect_load_refused(dir.file("ckpt.safetensors"), "no model architecture");
}

// ---- Loaded in another process --------------------------------------------------------------------------------
// The child is this binary started again with ModelFileChild.Load selected: it builds nothing itself, loads the
// model, predicts and trains one more epoch, and leaves both results in the directory for the parent to compare.

constexpr const char* kChildDirEnv = "MIXTRAIN_MODEL_FILE_TEST_DIR";
const FitOptions kChildFit{.epochs = 1, .batch_size = 16, .verbose = 0};

TEST(ModelFileChild, Load) {
  const char* dir = std::getenv(kChildDirEnv);
  if (!dir) GTEST_SKIP() << "helper process of ModelFile.LoadsInAnotherProcess; runs only when it starts it";
  const SafetensorsFile data = load_safetensors(std::string(dir) + "/data.safetensors");
  std::unique_ptr<Model> m = load_model(std::string(dir) + "/model.safetensors");
  NamedTensors out{{"prediction", m->predict(data.get("x"))}};
  m->fit(data.get("x"), data.get("y"), kChildFit);
  for (const Var& w : m->weights()) out.emplace_back(w.name(), w.value());
  save_safetensors(std::string(dir) + "/child.safetensors", out);
}

int run_child(const TempDir& dir, std::string* log) {
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  const std::string log_path = dir.file("child.log");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::string_view(*e).substr(0, 6) != "GTEST_") env_strings.emplace_back(*e);  // not the parent's filter
  env_strings.push_back(std::string(kChildDirEnv) + "=" + dir.path.string());
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=ModelFileChild.Load";
  std::vector<char*> argv{const_cast<char*>(exe.c_str()), filter.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  *log = read_bytes(log_path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(ModelFile, LoadsInAnotherProcess) {
  TempDir dir;
  auto [x, y] = blobs(48, 2);
  auto in = Input({8});
  auto h = (*make_layer<Dense>(12, "relu", dtype_arg("mixed_bfloat16")))(in);
  auto s = (*make_layer<Scale>(0.5f))(h);
  auto out = (*make_layer<Dense>(3, "linear", dtype_arg("float32")))((*make_layer<Concatenate>())({h, s}));
  Model m({in}, {out}, "two_process", 6);
  m.compile(make_optimizer("rmsprop", 0.01f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  m.fit(x, y, kChildFit);
  m.save(dir.file("model.safetensors"));
  save_safetensors(dir.file("data.safetensors"), {{"x", x}, {"y", y}});
  std::string log;
  ASSERT_EQ(run_child(dir, &log), 0) << log;
  const SafetensorsFile child = load_safetensors(dir.file("child.safetensors"));  // absent if the child skipped
  EXPECT_TRUE(same_bytes(m.predict(x), child.get("prediction")));
  m.fit(x, y, kChildFit);
  for (const Var& w : m.weights()) EXPECT_TRUE(same_bytes(w.value(), child.get(w.name()))) << w.name();
}

}  // namespace
}  // namespace mixtrain
