#include <gtest/gtest.h>

#include <sstream>

#include "mixtrain/autograd/gradcheck.h"
#include "mixtrain/autograd/tape.h"
#include "mixtrain/core/allocator.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/merging.h"
#include "mixtrain/nn/network.h"
#include "mixtrain/nn/sequential.h"
#include "mixtrain/nn/transformer_layers.h"

namespace mixtrain {
namespace {

class FunctionalTest : public ::testing::Test {
 protected:
  void TearDown() override { set_global_policy("float32"); }
};

Tensor ramp(const Shape& shape, float scale = 0.1f) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % 7) - 3);
  return Tensor::from_floats(shape, v);
}

TEST_F(FunctionalTest, ResidualGraphRunsAndEqualsTheHandWrittenComputation) {
  SymbolicTensor x = Input({6}, DType::kFloat32, "features");
  auto dense = make_layer<Dense>(6, "relu");
  SymbolicTensor h = (*dense)(x);
  SymbolicTensor sum = (*make_layer<Add>())({x, h});
  auto head = make_layer<Dense>(3);
  SymbolicTensor out = (*head)(sum);
  EXPECT_EQ(out.shape(), Shape{3});
  Network net({x}, {out}, "residual");
  Rng rng(5);
  net.build({6}, rng);
  ASSERT_EQ(net.layers().size(), 3u);
  EXPECT_EQ(net.layers()[1]->class_name(), "Add");

  Tensor in = ramp({4, 6});
  NoGradGuard no_grad;
  Var y = net.call(Var(in));
  // By hand: head(x + dense(x)).
  Var expected = (*head)(add(Var(in), (*dense)(Var(in))));
  EXPECT_EQ(y.value().to_floats(), expected.value().to_floats());
}

// A graph's forward holds only the values still to be read: under NoGradGuard a chain of eight Dense layers of 256
// units with a residual skip over the whole chain peaks at a few layers' outputs, not all eight (each (64, 256)
// float32 output is 64 KiB), and gives the same bits as the layers called by hand.
TEST_F(FunctionalTest, AForwardWithoutGradientsDropsEachValueAfterItsLastRead) {
  SymbolicTensor x = Input({256}, DType::kFloat32, "features");
  SymbolicTensor h = x;
  std::vector<std::shared_ptr<Dense>> chain;
  for (int i = 0; i < 8; ++i) {
    chain.push_back(make_layer<Dense>(256, "relu"));
    h = (*chain.back())(h);
  }
  SymbolicTensor out = (*make_layer<Add>())({x, h});  // x is read again at the end: it must stay
  Network net({x}, {out}, "chain");
  Rng rng(5);
  net.build({256}, rng);
  const Tensor in = ramp({64, 256});
  NoGradGuard no_grad;
  const int64_t live = memory_stats(Device::cpu()).live_bytes;
  reset_peak_memory(Device::cpu());
  const Var y = net.call(Var(in));
  const int64_t peak = memory_stats(Device::cpu()).peak_bytes - live;
  const int64_t one_output = 64 * 256 * 4;
  EXPECT_LE(peak, 4 * one_output) << "peak " << peak << " bytes";  // all eight kept: at least 9 outputs
  Var expected = Var(in);
  for (const auto& d : chain) expected = (*d)(expected);
  EXPECT_EQ(y.value().to_floats(), add(Var(in), expected).value().to_floats());
}

// While recording, a graph lets go of a value whose producer and readers all say their backward passes do not read
// it: a LayerNormalization feeding a Dense under mixed_float8 (which keeps FP8 codes of its input), and that Dense's
// gelu output feeding the next. The same graph with the normalization's output also a graph output keeps it: the
// difference is its bytes, and the gradients are the same bits. Under mixed_bfloat16 the Dense reads its input in
// backward, so nothing is let go (the gelu output only with set_recomputes_activations: the next Dense can make it
// again from the pre-activation).
struct GraphStep {
  int64_t held_bytes;
  std::vector<std::vector<float>> grads;
};
GraphStep graph_step(Network& net, const std::vector<std::shared_ptr<Layer>>& layers) {
  const Tensor in = ramp({40, 32});
  const int64_t before = memory_stats(Device::cpu()).live_bytes;
  std::vector<Var> ys = net.call(std::vector<Var>{Var(in)});
  GraphStep r{memory_stats(Device::cpu()).live_bytes - before, {}};
  backward(sum(cast(ys.front(), DType::kFloat32)));
  for (const auto& l : layers)
    for (const Var& w : l->weights()) {
      r.grads.push_back(w.grad().to_floats());
      Var(w).zero_grad();
    }
  return r;
}

TEST_F(FunctionalTest, RecordingLetsGoOfAValueNoBackwardPassReads) {
  for (const char* policy : {"mixed_float8", "mixed_bfloat16"}) {
    SymbolicTensor x = Input({32}, DType::kFloat32, "features");
    auto norm = make_layer<LayerNormalization>(1e-3f, dtype_arg(policy));
    auto up = make_layer<Dense>(64, "gelu", dtype_arg(policy));
    auto down = make_layer<Dense>(16, "linear", dtype_arg(policy));
    SymbolicTensor n = (*norm)(x);
    SymbolicTensor out = (*down)((*up)(n));
    Network lets_go({x}, {out}, "lets_go"), keeps({x}, {out, n}, "keeps");
    Rng rng(3);
    lets_go.build({32}, rng);
    const std::vector<std::shared_ptr<Layer>> layers{norm, up, down};
    graph_step(lets_go, layers);  // the first call makes mixed_bfloat16's cached bfloat16 kernels
    const GraphStep a = graph_step(lets_go, layers), b = graph_step(keeps, layers);
    const int64_t norm_output = 40 * 32 * 2;  // bfloat16
    EXPECT_EQ(b.held_bytes - a.held_bytes, std::string(policy) == "mixed_float8" ? norm_output : 0) << policy;
    EXPECT_EQ(a.grads, b.grads) << policy;
  }
}

// What each layer of a transformer block says its backward pass reads, under a 16-bit policy.
TEST_F(FunctionalTest, LayersSayWhatTheirBackwardPassesRead) {
  set_global_policy("mixed_bfloat16");
  EXPECT_FALSE(Add().backward_reads_inputs());
  EXPECT_FALSE(Add().backward_reads_output());
  EXPECT_FALSE(Dropout(0.1f).backward_reads_inputs());
  EXPECT_FALSE(Dropout(0.1f).backward_reads_output());
  MultiHeadAttentionOptions mha;
  mha.num_heads = 2;
  mha.key_dim = 4;
  EXPECT_TRUE(MultiHeadAttention(mha).backward_reads_inputs());
  EXPECT_FALSE(MultiHeadAttention(mha).backward_reads_output());  // the output projection's backward reads its input
  for (const char* a : {"linear", "gelu"}) EXPECT_FALSE(Dense(4, a).backward_reads_output()) << a;
  for (const char* a : {"relu", "tanh", "sigmoid", "softmax"}) EXPECT_TRUE(Dense(4, a).backward_reads_output()) << a;
  EXPECT_TRUE(Dense(4, "gelu").backward_reads_inputs());
  EXPECT_TRUE(Dense(4, "gelu").backward_recomputes_inputs());
  EXPECT_FALSE(LayerNormalization().backward_recomputes_inputs());
}

TEST_F(FunctionalTest, TwoInputsConcatenatedAndASharedLayer) {
  SymbolicTensor a = Input({4}, DType::kFloat32, "a");
  SymbolicTensor b = Input({4}, DType::kFloat32, "b");
  auto shared = make_layer<Dense>(5, "tanh");
  SymbolicTensor joined = (*make_layer<Concatenate>())({(*shared)(a), (*shared)(b)});
  EXPECT_EQ(joined.shape(), Shape{10});
  SymbolicTensor out = (*make_layer<Dense>(2))(joined);
  Network net({a, b}, {out, joined}, "two_towers");
  Rng rng(1);
  net.build({4}, rng);
  EXPECT_EQ(net.layers().size(), 3u);  // the shared Dense once
  EXPECT_EQ(net.weights().size(), 4u);
  std::vector<Var> ys = net.call({Var(ramp({3, 4})), Var(ramp({3, 4}, -0.2f))});
  ASSERT_EQ(ys.size(), 2u);
  EXPECT_EQ(ys[0].shape(), (Shape{3, 2}));
  EXPECT_EQ(ys[1].shape(), (Shape{3, 10}));
  // The first five columns are shared(a), the last five shared(b).
  NoGradGuard no_grad;
  const std::vector<float> left = (*shared)(Var(ramp({3, 4}))).value().to_floats();
  const std::vector<float> right = (*shared)(Var(ramp({3, 4}, -0.2f))).value().to_floats();
  const std::vector<float> j = ys[1].value().to_floats();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 5; ++c) {
      EXPECT_EQ(j[static_cast<size_t>(r * 10 + c)], left[static_cast<size_t>(r * 5 + c)]);
      EXPECT_EQ(j[static_cast<size_t>(r * 10 + 5 + c)], right[static_cast<size_t>(r * 5 + c)]);
    }
  EXPECT_THROW(net.call({Var(ramp({3, 4}))}), Error);       // two inputs expected
  EXPECT_THROW(net.call({Var(ramp({3, 5})), Var(ramp({3, 4}))}), Error);  // wrong per-sample shape
}

TEST_F(FunctionalTest, MergeLayersGradientsMatchFiniteDifferences) {
  Add add_layer;
  Concatenate concat(-1);
  const auto f = [&](const std::vector<Var>& v) {
    Var s = add_layer(std::vector<Var>{v[0], v[1], v[0]});
    Var c = concat(std::vector<Var>{s, v[2]});  // (2, 3 + 2)
    return sum(activation(c, ops::Activation::kTanh));
  };
  GradCheckResult r = check_gradients(f, {ramp({2, 3}), ramp({2, 3}, 0.3f), ramp({2, 2}, -0.4f)});
  EXPECT_LT(r.max_rel_error, 1e-3) << r.worst;
}

// A gated linear unit, as a newcomer writes one from the functional API: value * sigmoid(gate).
TEST_F(FunctionalTest, AGatedLayerFromMultiplyTrainsAndMatchesItsGradient) {
  SymbolicTensor x = Input({4}, DType::kFloat32, "x");
  auto value = make_layer<Dense>(5), gate = make_layer<Dense>(5, "sigmoid");
  SymbolicTensor gated = (*make_layer<Multiply>())({(*value)(x), (*gate)(x)});
  EXPECT_EQ(gated.shape(), Shape{5});
  Network net({x}, {gated}, "glu");
  Rng rng(2);
  net.build({4}, rng);
  EXPECT_EQ(net.layers()[2]->class_name(), "Multiply");
  const Tensor in = ramp({3, 4});
  {
    NoGradGuard no_grad;
    // By hand: value(x) * sigmoid(gate(x)), one float32 product per element.
    const std::vector<float> v = (*value)(Var(in)).value().to_floats(), g = (*gate)(Var(in)).value().to_floats();
    const std::vector<float> y = net.call(Var(in)).value().to_floats();
    ASSERT_EQ(y.size(), v.size());
    for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], v[i] * g[i]) << i;
  }
  Multiply three;
  const auto f = [&](const std::vector<Var>& v) { return sum(three(std::vector<Var>{v[0], v[1], v[0]})); };
  GradCheckResult r = check_gradients(f, {ramp({2, 3}), ramp({2, 3}, 0.3f)});
  EXPECT_LT(r.max_rel_error, 1e-3) << r.worst;
  EXPECT_THROW((*make_layer<Multiply>())({x, Input({3})}), Error);  // shapes differ
  EXPECT_THROW((*make_layer<Multiply>())(x), Error);                 // needs two inputs
}

TEST_F(FunctionalTest, ConcatenateAlongAMiddleAxisAndMixedDtypes) {
  set_global_policy("mixed_bfloat16");
  Concatenate concat(1);  // per-sample axis 0 of (batch, rows, cols)
  Var a(ramp({2, 1, 3})), b(ramp({2, 2, 3}, 0.5f).to(DType::kFloat16));
  Var c = concat(std::vector<Var>{a, b});
  EXPECT_EQ(c.shape(), (Shape{2, 3, 3}));
  EXPECT_EQ(c.dtype(), DType::kBFloat16);  // both inputs cast to the compute dtype
  EXPECT_EQ(c.value().at(3 * 3 + 1), a.value().to(DType::kBFloat16).at(3 + 1));  // sample 1, row 0
  EXPECT_EQ(c.value().at(1), a.value().to(DType::kBFloat16).at(1));
  EXPECT_EQ(c.value().at(3 + 2), b.value().to(DType::kBFloat16).at(2));  // sample 0, row 1 = b row 0
  EXPECT_THROW(concat(std::vector<Var>{Var(ramp({2, 1, 3})), Var(ramp({2, 2, 4}))}), Error);
  EXPECT_THROW(Concatenate(0), Error);
}

TEST_F(FunctionalTest, NamesArePerModelAndWeightPathsStable) {
  auto build = [] {
    auto m = std::make_unique<Sequential>("m");
    m->emplace<Dense>(4, "relu");
    m->emplace<Dense>(2);
    Rng rng(1);
    m->build({3}, rng);
    return m;
  };
  auto first = build();
  auto second = build();  // a second model in the same process: the same paths
  ASSERT_EQ(first->weights().size(), second->weights().size());
  for (size_t i = 0; i < first->weights().size(); ++i) EXPECT_EQ(first->weights()[i].name(), second->weights()[i].name());
  EXPECT_EQ(first->weights()[2].name(), "dense_1/kernel");

  SymbolicTensor x = Input({3});
  auto conv_like = make_layer<Dense>(4);
  conv_like->set_name("block_1/proj");
  SymbolicTensor y = (*make_layer<Dense>(2))((*conv_like)(x));
  Network net({x}, {y});
  Rng rng(2);
  net.build({3}, rng);
  EXPECT_EQ(net.weights()[0].name(), "block_1/proj/kernel");
  EXPECT_EQ(net.weights()[2].name(), "dense/kernel");
  EXPECT_EQ(net.layer("block_1/proj"), conv_like.get());
  EXPECT_THROW(conv_like->set_name(""), Error);
  EXPECT_THROW(conv_like->set_name("a//b"), Error);

  // Two layers given one name in one model: refused.
  auto s = std::make_unique<Sequential>();
  auto d1 = std::make_shared<Dense>(2);
  d1->set_name("same");
  auto d2 = std::make_shared<Dense>(2);
  d2->set_name("same");
  s->add(d1);
  EXPECT_THROW(s->add(d2), Error);
}

TEST_F(FunctionalTest, GraphErrorsAreClear) {
  SymbolicTensor x = Input({3}), other = Input({3}, DType::kFloat32, "other");
  SymbolicTensor y = (*make_layer<Add>())({x, other});
  try {
    Network net({x}, {y});
    FAIL() << "an output depending on an unlisted Input was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("other"), std::string::npos) << e.what();
  }
  Dense on_stack(2);
  EXPECT_THROW(on_stack(x), Error);  // not shared-owned
  EXPECT_THROW((*make_layer<Add>())({x, Input({4})}), Error);  // shapes differ
  EXPECT_THROW((*make_layer<Add>())(x), Error);                 // needs two inputs
  EXPECT_THROW(Input({0, 3}), Error);
  Sequential seq;
  EXPECT_THROW(seq.emplace<Add>(), Error);  // a merge layer cannot sit in a stack
}

TEST_F(FunctionalTest, SummaryShowsConnections) {
  SymbolicTensor x = Input({5}, DType::kFloat32, "pixels");
  auto a_very_long_layer_name_indeed = make_layer<Dense>(5);
  a_very_long_layer_name_indeed->set_name("encoder/a_very_long_layer_name_indeed");
  SymbolicTensor h = (*a_very_long_layer_name_indeed)(x);
  SymbolicTensor y = (*make_layer<Add>())({x, h});
  Network net({x}, {y}, "res");
  Rng rng(1);
  net.build({5}, rng);
  std::ostringstream s;
  net.summary(s);
  const std::string t = s.str();
  EXPECT_NE(t.find("Connected to"), std::string::npos) << t;
  EXPECT_NE(t.find("pixels (InputLayer)"), std::string::npos) << t;
  EXPECT_NE(t.find("pixels, encoder/a_very_long_layer_name_indeed"), std::string::npos) << t;
  EXPECT_NE(t.find("Total params: 30"), std::string::npos) << t;
  // Columns stay aligned: every "(None, 5)" starts at the same column.
  std::istringstream lines(t);
  std::string line;
  size_t column = std::string::npos;
  while (std::getline(lines, line)) {
    const size_t at = line.find("(None, 5)");
    if (at == std::string::npos) continue;
    if (column == std::string::npos) column = at;
    EXPECT_EQ(at, column) << t;
  }
}

}  // namespace
}  // namespace mixtrain
