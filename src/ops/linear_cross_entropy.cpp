// linear_cross_entropy's entry: validation, output allocation, dispatch (the CPU kernel in
// cpu/linear_cross_entropy.cpp).
#include "mixtrain/ops/linear_cross_entropy.h"

#include <algorithm>

#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/dispatch.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops {

namespace {

constexpr const char* kOp = "linear_cross_entropy";
constexpr int64_t kChunkLogitBytes = int64_t{4} << 20;  // a chunk's float32 logits stay in a large cache

std::string describe_or_undefined(const Tensor& t) { return t.defined() ? t.describe() : "an undefined tensor"; }

void check_operands(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& labels) {
  MIXTRAIN_CHECK(x.defined() && x.rank() == 2 && is_float(x.dtype()),
                 kOp << ": x must be a floating (rows, features) tensor, got " << describe_or_undefined(x));
  MIXTRAIN_CHECK(w.defined() && w.rank() == 2 && w.dtype() == x.dtype() && w.dim(0) == x.dim(1),
                 kOp << ": the weight must be (" << x.dim(1) << ", vocabulary) " << dtype_name(x.dtype())
                     << " for x " << x.describe() << ", got " << describe_or_undefined(w));
  MIXTRAIN_CHECK(w.dim(1) > 0, kOp << ": the vocabulary is empty (weight " << w.describe() << ")");
  MIXTRAIN_CHECK(!bias.defined() || (bias.dtype() == DType::kFloat32 && bias.shape() == Shape({w.dim(1)})),
                 kOp << ": the bias must be float32 (" << w.dim(1) << ",), got " << bias.describe());
  MIXTRAIN_CHECK(labels.defined() && is_index(labels.dtype()) && labels.shape() == Shape({x.dim(0)}),
                 kOp << ": labels must be int32 or int64 (" << x.dim(0) << ",) for x " << x.describe() << ", got "
                     << describe_or_undefined(labels));
  if (labels.device().is_cpu()) {  // read where that costs no device round trip, as the losses do
    const std::vector<int64_t> l = labels.contiguous().to_int64s();
    for (size_t i = 0; i < l.size(); ++i)
      MIXTRAIN_CHECK(l[i] >= 0 && l[i] < w.dim(1),
                     kOp << ": label " << l[i] << " at row " << i << " is outside [0, " << w.dim(1) << ")");
  }
}

}  // namespace

int64_t linear_cross_entropy_chunk_rows(int64_t vocabulary) {
  const int64_t rows = kChunkLogitBytes / (std::max<int64_t>(vocabulary, 1) * 4);
  return std::clamp<int64_t>(rows, 16, 4096);
}

LinearCrossEntropy linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& labels,
                                        const Tensor& seed_in, int64_t chunk_rows) {
  check_operands(x, w, bias, labels);
  MIXTRAIN_CHECK(chunk_rows >= 0, kOp << ": chunk_rows must be >= 0 (0: the default), got " << chunk_rows);
  const Device device = bias.defined() ? common_device(kOp, {&x, &w, &bias, &labels})
                                       : common_device(kOp, {&x, &w, &labels});
  Tensor seed;
  if (seed_in.defined()) {
    MIXTRAIN_CHECK(is_float(seed_in.dtype()) && seed_in.numel() == 1 && seed_in.device() == device,
                   kOp << ": the seed must be one floating element on " << device.str() << ", got "
                       << seed_in.describe());
    seed = cast(seed_in, DType::kFloat32).reshape({1});
  }
  const int64_t n = x.dim(0), d = x.dim(1), v = w.dim(1);
  LinearCrossEntropy r;
  r.loss = Tensor::empty({}, DType::kFloat32, device);
  r.correct = Tensor::empty({1}, DType::kFloat32, device);
  if (seed.defined()) {
    r.dx = Tensor::empty({n, d}, x.dtype(), device);
    r.dw = Tensor::empty({d, v}, DType::kFloat32, device);
    if (bias.defined()) r.dbias = Tensor::empty({v}, DType::kFloat32, device);
  }
  const int64_t chunk = chunk_rows > 0 ? chunk_rows : linear_cross_entropy_chunk_rows(v);
  kernel_for<Op::linear_cross_entropy>(device)(x.contiguous(), w.contiguous(),
                                               bias.defined() ? bias.contiguous() : Tensor(), labels.contiguous(),
                                               seed, chunk, r.loss, r.correct, r.dx, r.dw, r.dbias);
  return r;
}

}  // namespace mixtrain::ops
