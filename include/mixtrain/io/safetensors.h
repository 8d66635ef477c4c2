// Safetensors checkpoints, byte-compatible with the Hugging Face format:
//   [8 bytes: header length N, little-endian u64]
//   [N bytes: JSON header, padded with spaces to a multiple of 8]
//   [tensor bytes, each tensor contiguous, offsets relative to the start of this block]
// Header: {"__metadata__": {"key": "value"}, "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/tensor.h"

namespace mixtrain {

// Headers larger than this are refused, as the reference implementation does: a corrupt length field
// must not make the loader allocate gigabytes.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsFile {
  std::string path;  // the file these tensors came from, for error messages
  // Tensors in header order (the order they were saved in, for files written by mixtrain).
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;

  // The tensor called name; throws mixtrain::Error (kInvalidInput) naming the tensor and the file.
  const Tensor& get(const std::string& name) const;
  bool contains(const std::string& name) const;
};

// Writes tensors (in the given order) and string metadata to path atomically: the bytes go to
// "<path>.tmp.<pid>", are fsync'ed, and the temp file is renamed over path. On any failure the temp
// file is removed, an existing file at path is left untouched, and mixtrain::Error is thrown
// (kInvalidInput for bad arguments such as an undefined tensor or a repeated name, kIo otherwise).
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and validates a safetensors file: lengths, JSON, dtypes, shapes, offsets (bounds, sizes,
// overlaps, gaps). Throws mixtrain::Error naming the file and the problem: kIo when the file cannot be
// read, kInvalidInput when its contents are corrupt or unsupported (dtypes other than F32, F16, BF16,
// I32, U8).
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace mixtrain
