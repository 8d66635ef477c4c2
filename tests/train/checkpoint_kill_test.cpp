// SIGKILL during checkpoint saves: a child process saves checkpoints of a small model in a loop and is killed at
// random moments, 50 times. After every kill the file at the checkpoint path must load and hold one complete
// checkpoint (the last one the child finished, or the one whose rename it reached just before dying), and after
// the next save no temporary file of the dead process may remain.
//
// The child is a fork of the test process that only fills weights and saves. Every tensor stays below the CPU
// kernels' 65,536-element threshold for a thread team, so no OpenMP thread exists on either side of a fork.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include "mixtrain/nn/layers.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kKills = 50;
constexpr int kMaxKills = 500;
constexpr int64_t kFeatures = 250;

// 250 -> 250 -> 250 -> 250 -> 10 under Adam: about 190,000 float32 weights (0.75 MB) per save, each kernel
// 62,500 elements.
std::unique_ptr<Model> make_model() {
  auto m = std::make_unique<Model>("kill_mlp", 11);
  for (int i = 0; i < 3; ++i) m->emplace<Dense>(kFeatures, "relu");
  m->emplace<Dense>(10, "linear");
  m->compile(make_optimizer("adam", 0.001f), Loss("sparse_categorical_crossentropy", true), {});
  m->build_for(Shape{kFeatures});
  return m;
}

// The value every element of weight i holds in the checkpoint of epoch k: each save is recognisable whole.
float weight_value(int k, size_t i) { return static_cast<float>(k) + 0.25f * static_cast<float>(i); }

void fill_weights(Model& m, int k) {
  size_t i = 0;
  for (Var w : m.weights()) w.set_value(Tensor::full(w.shape(), w.dtype(), weight_value(k, i++)));
}

// Whether every element of every weight is the value for epoch k.
bool holds_epoch(const Model& m, int k) {
  size_t i = 0;
  for (const Var& w : m.weights()) {
    const std::vector<float> v = w.value().to_floats();
    const float want = weight_value(k, i++);
    if (!std::all_of(v.begin(), v.end(), [&](float x) { return x == want; })) return false;
  }
  return true;
}

std::vector<std::string> temp_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) out.push_back(e.path().filename().string());
  return out;
}

void save_epoch(const std::string& path, Model& m, int k) {
  fill_weights(m, k);
  CheckpointInfo info;
  info.epoch = k;
  save_checkpoint(path, m, info);
}

// Child: saves epochs first, first + 1, ... until killed, writing each finished epoch to the pipe. It writes
// first - 1 (the last epoch already saved) before it starts, so the parent times its kill from the moment saving
// begins: on a loaded machine a forked child may not run for milliseconds, and kills timed from the fork then all
// land before its first save.
[[noreturn]] void save_forever(const std::string& path, Model& m, int first, int pipe_fd) {
  const int saved = first - 1;
  if (::write(pipe_fd, &saved, sizeof saved) != static_cast<ssize_t>(sizeof saved)) ::_exit(4);
  try {
    for (int k = first;; ++k) {
      save_epoch(path, m, k);
      if (::write(pipe_fd, &k, sizeof k) != static_cast<ssize_t>(sizeof k)) ::_exit(4);
    }
  } catch (...) {
    ::_exit(3);
  }
}

TEST(CheckpointKill, SigkillDuringSavesAlwaysLeavesALoadableCheckpointAndNoTempFile) {
  const fs::path dir = fs::temp_directory_path() / ("mixtrain_kill_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "ckpt.safetensors").string();
  auto model = make_model();

  // How long one save takes here, so the kills can be spread over a few saves.
  int last_complete = 0;
  const auto t0 = Clock::now();
  for (int k = 1; k <= 5; ++k) save_epoch(path, *model, last_complete = k);
  const double save_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 5;

  const unsigned seed = 20240611;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> delay_us(0.0, 3.0 * save_us);
  int left_temp_files = 0, renamed_unreported = 0, kills = 0;
  // At least kKills kills, and more (up to kMaxKills) until enough of them landed inside a save: where the
  // kills land depends on the machine's load, and a kill between saves tests nothing.
  auto enough_inside = [&] { return left_temp_files >= 3 && left_temp_files + renamed_unreported >= kKills / 2; };
  for (int kill = 0; kill < kMaxKills && (kill < kKills || !enough_inside()); ++kill) {
    ++kills;
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(fds[0]);
      save_forever(path, *model, last_complete + 1, fds[1]);
    }
    ::close(fds[1]);
    int started = 0;
    ASSERT_EQ(::read(fds[0], &started, sizeof started), static_cast<ssize_t>(sizeof started)) << "kill " << kill;
    ASSERT_EQ(started, last_complete) << "kill " << kill;
    ::usleep(static_cast<useconds_t>(delay_us(rng)));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "kill " << kill << ": the child ended before the kill (exit status "
        << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << ": 3 = a save threw)";
    int reported = last_complete, k = 0;
    while (::read(fds[0], &k, sizeof k) == static_cast<ssize_t>(sizeof k)) reported = k;
    ::close(fds[0]);
    if (!temp_files(dir).empty()) ++left_temp_files;

    // The file loads, checksums verified, and is one whole checkpoint: the last reported one, or the next if the
    // child was killed between its rename and its report.
    CheckpointInfo info;
    ASSERT_NO_THROW(info = load_checkpoint(path, *model)) << "kill " << kill << " (seed " << seed << ")";
    EXPECT_TRUE(info.checksums_verified);
    ASSERT_TRUE(info.epoch == reported || info.epoch == reported + 1)
        << "kill " << kill << ": loaded epoch " << info.epoch << ", the child had finished " << reported;
    EXPECT_TRUE(holds_epoch(*model, info.epoch)) << "kill " << kill << ": epoch " << info.epoch << " is not whole";
    if (info.epoch == reported + 1) ++renamed_unreported;

    // The next save removes whatever the dead child left.
    last_complete = info.epoch + 1;
    save_epoch(path, *model, last_complete);
    EXPECT_EQ(temp_files(dir), std::vector<std::string>{}) << "kill " << kill;
  }
  std::printf("%d kills (seed %u, %.0f us per save): %d left a temp file, %d landed between rename and report\n",
              kills, seed, save_us, left_temp_files, renamed_unreported);
  // Kills must land inside saves, or this test would not be testing them: on an idle machine 5 to 26 of 50 left a
  // temp file and 20 to 29 more came between the rename and the report (the directory fsync); under load fewer
  // do, and the loop above goes on killing until enough have.
  EXPECT_GE(left_temp_files, 3);
  EXPECT_GE(left_temp_files + renamed_unreported, kKills / 2);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"ckpt.safetensors"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mixtrain
