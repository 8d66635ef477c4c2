// IDX files: the format of MNIST and Fashion-MNIST. A header of two zero bytes, a type byte, a rank byte and
// `rank` big-endian uint32 dimensions, followed by the raw elements in row-major order.
#pragma once

#include <cstdint>
#include <string>

#include "mixtrain/core/tensor.h"

namespace mixtrain {

// The only element type mixtrain reads: the image and label files of the MNIST family are all uint8.
constexpr uint8_t kIdxTypeUInt8 = 0x08;
// Refuses headers promising more elements than this (4 GiB of uint8; Fashion-MNIST's training images are 47 MB):
// a corrupt or hostile header must not make the reader allocate or inflate without bound.
constexpr int64_t kIdxMaxElements = int64_t{1} << 32;
// Deflate encodes at best 258 repeated bytes in 2 bits, so a gzip stream inflates to at most 1032 times its size:
// a header declaring more data than that is refused before anything is allocated.
constexpr uint64_t kIdxMaxGzipRatio = 1032;

// Reads an IDX file, gzip-compressed (detected by its 1f 8b magic) or plain, into a uint8 tensor with the
// file's dimensions. expected_rank >= 1 also requires that rank (3 for images: magic 0x00000803; 1 for labels:
// 0x00000801). Throws mixtrain::Error naming the file for a missing file, a truncated header or body, a wrong
// magic, an element type other than uint8, rank 0, or a dimension product beyond kIdxMaxElements. Only regular
// files are read (require_regular_file). The declared size is checked against the file before allocating (plain:
// exactly header + data; gzip: at most kIdxMaxGzipRatio times the compressed size), and inflating stops one byte
// past the declared size, so a gzip bomb costs at most the declared size in memory.
Tensor read_idx(const std::string& path, int expected_rank = 0);
// The dimensions an IDX file's header declares, with every check read_idx makes before reading the data (the
// data itself is neither read nor inflated): to compare an images file with its labels before the large part.
Shape read_idx_shape(const std::string& path, int expected_rank = 0);

}  // namespace mixtrain
