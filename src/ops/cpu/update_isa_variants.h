// How the optimizer updates' element-wise spans (update_spans.cpp) run at the shared instruction-set level
// (core/isa_level.h): each span is written once as an always-inline function, compiled three times by thin
// wrappers with target attributes (x86-64 baseline, AVX2, AVX-512 F), and the wrapper core's for_isa_level picks is called
// on static spans of the array, one per OpenMP thread. Unlike load-time function multiversioning, MIXTRAIN_ISA and
// the tests' override choose the variant, and the vectorised loop is compiled inside the wrapper (an OpenMP
// parallel region in a multiversioned function is outlined without the clone's target). The ops layer is compiled
// with -ffp-contract=off (GCC would otherwise fuse a*b+c into an FMA where the AVX-512 target allows it), so every
// variant gives the same bits; tests/ops/update_isa_variants_test.cpp checks that.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "mixtrain/core/isa_level.h"

namespace mixtrain::ops::cpu {

// Calls span(begin, end) on [0, n): once below min_parallel elements, else on one static span per thread (each a
// multiple of 16 floats, so no two threads share a cache line).
template <class Span>
void for_each_span(int64_t n, int64_t min_parallel, const Span& span) {
  if (n < min_parallel) {
    span(int64_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads();
    const int64_t chunk = ((n + threads - 1) / threads + 15) / 16 * 16;
    const int64_t begin = std::min(n, omp_get_thread_num() * chunk), end = std::min(n, begin + chunk);
    if (begin < end) span(begin, end);
  }
}

}  // namespace mixtrain::ops::cpu
