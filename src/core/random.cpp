#include "mixtrain/core/random.h"

#include <cmath>

#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float Rng::uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }

float Rng::normal() {
  // 1 - u keeps the logarithm's argument in (0, 1].
  const double u1 = 1.0 - static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
  const double u2 = static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

uint64_t Rng::below(uint64_t n) {
  // Rejection sampling removes modulo bias.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t r;
  do r = next_u64();
  while (r >= limit);
  return r % n;
}

std::vector<int64_t> Rng::permutation(int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[below(static_cast<uint64_t>(i + 1))]);
  return p;
}

Rng Rng::derive(uint64_t seed, uint64_t stream) {
  uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
  return Rng(splitmix64(x));
}

void Rng::set_state(const std::vector<uint64_t>& s) {
  MIXTRAIN_CHECK(s.size() == 4, "Rng::set_state: expected 4 words, got " << s.size());
  for (int i = 0; i < 4; ++i) s_[i] = s[i];
}

}  // namespace mixtrain
