// Fuzzes the text data reader: UTF-8 decoding, the vocabulary and the windows of a character language model.
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"
#include "mixtrain/data/text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mixtrain::fuzz::InputFile file("text.txt");
  const std::string& path = file.write(data, size);
  mixtrain::TextDatasetOptions options;
  options.context_length = 4;  // small, so short inputs reach the window code
  options.validation_fraction = 0.25;
  mixtrain::fuzz::refuse_or_accept([&] {
    const mixtrain::TextDataset d = mixtrain::load_text_dataset(path, options);
    // Every id must decode, and the vocabulary must round-trip through UTF-8.
    const mixtrain::Tensor& x = d.splits.train.x;
    const int32_t* ids = x.data<int32_t>();
    std::vector<int32_t> row(ids, ids + x.numel());
    const std::string text = d.vocabulary.decode(row);
    (void)mixtrain::utf8_to_code_points(text, path);
  });
  return 0;
}
