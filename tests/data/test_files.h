// Helpers for the data tests: a scratch directory, IDX and text file writers, and error capture.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "mixtrain/core/error.h"

namespace mixtrain::testing {

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto ticks = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = std::filesystem::temp_directory_path() / ("mixtrain_data_test_" + std::to_string(::getpid()) + "_" +
                                                      std::to_string(ticks) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Full path of a file inside the directory.
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Writes bytes as they are, or gzip-compressed through zlib.
inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    if (!bytes.empty()) {
      ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
    }
    ASSERT_EQ(gzclose(f), Z_OK);
  } else {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good()) << path;
  }
}

// The bytes of an IDX file: magic (0, 0, type, rank), big-endian uint32 dims, then data.
inline std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data,
                                      uint8_t type = 0x08) {
  std::vector<uint8_t> b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int shift : {24, 16, 8, 0}) b.push_back(static_cast<uint8_t>(d >> shift));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

inline void write_idx(const std::string& path, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data,
                      bool gzip) {
  write_bytes(path, idx_bytes(dims, data), gzip);
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// Runs fn and returns the mixtrain::Error it throws; records a failure when it throws nothing.
template <typename Fn>
Error error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected mixtrain::Error, nothing was thrown";
  return Error(ErrorKind::kInternal, "", "", "");
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A FIFO at path fed by a thread that writes `content` to it as soon as a reader opens it, so a reader that
// opens FIFOs gets this content and returns (instead of blocking) and a test can see it was not refused. The
// writer polls with O_NONBLOCK, which fails with ENXIO while no reader is there; it stops at scope exit.
class FedFifo {
 public:
  FedFifo(std::string path, std::string content) : path_(std::move(path)), content_(std::move(content)) {
    if (::mkfifo(path_.c_str(), 0600) != 0) {
      ADD_FAILURE() << "mkfifo " << path_ << ": " << std::strerror(errno);
      return;
    }
    writer_ = std::thread([this] {
      while (!stop_) {
        const int fd = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        ::fcntl(fd, F_SETFL, 0);  // blocking writes from here on: the reader is there
        [[maybe_unused]] const ssize_t n = ::write(fd, content_.data(), content_.size());
        ::close(fd);
        return;
      }
    });
  }
  ~FedFifo() {
    stop_ = true;
    if (writer_.joinable()) writer_.join();
  }
  FedFifo(const FedFifo&) = delete;
  FedFifo& operator=(const FedFifo&) = delete;

 private:
  std::string path_;
  std::string content_;
  std::atomic<bool> stop_{false};
  std::thread writer_;
};

}  // namespace mixtrain::testing
