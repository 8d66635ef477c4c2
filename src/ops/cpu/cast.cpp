// The CPU's cast: core's conversion (round to nearest even, as Tensor::to), in blocks across threads.
#include <algorithm>

#include "cpu_backend.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops::cpu {

namespace {
void cast(const Tensor& src, Tensor& dst) {
  constexpr int64_t kBlock = int64_t{1} << 16;
  const int64_t n = src.numel();
  const char* s = static_cast<const char*>(src.raw());
  char* d = static_cast<char*>(dst.raw());
  const size_t ss = dtype_size(src.dtype()), ds = dtype_size(dst.dtype());
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (blocks > 1) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock, count = std::min(kBlock, n - begin);
    convert_elements(s + begin * ss, src.dtype(), d + begin * ds, dst.dtype(), count);
  }
}
}  // namespace

void register_cast_kernels(Kernels& k) { k.set<Op::cast>(&cast); }

}  // namespace mixtrain::ops::cpu
