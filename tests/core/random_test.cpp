#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "mixtrain/core/random.h"

namespace mixtrain {
namespace {

TEST(Rng, SameSeedSameSequenceOtherSeedOther) {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    EXPECT_NE(x, c.next_u64());
  }
}

TEST(Rng, MomentsOfUniformAndNormal) {
  Rng r(7);
  double su = 0, sn = 0, sn2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const float u = r.uniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    su += u;
    const float z = r.normal();
    sn += z;
    sn2 += z * z;
  }
  EXPECT_NEAR(su / n, 0.5, 0.005);
  EXPECT_NEAR(sn / n, 0.0, 0.01);
  EXPECT_NEAR(sn2 / n, 1.0, 0.02);
}

TEST(Rng, PermutationIsAPermutationAndStateRestores) {
  Rng r(3);
  auto p = r.permutation(1000);
  auto sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_NE(p, sorted);
  auto st = r.state();
  const uint64_t next = r.next_u64();
  r.set_state(st);
  EXPECT_EQ(r.next_u64(), next);
}

}  // namespace
}  // namespace mixtrain
