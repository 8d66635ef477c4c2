#include "mixtrain/io/safetensors.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <csignal>
#include <cstdio>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <thread>

#include "mixtrain/core/error.h"
#include "mixtrain/core/input_budget.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors file image: length prefix, header (optionally space-padded to 8), data bytes.
std::string image(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mixtrain_io_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Names of every file left in the test directory, to prove no temp file survives.
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  // Loads bytes written to a file and returns the error, which must name the file.
  Error load_error(const std::string& bytes) {
    const std::string p = path("corrupt.safetensors");
    write_bytes(p, bytes);
    try {
      load_safetensors(p);
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(p), std::string::npos) << e.message();
      return e;
    }
    ADD_FAILURE() << "loaded without error";
    return Error(ErrorKind::kInternal, "", "", "");
  }

  void expect_corrupt(const std::string& bytes, const std::string& expected) {
    const Error e = load_error(bytes);
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
    EXPECT_NE(e.message().find(expected), std::string::npos) << "message: " << e.message();
  }

  fs::path dir_;
};

std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  // Awkward values on purpose: subnormals, -0, infinities and a NaN payload must survive bit for bit.
  Tensor f32 = Tensor::from_floats({2, 3}, {1.0f, -0.0f, 1e-40f, std::numeric_limits<float>::infinity(), 3.14159f, -2.5f});
  f32.data<float>()[5] = bits_float(0x7FC01234u);
  Tensor f16 = Tensor::from_floats({4}, {0.1f, 65504.0f, 6e-8f, -1.0f}, DType::kFloat16);
  f16.data<float16>()[3].bits = 0x7E01;  // NaN with a payload
  Tensor bf16 = Tensor::from_floats({1, 2, 2}, {1e30f, -1e-30f, 0.333f, 7.0f}, DType::kBFloat16);
  Tensor i32 = Tensor::from_ints({3}, {std::numeric_limits<int32_t>::min(), 0, std::numeric_limits<int32_t>::max()});
  Tensor u8 = Tensor::from_ints({5}, {0, 1, 127, 128, 255}).to(DType::kUInt8);
  Tensor scalar = Tensor::full({}, DType::kFloat32, 42.0f);
  Tensor empty = Tensor::zeros({0, 3}, DType::kFloat16);
  return {{"dense/kernel", f32}, {"dense/bias", f16}, {"norm.gamma", bf16}, {"labels", i32},
          {"pixels", u8},        {"step", scalar},    {"empty", empty}};
}

TEST_F(Safetensors, RoundTripIsBitExact) {
  const auto tensors = sample_tensors();
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"policy", "mixed_float16"}, {"note", "quote \" newline \n caf\xc3\xa9"}, {"", ""}};
  const std::string p = path("model.safetensors");
  save_safetensors(p, tensors, metadata);
  EXPECT_EQ(files(), std::vector<std::string>{"model.safetensors"});
  const std::string bytes = read_bytes(p);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  EXPECT_EQ(header_size % 8, 0u);

  const SafetensorsFile file = load_safetensors(p);
  EXPECT_EQ(file.path, p);
  EXPECT_EQ(file.metadata, metadata);  // without the checksum entries
  EXPECT_TRUE(file.checksums_verified);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file.tensors[i].first, tensors[i].first);
    EXPECT_TRUE(same_bytes(file.tensors[i].second, tensors[i].second)) << tensors[i].first;
  }
  EXPECT_TRUE(file.contains("labels"));
  EXPECT_FALSE(file.contains("missing"));
  EXPECT_EQ(file.get("step").item(), 42.0f);
  EXPECT_EQ(file.get("step").rank(), 0);

  // Saving what was loaded reproduces the file byte for byte.
  const std::string p2 = path("again.safetensors");
  save_safetensors(p2, file.tensors, file.metadata);
  EXPECT_EQ(read_bytes(p2), bytes);
}

TEST_F(Safetensors, WritesTheReferenceLayout) {
  const std::string p = path("ref.safetensors");
  save_safetensors(p, {{"a", Tensor::from_floats({2}, {1.0f, -2.5f})}}, {{"format", "pt"}});
  // The checksums as Python computes them: zlib.crc32(b"\0\0\x80?\0\0 \xc0") and zlib.crc32(b"format\0pt\0").
  const std::string header =
      R"({"__metadata__":{"checksum/__metadata__":"crc32:68e5a7ae","checksum/a":"crc32:560302f4","format":"pt"},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(read_bytes(p), image(header, std::string("\x00\x00\x80\x3f\x00\x00\x20\xc0", 8)));
  save_safetensors(p, {});
  EXPECT_EQ(read_bytes(p), image(R"({"__metadata__":{"checksum/__metadata__":"crc32:00000000"}})", ""));
  EXPECT_TRUE(load_safetensors(p).tensors.empty());
  EXPECT_TRUE(load_safetensors(p).metadata.empty());
}

TEST_F(Safetensors, LoadsHandWrittenFile) {
  // As a Python writer would produce it: tensors out of name order, an unpadded header, whitespace.
  const std::string header =
      R"({"b": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [8, 12]},)"
      R"( "__metadata__": {"format": "pt", "source": "hand"},)"
      R"( "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
      R"( "c": {"dtype": "I32", "shape": [], "data_offsets": [12, 16]},)"
      R"( "d": {"dtype": "U8", "shape": [3], "data_offsets": [16, 19]},)"
      R"( "e": {"dtype": "F16", "shape": [1], "data_offsets": [19, 21]}})";
  const std::string data("\x00\x00\x80\x3f\x00\x00\x20\xc0"  // F32 1.0, -2.5
                         "\x00\x3f\x40\x40"                  // BF16 0.5, 3.0
                         "\xff\xff\xff\xff"                  // I32 -1
                         "\x01\x02\xff"                      // U8 1, 2, 255
                         "\x00\x3c",                         // F16 1.0
                         21);
  for (bool pad : {false, true}) {
    const std::string p = path("hand.safetensors");
    write_bytes(p, image(header, data, pad));
    const SafetensorsFile file = load_safetensors(p);
    EXPECT_EQ(file.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"source", "hand"}}));
    EXPECT_FALSE(file.checksums_verified);  // files of other writers carry none; they load unverified
    ASSERT_EQ(file.tensors.size(), 5u);
    EXPECT_EQ(file.tensors[0].first, "b");  // header order
    EXPECT_EQ(file.get("a").to_floats(), (std::vector<float>{1.0f, -2.5f}));
    EXPECT_EQ(file.get("b").dtype(), DType::kBFloat16);
    EXPECT_EQ(file.get("b").shape(), (Shape{1, 2}));
    EXPECT_EQ(file.get("b").to_floats(), (std::vector<float>{0.5f, 3.0f}));
    EXPECT_EQ(file.get("c").to_ints(), (std::vector<int32_t>{-1}));
    EXPECT_EQ(file.get("d").to_ints(), (std::vector<int32_t>{1, 2, 255}));
    EXPECT_EQ(file.get("e").to_floats(), (std::vector<float>{1.0f}));
  }
}

TEST_F(Safetensors, MissingTensorErrorNamesTensorAndFile) {
  const std::string p = path("m.safetensors");
  save_safetensors(p, {{"w", Tensor::zeros({1}, DType::kFloat32)}});
  const SafetensorsFile file = load_safetensors(p);
  try {
    file.get("dense/kernel");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(e.message().find("'dense/kernel'"), std::string::npos);
    EXPECT_NE(e.message().find(p), std::string::npos);
    EXPECT_NE(e.hint().find("w"), std::string::npos);
  }
}

TEST_F(Safetensors, UnreadableFilesAreIoErrors) {
  for (const std::string& p : {path("does_not_exist.safetensors"), dir_.string()}) {
    try {
      load_safetensors(p);
      FAIL() << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIo);
      EXPECT_NE(e.message().find(p), std::string::npos);
    }
  }
}

TEST_F(Safetensors, RejectsCorruptFiles) {
  const auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                        const std::string& offsets) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
  };
  const std::string f32x2 = entry("a", "F32", "[2]", "[0,8]");
  const std::string eight(8, '\x11');

  expect_corrupt("", "too short (0 bytes)");
  expect_corrupt(std::string("\x08\x00\x00", 3), "too short (3 bytes)");
  expect_corrupt(le64(64) + "{}", "header length 64 runs past the end of the file (10 bytes)");
  expect_corrupt(le64(200'000'000) + "{}", "exceeds the limit of 100000000 bytes");
  expect_corrupt(le64(~uint64_t{0}) + "{}", "exceeds the limit");
  expect_corrupt(image("{\"a\":", ""), "invalid JSON");
  expect_corrupt(image("", ""), "invalid JSON");
  expect_corrupt(image("{\"a\":1,\"a\":2}", ""), "duplicate object key");
  expect_corrupt(image("[]", ""), "safetensors header is array, expected an object");
  expect_corrupt(image("{" + entry("a", "F64", "[1]", "[0,8]") + "}", eight), "unsupported dtype 'F64'");
  expect_corrupt(image("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", eight), "dtype is 7");
  expect_corrupt(image("{" + entry("a", "U8", "[4294967296,4294967296]", "[0,8]") + "}", eight),
                 "more elements than fit in 64 bits");
  expect_corrupt(image("{" + entry("a", "F32", "[4611686018427387904]", "[0,8]") + "}", eight),
                 "expected a non-negative integer");  // 2^62 is beyond the exact-integer range
  expect_corrupt(image("{" + entry("a", "F32", "[1099511627776,4194304]", "[0,8]") + "}", eight),
                 "more bytes than fit in 64 bits");  // 2^62 elements fit, 2^64 bytes do not
  // Found by fuzzing (fuzz/corpus/safetensors/zero_then_huge_dims): a zero dimension made the element count 0,
  // so huge dimensions beside it passed and the tensor's strides overflowed int64 (undefined behaviour).
  expect_corrupt(image("{" + entry("a", "U8", "[0,4294967296,4294967296]", "[0,0]") + "}", ""),
                 "has more elements than fit in 64 bits (leaving out the zeros)");
  expect_corrupt(image("{" + entry("a", "F32", "[2147483648,0,2147483648]", "[0,0]") + "}", ""),
                 "needs more bytes than fit in 64 bits (leaving out the zeros)");
  expect_corrupt(image("{" + entry("a", "U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") + "}", "x"),
                 "has rank 9; mixtrain tensors have at most 8 dimensions");
  expect_corrupt(image("{" + entry("a", "F32", "[-2]", "[0,8]") + "}", eight), "expected a non-negative integer");
  expect_corrupt(image("{" + entry("a", "F32", "[1.5]", "[0,8]") + "}", eight), "expected a non-negative integer");
  expect_corrupt(image("{" + entry("a", "F32", "{}", "[0,8]") + "}", eight), "expected an array");
  expect_corrupt(image("{" + entry("a", "F32", "[2,3]", "[0,8]") + "}", eight),
                 "data_offsets [0, 8] span 8 bytes, but F32 with shape (2, 3) needs 24");
  expect_corrupt(image("{" + entry("a", "F32", "[2]", "[8,0]") + "}", eight), "end before they begin");
  expect_corrupt(image("{" + entry("a", "F32", "[2]", "[0,8,9]") + "}", eight), "expected [begin, end]");
  expect_corrupt(image("{" + entry("a", "F32", "[2]", "[0,8]") + "}", "\x01\x02\x03\x04"),
                 "data_offsets [0, 8] run past the end of the data (4 bytes)");
  expect_corrupt(image("{" + entry("a", "F32", "[2]", "[8,16]") + "}", eight), "run past the end of the data");
  expect_corrupt(image("{" + f32x2 + "," + entry("b", "F32", "[2]", "[4,12]") + "}", eight + "1234"),
                 "tensors 'a' and 'b' overlap");
  expect_corrupt(image("{" + f32x2 + "," + entry("b", "F32", "[2]", "[0,8]") + "}", eight), "overlap");
  expect_corrupt(image("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]") + "}",
                       eight + "1234"),
                 "bytes [4, 8) of the data belong to no tensor");
  expect_corrupt(image("{" + f32x2 + "}", eight + "xyz"), "3 bytes after the last tensor");
  expect_corrupt(image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", eight), "no \"data_offsets\" field");
  expect_corrupt(image("{\"a\":[1]}", eight), "entry is array, expected an object");
  expect_corrupt(image("{\"__metadata__\":{\"epoch\":3}," + f32x2 + "}", eight),
                 "__metadata__ entry 'epoch' is number, expected a string");
  expect_corrupt(image("{\"__metadata__\":[]}", ""), "__metadata__ is array");
}

TEST_F(Safetensors, SaveRejectsBadArgumentsBeforeTouchingTheFile) {
  const std::string p = path("model.safetensors");
  save_safetensors(p, {{"w", Tensor::from_floats({2}, {1, 2})}}, {{"epoch", "1"}});
  const std::string before = read_bytes(p);
  const Tensor ok = Tensor::zeros({3}, DType::kFloat32);
  const std::vector<std::vector<std::pair<std::string, Tensor>>> bad = {
      {{"w", ok}, {"undefined", Tensor()}},
      {{"w", ok}, {"w", ok}},
      {{"__metadata__", ok}},
      {{"bad\xff", ok}},
  };
  const char* expected[] = {"tensor 'undefined' is undefined", "'w' appears twice", "reserved", "UTF-8"};
  try {
    save_safetensors(p, {{"w", ok}}, {{"checksum/w", "crc32:00000000"}});
    ADD_FAILURE() << "a checksum/ metadata key was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("metadata key 'checksum/w' uses the reserved prefix 'checksum/'"), std::string::npos)
        << e.message();
  }
  for (size_t i = 0; i < bad.size(); ++i) {
    try {
      save_safetensors(p, bad[i], {});
      FAIL() << i;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(e.message().find(expected[i]), std::string::npos) << e.message();
      EXPECT_NE(e.message().find(p), std::string::npos);
    }
    EXPECT_EQ(read_bytes(p), before);
    EXPECT_EQ(files(), std::vector<std::string>{"model.safetensors"});
  }
  EXPECT_THROW(save_safetensors(p, {{"w", ok}}, {{"k", "\xc3"}}), Error);
  EXPECT_EQ(read_bytes(p), before);
}

TEST_F(Safetensors, FailedSaveLeavesTargetUntouchedAndNoTempFile) {
  const Tensor big = Tensor::full({64 * 1024}, DType::kFloat32, 1.5f);
  // Into a directory that does not exist: nothing is created anywhere.
  try {
    save_safetensors(path("no/such/dir/model.safetensors"), {{"w", big}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(e.message().find("no/such/dir/model.safetensors"), std::string::npos);
  }
  EXPECT_TRUE(files().empty());

  // Over a directory: the rename fails after the data was written; the temp file is removed.
  fs::create_directory(path("taken"));
  EXPECT_THROW(save_safetensors(path("taken"), {{"w", big}}), Error);
  EXPECT_EQ(files(), std::vector<std::string>{"taken"});
  fs::remove(path("taken"));

  // A write that fails halfway (file size limit): the previous checkpoint survives byte for byte.
  const std::string p = path("model.safetensors");
  save_safetensors(p, {{"w", Tensor::from_floats({2}, {1, 2})}}, {{"epoch", "1"}});
  const std::string before = read_bytes(p);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Child: a 4 KiB file size limit makes the 256 KiB tensor write fail with EFBIG.
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      save_safetensors(p, {{"w", big}}, {{"epoch", "2"}});
    } catch (const Error& e) {
      ::_exit(e.kind() == ErrorKind::kIo ? 0 : 2);
    }
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the save succeeded, 2: wrong error kind";
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_EQ(files(), std::vector<std::string>{"model.safetensors"});

  // A successful save replaces the file and leaves no temp file behind.
  save_safetensors(p, {{"w", big}}, {{"epoch", "2"}});
  EXPECT_EQ(load_safetensors(p).metadata.at("epoch"), "2");
  EXPECT_TRUE(same_bytes(load_safetensors(p).get("w"), big));
  EXPECT_EQ(files(), std::vector<std::string>{"model.safetensors"});
}

// Every single data byte changed is refused, naming the file and the tensor the byte belongs to; the file loads
// again once the byte is restored.
TEST_F(Safetensors, ChecksumsRefuseAnyChangedDataByte) {
  const std::string p = path("model.safetensors");
  const auto tensors = sample_tensors();
  save_safetensors(p, tensors, {{"epoch", "3"}});
  const std::string bytes = read_bytes(p);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  uint64_t offset = 8 + header_size;
  int checked = 0;
  for (const auto& [name, t] : tensors) {
    for (uint64_t i = 0; i < static_cast<uint64_t>(t.nbytes()); ++i) {
      std::string changed = bytes;
      changed[offset + i] = static_cast<char>(changed[offset + i] ^ (1 << (i % 8)));  // one bit, a different one each time
      const Error e = load_error(changed);
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
      EXPECT_NE(e.message().find("tensor '" + name + "' fails its checksum"), std::string::npos) << e.message();
      ++checked;
    }
    offset += static_cast<uint64_t>(t.nbytes());
  }
  EXPECT_EQ(offset, bytes.size());
  EXPECT_GT(checked, 50);
  write_bytes(path("corrupt.safetensors"), bytes);
  EXPECT_TRUE(load_safetensors(path("corrupt.safetensors")).checksums_verified);
}

// A changed digit in a metadata value (the saved epoch, say) is refused too.
TEST_F(Safetensors, ChecksumsRefuseAChangedMetadataEntry) {
  const std::string p = path("model.safetensors");
  save_safetensors(p, {{"w", Tensor::from_floats({2}, {1, 2})}}, {{"epoch", "3"}, {"seed", "7"}});
  std::string bytes = read_bytes(p);
  const auto at = bytes.find("\"epoch\":\"3\"");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 9] = '4';
  expect_corrupt(bytes, "__metadata__ fails its checksum");
}

// Checksum entries that are malformed, missing for a tensor, or for a tensor the file lacks are refused.
TEST_F(Safetensors, IncompleteOrMalformedChecksumsAreRefused) {
  const std::string a = R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]})";
  const std::string b = R"("b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]})";
  const std::string data("\x01\x02\x03", 3);
  char sum_a[16], sum_b[16], sum_meta[16];
  std::snprintf(sum_a, sizeof sum_a, "crc32:%08lx", crc32(0, reinterpret_cast<const Bytef*>(data.data()), 2));
  std::snprintf(sum_b, sizeof sum_b, "crc32:%08lx", crc32(0, reinterpret_cast<const Bytef*>(data.data() + 2), 1));
  std::snprintf(sum_meta, sizeof sum_meta, "crc32:%08lx", crc32(0, Z_NULL, 0));
  const auto meta = [&](const std::string& entries) { return "\"__metadata__\":{" + entries + "}"; };
  const std::string meta_sum = std::string("\"checksum/__metadata__\":\"") + sum_meta + "\"";
  const std::string a_sum = std::string("\"checksum/a\":\"") + sum_a + "\"";
  const std::string b_sum = std::string("\"checksum/b\":\"") + sum_b + "\"";

  // The complete set loads (this is what the cases below take something from).
  write_bytes(path("ok.safetensors"), image("{" + meta(meta_sum + "," + a_sum + "," + b_sum) + "," + a + "," + b + "}", data));
  EXPECT_TRUE(load_safetensors(path("ok.safetensors")).checksums_verified);

  expect_corrupt(image("{" + meta(meta_sum + "," + a_sum) + "," + a + "," + b + "}", data),
                 "tensor 'b' has no 'checksum/b' entry though the file holds checksums");
  expect_corrupt(image("{" + meta(a_sum + "," + b_sum) + "," + a + "," + b + "}", data),
                 "holds tensor checksums but no 'checksum/__metadata__' entry");
  expect_corrupt(image("{" + meta(meta_sum + "," + a_sum + "," + b_sum + ",\"checksum/c\":\"crc32:00000000\"") + "," +
                           a + "," + b + "}",
                       data),
                 "checksum entry 'checksum/c' names no tensor in the file");
  expect_corrupt(image("{" + meta(meta_sum + "," + a_sum + ",\"checksum/b\":\"crc32:xyz\"") + "," + a + "," + b + "}", data),
                 "entry 'checksum/b' holds 'crc32:xyz', expected crc32: and 8 hex digits");
  expect_corrupt(image("{" + meta(meta_sum + "," + a_sum + ",\"checksum/b\":\"md5:0123456789\"") + "," + a + "," + b + "}", data),
                 "expected crc32: and 8 hex digits");
}

// A truncated file, and one whose header claims more bytes than the file holds, are refused before any tensor is
// allocated, naming the file and the tensor.
TEST_F(Safetensors, TruncatedFilesAndSizesPastTheFileAreRefused) {
  const std::string p = path("model.safetensors");
  save_safetensors(p, {{"w", Tensor::full({1000}, DType::kFloat32, 0.5f)}, {"b", Tensor::zeros({10}, DType::kFloat32)}});
  const std::string bytes = read_bytes(p);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  for (size_t keep : {bytes.size() - 1, bytes.size() - 40, bytes.size() / 2, size_t{8} + header_size, size_t{20}, size_t{4}}) {
    const Error e = load_error(bytes.substr(0, keep));
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << keep << ": " << e.what();
  }
  expect_corrupt(bytes.substr(0, bytes.size() - 1), "tensor 'b': data_offsets [4000, 4040] run past the end of the data (4039 bytes)");
  // The header grown to claim a 100-million-element tensor: the file is 4 KB, so nothing that size is allocated.
  std::string claims = bytes;
  const auto at = claims.find("\"shape\":[1000],\"data_offsets\":[0,4000]");
  ASSERT_NE(at, std::string::npos);
  claims.replace(at, 38, "\"shape\":[1e8],\"data_offsets\":[0,4e8]  ");
  expect_corrupt(claims, "tensor 'w': data_offsets [0, 400000000] run past the end of the data");
}

// A save removes the temp files that killed saves of the same path left ("<path>.tmp.<pid>" of a process that no
// longer exists) and nothing else: not a live process's, not another path's, not a name without a pid.
TEST_F(Safetensors, SaveRemovesTempFilesOfProcessesThatNoLongerExist) {
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string p = path("model.safetensors");
  const std::string stale = p + ".tmp." + std::to_string(dead);
  const std::string live = p + ".tmp." + std::to_string(::getppid());
  const std::string other = path("other.safetensors.tmp." + std::to_string(dead));
  const std::string not_pid = p + ".tmp.12ab";
  for (const std::string& f : {stale, live, other, not_pid}) write_bytes(f, "partial");
  save_safetensors(p, {{"w", Tensor::from_floats({2}, {1, 2})}});
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(not_pid));
  EXPECT_TRUE(load_safetensors(p).checksums_verified);
}

// A save through a symbolic link writes the file it points to and keeps the link (rename over the link would
// replace the link with a regular file); a FIFO or directory at the path is refused and left as it was.
TEST_F(Safetensors, SaveFollowsLinksAndRefusesWhatIsNotARegularFile) {
  const std::string real = path("real.safetensors"), link = path("link.safetensors");
  fs::create_symlink("real.safetensors", link);  // relative, as `ln -s` makes them
  save_safetensors(link, {{"w", Tensor::from_floats({2}, {1, 2})}});
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(real)));
  EXPECT_EQ(load_safetensors(real).get("w").to_floats(), (std::vector<float>{1, 2}));
  const std::string fifo = path("fifo.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& p : {fifo, path("")}) {
    try {
      save_safetensors(p, {{"w", Tensor::from_floats({2}, {1, 2})}});
      ADD_FAILURE() << "saved over " << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIo);
      EXPECT_NE(e.message().find("not a regular file"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_directory(dir_));
}

// Loading a FIFO is refused at once instead of waiting for a writer. Should the load block, a thread opens the
// FIFO's write end after 3 s so the test ends (as a failure on the elapsed time) rather than hanging.
TEST_F(Safetensors, LoadingAFifoIsRefusedWithoutWaitingForAWriter) {
  const std::string fifo = path("fifo.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::atomic<bool> done{false};
  std::thread unblock([&] {
    for (int i = 0; i < 30 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!done) ::close(::open(fifo.c_str(), O_WRONLY));
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(load_safetensors(fifo), Error);
  done = true;
  unblock.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
}

// The float8 dtypes travel under the safetensors spec's tags, every code (NaNs included) bit for bit.
TEST_F(Safetensors, Float8TensorsRoundTripUnderTheirTags) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  const std::pair<DType, const char*> formats[] = {
      {DType::kFloat8E4M3FN, "F8_E4M3"}, {DType::kFloat8E5M2, "F8_E5M2"}, {DType::kFloat8E8M0FNU, "F8_E8M0"}};
  for (const auto& [dtype, tag] : formats) {
    Tensor t = Tensor::empty({16, 16}, dtype);
    for (int i = 0; i < 256; ++i) static_cast<uint8_t*>(t.raw())[i] = static_cast<uint8_t>(i);
    tensors.emplace_back(tag, t);
  }
  const std::string p = path("fp8.safetensors");
  save_safetensors(p, tensors);
  const std::string bytes = read_bytes(p);
  for (const auto& [dtype, tag] : formats)
    EXPECT_NE(bytes.find(std::string("\"") + tag + "\""), std::string::npos) << tag;
  const SafetensorsFile file = load_safetensors(p);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_TRUE(same_bytes(file.tensors[i].second, tensors[i].second));
}

// A header is charged at ten times its text (what parsing it takes) before it is read: the issue's 96 MB header of
// 1.38 million tiny tensors took 1.4 GB; here a small budget stands in for a small machine.
TEST_F(Safetensors, AHeaderPastTheInputBudgetIsRefusedBeforeItIsRead) {
  std::string header = "{";
  for (int i = 0; i < 5000; ++i)
    header += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[" +
              std::to_string(i) + "," + std::to_string(i + 1) + "]}";
  header += "}";
  std::string bytes(8, '\0');
  for (int b = 0; b < 8; ++b) bytes[b] = static_cast<char>((header.size() >> (8 * b)) & 0xFF);
  bytes += header + std::string(5000, '\0');
  const std::string p = path("many.safetensors");
  write_bytes(p, bytes);
  EXPECT_EQ(load_safetensors(p).tensors.size(), 5000u);  // under the default budget it loads
  set_input_budget(int64_t{1} << 20);
  const Error e = load_error(bytes);
  set_input_budget(0);
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
  EXPECT_NE(e.message().find("-byte safetensors header, parsed, would take"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("more than the input budget of 1.0 MiB"), std::string::npos) << e.message();
}

}  // namespace
}  // namespace mixtrain
