// CPU kernel of the batched product: kernels::gemm once per product, the products spread over threads
// when there are enough of them (each gemm then runs on its calling thread alone).
#include <omp.h>

#include <exception>

#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/matmul.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {
// Below this many multiply-adds per product, one gemm gains little from a thread team of its own.
constexpr int64_t kSmallProduct = int64_t{1} << 18;
}  // namespace

void bmm(const Tensor& a, const Tensor& b, const Tensor& bias, const kernel::BmmLayout& l, Tensor& c) {
  int64_t count = 1;
  for (int64_t d : l.batch) count *= d;
  if (count == 0) return;
  const size_t eab = dtype_size(a.dtype()), ec = dtype_size(c.dtype());
  const char* ap = static_cast<const char*>(a.raw());
  const char* bp = static_cast<const char*>(b.raw());
  char* cp = static_cast<char*>(c.raw());
  const float* biasp = bias.defined() ? bias.data<float>() : nullptr;
  const int rank = static_cast<int>(l.batch.size());
  auto one = [&](int64_t p) {
    int64_t oa = 0, ob = 0, rest = p;
    for (int d = rank - 1; d >= 0; --d) {
      const size_t i = static_cast<size_t>(d);
      const int64_t idx = rest % l.batch[i];
      rest /= l.batch[i];
      oa += idx * l.a_batch_strides[i];
      ob += idx * l.b_batch_strides[i];
    }
    kernels::gemm(l.trans_a, l.trans_b, l.m, l.n, l.k, a.dtype(), ap + oa * static_cast<int64_t>(eab), l.lda,
                  bp + ob * static_cast<int64_t>(eab), l.ldb, c.dtype(), cp + p * l.m * l.n * static_cast<int64_t>(ec),
                  l.n, /*accumulate=*/false, biasp);
  };
  const int64_t work = l.m * l.n * l.k;
  const bool across_batch = count > 1 && (count >= omp_get_max_threads() || work < kSmallProduct);
  if (!across_batch) {
    for (int64_t p = 0; p < count; ++p) one(p);
    return;
  }
  // gemm throws only on arguments the entry has already checked; still, an exception must not leave an
  // OpenMP region, so the first one is carried out and rethrown.
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t p = 0; p < count; ++p) {
    try {
      one(p);
    } catch (...) {
#pragma omp critical(mixtrain_bmm_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void register_matmul_kernels(Kernels& k) {
  k.set<Op::bmm>(&bmm);
}

}  // namespace mixtrain::ops::cpu
