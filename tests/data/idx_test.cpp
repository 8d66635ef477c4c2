#include "mixtrain/data/idx.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/input_budget.h"
#include "test_files.h"

namespace mixtrain {
namespace {

using testing::contains;
using testing::error_of;
using testing::FedFifo;
using testing::TempDir;
using testing::write_bytes;
using testing::write_idx;

std::vector<uint8_t> iota_bytes(size_t n, uint8_t start = 0) {
  std::vector<uint8_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// The error names the file and says what went wrong; bad content is kInvalidInput.
void expect_bad_file(const std::string& path, int expected_rank, const std::string& detail,
                     ErrorKind kind = ErrorKind::kInvalidInput) {
  const Error e = error_of([&] { read_idx(path, expected_rank); });
  EXPECT_TRUE(contains(e.what(), path)) << e.what();
  EXPECT_TRUE(contains(e.what(), detail)) << e.what();
  EXPECT_EQ(e.kind(), kind) << e.what();
}

TEST(Idx, ReadsPlainAndGzipImages) {
  TempDir dir;
  const std::vector<uint8_t> pixels = iota_bytes(24, 240);  // 240..255, 0..7: high bytes must survive
  for (bool gzip : {false, true}) {
    const std::string path = dir.file(gzip ? "img-idx3-ubyte.gz" : "img-idx3-ubyte");
    write_idx(path, {2, 3, 4}, pixels, gzip);
    const Tensor t = read_idx(path, 3);
    EXPECT_EQ(t.dtype(), DType::kUInt8);
    EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
    const uint8_t* p = t.data<uint8_t>();
    EXPECT_EQ(std::vector<uint8_t>(p, p + 24), pixels) << path;
    EXPECT_EQ(p[0], 240);
    EXPECT_EQ(p[15], 255);
    EXPECT_EQ(p[23], 7);
  }
}

TEST(Idx, ReadsLabelsAndAnyRankWithoutExpectation) {
  TempDir dir;
  write_idx(dir.file("labels"), {5}, {9, 0, 0, 3, 255}, false);
  const Tensor labels = read_idx(dir.file("labels"), 1);
  EXPECT_EQ(labels.shape(), (Shape{5}));
  EXPECT_EQ(labels.to_ints(), (std::vector<int32_t>{9, 0, 0, 3, 255}));
  write_idx(dir.file("four"), {1, 2, 1, 2}, {1, 2, 3, 4}, true);
  EXPECT_EQ(read_idx(dir.file("four")).shape(), (Shape{1, 2, 1, 2}));
}

TEST(Idx, DetectsGzipByMagicNotByName) {
  TempDir dir;
  const std::string path = dir.file("compressed-but-named-plain.idx");
  write_idx(path, {2}, {7, 8}, true);
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(in.get(), 0x1f);
  EXPECT_EQ(in.get(), 0x8b);
  EXPECT_EQ(read_idx(path, 1).to_ints(), (std::vector<int32_t>{7, 8}));
}

TEST(Idx, ZeroLengthDimensionGivesEmptyTensor) {
  TempDir dir;
  write_idx(dir.file("empty"), {0, 28, 28}, {}, false);
  const Tensor t = read_idx(dir.file("empty"), 3);
  EXPECT_EQ(t.shape(), (Shape{0, 28, 28}));
  EXPECT_EQ(t.numel(), 0);
}

TEST(Idx, MissingFileIsAnIoError) {
  TempDir dir;
  expect_bad_file(dir.file("nope-idx3-ubyte.gz"), 3, "does not exist", ErrorKind::kIo);
  expect_bad_file(dir.path().string(), 3, "is a directory", ErrorKind::kIo);
}

TEST(Idx, TruncatedHeader) {
  TempDir dir;
  for (bool gzip : {false, true}) {
    const std::string a = dir.file(gzip ? "short-magic.gz" : "short-magic");
    write_bytes(a, {0, 0, 8}, gzip);
    expect_bad_file(a, 3, "needs 4 magic bytes, the file has 3");
    const std::string b = dir.file(gzip ? "short-dims.gz" : "short-dims");
    write_bytes(b, {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3}, gzip);  // rank 3 but two dims
    expect_bad_file(b, 3, "needs 12 dimension bytes, the file has 8");
  }
  const std::string empty = dir.file("empty-file");
  write_bytes(empty, {}, false);
  expect_bad_file(empty, 1, "the file has 0");
}

TEST(Idx, TruncatedData) {
  TempDir dir;
  for (bool gzip : {false, true}) {
    const std::string path = dir.file(gzip ? "cut.gz" : "cut");
    write_idx(path, {2, 3, 4}, iota_bytes(10), gzip);
    expect_bad_file(path, 3, "declares (2, 3, 4) = 24 bytes of data, the file has 10");
  }
}

TEST(Idx, TruncatedGzipStream) {
  TempDir dir;
  const std::string whole = dir.file("whole.gz");
  write_idx(whole, {100, 10, 10}, std::vector<uint8_t>(10000, 0), true);
  const auto size = std::filesystem::file_size(whole);
  std::vector<uint8_t> bytes(size);
  std::ifstream(whole, std::ios::binary).read(reinterpret_cast<char*>(bytes.data()), static_cast<long>(size));
  bytes.resize(size / 2);
  const std::string cut = dir.file("half.gz");
  write_bytes(cut, bytes, false);
  expect_bad_file(cut, 3, "ends unexpectedly: the file is truncated");
}

TEST(Idx, CorruptGzipData) {
  TempDir dir;
  const std::string path = dir.file("garbage.gz");
  // A valid gzip member header followed by bytes that are not a deflate stream.
  write_bytes(path, {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, false);
  expect_bad_file(path, 3, "corrupt gzip data");
}

TEST(Idx, WrongMagic) {
  TempDir dir;
  const std::string zip = dir.file("archive.zip");
  write_bytes(zip, {'P', 'K', 3, 4, 0, 0, 0, 0}, false);
  expect_bad_file(zip, 3, "is not an IDX file: magic 0x504b0304, expected 0x00000803 (uint8, rank 3)");

  const std::string labels = dir.file("train-labels-idx1-ubyte");
  write_idx(labels, {3}, {1, 2, 3}, false);
  expect_bad_file(labels, 3, "has magic 0x00000801 (rank 1), expected 0x00000803 (uint8, rank 3)");
  const std::string images = dir.file("train-images-idx3-ubyte");
  write_idx(images, {1, 1, 1}, {1}, false);
  expect_bad_file(images, 1, "has magic 0x00000803 (rank 3), expected 0x00000801 (uint8, rank 1)");
}

TEST(Idx, RejectsElementTypesOtherThanUInt8) {
  TempDir dir;
  const std::string path = dir.file("floats-idx3");
  write_bytes(path, testing::idx_bytes({1, 1, 1}, {0, 0, 0, 0}, 0x0D), false);
  expect_bad_file(path, 3, "element type 0x0d (float32); only 0x08 (uint8) is supported");
  write_bytes(path, testing::idx_bytes({1}, {0}, 0x42), false);
  expect_bad_file(path, 1, "element type 0x42 (unknown)");
}

TEST(Idx, RejectsRankZero) {
  TempDir dir;
  const std::string path = dir.file("scalar");
  write_bytes(path, {0, 0, 8, 0, 5}, false);
  expect_bad_file(path, 0, "has rank 0 (magic 0x00000800)");
}

TEST(Idx, RejectsHugeOrOverflowingDimensions) {
  TempDir dir;
  const std::string big = dir.file("big");
  write_bytes(big, testing::idx_bytes({1u << 16, 1u << 16, 2}, {}), false);  // 2^33 elements
  expect_bad_file(big, 3, "(65536, 65536, 2) whose product exceeds the limit of 4294967296 elements");
  const std::string overflow = dir.file("overflow");
  std::vector<uint32_t> dims(8, 0xFFFFFFFFu);  // product far beyond int64
  write_bytes(overflow, testing::idx_bytes(dims, {}), false);
  expect_bad_file(overflow, 0, "(4294967295, 4294967295)... whose product exceeds the limit");
}

// Found by fuzz/idx_fuzz.cpp (fuzz/corpus/idx/zero_then_huge_dims): a zero dimension made the product 0, so the
// huge dimensions after it passed the limit and the tensor's strides overflowed int64 (undefined behaviour).
TEST(Idx, AZeroDimensionDoesNotHideHugeOnes) {
  TempDir dir;
  const std::string path = dir.file("zero-then-huge");
  write_bytes(path, testing::idx_bytes({0, 514, 65534, 4110765679u}, {}), false);
  expect_bad_file(path, 0, "(0, 514, 65534, 4110765679) whose product (leaving out the zeros) exceeds the limit");
  write_bytes(path, testing::idx_bytes({3, 0, 1u << 31, 2}, {}), false);
  expect_bad_file(path, 0, "(3, 0, 2147483648)... whose product (leaving out the zeros) exceeds the limit");
  // Zeros with ordinary dimensions are still an empty data set, as before.
  write_bytes(path, testing::idx_bytes({0, 28, 28}, {}), false);
  EXPECT_EQ(read_idx(path, 3).shape(), (Shape{0, 28, 28}));
}

TEST(Idx, RejectsDataBeyondTheDeclaredSize) {
  TempDir dir;
  const std::string path = dir.file("long");
  write_idx(path, {2}, {1, 2, 3}, false);
  expect_bad_file(path, 1, "has bytes after the 2 bytes of data its header (2,) declares");
}

TEST(Idx, RejectsTheLimitBoundary) {
  TempDir dir;
  const std::string path = dir.file("over");
  // 2^32 + 65536 elements: one row past the 4 GiB cap, refused from the header alone.
  write_bytes(path, testing::idx_bytes({65537, 65536, 1}, {}), false);
  expect_bad_file(path, 3, "whose product exceeds the limit of 4294967296 elements");
}

// Only regular files are data: a FIFO (which would block the open until someone writes) and a device behind a
// data-like name are refused before they are opened, naming the path.
TEST(Idx, RefusesFifosDevicesAndDirectories) {
  TempDir dir;
  const std::string fifo = dir.file("fifo-images-idx3-ubyte");
  const std::vector<uint8_t> valid = testing::idx_bytes({1, 1, 1}, {7});
  FedFifo feeder(fifo, std::string(valid.begin(), valid.end()));
  expect_bad_file(fifo, 3, "is a FIFO (named pipe), not a regular file", ErrorKind::kIo);

  const std::string device = dir.file("null-images-idx3-ubyte.gz");
  std::filesystem::create_symlink("/dev/null", device);
  expect_bad_file(device, 3, "is a character device, not a regular file", ErrorKind::kIo);

  expect_bad_file(dir.path().string(), 3, "is a directory, not a regular file", ErrorKind::kIo);

  // A symbolic link to a regular file is read as the file.
  const std::string real = dir.file("real");
  write_idx(real, {1}, {5}, false);
  const std::string link = dir.file("link");
  std::filesystem::create_symlink(real, link);
  EXPECT_EQ(read_idx(link, 1).data<uint8_t>()[0], 5);
}

// A small gzip file whose header declares far more data than its compressed bytes could inflate to is refused
// before the tensor is allocated (the allocator's peak stays flat).
TEST(Idx, GzipHeaderBeyondWhatTheStreamCanHoldIsRefusedBeforeAllocating) {
  TempDir dir;
  const std::string path = dir.file("bomb-images-idx3-ubyte.gz");
  write_idx(path, {1024, 1024, 512}, iota_bytes(100), true);  // declares 512 MiB, holds 100 bytes
  reset_peak_memory();
  const int64_t before = memory_stats().live_bytes;
  expect_bad_file(path, 3, "declares (1024, 1024, 512) = 536870912 bytes of data, more than its");
  expect_bad_file(path, 3, "compressed bytes can hold (gzip expands at most 1032 times)");
  EXPECT_LT(memory_stats().peak_bytes - before, int64_t{1} << 20);
}

// Inflating stops one byte past what the header declares: 64 MiB of zeros behind a header that declares 2 bytes
// are refused as soon as the third byte arrives.
TEST(Idx, GzipDataBeyondTheDeclaredSizeIsRefused) {
  TempDir dir;
  const std::string path = dir.file("long.gz");
  write_idx(path, {2}, std::vector<uint8_t>(size_t{64} << 20, 0), true);
  expect_bad_file(path, 1, "has bytes after the 2 bytes of data its header (2,) declares");
}

// The declared data, as bytes and as float32, is charged to the input budget before it is allocated or inflated.
TEST(Idx, DeclaredDataPastTheInputBudgetIsRefusedBeforeItIsRead) {
  TempDir dir;
  const std::string path = dir.file("img-idx3-ubyte.gz");
  write_idx(path, {400, 32, 32}, std::vector<uint8_t>(400 * 32 * 32, 3), true);  // 400 KiB, 2.0 MiB charged
  set_input_budget(1 << 20);
  expect_bad_file(path, 3, "its (400, 32, 32) bytes of data, as bytes and as float32 would take 2.0 MiB");
  set_input_budget(0);
  EXPECT_EQ(read_idx(path, 3).shape(), (Shape{400, 32, 32}));
}

}  // namespace
}  // namespace mixtrain
