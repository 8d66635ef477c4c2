// Rng: a seeded, portable random generator (xoshiro256** seeded through splitmix64).
// std:: distributions differ between standard libraries, so uniform and normal are computed here:
// one seed gives the same numbers on every platform.
#pragma once

#include <cstdint>
#include <vector>

namespace mixtrain {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t next_u64();
  // Uniform in [0, 1) with 24 random bits.
  float uniform();
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal (Box-Muller on two uniforms).
  float normal();
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n);
  // Fisher-Yates permutation of 0..n-1.
  std::vector<int64_t> permutation(int64_t n);

  // A new generator derived from this seed and a stream id, so that independent consumers
  // (initialisation, shuffling, dropout) do not disturb each other's sequences.
  static Rng derive(uint64_t seed, uint64_t stream);

  // Whole state, for checkpoints.
  std::vector<uint64_t> state() const { return {s_[0], s_[1], s_[2], s_[3]}; }
  void set_state(const std::vector<uint64_t>& s);

 private:
  uint64_t s_[4];
};

}  // namespace mixtrain
