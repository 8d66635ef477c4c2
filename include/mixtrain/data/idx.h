// IDX files: the format of MNIST and Fashion-MNIST. A header of two zero bytes, a type byte, a rank byte and
// `rank` big-endian uint32 dimensions, followed by the raw elements in row-major order.
#pragma once

#include <cstdint>
#include <string>

#include "mixtrain/core/tensor.h"

namespace mixtrain {

// The only element type mixtrain reads: the image and label files of the MNIST family are all uint8.
constexpr uint8_t kIdxTypeUInt8 = 0x08;
// Refuses headers promising more elements than this (16 GiB of uint8), which only a corrupt header would.
constexpr int64_t kIdxMaxElements = int64_t{1} << 34;

// Reads an IDX file, gzip-compressed (detected by its 1f 8b magic) or plain, into a uint8 tensor with the
// file's dimensions. expected_rank >= 1 also requires that rank (3 for images: magic 0x00000803; 1 for labels:
// 0x00000801). Throws mixtrain::Error naming the file for a missing file, a truncated header or body, a wrong
// magic, an element type other than uint8, rank 0, or a dimension product beyond kIdxMaxElements.
Tensor read_idx(const std::string& path, int expected_rank = 0);

}  // namespace mixtrain
