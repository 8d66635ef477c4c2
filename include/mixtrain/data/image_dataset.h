// Image classification data sets stored as IDX file pairs (MNIST, Fashion-MNIST, EMNIST, KMNIST, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/data/dataset.h"

namespace mixtrain {

// Loads an (N, H, W) uint8 IDX image file and its (N,) label file into a Dataset: x (N, H*W) float32 scaled
// to [0, 1] by /255, y (N,) int32, sample_shape {H, W}. Throws when the counts differ, naming both files.
Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path);

// Label files that may belong to an image file, most likely first: "images-idx3" becomes "labels-idx1"
// ("-images." becomes "-labels." for copies named that way), tried with the image file's .gz suffix first,
// then without (or with) it. Empty when the file name does not mention "images".
std::vector<std::string> label_path_candidates(const std::string& images_path);

// Test image files that may accompany a training image file: the first "train" of the file name becomes
// "t10k", then "test", each with and without .gz. Empty when the file name does not mention "train".
std::vector<std::string> test_path_candidates(const std::string& images_path);

// Loads a training IDX image file, its labels found beside it, and the matching test files when they exist;
// otherwise holds out holdout_fraction of the training samples (seeded by seed) as the test set.
// num_classes is the largest label of either split plus one.
DataSplits load_idx_dataset(const std::string& images_path, double holdout_fraction, uint64_t seed);

// Where the Debian package dataset-fashion-mnist installs the four Fashion-MNIST files.
std::string fashion_mnist_dir();

// Fashion-MNIST from dir (its four .gz files): 60000 training and 10000 test images of 28x28, 10 classes.
// Throws mixtrain::Error (kIo) with the apt-get hint when a file is missing.
DataSplits load_fashion_mnist(const std::string& dir = fashion_mnist_dir());

}  // namespace mixtrain
