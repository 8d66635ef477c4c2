#include "mixtrain/data/idx.h"

#include <zlib.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <iomanip>
#include <memory>
#include <sstream>
#include <vector>

#include "mixtrain/core/file_checks.h"
#include "mixtrain/core/input_budget.h"

namespace mixtrain {

namespace {

constexpr const char* kIdxHint = "pass an IDX file such as train-images-idx3-ubyte(.gz) from MNIST or Fashion-MNIST";

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

std::string hex32(uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(8) << std::setfill('0') << v;
  return os.str();
}

const char* idx_type_name(uint8_t type) {
  switch (type) {
    case 0x08:
      return "uint8";
    case 0x09:
      return "int8";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return "unknown";
  }
}

std::string expected_magic(int expected_rank) {
  if (expected_rank <= 0) return "0x000008NN (uint8, NN = rank)";
  return hex32(0x0800u | static_cast<uint32_t>(expected_rank)) + " (uint8, rank " + std::to_string(expected_rank) + ")";
}

GzHandle open_idx(const std::string& path) {
  require_regular_file(path, "IDX file");
  errno = 0;
  // gzopen reads gzip streams (recognised by their 1f 8b magic) and passes any other file through unchanged.
  GzHandle f(gzopen(path.c_str(), "rb"));
  if (!f) MIXTRAIN_FAIL(kIo, "cannot open IDX file '" << path << "': " << std::strerror(errno), "check permissions");
  gzbuffer(f.get(), 1 << 17);
  return f;
}

// Size of the file on disk, for bounding what its header may declare before anything is allocated.
uint64_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    MIXTRAIN_FAIL(kIo, "cannot examine IDX file '" << path << "': " << std::strerror(errno), "check the path");
  return static_cast<uint64_t>(st.st_size);
}

// Reads up to `bytes` bytes; returns how many arrived. Corrupt compressed data is an error, a short read is not.
size_t read_some(gzFile f, void* dst, size_t bytes, const std::string& path) {
  size_t done = 0;
  char* out = static_cast<char*>(dst);
  while (done < bytes) {
    // gzread takes an unsigned count; stay well inside it.
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes - done, size_t{1} << 30));
    const int got = gzread(f, out + done, chunk);
    if (got < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      MIXTRAIN_FAIL(kInvalidInput, "corrupt gzip data in IDX file '" << path << "': " << msg,
                    "download the file again; it may be truncated or damaged");
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  // A gzip stream cut short is not an error to gzread: it returns what it could inflate and records Z_BUF_ERROR.
  int errnum = Z_OK;
  gzerror(f, &errnum);
  if (done < bytes && errnum == Z_BUF_ERROR)
    MIXTRAIN_FAIL(kInvalidInput, "gzip data in IDX file '" << path << "' ends unexpectedly: the file is truncated",
                  "download the file again; it may be incomplete");
  return done;
}

}  // namespace

namespace {

// Reads and checks the 4 magic bytes: two zeros, the element type (uint8 only) and the rank, against
// expected_rank (0: any). Returns the rank.
int read_magic(gzFile f, const std::string& path, int expected_rank) {
  unsigned char magic[4];
  const size_t got_magic = read_some(f, magic, 4, path);
  if (got_magic < 4)
    MIXTRAIN_FAIL(kInvalidInput,
                  "IDX file '" << path << "' is truncated: the header needs 4 magic bytes, the file has " << got_magic,
                  kIdxHint);
  const uint32_t magic_value =
      (uint32_t{magic[0]} << 24) | (uint32_t{magic[1]} << 16) | (uint32_t{magic[2]} << 8) | uint32_t{magic[3]};
  if (magic[0] != 0 || magic[1] != 0)
    MIXTRAIN_FAIL(kInvalidInput,
                  "'" << path << "' is not an IDX file: magic " << hex32(magic_value) << ", expected "
                      << expected_magic(expected_rank),
                  kIdxHint);
  const uint8_t type = magic[2];
  const int rank = magic[3];
  if (type != kIdxTypeUInt8)
    MIXTRAIN_FAIL(kInvalidInput,
                  "IDX file '" << path << "' holds element type 0x" << std::hex << std::setw(2) << std::setfill('0')
                               << int{type} << std::dec << " (" << idx_type_name(type)
                               << "); only 0x08 (uint8) is supported, expected magic " << expected_magic(expected_rank),
                  "MNIST-family image and label files are uint8");
  if (rank == 0)
    MIXTRAIN_FAIL(kInvalidInput,
                  "IDX file '" << path << "' has rank 0 (magic " << hex32(magic_value) << "), expected "
                               << expected_magic(expected_rank),
                  kIdxHint);
  if (expected_rank > 0 && rank != expected_rank)
    MIXTRAIN_FAIL(kInvalidInput,
                  "IDX file '" << path << "' has magic " << hex32(magic_value) << " (rank " << rank << "), expected "
                               << expected_magic(expected_rank),
                  expected_rank == 3 ? "pass the images file (...-images-idx3-ubyte), not the labels file"
                                     : "the labels file (...-labels-idx1-ubyte) holds one uint8 per sample");
  return rank;
}

// Reads the rank big-endian 32-bit dimensions and checks that the product of the non-zero ones stays within
// kIdxMaxElements. Sets *count to the number of elements they declare.
std::vector<int64_t> read_dims(gzFile f, const std::string& path, int rank, int64_t* count) {
  std::vector<unsigned char> dim_bytes(static_cast<size_t>(rank) * 4);
  const size_t got_dims = read_some(f, dim_bytes.data(), dim_bytes.size(), path);
  if (got_dims < dim_bytes.size())
    MIXTRAIN_FAIL(kInvalidInput,
                  "IDX file '" << path << "' is truncated: the header declares rank " << rank << " and needs "
                               << dim_bytes.size() << " dimension bytes, the file has " << got_dims,
                  kIdxHint);
  std::vector<int64_t> dims(static_cast<size_t>(rank));
  // The limit applies to the product of the non-zero dimensions: a zero makes the data empty, but (0, 2^32-1,
  // 2^32-1) is still no shape a real file has, and its strides would overflow int64.
  int64_t nonzero_product = 1;
  bool empty = false;
  for (int i = 0; i < rank; ++i) {
    const unsigned char* b = &dim_bytes[static_cast<size_t>(i) * 4];
    dims[i] =
        static_cast<int64_t>((uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]});
    empty = empty || dims[i] == 0;
    // Checked per factor: with up to 255 factors of up to 2^32 the product overflows int64 long before the end.
    if (dims[i] != 0 &&
        (__builtin_mul_overflow(nonzero_product, dims[i], &nonzero_product) || nonzero_product > kIdxMaxElements))
      MIXTRAIN_FAIL(kInvalidInput,
                    "IDX file '" << path << "' declares dimensions "
                                 << Shape(std::vector<int64_t>(dims.begin(), dims.begin() + i + 1))
                                 << (i + 1 < rank ? "..." : "") << " whose product"
                                 << (empty ? " (leaving out the zeros)" : "") << " exceeds the limit of "
                                 << kIdxMaxElements << " elements",
                    "the header is corrupt; download the file again");
  }
  *count = empty ? 0 : nonzero_product;
  return dims;
}

// What the header declares must fit in the file before the tensor is allocated: a plain file holds exactly the
// header and the data; a gzip stream cannot inflate to more than kIdxMaxGzipRatio times its compressed size.
void check_declared_size(gzFile f, const std::string& path, const std::vector<int64_t>& dims, int64_t count) {
  const size_t want = static_cast<size_t>(count);
  const uint64_t header_bytes = 4 + static_cast<uint64_t>(dims.size()) * 4;
  const uint64_t on_disk = file_size(path);
  if (gzdirect(f)) {
    if (header_bytes + want > on_disk)
      MIXTRAIN_FAIL(kInvalidInput,
                    "IDX file '" << path << "' is truncated: the header declares " << Shape(dims) << " = " << want
                                 << " bytes of data, the file has " << (on_disk - header_bytes),
                    "download the file again; it may be incomplete");
    if (header_bytes + want < on_disk)
      MIXTRAIN_FAIL(kInvalidInput,
                    "IDX file '" << path << "' has bytes after the " << want << " bytes of data its header "
                                 << Shape(dims) << " declares",
                    "the header does not match the data; download the file again");
  } else if ((header_bytes + want - 1) / kIdxMaxGzipRatio >= on_disk) {  // > ratio * on_disk, without overflow
    MIXTRAIN_FAIL(kInvalidInput,
                  "gzip IDX file '" << path << "' declares " << Shape(dims) << " = " << want << " bytes of data, more "
                                    << "than its " << on_disk << " compressed bytes can hold (gzip expands at most "
                                    << kIdxMaxGzipRatio << " times)",
                  "the header is corrupt or the file is truncated; download the file again");
  }
}

// Reads and checks the header of the open file f: magic, element type, rank, dimensions and what they declare
// against the file's size. Leaves f at the first data byte.
std::vector<int64_t> read_header(gzFile f, const std::string& path, int expected_rank) {
  const int rank = read_magic(f, path, expected_rank);
  int64_t count = 0;
  std::vector<int64_t> dims = read_dims(f, path, rank, &count);
  check_declared_size(f, path, dims, count);
  // The bytes, then the float32 samples made from them.
  check_input_budget(path, "its " + Shape(dims).to_string() + " bytes of data, as bytes and as float32", count * 5);
  return dims;
}

}  // namespace

Shape read_idx_shape(const std::string& path, int expected_rank) {
  GzHandle file = open_idx(path);
  return Shape(read_header(file.get(), path, expected_rank));
}

Tensor read_idx(const std::string& path, int expected_rank) {
  GzHandle file = open_idx(path);
  gzFile f = file.get();
  const std::vector<int64_t> dims = read_header(f, path, expected_rank);
  const size_t want = static_cast<size_t>(Shape(dims).numel());
  Tensor t = Tensor::empty(Shape(dims), DType::kUInt8);  // (d0, d1, ...)
  const size_t got = want ? read_some(f, t.raw(), want, path) : 0;
  if (got < want)
    MIXTRAIN_FAIL(kInvalidInput,
                  "IDX file '" << path << "' is truncated: the header declares " << Shape(dims) << " = " << want
                               << " bytes of data, the file has " << got,
                  "download the file again; it may be incomplete");
  // More data than the header declares means the header does not describe this file.
  unsigned char extra;
  if (read_some(f, &extra, 1, path) != 0)
    MIXTRAIN_FAIL(kInvalidInput,
                  "IDX file '" << path << "' has bytes after the " << want << " bytes of data its header "
                               << Shape(dims) << " declares",
                  "the header does not match the data; download the file again");
  return t;
}

}  // namespace mixtrain
