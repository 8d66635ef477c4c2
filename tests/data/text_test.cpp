// Text data sets: UTF-8 decoding, the character vocabulary, and the windows a language model trains on.
#include "mixtrain/data/text.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "mixtrain/core/input_budget.h"
#include "test_files.h"

namespace mixtrain {
namespace {

using testing::contains;
using testing::error_of;
using testing::TempDir;
using testing::write_text;

TEST(Text, Utf8RoundTripsEveryEncodingLength) {
  const std::string s = "a\xC3\xA9\xE2\x80\x94\xF0\x9F\x90\xB3";  // a, e-acute, em dash, whale (1-4 bytes)
  const std::u32string cps = utf8_to_code_points(s, "s");
  ASSERT_EQ(cps, (std::u32string{U'a', U'\u00e9', U'\u2014', U'\U0001F433'}));
  EXPECT_EQ(code_points_to_utf8(cps), s);
}

TEST(Text, InvalidUtf8NamesTheSourceAndTheByte) {
  EXPECT_TRUE(contains(error_of([] { utf8_to_code_points("ab\xFF", "f.txt"); }).what(), "'f.txt' is not UTF-8"));
  EXPECT_TRUE(contains(error_of([] { utf8_to_code_points("ab\xFF", "f.txt"); }).what(), "byte 2"));
  EXPECT_THROW(utf8_to_code_points("\xC3", "t"), Error);          // cut inside a character
  EXPECT_THROW(utf8_to_code_points("\xC0\x80", "t"), Error);      // overlong NUL
  EXPECT_THROW(utf8_to_code_points("\xED\xA0\x80", "t"), Error);  // a surrogate
  EXPECT_THROW(utf8_to_code_points("\xE2\x28\xA1", "t"), Error);  // bad continuation
}

TEST(Text, VocabularyIsTheSortedCharactersAndEncodesBothWays) {
  const Vocabulary v = Vocabulary::from_text(U"banana\u2014");
  EXPECT_EQ(v.code_points(), (std::vector<char32_t>{U'a', U'b', U'n', U'\u2014'}));
  EXPECT_EQ(v.encode(U"nab\u2014", "test"), (std::vector<int32_t>{2, 0, 1, 3}));
  EXPECT_EQ(v.decode({1, 0, 2, 0, 3}), "bana\xE2\x80\x94");
  EXPECT_EQ(v.id_of(U'z'), -1);
  const std::string e = error_of([&] { v.encode(U"bat", "the prompt"); }).what();
  EXPECT_TRUE(contains(e, "the prompt")) << e;
  EXPECT_TRUE(contains(e, "U+74 't' at position 2")) << e;
  EXPECT_THROW(v.decode({4}), Error);
  EXPECT_THROW(v.decode({-1}), Error);
  // As stored in a checkpoint: strictly increasing code points only.
  EXPECT_EQ(Vocabulary::from_code_points(v.code_points()).code_points(), v.code_points());
  EXPECT_THROW(Vocabulary::from_code_points({U'b', U'a'}), Error);
  EXPECT_THROW(Vocabulary::from_code_points({U'a', U'a'}), Error);
  EXPECT_THROW(Vocabulary::from_code_points({0x110000}), Error);
  EXPECT_THROW(Vocabulary::from_code_points({}), Error);
}

TEST(Text, WindowsTargetTheNextCharacterAndValidationIsTheLastPart) {
  // 100 characters cycling through 10 letters: the id of character i is i % 10.
  std::u32string text;
  for (int i = 0; i < 100; ++i) text.push_back(U'a' + i % 10);
  TextDatasetOptions o;
  o.context_length = 8;
  o.validation_fraction = 0.2;
  o.stride = 3;
  const TextDataset d = make_text_dataset(text, "cycle", o);
  EXPECT_EQ(d.vocabulary.size(), 10);
  EXPECT_EQ(d.train_characters, 80);
  EXPECT_EQ(d.validation_characters, 20);
  const Dataset& tr = d.splits.train;
  // Training windows start at 0, 3, 6, ... and need T + 1 = 9 characters of the first 80: starts up to 71.
  ASSERT_EQ(tr.x.shape(), Shape({24, 8}));
  EXPECT_EQ(tr.y.shape(), tr.x.shape());
  EXPECT_EQ(tr.num_classes, 10);
  EXPECT_EQ(tr.sample_shape, (std::vector<int64_t>{8}));
  const int32_t* x = tr.x.data<int32_t>();
  const int32_t* y = tr.y.data<int32_t>();
  for (int64_t r = 0; r < 24; ++r)
    for (int64_t t = 0; t < 8; ++t) {
      ASSERT_EQ(x[r * 8 + t], (r * 3 + t) % 10);
      ASSERT_EQ(y[r * 8 + t], (r * 3 + t + 1) % 10);
    }
  // Validation: characters 80..99, windows that do not overlap: starts 80 and 88 (96 + 9 > 100).
  const Dataset& va = d.splits.test;
  ASSERT_EQ(va.x.shape(), Shape({2, 8}));
  EXPECT_EQ(va.x.data<int32_t>()[8], 88 % 10);
  EXPECT_EQ(va.y.data<int32_t>()[15], (88 + 8) % 10);
  validate_dataset(tr);
  validate_dataset(va);
}

TEST(Text, TooShortATextIsRefusedWithTheNumbers) {
  const std::string e = error_of([] {
    TextDatasetOptions o;
    o.context_length = 64;
    make_text_dataset(U"short text", "tiny.txt", o);
  }).what();
  EXPECT_TRUE(contains(e, "'tiny.txt' has 10 characters")) << e;
}

TEST(Text, LoadsAFileAndRefusesWhatIsNotARegularTextFile) {
  TempDir dir;
  const std::string path = dir.file("t.txt");
  std::string body;
  for (int i = 0; i < 50; ++i) body += "the whale \xE2\x80\x94 ";
  write_text(path, body);
  TextDatasetOptions o;
  o.context_length = 16;
  const TextDataset d = load_text_dataset(path, o);
  EXPECT_EQ(d.train_characters + d.validation_characters, 50 * 12);
  EXPECT_EQ(d.splits.train.source, path);
  EXPECT_TRUE(contains(error_of([&] { load_text_dataset(dir.file("missing.txt"), o); }).what(), "text file"));
  EXPECT_TRUE(contains(error_of([&] { load_text_dataset(dir.path(), o); }).what(), "not a regular file"));
  write_text(path, "abc\xFF" + body);
  EXPECT_TRUE(contains(error_of([&] { load_text_dataset(path, o); }).what(), "is not UTF-8"));
}

// A file under /proc is regular but reports a size of 0; it is read to its end (it once read as "has 0
// characters"). The count is checked against the file read independently, through a stream iterator.
TEST(Text, AFileThatReportsSizeZeroIsReadToItsEnd) {
  const std::string path = "/proc/version";  // stable while the machine runs, unlike /proc/cpuinfo's MHz lines
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  ASSERT_EQ(std::filesystem::file_size(path), 0u);
  std::ifstream f(path, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  ASSERT_GT(text.size(), 20u);
  TextDatasetOptions o;
  o.context_length = 4;
  const TextDataset d = load_text_dataset(path, o);
  EXPECT_EQ(d.train_characters + d.validation_characters, static_cast<int64_t>(utf8_to_code_points(text, path).size()));
}

TEST(Text, MobyDickPathFollowsTheEnvironment) {
  ::setenv("MIXTRAIN_DATA_DIR", "/data/sets", 1);
  EXPECT_EQ(moby_dick_path(), "/data/sets/moby-dick.txt");
  ::unsetenv("MIXTRAIN_DATA_DIR");
  ::setenv("XDG_DATA_HOME", "/x", 1);
  EXPECT_EQ(moby_dick_path(), "/x/mixtrain/moby-dick.txt");
  ::unsetenv("XDG_DATA_HOME");
  const char* home = std::getenv("HOME");
  const std::string saved = home ? home : "";
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(moby_dick_path(), "/home/u/.local/share/mixtrain/moby-dick.txt");
  if (home) ::setenv("HOME", saved.c_str(), 1);
  else ::unsetenv("HOME");
}

TEST(Text, TokenWindowDatasetsAreValidated) {
  Dataset d;
  d.x = Tensor::from_ints({1, 3}, {0, 1, 2});
  d.y = Tensor::from_ints({1, 3}, {1, 2, 3});
  d.num_classes = 3;
  d.source = "w";
  EXPECT_TRUE(contains(error_of([&] { validate_dataset(d); }).what(), "sample 0 has label 3 at position 2"));
  d.y = Tensor::from_ints({1, 2}, {1, 2});
  EXPECT_TRUE(contains(error_of([&] { validate_dataset(d); }).what(), "differ in shape"));
  d.y = Tensor::from_ints({1, 3}, {1, 2, 0});
  validate_dataset(d);
  d.x = Tensor::from_ints({1, 3}, {0, 5, 2});
  EXPECT_TRUE(contains(error_of([&] { validate_dataset(d); }).what(), "token 1 is 5"));
}

// A text of many distinct characters (the issue's: 4.4 MB holding 1.1 million, which took 4.9 GB) is refused once
// its vocabulary is counted, naming the count; a long text's windows are charged before they are made.
TEST(Text, DistinctCharactersAndWindowsPastTheInputBudgetAreRefused) {
  std::u32string text;
  for (char32_t c = 0x4E00; c < 0x4E00 + 5000; ++c) text += c;  // 5,000 distinct CJK characters
  text += text;
  TextDatasetOptions o;
  o.context_length = 64;
  set_input_budget(1 << 20);  // 5,000 x 64 x 8 bytes = 2.4 MiB of logits per window
  const Error many = error_of([&] { make_text_dataset(text, "cjk.txt", o); });
  EXPECT_TRUE(contains(many.what(), "'cjk.txt': 5000 distinct characters")) << many.what();
  EXPECT_TRUE(contains(many.what(), "more than the input budget of 1.0 MiB")) << many.what();
  set_input_budget(1 << 18);  // 10,000 characters as 155 windows of 64 (x4 stride): 0.2 MiB + 0.1 MiB
  const Error windows = error_of([&] { make_text_dataset(text, "cjk.txt", o); });
  EXPECT_TRUE(contains(windows.what(), "10000 characters as ")) << windows.what();
  set_input_budget(0);
  EXPECT_EQ(make_text_dataset(text, "cjk.txt", o).vocabulary.size(), 5000);
}

}  // namespace
}  // namespace mixtrain
