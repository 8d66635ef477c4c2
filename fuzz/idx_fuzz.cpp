// Fuzzes the IDX reader (plain and gzip files): any bytes must be read or refused with a clear error, and nothing
// may be allocated beyond what the file can hold.
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"
#include "mixtrain/data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mixtrain::fuzz::InputFile file("train-images-idx3-ubyte");
  const std::string& path = file.write(data, size);
  // Rank 0 accepts any rank, so the dimension and size checks see every header; rank 3 adds the images check.
  for (int rank : {0, 3}) {
    mixtrain::fuzz::refuse_or_accept([&] {
      const mixtrain::Tensor t = mixtrain::read_idx(path, rank);
      // What was read must be what the header promised: touch every byte (ASan sees a short buffer).
      const uint8_t* p = t.data<uint8_t>();
      unsigned sum = 0;
      for (int64_t i = 0; i < t.numel(); ++i) sum += p[i];
      (void)sum;
    });
  }
  return 0;
}
