#include "mixtrain/io/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "mixtrain/core/error.h"
#include "mixtrain/core/file_checks.h"
#include "mixtrain/core/input_budget.h"
#include "mixtrain/core/pending_temp_file.h"
#include "mixtrain/core/json.h"

namespace mixtrain {

// Tensor bytes are written and read as they lie in memory; the format stores them little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kChecksumPrefix = "checksum/";
constexpr const char* kCorruptHint = "the file is truncated or corrupt, or is not a safetensors file";
constexpr const char* kChangedHint =
    "the file was damaged or edited after it was saved; use another copy or an earlier checkpoint";

std::string errno_text() { return std::strerror(errno); }

bool has_prefix(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

uint32_t crc32_of(const void* data, size_t bytes, uint32_t crc = 0) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), bytes));
}

// "crc32:0a1b2c3d": the algorithm travels with the value so another one can be added without a format change.
std::string checksum_text(uint32_t crc) {
  char text[16];
  std::snprintf(text, sizeof text, "crc32:%08x", crc);
  return text;
}

// The checksum that covers the metadata: every non-checksum entry as key NUL value NUL, in key order (the order a
// std::map and the written header both use), so a changed digit in, say, the saved epoch is caught too.
uint32_t metadata_crc(const std::map<std::string, std::string>& metadata) {
  uint32_t crc = 0;
  for (const auto& [key, value] : metadata) {
    if (has_prefix(key, kChecksumPrefix)) continue;
    crc = crc32_of(key.data(), key.size() + 1, crc);  // c_str() keeps a NUL after the last character
    crc = crc32_of(value.data(), value.size() + 1, crc);
  }
  return crc;
}

// Removes "<path>.tmp.<pid>" files that a process which no longer exists left behind (killed during a save):
// kill(pid, 0) failing with ESRCH says no such process. A live process's file (even another user's: EPERM) is
// left alone. Best effort: a failure here must not stop the save.
void remove_stale_temp_files(const std::string& path, const std::string& directory) {
  const auto slash = path.rfind('/');
  const std::string prefix = (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.";
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) return;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string_view name = entry->d_name;
    if (!has_prefix(name, prefix)) continue;
    const std::string_view digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string_view::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(std::string(digits)));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    ::unlinkat(::dirfd(dir), entry->d_name, 0);
  }
  ::closedir(dir);
}

// Closes a descriptor on scope exit unless released.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  int get() const { return fd_; }
  // Closes now so the caller can see the error (a failed close can mean lost data on some filesystems).
  int close_now() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t chunk = std::min<size_t>(bytes, size_t{1} << 30);
    const ssize_t n = ::write(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      MIXTRAIN_FAIL(kIo, "cannot write '" << path << "': " << errno_text(),
                    "check free disk space and write permission");
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void read_all(int fd, void* data, size_t bytes, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const size_t chunk = std::min<size_t>(bytes, size_t{1} << 30);
    const ssize_t n = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      MIXTRAIN_FAIL(kIo, "cannot read '" << path << "': " << errno_text(), "");
    }
    if (n == 0) MIXTRAIN_FAIL(kIo, "'" << path << "' ended early while reading (was it modified during the load?)", "");
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

// The directory holding path, so a rename into it can be made durable.
std::string parent_directory(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// dense[i] is tensors[i] made contiguous (what is written and checksummed).
Json header_for(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                const std::vector<Tensor>& dense, const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  std::map<std::string, std::string> meta_out;
  for (const auto& [key, value] : metadata) {
    MIXTRAIN_CHECK(is_valid_utf8(key) && is_valid_utf8(value),
                   "save_safetensors('" << path << "'): metadata entry '" << key << "' is not valid UTF-8");
    MIXTRAIN_CHECK(!has_prefix(key, kChecksumPrefix), "save_safetensors('" << path << "'): metadata key '" << key
                                                                          << "' uses the reserved prefix '"
                                                                          << kChecksumPrefix << "'");
    meta_out.emplace(key, value);
  }
  meta_out.emplace(std::string(kChecksumPrefix) + kMetadataKey, checksum_text(metadata_crc(metadata)));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!dense[i].defined()) continue;  // refused below, with the tensor's name
    // Names that repeat are refused below too; emplace keeps the first meanwhile.
    meta_out.emplace(std::string(kChecksumPrefix) + tensors[i].first,
                     checksum_text(crc32_of(dense[i].raw(), dense[i].nbytes())));
  }
  Json& meta = header[kMetadataKey];
  meta = Json::object();
  for (const auto& [key, value] : meta_out) meta.as_object().emplace_back(key, value);

  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    MIXTRAIN_CHECK(name != kMetadataKey,
                   "save_safetensors('" << path << "'): '" << kMetadataKey << "' is reserved and cannot name a tensor");
    MIXTRAIN_CHECK(names.insert(name).second,
                   "save_safetensors('" << path << "'): tensor name '" << name << "' appears twice");
    MIXTRAIN_CHECK(is_valid_utf8(name), "save_safetensors('" << path << "'): tensor name '" << name
                                                             << "' is not valid UTF-8");
    MIXTRAIN_CHECK(tensor.defined(), "save_safetensors('" << path << "'): tensor '" << name << "' is undefined");
    Json shape = Json::array();
    for (int64_t d : tensor.shape().dims()) shape.push_back(d);
    const uint64_t end = offset + tensor.nbytes();
    // Names were checked unique above, so append directly instead of a linear lookup per tensor.
    header.as_object().emplace_back(
        name, Json::object({{"dtype", traits(tensor.dtype()).safetensors},
                            {"shape", std::move(shape)},
                            {"data_offsets", Json::array({offset, end})}}));
    offset = end;
  }
  return header;
}

// Reads a non-negative integer field of a tensor entry, with the file and tensor in the message.
int64_t read_count(const Json& value, const std::string& path, const std::string& name, const char* field) {
  const double x = value.is_number() ? value.as_number() : -1;
  if (!(x >= 0 && x <= 9007199254740992.0 && x == std::floor(x))) {  // integers are exact up to 2^53
    MIXTRAIN_FAIL(kInvalidInput,
                  "'" << path << "': tensor '" << name << "': " << field << " holds " << value.dump()
                      << ", expected a non-negative integer",
                  kCorruptHint);
  }
  return value.as_int64();
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

Entry parse_entry(const std::string& path, const std::string& name, const Json& info) {
  const auto fail_field = [&](const std::string& what) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': tensor '" << name << "': " << what, kCorruptHint);
  };
  if (!info.is_object()) fail_field(std::string("entry is ") + info.type_name() + ", expected an object");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!info.contains(field)) fail_field(std::string("entry has no \"") + field + "\" field");

  Entry e;
  e.name = name;
  const Json& dtype = info.at("dtype");
  if (!dtype.is_string()) fail_field("dtype is " + dtype.dump() + ", expected a string");
  bool known = false;
  for (int i = 0; i < kNumDTypes && !known; ++i) {
    if (dtype.as_string() == traits(static_cast<DType>(i)).safetensors) {
      e.dtype = static_cast<DType>(i);
      known = true;
    }
  }
  if (!known) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': tensor '" << name << "' has unsupported dtype '" << dtype.as_string() << "'",
                  "mixtrain reads F32, F16, BF16, I32, I64, U8, F8_E4M3, F8_E5M2 and F8_E8M0 tensors");
  }

  const Json& shape = info.at("shape");
  if (!shape.is_array()) fail_field("shape is " + shape.dump() + ", expected an array");
  if (shape.size() > static_cast<size_t>(kMaxRank))
    fail_field("shape " + shape.dump() + " has rank " + std::to_string(shape.size()) + "; mixtrain tensors have at most " +
               std::to_string(kMaxRank) + " dimensions");
  std::vector<int64_t> dims;
  // The product of the non-zero dimensions must fit too: a zero makes the tensor empty, but the strides of
  // [0, 2^40, 2^40] would still overflow int64.
  int64_t nonzero_product = 1;
  bool empty = false;
  for (const Json& d : shape.as_array()) {
    dims.push_back(read_count(d, path, name, "shape"));
    empty = empty || dims.back() == 0;
    if (dims.back() != 0 && __builtin_mul_overflow(nonzero_product, dims.back(), &nonzero_product))
      fail_field("shape " + shape.dump() + " has more elements than fit in 64 bits" + (empty ? " (leaving out the zeros)" : ""));
  }
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(nonzero_product, static_cast<int64_t>(dtype_size(e.dtype)), &nbytes))
    fail_field("shape " + shape.dump() + " needs more bytes than fit in 64 bits" + (empty ? " (leaving out the zeros)" : ""));
  if (empty) nbytes = 0;
  e.shape = Shape(std::move(dims));

  const Json& offsets = info.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) fail_field("data_offsets is " + offsets.dump() + ", expected [begin, end]");
  e.begin = static_cast<uint64_t>(read_count(offsets.at(size_t{0}), path, name, "data_offsets"));
  e.end = static_cast<uint64_t>(read_count(offsets.at(size_t{1}), path, name, "data_offsets"));
  std::ostringstream range_text;
  range_text << '[' << e.begin << ", " << e.end << ']';
  const std::string range = range_text.str();
  if (e.end < e.begin) fail_field("data_offsets " + range + " end before they begin");
  if (e.end - e.begin != static_cast<uint64_t>(nbytes)) {
    fail_field("data_offsets " + range + " span " + std::to_string(e.end - e.begin) + " bytes, but " +
               dtype.as_string() + " with shape " + e.shape.to_string() + " needs " + std::to_string(nbytes));
  }
  return e;
}

// Parses "crc32:" followed by 8 hex digits.
bool parse_checksum(const std::string& text, uint32_t* out) {
  if (text.size() != 14 || !has_prefix(text, "crc32:")) return false;
  uint32_t v = 0;
  for (char c : text.substr(6)) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return false;
    v = (v << 4) | static_cast<uint32_t>(digit);
  }
  *out = v;
  return true;
}

// Removes the checksum entries from metadata and returns them by tensor name, after checking they are complete
// (one per tensor, none for a tensor the file lacks) and that the metadata checksum matches. Empty when the file
// holds no checksum entries (written by an older mixtrain or another tool).
std::map<std::string, uint32_t> take_checksums(const std::string& path, const std::vector<Entry>& entries,
                                              std::map<std::string, std::string>& metadata) {
  std::map<std::string, uint32_t> sums;
  for (auto it = metadata.begin(); it != metadata.end();) {
    if (!has_prefix(it->first, kChecksumPrefix)) {
      ++it;
      continue;
    }
    uint32_t crc = 0;
    if (!parse_checksum(it->second, &crc)) {
      MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': " << kMetadataKey << " entry '" << it->first << "' holds '"
                                       << it->second << "', expected crc32: and 8 hex digits",
                    kChangedHint);
    }
    sums.emplace(it->first.substr(std::string_view(kChecksumPrefix).size()), crc);
    it = metadata.erase(it);
  }
  if (sums.empty()) return sums;

  const auto meta_sum = sums.find(kMetadataKey);
  if (meta_sum == sums.end()) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': the file holds tensor checksums but no '" << kChecksumPrefix
                                     << kMetadataKey << "' entry",
                  kChangedHint);
  }
  const uint32_t actual = metadata_crc(metadata);
  if (actual != meta_sum->second) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': " << kMetadataKey << " fails its checksum: the header records "
                                     << checksum_text(meta_sum->second) << ", its entries give "
                                     << checksum_text(actual) << " (an entry was changed after the file was saved)",
                  kChangedHint);
  }
  sums.erase(meta_sum);
  std::set<std::string> names;
  for (const Entry& e : entries) {
    names.insert(e.name);
    if (!sums.count(e.name)) {
      MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': tensor '" << e.name << "' has no '" << kChecksumPrefix << e.name
                                       << "' entry though the file holds checksums",
                    kChangedHint);
    }
  }
  for (const auto& [name, crc] : sums) {
    if (!names.count(name)) {
      MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': checksum entry '" << kChecksumPrefix << name
                                       << "' names no tensor in the file",
                    kChangedHint);
    }
  }
  return sums;
}

// The size of the open file fd, which must be a regular file.
uint64_t regular_file_size(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) MIXTRAIN_FAIL(kIo, "cannot stat '" << path << "': " << errno_text(), "");
  if (!S_ISREG(st.st_mode))
    MIXTRAIN_FAIL(kIo, "'" << path << "' is not a regular file (" << (S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory" : "a device or other special file") << ")", "pass a .safetensors file");
  return static_cast<uint64_t>(st.st_size);
}

// The JSON header of the open file fd (file_size bytes): its 8-byte little-endian length, checked against the limit
// and the file's size before the header is read, then the header itself, which must be a JSON object. Sets
// *header_size to the header's length.
constexpr int64_t kParsedHeaderExpansion = 10;

Json read_header(int fd, const std::string& path, uint64_t file_size, uint64_t* header_size) {
  if (file_size < 8) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "' is too short (" << file_size
                                     << " bytes) to hold the 8-byte safetensors header length",
                  kCorruptHint);
  }
  unsigned char length[8];
  read_all(fd, length, sizeof length, 0, path);
  uint64_t size = 0;
  for (int i = 7; i >= 0; --i) size = (size << 8) | length[i];
  if (size > kMaxSafetensorsHeaderBytes) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': header length " << size << " exceeds the limit of "
                                     << kMaxSafetensorsHeaderBytes << " bytes",
                  kCorruptHint);
  }
  if (size > file_size - 8) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': header length " << size << " runs past the end of the file ("
                                     << file_size << " bytes)",
                  kCorruptHint);
  }
  // A parsed JSON header takes about ten times its text (measured: a 96 MB header of 1.38 million tiny tensors
  // peaked at 986 MB); checked before the text is read, so a header of millions of entries is refused at once.
  check_input_budget(path, "its " + std::to_string(size) + "-byte safetensors header, parsed,",
                     static_cast<int64_t>(size) * kParsedHeaderExpansion);
  std::string text(size, '\0');
  read_all(fd, text.data(), text.size(), 8, path);
  Json header = Json::parse(text, "'" + path + "' (safetensors header)");
  if (!header.is_object()) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': safetensors header is " << header.type_name() << ", expected an object",
                  kCorruptHint);
  }
  *header_size = size;
  return header;
}

// The header's tensor entries, in the header's order; its metadata (every value a string) goes to metadata.
std::vector<Entry> parse_header(const std::string& path, const Json& header,
                                std::map<std::string, std::string>& metadata) {
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.as_object()) {
    if (key != kMetadataKey) {
      entries.push_back(parse_entry(path, key, value));
      continue;
    }
    if (!value.is_object())
      MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': " << kMetadataKey << " is " << value.type_name() << ", expected an object", kCorruptHint);
    for (const auto& [mk, mv] : value.as_object()) {
      if (!mv.is_string()) {
        MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': " << kMetadataKey << " entry '" << mk << "' is " << mv.type_name()
                                         << ", expected a string",
                      kCorruptHint);
      }
      metadata[mk] = mv.as_string();
    }
  }
  return entries;
}

// The data block (data_size bytes) must be tiled exactly, as the reference implementation requires: no byte
// belongs to two tensors, none to no tensor.
void check_tiling(const std::string& path, const std::vector<Entry>& entries, uint64_t data_size) {
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) {
    if (e.end > data_size) {
      MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': tensor '" << e.name << "': data_offsets [" << e.begin << ", " << e.end
                                       << "] run past the end of the data (" << data_size << " bytes)",
                    kCorruptHint);
    }
    by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : by_offset) {
    if (e->begin < cursor) {
      MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': tensors '" << previous->name << "' and '" << e->name
                                       << "' overlap (bytes [" << e->begin << ", " << std::min(cursor, e->end) << "))",
                    kCorruptHint);
    }
    if (e->begin > cursor) {
      MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': bytes [" << cursor << ", " << e->begin
                                       << ") of the data belong to no tensor",
                    kCorruptHint);
    }
    cursor = e->end;
    previous = e;
  }
  if (cursor != data_size) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': " << (data_size - cursor) << " bytes after the last tensor belong to no tensor",
                  kCorruptHint);
  }
}

// Tensor name's bytes, read into t, against the checksum the header records for them.
void check_tensor_checksum(const std::string& path, const std::string& name, const Tensor& t, uint32_t stored) {
  const uint32_t actual = crc32_of(t.raw(), t.nbytes());
  if (actual != stored) {
    MIXTRAIN_FAIL(kInvalidInput,
                  "'" << path << "': tensor '" << name << "' fails its checksum: the header records "
                      << checksum_text(stored) << ", its " << t.nbytes() << " bytes give " << checksum_text(actual),
                  kChangedHint);
  }
}

}  // namespace

const Tensor& SafetensorsFile::get(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  std::string names;
  for (size_t i = 0; i < tensors.size() && i < 10; ++i) names += (i ? ", " : "") + tensors[i].first;
  if (tensors.size() > 10) names += ", ... (" + std::to_string(tensors.size()) + " in all)";
  MIXTRAIN_FAIL(kInvalidInput, "tensor '" << name << "' not found in '" << path << "'",
                tensors.empty() ? std::string("the file holds no tensors") : "the file holds: " + names);
}

bool SafetensorsFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& entry) { return entry.first == name; });
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Everything that can be checked is checked before a file is touched. Tensors already contiguous (arena
  // views included) are used in place; others are copied once, for the checksum and the write.
  std::vector<Tensor> dense;
  dense.reserve(tensors.size());
  for (const auto& entry : tensors) dense.push_back(entry.second.contiguous());
  std::string header = header_for(path, tensors, dense, metadata).dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));

  // The temporary file goes beside the file a symbolic link points to, so the rename replaces that file and the
  // link stays; a FIFO, device or directory at path is refused rather than replaced.
  const std::string target = output_file_target(path, "safetensors file");
  const std::string directory = parent_directory(target);
  remove_stale_temp_files(target, directory);
  const std::string tmp = target + ".tmp." + std::to_string(::getpid());
  // Recorded before it exists, so a signal that ends the process during the save can remove it.
  const PendingTempFile pending(tmp);
  FileDescriptor fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
  if (fd.get() < 0) {
    MIXTRAIN_FAIL(kIo, "cannot create '" << tmp << "' to save '" << path << "': " << errno_text(),
                  "check that the directory exists and is writable");
  }
  try {
    write_all(fd.get(), length, sizeof length, tmp);
    write_all(fd.get(), header.data(), header.size(), tmp);
    for (const Tensor& t : dense) write_all(fd.get(), t.raw(), t.nbytes(), tmp);
    if (::fsync(fd.get()) != 0) MIXTRAIN_FAIL(kIo, "cannot flush '" << tmp << "' to disk: " << errno_text(), "");
    if (fd.close_now() != 0) MIXTRAIN_FAIL(kIo, "cannot close '" << tmp << "': " << errno_text(), "");
    if (::rename(tmp.c_str(), target.c_str()) != 0)
      MIXTRAIN_FAIL(kIo, "cannot rename '" << tmp << "' to '" << path << "': " << errno_text(), "");
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Makes the rename itself survive a power loss; the data is already safe, so failure here is ignored.
  const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

namespace {

// Opens path (O_NONBLOCK: opening a FIFO returns at once, without it it waits for a writer forever, so the check
// of the file's type refuses it; reads of a regular file never block either way) and reads and checks its header.
struct OpenedFile {
  FileDescriptor fd;
  uint64_t header_size = 0;
  std::vector<Entry> entries;
  std::map<std::string, uint32_t> checksums;  // by tensor name; empty for a file without
};

OpenedFile open_safetensors(const std::string& path, SafetensorsFile& file) {
  OpenedFile f{FileDescriptor(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)), 0, {}, {}};
  if (f.fd.get() < 0) MIXTRAIN_FAIL(kIo, "cannot open safetensors file '" << path << "': " << errno_text(), "check the path");
  const uint64_t file_size = regular_file_size(f.fd.get(), path);
  const Json header = read_header(f.fd.get(), path, file_size, &f.header_size);
  file.path = path;
  f.entries = parse_header(path, header, file.metadata);
  check_tiling(path, f.entries, file_size - 8 - f.header_size);
  f.checksums = take_checksums(path, f.entries, file.metadata);
  file.checksums_verified = !f.checksums.empty();
  return f;
}

}  // namespace

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  SafetensorsFile file;
  open_safetensors(path, file);
  return std::move(file.metadata);
}

SafetensorsFile load_safetensors(const std::string& path) {
  SafetensorsFile file;
  const OpenedFile opened = open_safetensors(path, file);
  const FileDescriptor& fd = opened.fd;
  const uint64_t header_size = opened.header_size;
  const std::vector<Entry>& entries = opened.entries;
  const std::map<std::string, uint32_t>& checksums = opened.checksums;

  file.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    read_all(fd.get(), t.raw(), t.nbytes(), 8 + header_size + e.begin, path);
    if (file.checksums_verified) check_tensor_checksum(path, e.name, t, checksums.at(e.name));
    file.tensors.emplace_back(e.name, std::move(t));
  }
  return file;
}

}  // namespace mixtrain
