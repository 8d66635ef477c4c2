// The summation order of a row sum that a GPU warp computes in parallel and the CPU in vector registers, for host
// and device: term j goes to lane j % kSumLanes, each lane adds its terms from +0 in index order (each partial sum
// rounded), then the lanes are combined pairwise, lane i with lane i + 16 for i < 16, then with i + 8 for i < 8, and
// so on down to lane 0. That is a warp's xor butterfly (device::warp_sum in cuda/device_util.cuh): there every lane
// ends with lane 0's value, since lane i + o adds the same two floats in the other order and float addition is
// commutative. The serial order (ordered_sum.h) keeps one running sum, so a GPU had to leave the row to one lane; this
// one lets 32 lanes share it, and the CPU's loop over 32 independent sums vectorizes.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace mixtrain::ops::shared {

constexpr int kSumLanes = 32;  // a warp; part of the result's bits

// Lane `lane`'s partial sum: term(lane) + term(lane + 32) + ... below n, from +0 (what one GPU lane adds).
template <typename Term>
MIXTRAIN_HOST_DEVICE inline float lane_partial(int64_t n, int lane, const Term& term) {
  float s = 0.0f;
  for (int64_t j = lane; j < n; j += kSumLanes) s = add_rn(s, term(j));
  return s;
}

// The lanes' partial sums combined in the butterfly's order; overwrites lanes[0, kSumLanes).
MIXTRAIN_HOST_DEVICE inline float combine_lanes(float* lanes) {
  for (int o = kSumLanes / 2; o > 0; o /= 2)
    for (int i = 0; i < o; ++i) lanes[i] = add_rn(lanes[i], lanes[i + o]);
  return lanes[0];
}

// The whole sum of term(0), ..., term(n - 1) in this order, every lane's partial sum in one pass over the terms.
template <typename Term>
MIXTRAIN_HOST_DEVICE inline float lane_sum(int64_t n, const Term& term) {
  float lanes[kSumLanes] = {};
  int64_t j0 = 0;
  for (; j0 + kSumLanes <= n; j0 += kSumLanes)
    for (int l = 0; l < kSumLanes; ++l) lanes[l] = add_rn(lanes[l], term(j0 + l));
  for (int l = 0; j0 + l < n; ++l) lanes[l] = add_rn(lanes[l], term(j0 + l));
  return combine_lanes(lanes);
}

}  // namespace mixtrain::ops::shared
