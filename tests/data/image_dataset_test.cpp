#include "mixtrain/data/image_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "mixtrain/data/idx.h"
#include "test_files.h"

namespace mixtrain {
namespace {

using testing::contains;
using testing::error_of;
using testing::TempDir;
using testing::write_idx;

// Sample i of an (n, 2, 3) image file holds pixels 10*i + 0..5, so each row names its sample.
std::vector<uint8_t> tagged_pixels(uint32_t n) {
  std::vector<uint8_t> v;
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t k = 0; k < 6; ++k) v.push_back(static_cast<uint8_t>(10 * i + k));
  return v;
}

TEST(ImageDataset, LabelPathCandidates) {
  EXPECT_EQ(label_path_candidates("/d/train-images-idx3-ubyte.gz"),
            (std::vector<std::string>{"/d/train-labels-idx1-ubyte.gz", "/d/train-labels-idx1-ubyte"}));
  EXPECT_EQ(label_path_candidates("/d/train-images-idx3-ubyte"),
            (std::vector<std::string>{"/d/train-labels-idx1-ubyte", "/d/train-labels-idx1-ubyte.gz"}));
  EXPECT_EQ(label_path_candidates("/d/train-images.idx3-ubyte"),
            (std::vector<std::string>{"/d/train-labels.idx1-ubyte", "/d/train-labels.idx1-ubyte.gz"}));
  EXPECT_EQ(label_path_candidates("/images/x-images.bin"),
            (std::vector<std::string>{"/images/x-labels.bin", "/images/x-labels.bin.gz"}));
  EXPECT_EQ(label_path_candidates("relative-images-idx3"),
            (std::vector<std::string>{"relative-labels-idx1", "relative-labels-idx1.gz"}));
  EXPECT_TRUE(label_path_candidates("/images/pixels.bin").empty());
}

TEST(ImageDataset, TestPathCandidates) {
  EXPECT_EQ(test_path_candidates("/train/train-images-idx3-ubyte.gz"),
            (std::vector<std::string>{"/train/t10k-images-idx3-ubyte.gz", "/train/t10k-images-idx3-ubyte",
                                      "/train/test-images-idx3-ubyte.gz", "/train/test-images-idx3-ubyte"}));
  EXPECT_EQ(test_path_candidates("/d/emnist-digits-train-images-idx3-ubyte"),
            (std::vector<std::string>{
                "/d/emnist-digits-t10k-images-idx3-ubyte", "/d/emnist-digits-t10k-images-idx3-ubyte.gz",
                "/d/emnist-digits-test-images-idx3-ubyte", "/d/emnist-digits-test-images-idx3-ubyte.gz"}));
  EXPECT_TRUE(test_path_candidates("/train/images-idx3").empty());
}

TEST(ImageDataset, LoadsTrainAndTestFiles) {
  TempDir dir;
  write_idx(dir.file("train-images-idx3-ubyte.gz"), {5, 2, 3}, tagged_pixels(5), true);
  write_idx(dir.file("train-labels-idx1-ubyte"), {5}, {0, 2, 1, 2, 0}, false);  // plain beside gzip
  std::vector<uint8_t> test_pixels = tagged_pixels(3);
  test_pixels[0] = 255;
  write_idx(dir.file("t10k-images-idx3-ubyte"), {3, 2, 3}, test_pixels, false);
  write_idx(dir.file("t10k-labels-idx1-ubyte.gz"), {3}, {3, 0, 1}, true);

  const DataSplits s = load_idx_dataset(dir.file("train-images-idx3-ubyte.gz"), 0.5, 1);
  EXPECT_TRUE(s.test_from_files);
  EXPECT_EQ(s.train.x.shape(), (Shape{5, 6}));
  EXPECT_EQ(s.train.x.dtype(), DType::kFloat32);
  EXPECT_EQ(s.train.y.to_ints(), (std::vector<int32_t>{0, 2, 1, 2, 0}));
  EXPECT_EQ(s.train.y.dtype(), DType::kInt32);
  EXPECT_EQ(s.test.x.shape(), (Shape{3, 6}));
  EXPECT_EQ(s.test.y.to_ints(), (std::vector<int32_t>{3, 0, 1}));
  // Label 3 appears only in the test file, yet both splits must agree on the class count.
  EXPECT_EQ(s.train.num_classes, 4);
  EXPECT_EQ(s.test.num_classes, 4);
  EXPECT_EQ(s.train.sample_shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(s.train.source, dir.file("train-images-idx3-ubyte.gz"));
  EXPECT_EQ(s.test.source, dir.file("t10k-images-idx3-ubyte"));
  const std::vector<float> x = s.train.x.to_floats();
  const std::vector<uint8_t> px = tagged_pixels(5);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], static_cast<float>(px[i]) / 255.0f) << i;
  EXPECT_EQ(x[13], 21.0f / 255.0f);  // sample 2, pixel 1
  EXPECT_EQ(s.test.x.at(0), 1.0f);
  EXPECT_EQ(s.test.x.at(1), 1.0f / 255.0f);
}

TEST(ImageDataset, FindsTestFilesNamedTest) {
  TempDir dir;
  write_idx(dir.file("emnist-train-images-idx3-ubyte"), {2, 2, 3}, tagged_pixels(2), false);
  write_idx(dir.file("emnist-train-labels-idx1-ubyte"), {2}, {4, 1}, false);
  write_idx(dir.file("emnist-test-images-idx3-ubyte.gz"), {1, 2, 3}, tagged_pixels(1), true);
  write_idx(dir.file("emnist-test-labels-idx1-ubyte.gz"), {1}, {0}, true);
  const DataSplits s = load_idx_dataset(dir.file("emnist-train-images-idx3-ubyte"), 0.5, 1);
  EXPECT_TRUE(s.test_from_files);
  EXPECT_EQ(s.test.size(), 1);
  EXPECT_EQ(s.train.num_classes, 5);
}

TEST(ImageDataset, HoldsOutTestSetWhenNoTestFiles) {
  TempDir dir;
  write_idx(dir.file("data-images.idx3-ubyte"), {10, 2, 3}, tagged_pixels(10), false);
  write_idx(dir.file("data-labels.idx1-ubyte.gz"), {10}, {0, 1, 2, 0, 1, 2, 0, 1, 2, 0}, true);
  const DataSplits s = load_idx_dataset(dir.file("data-images.idx3-ubyte"), 0.3, 42);
  EXPECT_FALSE(s.test_from_files);
  EXPECT_EQ(s.train.size(), 7);
  EXPECT_EQ(s.test.size(), 3);
  EXPECT_EQ(s.train.num_classes, 3);
  EXPECT_EQ(s.test.num_classes, 3);
  // Pixel 0 of sample i is 10*i / 255: recover the sample ids and check both parts cover 0..9 once.
  std::set<int> seen;
  for (const Dataset* d : {&s.train, &s.test})
    for (int64_t r = 0; r < d->size(); ++r) {
      const int id = static_cast<int>(std::lround(d->x.at(r * 6) * 255.0f / 10.0f));
      EXPECT_TRUE(seen.insert(id).second) << "sample " << id << " in both parts";
      EXPECT_EQ(d->y.at(r), static_cast<float>(id % 3)) << "label travelled with its sample";
    }
  EXPECT_EQ(seen.size(), 10u);
  const DataSplits again = load_idx_dataset(dir.file("data-images.idx3-ubyte"), 0.3, 42);
  EXPECT_EQ(again.test.x.to_floats(), s.test.x.to_floats());
}

TEST(ImageDataset, MismatchedCountsNameBothFiles) {
  TempDir dir;
  write_idx(dir.file("train-images-idx3-ubyte"), {3, 2, 3}, tagged_pixels(3), false);
  write_idx(dir.file("train-labels-idx1-ubyte"), {2}, {0, 1}, false);
  const Error e = error_of([&] { load_idx_dataset(dir.file("train-images-idx3-ubyte"), 0.5, 0); });
  EXPECT_TRUE(contains(e.what(), "image file '" + dir.file("train-images-idx3-ubyte") + "' holds 3 images"))
      << e.what();
  EXPECT_TRUE(contains(e.what(), "label file '" + dir.file("train-labels-idx1-ubyte") + "' holds 2 labels"))
      << e.what();
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
}

// The labels are counted against the images header before the images' data is read: a gzip images file whose
// header declares 1,000 images (784,000 bytes, within what its 3,000 incompressible bytes could inflate to) but
// whose stream holds only 3,000 is refused for the count, not read until its data runs out.
TEST(ImageDataset, LabelsAreCountedBeforeTheImagesDataIsRead) {
  TempDir dir;
  std::vector<uint8_t> noise(3000);
  uint32_t state = 12345;
  for (uint8_t& b : noise) b = static_cast<uint8_t>((state = state * 1664525u + 1013904223u) >> 24);
  std::vector<uint8_t> bytes = {0, 0, 0x08, 3, 0, 0, 0x03, 0xE8, 0, 0, 0, 28, 0, 0, 0, 28};  // (1000, 28, 28)
  bytes.insert(bytes.end(), noise.begin(), noise.end());
  const std::string images = dir.file("train-images-idx3-ubyte.gz");
  testing::write_bytes(images, bytes, true);
  write_idx(dir.file("train-labels-idx1-ubyte.gz"), {10}, std::vector<uint8_t>(10, 1), true);
  ASSERT_EQ(read_idx_shape(images, 3), (Shape{1000, 28, 28}));
  const Error e = error_of([&] { load_idx_dataset(images, 0.5, 0); });
  EXPECT_TRUE(contains(e.what(), "holds 1000 images but label file")) << e.what();
  EXPECT_TRUE(contains(e.what(), "holds 10 labels")) << e.what();
  // The images file itself is truncated: reading its data says so.
  EXPECT_TRUE(contains(error_of([&] { read_idx(images, 3); }).what(), "truncated"));
}

TEST(ImageDataset, MissingLabelsListTheNamesTried) {
  TempDir dir;
  const std::string images = dir.file("train-images-idx3-ubyte.gz");
  write_idx(images, {1, 2, 3}, tagged_pixels(1), true);
  const Error e = error_of([&] { load_idx_dataset(images, 0.5, 0); });
  EXPECT_TRUE(contains(e.what(), "no labels file found for '" + images + "'")) << e.what();
  EXPECT_TRUE(contains(e.what(), dir.file("train-labels-idx1-ubyte.gz") + ", " + dir.file("train-labels-idx1-ubyte")))
      << e.what();
  EXPECT_EQ(e.kind(), ErrorKind::kIo);

  const std::string unnamed = dir.file("pixels.bin");
  write_idx(unnamed, {1, 2, 3}, tagged_pixels(1), false);
  const Error e2 = error_of([&] { load_idx_dataset(unnamed, 0.5, 0); });
  EXPECT_TRUE(contains(e2.what(), "'" + unnamed + "': its name does not contain \"images\"")) << e2.what();
}

TEST(ImageDataset, WrongOrMissingImagesFileIsReportedAsSuch) {
  TempDir dir;
  const Error missing = error_of([&] { load_idx_dataset(dir.file("train-images-idx3-ubyte.gz"), 0.5, 0); });
  EXPECT_TRUE(contains(missing.what(), "IDX file '" + dir.file("train-images-idx3-ubyte.gz") + "' does not exist"))
      << missing.what();
  EXPECT_EQ(missing.kind(), ErrorKind::kIo);
  const std::string labels = dir.file("train-labels-idx1-ubyte");
  write_idx(labels, {2}, {0, 1}, false);
  const Error swapped = error_of([&] { load_idx_dataset(labels, 0.5, 0); });
  EXPECT_TRUE(contains(swapped.what(), "'" + labels + "' has magic 0x00000801 (rank 1), expected 0x00000803"))
      << swapped.what();
}

TEST(ImageDataset, TestImagesOfAnotherShapeAreRejected) {
  TempDir dir;
  write_idx(dir.file("train-images-idx3-ubyte"), {2, 2, 3}, tagged_pixels(2), false);
  write_idx(dir.file("train-labels-idx1-ubyte"), {2}, {0, 1}, false);
  write_idx(dir.file("t10k-images-idx3-ubyte"), {1, 3, 2}, tagged_pixels(1), false);
  write_idx(dir.file("t10k-labels-idx1-ubyte"), {1}, {0}, false);
  const Error e = error_of([&] { load_idx_dataset(dir.file("train-images-idx3-ubyte"), 0.5, 0); });
  EXPECT_TRUE(contains(e.what(), "test images '" + dir.file("t10k-images-idx3-ubyte") + "' are (3, 2)")) << e.what();
  EXPECT_TRUE(contains(e.what(), "training images '" + dir.file("train-images-idx3-ubyte") + "' are (2, 3)"))
      << e.what();
}

TEST(ImageDataset, EmptyImageFileIsRejected) {
  TempDir dir;
  write_idx(dir.file("train-images-idx3-ubyte"), {0, 2, 3}, {}, false);
  write_idx(dir.file("train-labels-idx1-ubyte"), {0}, {}, false);
  const Error e = error_of([&] { load_idx_dataset(dir.file("train-images-idx3-ubyte"), 0.5, 0); });
  EXPECT_TRUE(contains(e.what(), "image file '" + dir.file("train-images-idx3-ubyte") + "' is empty")) << e.what();
}

TEST(ImageDataset, FashionMnistMissingGivesInstallHint) {
  TempDir dir;
  const Error e = error_of([&] { load_fashion_mnist(dir.file("absent")); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_EQ(e.hint(), "apt-get install dataset-fashion-mnist");
  EXPECT_TRUE(contains(e.what(), dir.file("absent") + "/train-images-idx3-ubyte.gz")) << e.what();
  EXPECT_EQ(fashion_mnist_dir(), "/usr/share/datasets/fashion-mnist");
}

// Skips where the data set is not installed; MIXTRAIN_REQUIRE_DATA=1 (.ci/run sets it: the setup installs it) makes
// that a failure, so the real-data checks cannot pass by skipping.
TEST(ImageDataset, RealFashionMnist) {
  if (!std::filesystem::exists(fashion_mnist_dir() + "/train-images-idx3-ubyte.gz")) {
    const char* required = std::getenv("MIXTRAIN_REQUIRE_DATA");
    if (required != nullptr && std::string(required) == "1")
      FAIL() << "MIXTRAIN_REQUIRE_DATA=1 but Fashion-MNIST is not in " << fashion_mnist_dir();
    GTEST_SKIP() << "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)";
  }
  const DataSplits s = load_fashion_mnist();
  EXPECT_TRUE(s.test_from_files);
  EXPECT_EQ(s.train.x.shape(), (Shape{60000, 784}));
  EXPECT_EQ(s.train.y.shape(), (Shape{60000}));
  EXPECT_EQ(s.test.x.shape(), (Shape{10000, 784}));
  EXPECT_EQ(s.test.y.shape(), (Shape{10000}));
  EXPECT_EQ(s.train.num_classes, 10);
  EXPECT_EQ(s.test.num_classes, 10);
  EXPECT_EQ(s.train.sample_shape, (std::vector<int64_t>{28, 28}));
  EXPECT_EQ(class_counts(s.train), std::vector<int64_t>(10, 6000));
  EXPECT_EQ(class_counts(s.test), std::vector<int64_t>(10, 1000));
  for (const Dataset* d : {&s.train, &s.test}) {
    const float* x = d->x.data<float>();
    const auto [lo, hi] = std::minmax_element(x, x + d->x.numel());
    EXPECT_EQ(*lo, 0.0f);
    EXPECT_EQ(*hi, 1.0f);
  }
  // Known first labels of the published files (9 = ankle boot).
  const std::vector<int32_t> train_y = s.train.y.to_ints();
  EXPECT_EQ(std::vector<int32_t>(train_y.begin(), train_y.begin() + 10),
            (std::vector<int32_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5}));
  const std::vector<int32_t> test_y = s.test.y.to_ints();
  EXPECT_EQ(std::vector<int32_t>(test_y.begin(), test_y.begin() + 10),
            (std::vector<int32_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7}));
  // The first training image: pixel sum 76247 / 255, brightest pixel (255) at index 417.
  const float* first = s.train.x.data<float>();
  int64_t pixel_sum = 0;
  for (int k = 0; k < 784; ++k) pixel_sum += std::lround(first[k] * 255.0f);
  EXPECT_EQ(pixel_sum, 76247);
  EXPECT_EQ(std::max_element(first, first + 784) - first, 417);
}

}  // namespace
}  // namespace mixtrain
