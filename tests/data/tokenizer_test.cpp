// --tokenizer values and the character tokenizer, which every build has.
#include "mixtrain/data/tokenizer.h"

#include <gtest/gtest.h>

#include "mixtrain/data/token_text.h"
#include "test_files.h"

namespace mixtrain {
namespace {

using testing::contains;
using testing::error_of;

TEST(TokenizerSpec, ParsesEachForm) {
  EXPECT_EQ(parse_tokenizer_spec("char").kind, TokenizerSpec::Kind::kChar);
  const TokenizerSpec bpe = parse_tokenizer_spec("bpe:512");
  EXPECT_EQ(bpe.kind, TokenizerSpec::Kind::kBpe);
  EXPECT_EQ(bpe.pieces, 512);
  const TokenizerSpec unigram = parse_tokenizer_spec("unigram:2048");
  EXPECT_EQ(unigram.kind, TokenizerSpec::Kind::kUnigram);
  EXPECT_EQ(unigram.pieces, 2048);
  const TokenizerSpec file = parse_tokenizer_spec("dir/my.model");
  EXPECT_EQ(file.kind, TokenizerSpec::Kind::kModelFile);
  EXPECT_EQ(file.path, "dir/my.model");
}

TEST(TokenizerSpec, RefusesOtherValuesInOneLine) {
  for (const char* bad : {"", "chars", "bpe", "bpe:", "bpe:x", "bpe:12x", "bpe:-5", "bpe:1", "unigram:1000001",
                          "wordpiece:100", "model.txt"}) {
    const Error e = error_of([&] { parse_tokenizer_spec(bad); });
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << bad;
    EXPECT_TRUE(contains(e.message(), "--tokenizer")) << e.message();
    EXPECT_EQ(e.message().find('\n'), std::string::npos) << e.message();
  }
}

// The character tokenizer is the character vocabulary: the same ids both ways.
TEST(CharTokenizer, IsTheCharacterVocabulary) {
  const Vocabulary v = Vocabulary::from_text(U"the whale\u2014");
  const auto t = make_char_tokenizer(v);
  EXPECT_EQ(t->kind(), "char");
  EXPECT_EQ(t->size(), v.size());
  const std::string text = "hate wet\xE2\x80\x94";
  EXPECT_EQ(t->encode(text, "s"), v.encode(utf8_to_code_points(text, "s"), "s"));
  const std::vector<int32_t> ids = t->encode(text, "s");
  EXPECT_EQ(t->decode(ids), text);
  std::string streamed;
  for (int32_t id : ids) streamed += t->piece_bytes(id);
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(t->serialized_model(), "");
  EXPECT_TRUE(contains(error_of([&] { t->encode("wax", "the prompt"); }).what(), "the prompt"));
}

// --tokenizer char gives make_text_dataset's windows bit for bit (the main job's data).
TEST(CharTokenizer, TokenDatasetIsTheCharacterDataset) {
  std::string text;
  for (int i = 0; i < 500; ++i) text += static_cast<char>('a' + (i * 7) % 23);
  TextDatasetOptions o;
  o.context_length = 16;
  const TextDataset a = make_text_dataset(utf8_to_code_points(text, "t"), "t", o);
  const TextDataset b = make_token_text_dataset(text, "t", o, parse_tokenizer_spec("char"));
  EXPECT_EQ(b.vocabulary.code_points(), a.vocabulary.code_points());
  ASSERT_TRUE(b.tokenizer);
  EXPECT_EQ(b.tokenizer->kind(), "char");
  for (auto [x, y] : {std::pair{&a.splits.train, &b.splits.train}, std::pair{&a.splits.test, &b.splits.test}}) {
    ASSERT_EQ(x->x.shape(), y->x.shape());
    EXPECT_EQ(std::memcmp(x->x.data<int32_t>(), y->x.data<int32_t>(), x->x.numel() * 4), 0);
    EXPECT_EQ(std::memcmp(x->y.data<int32_t>(), y->y.data<int32_t>(), x->y.numel() * 4), 0);
    EXPECT_EQ(x->num_classes, y->num_classes);
  }
}

// A build without SentencePiece (MIXTRAIN_SENTENCEPIECE=OFF, or AUTO where it is missing) says why in one line.
TEST(SubwordTokenizers, AreRefusedWithAReasonWhereNotBuilt) {
  if (subword_tokenizers_available()) GTEST_SKIP() << "built with SentencePiece (subword_tokenizer_test.cpp)";
  const Error e = error_of([] { train_tokenizer(parse_tokenizer_spec("bpe:300"), "text", "t"); });
  EXPECT_TRUE(contains(e.message(), "--tokenizer bpe:300 needs SentencePiece, and this mixtrain was built without it"))
      << e.message();
  EXPECT_THROW(load_tokenizer_model("x.model"), Error);
  EXPECT_THROW(tokenizer_from_model("bytes", "'c.safetensors'"), Error);
}

}  // namespace
}  // namespace mixtrain
