// Writes the seed corpus of every fuzz target into <dir>/<target>/ (fuzz/corpus/ in the repository): a few small,
// valid inputs and near-valid ones, so mutations start from files that reach the deep checks. Deterministic: the
// same build writes the same bytes. Run as `mixtrain_fuzz_seeds fuzz/corpus` after a change of the formats.
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_model.h"
#include "mixtrain/core/json.h"
#include "mixtrain/io/safetensors.h"
#include "mixtrain/train/callbacks.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/recovery.h"

namespace fs = std::filesystem;
using namespace mixtrain;

namespace {

fs::path g_root;

void write(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = g_root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

std::string idx(const std::vector<uint32_t>& dims, size_t data_bytes) {
  std::string b = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int shift : {24, 16, 8, 0}) b.push_back(static_cast<char>(d >> shift));
  for (size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<char>(i * 37));
  return b;
}

// A gzip stream as gzwrite produces it (mtime 0, so the bytes do not depend on when this runs).
std::string gzip(const std::string& data) {
  z_stream s{};
  deflateInit2(&s, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&s, data.size()) + 32, '\0');
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  s.avail_in = static_cast<uInt>(data.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  deflate(&s, Z_FINISH);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The file save_safetensors would write, without the checksum entries (as another tool or an older mixtrain
// writes it): mutations of its bytes reach the checks behind the checksums.
std::string without_checksums(const SafetensorsFile& f) {
  Json header = Json::object();
  Json meta = Json::object();
  for (const auto& [k, v] : f.metadata) meta[k] = v;
  if (!f.metadata.empty()) header["__metadata__"] = meta;
  std::string data;
  for (const auto& [name, t] : f.tensors) {
    Json shape = Json::array();
    for (int64_t d : t.shape().dims()) shape.push_back(d);
    const uint64_t begin = data.size();
    data.append(static_cast<const char*>(t.raw()), t.nbytes());
    header[name] = Json::object({{"dtype", traits(t.dtype()).safetensors},
                                 {"shape", shape},
                                 {"data_offsets", Json::array({begin, static_cast<uint64_t>(data.size())})}});
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  return out + text + data;
}

void idx_seeds() {
  write("idx", "images_2x3x3", idx({2, 3, 3}, 18));
  write("idx", "labels_5", idx({5}, 5));
  write("idx", "rank4_1x2x1x2", idx({1, 2, 1, 2}, 4));
  write("idx", "empty_0x28x28", idx({0, 28, 28}, 0));
  write("idx", "images_3x4x4.gz", gzip(idx({3, 4, 4}, 48)));
}

void csv_seeds() {
  write("csv", "plain.csv", "x1,x2,label\n0.5,1.5,0\n-2,3e-2,1\n4,5,2\n");
  write("csv", "quoted_crlf_bom.csv", "\xEF\xBB\xBF\"a,b\", c ,label\r\n\"1\",2,0\r\n\r\n 3 ,\"4\",1\r\n");
  write("csv", "signs_and_exponents.csv", "f,label\n+1.25e3,0\n-inf,1\n1e39,0\n");
  write("csv", "headerless.csv.gz", gzip("1,2,0\n3,4,1\n5,6,2\n"));
}

void text_seeds() {
  write("text", "ascii.txt", "the quick brown fox jumps over the lazy dog\n");
  write("text", "utf8.txt", "caf\xC3\xA9 na\xC3\xAFve \xE2\x82\xAC 5, \xF0\x9F\x98\x80 ok, \xC3\xA9t\xC3\xA9 \xE2\x82\xAC\xE2\x82\xAC\n");
  write("text", "short.txt", "abc");
}

void safetensors_seeds() {
  const fs::path tmp = g_root / "tmp.safetensors";
  save_safetensors(tmp.string(),
                   {{"w", Tensor::from_floats({2, 3}, {1, -2, 3.5f, 0, 1e-3f, -7})},
                    {"h", Tensor::from_floats({3}, {1, 2, 3}, DType::kFloat16)},
                    {"b", Tensor::from_floats({2}, {0.5f, -0.25f}, DType::kBFloat16)},
                    {"i", Tensor::from_ints({2, 2}, {1, -1, 7, 0})},
                    {"l", Tensor::from_int64s({1}, {1234567890123})},
                    {"u", Tensor::zeros({3}, DType::kUInt8)},
                    {"scalar", Tensor::from_floats({}, {42})},
                    {"empty", Tensor::zeros({0, 4}, DType::kFloat32)}},
                   {{"note", "seed"}});
  write("safetensors", "all_dtypes_checksummed.safetensors", read(tmp));
  write("safetensors", "all_dtypes_unchecked.safetensors", without_checksums(load_safetensors(tmp.string())));
  save_safetensors(tmp.string(), {});
  write("safetensors", "no_tensors.safetensors", read(tmp));
  fs::remove(tmp);
}

void checkpoint_seeds() {
  const fs::path tmp = g_root / "tmp.safetensors";
  auto model = fuzz::make_fuzz_model();
  // One step creates every optimizer slot and moves the loss scale's counters.
  model->train_step(Tensor::from_floats({4, 2}, {0.1f, 0.2f, -1, 1, 2, -0.5f, 0, 0.3f}), Tensor::from_ints({4}, {0, 1, 2, 1}));
  CheckpointInfo info;
  info.epoch = 1;
  info.config = "{\"model\":\"mlp\"}";
  save_checkpoint(tmp.string(), *model, info);
  write("checkpoint", "mlp_checksummed.safetensors", read(tmp));
  write("checkpoint", "mlp_unchecked.safetensors", without_checksums(load_safetensors(tmp.string())));
  // Saved during fit(): the fit state with the recovery ladder's and EarlyStopping's states, and the best
  // weights as callback/ tensors.
  auto fitted = fuzz::make_fuzz_model();
  EarlyStopping stopper("loss", 3, 0.0, /*restore_best_weights=*/true);
  CheckpointCallback saver(tmp.string());
  RecoveryGuard guard;
  FitOptions o;
  o.epochs = 1;
  o.batch_size = 2;
  o.verbose = 0;
  o.callbacks = {&stopper, &saver};
  o.recovery = &guard;
  fitted->fit(Tensor::from_floats({4, 2}, {0.1f, 0.2f, -1, 1, 2, -0.5f, 0, 0.3f}), Tensor::from_ints({4}, {0, 1, 2, 1}), o);
  write("checkpoint", "mlp_fit_state_callbacks.safetensors", read(tmp));
  fs::remove(tmp);
}

void args_seeds() {
  write("args", "numbers", "--epochs\n3\n--batch-size=64\n--seed\n18446744073709551615\n--lr\n1e-3\n");
  write("args", "lists", "--hidden\n256,128\n--hidden=+4,1\n--model\nmlp\n--recover\n");
  write("args", "bad", "--epochs\n-1\n--steps\n99999999999999999999\n--dropout\nnan\n--unknown\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus directory, e.g. fuzz/corpus>\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  try {
    idx_seeds();
    csv_seeds();
    text_seeds();
    safetensors_seeds();
    checkpoint_seeds();
    args_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
