// Fuzzes the checkpoint loader: the safetensors file, then the metadata, the Rng entries, the weights and the
// optimizer state checked against a model, which is built from the file's input_shape first.
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"
#include "fuzz_model.h"
#include "mixtrain/train/checkpoint.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mixtrain::fuzz::silence_library_warnings();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mixtrain::fuzz::InputFile file("model.ckpt.safetensors");
  const std::string& path = file.write(data, size);
  const std::unique_ptr<mixtrain::Model> model = mixtrain::fuzz::make_fuzz_model();
  mixtrain::fuzz::refuse_or_accept([&] { (void)mixtrain::load_checkpoint(path, *model); });
  return 0;
}
