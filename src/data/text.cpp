#include "mixtrain/data/text.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include "mixtrain/core/environment.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/file_checks.h"
#include "mixtrain/core/input_budget.h"

namespace mixtrain {

namespace {

std::string describe_char(char32_t c) {
  std::ostringstream os;
  os << "U+" << std::hex << std::uppercase << static_cast<uint32_t>(c);
  if (c >= 0x20 && c != 0x7f) os << " '" << code_points_to_utf8(std::u32string_view(&c, 1)) << "'";
  return os.str();
}

bool valid_code_point(char32_t c) { return c <= 0x10FFFF && (c < 0xD800 || c > 0xDFFF); }

}  // namespace

void fill_windows(const std::vector<int32_t>& ids, int64_t begin, int64_t end, int64_t T, int64_t stride,
                  Dataset& out) {
  const int64_t usable = end - begin - 1;  // the last window needs one more character for its targets
  const int64_t rows = usable >= T ? (usable - T) / stride + 1 : 0;
  out.x = Tensor::empty({rows, T}, DType::kInt32);
  out.y = Tensor::empty({rows, T}, DType::kInt32);
  int32_t* x = out.x.data<int32_t>();
  int32_t* y = out.y.data<int32_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* src = ids.data() + begin + r * stride;
    std::copy(src, src + T, x + r * T);
    std::copy(src + 1, src + 1 + T, y + r * T);
  }
  out.sample_shape = {T};
}

std::u32string utf8_to_code_points(std::string_view bytes, const std::string& source) {
  std::u32string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const auto b0 = static_cast<unsigned char>(bytes[i]);
    int extra = 0;
    char32_t c = 0;
    if (b0 < 0x80) {
      c = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      extra = 1;
      c = b0 & 0x1F;
    } else if ((b0 & 0xF0) == 0xE0) {
      extra = 2;
      c = b0 & 0x0F;
    } else if ((b0 & 0xF8) == 0xF0) {
      extra = 3;
      c = b0 & 0x07;
    } else {
      MIXTRAIN_FAIL(kInvalidInput, "'" << source << "' is not UTF-8 text: byte " << i << " is 0x" << std::hex
                                       << static_cast<int>(b0),
                    "give a UTF-8 (or ASCII) text file");
    }
    MIXTRAIN_CHECK(i + extra < bytes.size(), "'" << source << "' is not UTF-8 text: it ends inside a character at byte "
                                                 << i);
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(bytes[i + k]);
      MIXTRAIN_CHECK((b & 0xC0) == 0x80, "'" << source << "' is not UTF-8 text: bad continuation byte at " << i + k);
      c = (c << 6) | (b & 0x3F);
    }
    // Overlong forms and surrogates are not UTF-8 (they would give two encodings of one character).
    static constexpr char32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    MIXTRAIN_CHECK(c >= kMin[extra] && valid_code_point(c),
                   "'" << source << "' is not UTF-8 text: invalid character at byte " << i);
    out.push_back(c);
    i += static_cast<size_t>(extra) + 1;
  }
  return out;
}

std::string code_points_to_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

Vocabulary Vocabulary::from_text(std::u32string_view text) {
  Vocabulary v;
  v.chars_.assign(text.begin(), text.end());
  std::sort(v.chars_.begin(), v.chars_.end());
  v.chars_.erase(std::unique(v.chars_.begin(), v.chars_.end()), v.chars_.end());
  return v;
}

Vocabulary Vocabulary::from_code_points(std::vector<char32_t> code_points) {
  MIXTRAIN_CHECK(!code_points.empty(), "a vocabulary needs at least one character");
  for (size_t i = 0; i < code_points.size(); ++i) {
    MIXTRAIN_CHECK(valid_code_point(code_points[i]),
                   "vocabulary entry " << i << " (" << static_cast<uint32_t>(code_points[i])
                                       << ") is not a Unicode code point");
    MIXTRAIN_CHECK(i == 0 || code_points[i - 1] < code_points[i],
                   "vocabulary entries must be strictly increasing; entry " << i << " is not");
  }
  Vocabulary v;
  v.chars_ = std::move(code_points);
  return v;
}

int32_t Vocabulary::id_of(char32_t c) const {
  auto it = std::lower_bound(chars_.begin(), chars_.end(), c);
  return it != chars_.end() && *it == c ? static_cast<int32_t>(it - chars_.begin()) : -1;
}

std::vector<int32_t> Vocabulary::encode(std::u32string_view text, std::string_view where) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    ids[i] = id_of(text[i]);
    MIXTRAIN_CHECK(ids[i] >= 0, where << ": character " << describe_char(text[i]) << " at position " << i
                                      << " is not in the model's vocabulary of " << size() << " characters");
  }
  return ids;
}

std::string Vocabulary::decode(const std::vector<int32_t>& ids) const {
  std::u32string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    MIXTRAIN_CHECK(id >= 0 && id < size(), "character id " << id << " is outside the vocabulary [0, " << size() << ")");
    text.push_back(chars_[static_cast<size_t>(id)]);
  }
  return code_points_to_utf8(text);
}

namespace {

// The code points, their ids, the sorted copy the vocabulary is drawn from, and the windows (inputs and targets,
// int32) of both parts, before any of the windows is made.
void charge_text_windows(const std::string& source, int64_t n, int64_t n_train, int64_t T, int64_t stride) {
  const int64_t train_rows = (n_train - 1 - T) / stride + 1;
  const int64_t test_rows = (n - n_train - 1 - T) / T + 1;
  const int64_t bytes = 3 * n * 4 + (train_rows + test_rows) * T * 2 * 4;
  check_input_budget(source, std::to_string(n) + " characters as " + std::to_string(train_rows + test_rows) +
                                 " windows of " + std::to_string(T),
                     bytes);
}

}  // namespace

TextDataset make_text_dataset(std::u32string_view text, const std::string& source, const TextDatasetOptions& o) {
  const int64_t T = o.context_length;
  MIXTRAIN_CHECK(T > 0, "the context length must be positive, got " << T);
  MIXTRAIN_CHECK(o.validation_fraction > 0 && o.validation_fraction < 1,
                 "the validation fraction must be in (0, 1), got " << o.validation_fraction);
  const int64_t stride = o.stride > 0 ? o.stride : std::max<int64_t>(1, T / 4);
  const auto n = static_cast<int64_t>(text.size());
  const int64_t n_train = n - static_cast<int64_t>(static_cast<double>(n) * o.validation_fraction);
  MIXTRAIN_CHECK(n_train >= T + 1 && n - n_train >= T + 1,
                 "'" << source << "' has " << n << " characters: too few for windows of " << T
                     << " characters in both the training part and the last " << o.validation_fraction * 100
                     << "% (each needs at least " << T + 1 << ")");
  charge_text_windows(source, n, n_train, T, stride);
  TextDataset d;
  d.vocabulary = Vocabulary::from_text(text);
  // Each distinct character is a logit at every position of a window (with its gradient, float32), before any
  // batch or layer: 1.1 million distinct characters would need 1.1 GB per window of 128.
  check_input_budget(source, std::to_string(d.vocabulary.size()) + " distinct characters (a logit and its gradient "
                                 "each, at each of a window's " + std::to_string(T) + " positions)",
                     static_cast<int64_t>(d.vocabulary.size()) * T * 8);
  const std::vector<int32_t> ids = d.vocabulary.encode(text, source);
  fill_windows(ids, 0, n_train, T, stride, d.splits.train);
  fill_windows(ids, n_train, n, T, T, d.splits.test);
  for (Dataset* part : {&d.splits.train, &d.splits.test}) {
    part->num_classes = d.vocabulary.size();
    part->source = source;
  }
  d.splits.test_from_files = false;
  d.train_characters = n_train;
  d.validation_characters = n - n_train;
  return d;
}

TextDataset load_text_dataset(const std::string& path, const TextDatasetOptions& options) {
  const std::string raw = read_text_file(path);
  check_input_budget(path, "its " + std::to_string(raw.size()) + " bytes of text as code points",
                     static_cast<int64_t>(raw.size()) * 5);
  return make_text_dataset(utf8_to_code_points(raw, path), path, options);
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && path == moby_dick_path())
    MIXTRAIN_FAIL(kIo, "Moby Dick is not installed at '" << path << "'", "run scripts/setup.sh, which downloads it");
  require_regular_file(path, "text file");
  const auto bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  MIXTRAIN_CHECK(!ec && bytes <= kMaxTextBytes,
                 "'" << path << "' has " << bytes << " bytes; text data sets are limited to " << kMaxTextBytes);
  std::ifstream f(path, std::ios::binary);
  MIXTRAIN_CHECK(f.good(), "cannot open '" << path << "'");
  // Read to the end, not for the size stat reports: a file under /proc reports 0 bytes yet holds text (it read
  // as "has 0 characters"). The limit is checked as the text arrives, so a file that grows is not read forever.
  std::string raw;
  raw.reserve(static_cast<size_t>(bytes));
  std::vector<char> chunk(1 << 16);
  while (f.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) || f.gcount() > 0) {
    raw.append(chunk.data(), static_cast<size_t>(f.gcount()));
    MIXTRAIN_CHECK(static_cast<int64_t>(raw.size()) <= kMaxTextBytes,
                   "'" << path << "' holds more than " << kMaxTextBytes << " bytes, the limit for text data sets");
  }
  MIXTRAIN_CHECK(!f.bad(), "reading '" << path << "' failed after " << raw.size() << " bytes");
  return raw;
}

std::string moby_dick_path() {
  if (const auto dir = env::mixtrain_data_dir(); dir && !dir->empty()) return *dir + "/moby-dick.txt";
  if (const auto xdg = env::xdg_data_home(); xdg && !xdg->empty()) return *xdg + "/mixtrain/moby-dick.txt";
  const auto home = env::home();
  return (home && !home->empty() ? *home : std::string(".")) + "/.local/share/mixtrain/moby-dick.txt";
}

}  // namespace mixtrain
