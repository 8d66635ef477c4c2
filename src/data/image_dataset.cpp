#include "mixtrain/data/image_dataset.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <sstream>

#include "mixtrain/data/idx.h"

namespace fs = std::filesystem;

namespace mixtrain {

namespace {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
constexpr const char* kFashionMnistHint = "apt-get install dataset-fashion-mnist";

bool ends_with_gz(const std::string& name) { return name.size() > 3 && name.compare(name.size() - 3, 3, ".gz") == 0; }

// Replaces the first `from` in s; false when s does not contain it.
bool replace_first(std::string& s, const std::string& from, const std::string& to) {
  const auto pos = s.find(from);
  if (pos == std::string::npos) return false;
  s.replace(pos, from.size(), to);
  return true;
}

// Turns file names into full paths beside `dir`, each with its .gz form: the name's own compression first.
std::vector<std::string> with_gz_variants(const fs::path& dir, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& name : names) {
    const bool gz = ends_with_gz(name);
    const std::string stem = gz ? name.substr(0, name.size() - 3) : name;
    for (const std::string& n : gz ? std::array{stem + ".gz", stem} : std::array{stem, stem + ".gz"}) {
      const std::string p = (dir / n).string();
      if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    }
  }
  return out;
}

const std::string* first_existing(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return &p;
  }
  return nullptr;
}

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const std::string& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

std::string find_labels(const std::string& images_path) {
  const std::vector<std::string> candidates = label_path_candidates(images_path);
  if (candidates.empty())
    MIXTRAIN_FAIL(
        kInvalidInput,
        "cannot tell which labels file belongs to '" << images_path << "': its name does not contain \"images\"",
        "name the files like train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz");
  const std::string* found = first_existing(candidates);
  if (!found)
    MIXTRAIN_FAIL(kIo, "no labels file found for '" << images_path << "'; looked for " << join(candidates),
                  "put the labels file beside the images file under one of those names");
  return *found;
}

int32_t max_label(const Dataset& d) {
  const int32_t* y = d.y.data<int32_t>();
  return d.size() ? *std::max_element(y, y + d.size()) : -1;
}

// Reads an images file and its labels file into a Dataset. The images file's header comes first (a mistaken
// images file is reported as such), then the labels (one byte per sample), and the counts are compared before
// the images' data is read: a header declaring more images than there are labels is refused before it can make
// the reader inflate its data.
Dataset read_labelled_images(const std::string& images_path, const std::string& labels_path) {
  const Shape declared = read_idx_shape(images_path, 3);  // (N, H, W)
  const Tensor labels = read_idx(labels_path, 1);         // (N,) uint8
  const int64_t n = declared[0];
  if (labels.dim(0) != n)
    MIXTRAIN_FAIL(kInvalidInput,
                  "image file '" << images_path << "' holds " << n << " images but label file '" << labels_path
                                 << "' holds " << labels.dim(0) << " labels",
                  "use the labels file that belongs to this images file");
  const Tensor images = read_idx(images_path, 3);
  if (n == 0 || images.dim(1) == 0 || images.dim(2) == 0)
    MIXTRAIN_FAIL(kInvalidInput, "image file '" << images_path << "' is empty: shape " << images.shape(),
                  "pass a file with at least one image");

  const int64_t features = images.dim(1) * images.dim(2);
  Dataset d;
  d.x = Tensor::empty({n, features}, DType::kFloat32);  // (N, H*W)
  d.y = Tensor::empty({n}, DType::kInt32);              // (N,)
  std::array<float, 256> scaled;
  for (int v = 0; v < 256; ++v) scaled[v] = static_cast<float>(v) / 255.0f;
  const uint8_t* src = images.data<uint8_t>();
  float* x = d.x.data<float>();
  for (int64_t i = 0; i < n * features; ++i) x[i] = scaled[src[i]];
  const uint8_t* lab = labels.data<uint8_t>();
  int32_t* y = d.y.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) y[i] = lab[i];
  d.sample_shape = {images.dim(1), images.dim(2)};
  d.source = images_path;
  d.num_classes = max_label(d) + 1;
  return d;
}

}  // namespace

std::vector<std::string> label_path_candidates(const std::string& images_path) {
  const fs::path path(images_path);
  const std::string name = path.filename().string();
  std::vector<std::string> names;
  auto add = [&names](const std::string& n) {
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  };
  if (std::string n = name; replace_first(n, "images-idx3", "labels-idx1")) add(n);
  if (std::string n = name; replace_first(n, "-images.", "-labels.")) {
    replace_first(n, "idx3", "idx1");
    add(n);
  }
  if (std::string n = name; replace_first(n, "images", "labels")) {
    replace_first(n, "idx3", "idx1");
    add(n);
  }
  return with_gz_variants(path.parent_path(), names);
}

std::vector<std::string> test_path_candidates(const std::string& images_path) {
  const fs::path path(images_path);
  const std::string name = path.filename().string();
  std::vector<std::string> names;
  for (const char* prefix : {"t10k", "test"})
    if (std::string n = name; replace_first(n, "train", prefix)) names.push_back(n);
  return with_gz_variants(path.parent_path(), names);
}

Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path) {
  return read_labelled_images(images_path, labels_path);
}

DataSplits load_idx_dataset(const std::string& images_path, double holdout_fraction, uint64_t seed) {
  DataSplits splits;
  // The images header first, so a missing or mistaken images file is reported as such rather than as missing
  // labels.
  read_idx_shape(images_path, 3);
  splits.train = read_labelled_images(images_path, find_labels(images_path));

  std::vector<std::string> test_candidates = test_path_candidates(images_path);
  std::erase(test_candidates, images_path);
  if (const std::string* test_images = first_existing(test_candidates)) {
    read_idx_shape(*test_images, 3);
    splits.test = read_labelled_images(*test_images, find_labels(*test_images));
    if (splits.test.sample_shape != splits.train.sample_shape)
      MIXTRAIN_FAIL(kInvalidInput,
                    "test images '" << *test_images << "' are " << Shape(splits.test.sample_shape)
                                    << " but training images '" << images_path << "' are "
                                    << Shape(splits.train.sample_shape),
                    "use test and training files of the same data set");
    splits.test_from_files = true;
    const int64_t classes = std::max(max_label(splits.train), max_label(splits.test)) + 1;
    splits.train.num_classes = classes;
    splits.test.num_classes = classes;
  } else {
    auto [train, test] = split_holdout(splits.train, holdout_fraction, seed);
    splits.train = std::move(train);
    splits.test = std::move(test);
    splits.test_from_files = false;
  }
  return splits;
}

std::string fashion_mnist_dir() { return kFashionMnistDir; }

DataSplits load_fashion_mnist(const std::string& dir_name) {
  const fs::path dir(dir_name);
  std::vector<std::string> missing;
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                           "t10k-labels-idx1-ubyte.gz"}) {
    std::error_code ec;
    if (!fs::is_regular_file(dir / name, ec)) missing.push_back((dir / name).string());
  }
  if (!missing.empty())
    MIXTRAIN_FAIL(kIo, "Fashion-MNIST is not installed: missing " << join(missing), kFashionMnistHint);
  // The package ships a test set, so the holdout fraction is never used.
  return load_idx_dataset((dir / "train-images-idx3-ubyte.gz").string(), 0.1, 0);
}

}  // namespace mixtrain
