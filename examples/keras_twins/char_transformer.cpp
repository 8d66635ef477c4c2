// A newcomer's third program: a small character transformer on Moby Dick under mixed_bfloat16, then text sampled
// from it (temperature and top-k) through the library's generate(), which keeps a key/value cache.
// Its Keras 3 twin, line for line (scripts/keras_twin_lines.py counts both):
// keras-twin:
//   import keras, numpy as np
//   from keras import layers
//   keras.mixed_precision.set_global_policy("mixed_bfloat16")
//   text = open(keras.utils.get_file("moby-dick.txt", MOBY_DICK_URL)).read()
//   chars = sorted(set(text)); index = {c: i for i, c in enumerate(chars)}
//   ids = np.array([index[c] for c in text]); T = 64
//   starts = np.arange(0, len(ids) - T - 1, 16)
//   x, y = ids[starts[:, None] + np.arange(T)], ids[starts[:, None] + np.arange(1, T + 1)]
//   inputs = keras.Input((T,), dtype="int32")
//   h = layers.Embedding(len(chars), 128)(inputs) + layers.Embedding(T, 128)(np.arange(T))
//   for _ in range(2):
//       a = layers.LayerNormalization()(h)
//       h = h + layers.MultiHeadAttention(4, 32)(a, a, use_causal_mask=True)
//       m = layers.Dense(512, activation="gelu")(layers.LayerNormalization()(h))
//       h = h + layers.Dense(128)(m)
//   outputs = layers.Dense(len(chars), dtype="float32")(layers.LayerNormalization()(h))
//   model = keras.Model(inputs, outputs)
//   loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
//   model.compile(keras.optimizers.AdamW(2e-3), loss, metrics=["accuracy"])
//   model.fit(x, y, batch_size=32, epochs=1, steps_per_epoch=200)
//   tokens = [index[c] for c in "Call me Ishmael."]
//   for _ in range(200):
//       logits = model.predict(np.array([tokens[-T:]]), verbose=0)[0, len(tokens[-T:]) - 1] / 0.8
//       top = np.argsort(logits)[-8:]; p = np.exp(logits[top] - logits[top].max())
//       tokens.append(int(np.random.choice(top, p=p / p.sum())))
//   print("".join(chars[t] for t in tokens))
// end-keras-twin
#include "mixtrain/train/keras.h"
using namespace mixtrain;

int main() {
  set_global_policy("mixed_bfloat16");
  TextDataset text = load_text_dataset(moby_dick_path(), {.context_length = 64});
  const int64_t T = 64, vocabulary = text.vocabulary.size();
  SymbolicTensor inputs = Input({T}, DType::kInt32);
  SymbolicTensor h = (*make_layer<PositionEmbedding>(T))((*make_layer<Embedding>(vocabulary, 128))(inputs));
  for (int block = 0; block < 2; ++block) {
    SymbolicTensor a = (*make_layer<LayerNormalization>())(h);
    h = (*make_layer<Add>())({h, (*make_layer<MultiHeadAttention>(MultiHeadAttentionOptions{4, 32, 0, true}))(a)});
    SymbolicTensor m = (*make_layer<Dense>(512, "gelu"))((*make_layer<LayerNormalization>())(h));
    h = (*make_layer<Add>())({h, (*make_layer<Dense>(128))(m)});
  }
  SymbolicTensor outputs = (*make_layer<Dense>(vocabulary, "linear", dtype_arg("float32")))(
      (*make_layer<LayerNormalization>())(h));
  Model model({inputs}, {outputs});
  model.compile(make_optimizer("adamw", 2e-3f), Loss("sparse_categorical_crossentropy", true), {"accuracy"});
  model.fit(text.splits.train.x, text.splits.train.y, {.epochs = 1, .batch_size = 32, .steps_per_epoch = 200});
  std::vector<int32_t> prompt = text.vocabulary.encode(U"Call me Ishmael.", "the prompt");
  std::vector<int32_t> tokens = generate(model, prompt, {.max_new_tokens = 200, .temperature = 0.8, .top_k = 8});
  std::cout << text.vocabulary.decode(tokens) << "\n";
}
