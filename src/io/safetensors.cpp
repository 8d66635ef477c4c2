#include "mixtrain/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>
#include <sstream>

#include "mixtrain/core/error.h"
#include "mixtrain/core/json.h"

namespace mixtrain {

// Tensor bytes are written and read as they lie in memory; the format stores them little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kCorruptHint = "the file is truncated or corrupt, or is not a safetensors file";

std::string errno_text() { return std::strerror(errno); }

// Closes a descriptor on scope exit unless released.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
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

Json header_for(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json& meta = header[kMetadataKey];
    meta = Json::object();
    for (const auto& [key, value] : metadata) {
      MIXTRAIN_CHECK(is_valid_utf8(key) && is_valid_utf8(value),
                     "save_safetensors('" << path << "'): metadata entry '" << key << "' is not valid UTF-8");
      meta.as_object().emplace_back(key, value);
    }
  }
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
                  "mixtrain reads F32, F16, BF16, I32, I64 and U8 tensors");
  }

  const Json& shape = info.at("shape");
  if (!shape.is_array()) fail_field("shape is " + shape.dump() + ", expected an array");
  std::vector<int64_t> dims;
  int64_t numel = 1;
  for (const Json& d : shape.as_array()) {
    dims.push_back(read_count(d, path, name, "shape"));
    if (__builtin_mul_overflow(numel, dims.back(), &numel)) fail_field("shape " + shape.dump() + " has more elements than fit in 64 bits");
  }
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(dtype_size(e.dtype)), &nbytes))
    fail_field("shape " + shape.dump() + " needs more bytes than fit in 64 bits");
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
  // Everything that can be checked is checked before a file is touched.
  std::string header = header_for(path, tensors, metadata).dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FileDescriptor fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
  if (fd.get() < 0) {
    MIXTRAIN_FAIL(kIo, "cannot create '" << tmp << "' to save '" << path << "': " << errno_text(),
                  "check that the directory exists and is writable");
  }
  try {
    write_all(fd.get(), length, sizeof length, tmp);
    write_all(fd.get(), header.data(), header.size(), tmp);
    for (const auto& entry : tensors) {
      const Tensor dense = entry.second.contiguous();  // views (e.g. into a parameter arena) write their own elements
      write_all(fd.get(), dense.raw(), dense.nbytes(), tmp);
    }
    if (::fsync(fd.get()) != 0) MIXTRAIN_FAIL(kIo, "cannot flush '" << tmp << "' to disk: " << errno_text(), "");
    if (fd.close_now() != 0) MIXTRAIN_FAIL(kIo, "cannot close '" << tmp << "': " << errno_text(), "");
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      MIXTRAIN_FAIL(kIo, "cannot rename '" << tmp << "' to '" << path << "': " << errno_text(), "");
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Makes the rename itself survive a power loss; the data is already safe, so failure here is ignored.
  const int dir = ::open(parent_directory(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

SafetensorsFile load_safetensors(const std::string& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) MIXTRAIN_FAIL(kIo, "cannot open safetensors file '" << path << "': " << errno_text(), "check the path");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) MIXTRAIN_FAIL(kIo, "cannot stat '" << path << "': " << errno_text(), "");
  if (!S_ISREG(st.st_mode)) MIXTRAIN_FAIL(kIo, "'" << path << "' is not a regular file", "pass a .safetensors file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);

  if (file_size < 8) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "' is too short (" << file_size
                                     << " bytes) to hold the 8-byte safetensors header length",
                  kCorruptHint);
  }
  unsigned char length[8];
  read_all(fd.get(), length, sizeof length, 0, path);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length[i];
  if (header_size > kMaxSafetensorsHeaderBytes) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': header length " << header_size << " exceeds the limit of "
                                     << kMaxSafetensorsHeaderBytes << " bytes",
                  kCorruptHint);
  }
  if (header_size > file_size - 8) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': header length " << header_size << " runs past the end of the file ("
                                     << file_size << " bytes)",
                  kCorruptHint);
  }
  std::string text(header_size, '\0');
  read_all(fd.get(), text.data(), text.size(), 8, path);
  const Json header = Json::parse(text, "'" + path + "' (safetensors header)");
  if (!header.is_object()) {
    MIXTRAIN_FAIL(kInvalidInput, "'" << path << "': safetensors header is " << header.type_name() << ", expected an object",
                  kCorruptHint);
  }

  SafetensorsFile file;
  file.path = path;
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
      file.metadata[mk] = mv.as_string();
    }
  }

  // The data block must be tiled exactly, as the reference implementation requires: no byte belongs to
  // two tensors, none to no tensor.
  const uint64_t data_size = file_size - 8 - header_size;
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

  file.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    read_all(fd.get(), t.raw(), t.nbytes(), 8 + header_size + e.begin, path);
    file.tensors.emplace_back(e.name, std::move(t));
  }
  return file;
}

}  // namespace mixtrain
