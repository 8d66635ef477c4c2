// Safetensors checkpoints, byte-compatible with the Hugging Face format:
//   [8 bytes: header length N, little-endian u64]
//   [N bytes: JSON header, padded with spaces to a multiple of 8]
//   [tensor bytes, each tensor contiguous, offsets relative to the start of this block]
// Header: {"__metadata__": {"key": "value"}, "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}.
//
// Checksums: mixtrain adds to __metadata__ "checksum/<tensor name>" = "crc32:<8 hex digits>" (CRC-32 of the
// tensor's bytes, as zlib computes it) for every tensor, and "checksum/__metadata__" over the other metadata
// entries (each key NUL value NUL, in key order). Other readers see ordinary string metadata; load_safetensors
// verifies them, so a changed byte or digit is refused rather than loaded.
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
  // The __metadata__ table without the checksum entries (those are the loader's business).
  std::map<std::string, std::string> metadata;
  // Whether the file carried checksums and every tensor and the metadata matched them. False for files written by
  // other tools or by mixtrain before checksums were added: their bytes could not be verified.
  bool checksums_verified = false;

  // The tensor called name; throws mixtrain::Error (kInvalidInput) naming the tensor and the file.
  const Tensor& get(const std::string& name) const;
  bool contains(const std::string& name) const;
};

// Writes tensors (in the given order), string metadata and their checksums to path atomically: the bytes go to
// "<path>.tmp.<pid>", are fsync'ed, the temp file is renamed over path, and the directory is fsync'ed so the
// rename survives a power loss. On any failure the temp file is removed, an existing file at path is left
// untouched, and mixtrain::Error is thrown (kInvalidInput for bad arguments such as an undefined tensor, a
// repeated name or a metadata key starting with "checksum/", kIo otherwise). A process killed mid-save cannot
// remove its temp file: each save first removes "<path>.tmp.<pid>" files whose process no longer exists
// (kill(pid, 0) fails with ESRCH). (A process of another PID namespace sharing the directory is not seen; do not
// let two containers save to one path.)
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and validates a safetensors file: lengths, JSON, dtypes, shapes, offsets (bounds, sizes,
// overlaps, gaps), all before any tensor is allocated, then the checksums when the file has them. Throws
// mixtrain::Error naming the file (and the tensor, where one is at fault) and the problem: kIo when the file
// cannot be read, kInvalidInput when its contents are corrupt, fail a checksum, or are unsupported (dtypes other
// than F32, F16, BF16, I32, I64, U8, F8_E4M3, F8_E5M2, F8_E8M0).
SafetensorsFile load_safetensors(const std::string& path);
// The metadata of a safetensors file (without checksum entries), after the same checks of its header and of the
// metadata's checksum as load_safetensors; no tensor is read.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

}  // namespace mixtrain
