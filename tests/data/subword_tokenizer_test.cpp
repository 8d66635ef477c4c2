// Subword tokenizers on SentencePiece (built when CMake found it): exact round trips of any UTF-8 through byte
// fallback, deterministic training, the windows they make, and one-line errors.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "mixtrain/data/token_text.h"
#include "mixtrain/data/tokenizer.h"
#include "test_files.h"

namespace mixtrain {
namespace {

using testing::contains;
using testing::error_of;
using testing::TempDir;
using testing::write_text;

// About 40 KB of English-like lines over 40 words: enough text for a few hundred pieces of either kind.
std::string training_text() {
  static const char* words[] = {"the",   "whale", "sea",    "ship",    "captain", "white", "harpoon", "of",
                                "and",   "a",     "to",     "in",      "his",     "was",   "that",    "with",
                                "ocean", "deep",  "sailor", "Ahab",    "Ishmael", "boat",  "wind",    "sail",
                                "dark",  "storm", "night",  "morning", "water",   "line",  "crew",    "deck",
                                "old",   "great", "long",   "voyage",  "harbour", "mast",  "rope",    "oil"};
  std::mt19937 rng(7);
  std::string text;
  while (text.size() < 40000) {
    const int n = 4 + static_cast<int>(rng() % 9);
    for (int w = 0; w < n; ++w) text += std::string(w ? " " : "") + words[rng() % 40];
    text += rng() % 3 ? ".\n" : ", ";
  }
  return text;
}

// Random valid UTF-8 over every encoding length: ASCII with controls, Latin, CJK, emoji (none of which but ASCII
// the training text holds), so most of it reaches the tokenizer as byte pieces.
std::string random_utf8(uint32_t seed, int chars) {
  std::mt19937 rng(seed);
  std::u32string s;
  for (int i = 0; i < chars; ++i) {
    const uint32_t pick = rng() % 5;
    char32_t c = pick == 0 ? 1 + rng() % 0x7F : pick == 1 ? 0x80 + rng() % 0x780 : pick == 2 ? 0x4E00 + rng() % 0x5000
               : pick == 3 ? 0x1F300 + rng() % 0x300 : U"the whale\n "[rng() % 11];
    s.push_back(c);
  }
  return code_points_to_utf8(s);
}

class SubwordTokenizer : public ::testing::TestWithParam<const char*> {};

TEST_P(SubwordTokenizer, AnyUtf8RoundTripsThroughByteFallback) {
  const auto t = train_tokenizer(parse_tokenizer_spec(GetParam()), training_text(), "test text");
  EXPECT_EQ(t->size(), parse_tokenizer_spec(GetParam()).pieces);
  EXPECT_EQ(t->kind(), "sentencepiece");
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    const std::string text = random_utf8(seed, 200);
    const std::vector<int32_t> ids = t->encode(text, "probe");
    EXPECT_EQ(t->decode(ids), text) << "seed " << seed;
    std::string streamed;
    for (int32_t id : ids) streamed += t->piece_bytes(id);
    EXPECT_EQ(streamed, text) << "seed " << seed;
  }
  // Text like the training text takes fewer ids than characters: the pieces are words and parts of words.
  const std::string prose = "the white whale and the captain of the ship.\n";
  EXPECT_LT(t->encode(prose, "prose").size(), prose.size() / 2);
  EXPECT_TRUE(contains(error_of([&] { t->encode("ab\xFF", "the prompt"); }).what(), "the prompt"));
  EXPECT_THROW(t->decode({static_cast<int32_t>(t->size())}), Error);
  EXPECT_THROW(t->piece_bytes(-1), Error);
}

TEST_P(SubwordTokenizer, TrainingIsDeterministicAndTheModelReloads) {
  const TokenizerSpec spec = parse_tokenizer_spec(GetParam());
  const std::string text = training_text();
  const auto a = train_tokenizer(spec, text, "test text");
  const auto b = train_tokenizer(spec, text, "test text");
  ASSERT_FALSE(a->serialized_model().empty());
  EXPECT_EQ(a->serialized_model(), b->serialized_model());
  for (int32_t id = 0; id < a->size(); ++id) ASSERT_EQ(a->piece_bytes(id), b->piece_bytes(id)) << id;
  // From the bytes a checkpoint stores, and from a .model file: the same ids.
  const auto c = tokenizer_from_model(a->serialized_model(), "checkpoint");
  TempDir dir;
  const std::string file = (dir.path() / "t.model").string();
  write_text(file, a->serialized_model());
  const auto d = load_tokenizer_model(file);
  const std::string probe = random_utf8(99, 300) + text.substr(0, 300);
  EXPECT_EQ(c->encode(probe, "p"), a->encode(probe, "p"));
  EXPECT_EQ(d->encode(probe, "p"), a->encode(probe, "p"));
}

INSTANTIATE_TEST_SUITE_P(Kinds, SubwordTokenizer, ::testing::Values("bpe:400", "unigram:320"));

TEST(SubwordTokenizerErrors, SayWhatIsWrongInOneLine) {
  const std::string text = training_text();
  const std::string few = error_of([&] { train_tokenizer(parse_tokenizer_spec("bpe:100"), text, "'t.txt'"); }).what();
  EXPECT_TRUE(contains(few, "--tokenizer bpe:100: 100 pieces are too few for 't.txt', which needs at least")) << few;
  const std::string many =
      error_of([&] { train_tokenizer(parse_tokenizer_spec("unigram:100000"), text, "'t.txt'"); }).what();
  EXPECT_TRUE(contains(many, "'t.txt' is too short to make 100000 pieces; it makes at most")) << many;
  TempDir dir;
  const std::string junk_file = (dir.path() / "junk.model").string();
  write_text(junk_file, "not a model at all");
  const Error junk = error_of([&] { load_tokenizer_model(junk_file); });
  EXPECT_TRUE(contains(junk.message(), "is not a SentencePiece model")) << junk.message();
  const Error missing = error_of([&] { load_tokenizer_model((dir.path() / "none.model").string()); });
  EXPECT_EQ(missing.kind(), ErrorKind::kIo);
  for (const Error& e : {junk, missing}) EXPECT_EQ(e.message().find('\n'), std::string::npos) << e.message();
}

// Windows of tokens: the training part's tokenizer, each part encoded alone, targets one token later.
TEST(SubwordTextDataset, WindowsAreTokensOfEachPart) {
  const std::string text = training_text();
  TextDatasetOptions o;
  o.context_length = 24;
  const TextDataset d = make_token_text_dataset(text, "t", o, parse_tokenizer_spec("bpe:300"));
  ASSERT_TRUE(d.tokenizer);
  EXPECT_EQ(d.splits.train.num_classes, 300);
  const Tensor& x = d.splits.train.x;
  const Tensor& y = d.splits.train.y;
  ASSERT_EQ(x.dim(1), 24);
  const int64_t stride = 6;  // context_length / 4
  // Row r + 1 starts `stride` tokens after row r, and y is x one token later.
  for (int64_t r = 0; r + 1 < x.dim(0); ++r)
    for (int64_t t = 0; t + 1 < 24; ++t) {
      ASSERT_EQ(y.data<int32_t>()[r * 24 + t], x.data<int32_t>()[r * 24 + t + 1]);
      if (t + stride < 24) {
        ASSERT_EQ(x.data<int32_t>()[(r + 1) * 24 + t], x.data<int32_t>()[r * 24 + t + stride]);
      }
    }
  // The first window decodes to the text's beginning.
  const std::vector<int32_t> first(x.data<int32_t>(), x.data<int32_t>() + 24);
  EXPECT_EQ(text.rfind(d.tokenizer->decode(first), 0), 0u);
  o.context_length = 20000;
  const std::string e = error_of([&] { make_token_text_dataset(text, "t", o, parse_tokenizer_spec("bpe:300")); }).what();
  EXPECT_TRUE(contains(e, "too few for windows of 20000 tokens")) << e;
}

}  // namespace
}  // namespace mixtrain
