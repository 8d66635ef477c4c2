// Fuzzes the safetensors reader: header length, JSON header, dtypes, shapes, offsets and checksums.
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"
#include "mixtrain/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mixtrain::fuzz::InputFile file("model.safetensors");
  const std::string& path = file.write(data, size);
  mixtrain::fuzz::refuse_or_accept([&] {
    const mixtrain::SafetensorsFile f = mixtrain::load_safetensors(path);
    // Every loaded tensor must own the bytes its dtype and shape describe: read them all.
    for (const auto& [name, t] : f.tensors) {
      const auto* p = static_cast<const uint8_t*>(t.raw());
      unsigned sum = 0;
      for (size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
      (void)sum;
      (void)f.get(name);
    }
  });
  return 0;
}
