// Fuzzes the CSV reader (plain and gzip files): any bytes must load as a data set or be refused with a clear error.
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"
#include "mixtrain/data/csv.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mixtrain::fuzz::InputFile file("data.csv");
  const std::string& path = file.write(data, size);
  // The default (header detected, label last) and the other branches: no header, label first.
  mixtrain::CsvOptions headerless;
  headerless.header = mixtrain::CsvHeader::kNo;
  headerless.label_index = 0;
  for (const mixtrain::CsvOptions& options : {mixtrain::CsvOptions{}, headerless}) {
    mixtrain::fuzz::refuse_or_accept([&] {
      const mixtrain::Dataset d = mixtrain::load_csv(path, options);
      // A loaded set must be consistent: one label per row, labels inside [0, num_classes).
      if (d.x.dim(0) != d.y.dim(0) || d.num_classes < 1) std::abort();
      const int32_t* y = d.y.data<int32_t>();
      for (int64_t i = 0; i < d.y.numel(); ++i)
        if (y[i] < 0 || y[i] >= d.num_classes) std::abort();
    });
  }
  return 0;
}
