// Embedding entries: validation (ids in range), output allocation, dispatch (kernels in cpu/embedding.cpp).
#include "mixtrain/ops/embedding.h"

#include <algorithm>
#include <cstring>

#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/elementwise.h"

namespace mixtrain::ops {

namespace kernel {

void fail_id_out_of_range(const char* op, int64_t id, int64_t position, int64_t input_dim,
                          const std::string& found_where) {
  MIXTRAIN_FAIL(kInvalidInput,
                op << ": id " << id << " at position " << position << " is outside [0, " << input_dim
                   << ") (input_dim " << input_dim << ")",
                "ids must index the embedding table: raise input_dim or fix the data" +
                    (found_where.empty() ? std::string() : " (" + found_where + ")"));
}
}  // namespace kernel

namespace {
std::string text(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

void check_ids(const Tensor& ids, const char* op) {
  MIXTRAIN_CHECK(ids.defined() && is_index(ids.dtype()),
                 op << ": ids must be an int32 or int64 tensor, got " << text(ids));
}

// Every id in [0, input_dim). Read on the host (a device backend checks in its kernel).
template <typename I>
void check_range(const I* p, int64_t n, int64_t input_dim, const char* op) {
  for (int64_t i = 0; i < n; ++i)
    if (p[i] < 0 || p[i] >= input_dim) kernel::fail_id_out_of_range(op, static_cast<int64_t>(p[i]), i, input_dim);
}

void check_ids_in_range(const Tensor& ids, int64_t input_dim, const char* op) {
  if (ids.device().type != DeviceType::kCpu) return;
  if (ids.dtype() == DType::kInt32)
    check_range(ids.data<int32_t>(), ids.numel(), input_dim, op);
  else
    check_range(ids.data<int64_t>(), ids.numel(), input_dim, op);
}

Shape with_last(const Shape& s, int64_t last) {
  std::vector<int64_t> dims = s.dims();
  dims.push_back(last);
  return Shape(dims);
}
}  // namespace

Tensor embedding(const Tensor& ids, const Tensor& table, DType out_dtype) {
  constexpr const char* op = "embedding";
  check_ids(ids, op);
  MIXTRAIN_CHECK(table.defined() && is_float(table.dtype()) && table.rank() == 2,
                 op << ": table must be a floating (input_dim, output_dim) tensor, got " << text(table));
  MIXTRAIN_CHECK(is_float(out_dtype), op << ": the output dtype must be floating, got " << dtype_name(out_dtype));
  const Device device = common_device(op, {&ids, &table});
  Tensor idc = ids.contiguous();
  check_ids_in_range(idc, table.dim(0), op);
  Tensor y = Tensor::empty(with_last(ids.shape(), table.dim(1)), out_dtype, device);
  kernel_for<Op::embedding>(device)(idc, table.contiguous(), y);
  return y;
}

namespace {
void check_gradient(const Tensor& dy, const Tensor& ids, const char* op) {
  check_ids(ids, op);
  MIXTRAIN_CHECK(dy.defined() && is_float(dy.dtype()) && dy.rank() == ids.rank() + 1,
                 op << ": gradient " << text(dy) << " does not match ids " << ids.describe() << " plus a feature axis");
  MIXTRAIN_CHECK(with_last(ids.shape(), dy.dim(-1)) == dy.shape(),
                 op << ": gradient " << dy.describe() << " does not match ids " << ids.describe());
}

// Zeroes rows [first, last) of a host (rows, d) float32 table.
void zero_rows(float* table, int64_t d, int64_t first, int64_t last) {
  if (last > first) std::memset(table + first * d, 0, static_cast<size_t>((last - first) * d) * sizeof(float));
}
}  // namespace

Tensor embedding_backward(const Tensor& dy, const Tensor& ids, int64_t input_dim) {
  constexpr const char* op = "embedding_backward";
  check_gradient(dy, ids, op);
  MIXTRAIN_CHECK(input_dim > 0, op << ": input_dim must be positive, got " << input_dim);
  const Device device = common_device(op, {&dy, &ids});
  Tensor idc = ids.contiguous();
  check_ids_in_range(idc, input_dim, op);
  Tensor dtable = full({input_dim, dy.dim(-1)}, DType::kFloat32, 0.0f, device);
  kernel_for<Op::embedding_backward>(device)(dy.contiguous(), idc, dtable);
  return dtable;
}

std::vector<int64_t> embedding_backward_into(const Tensor& dy, const Tensor& ids, Tensor& dtable,
                                             const std::vector<int64_t>* clear) {
  constexpr const char* op = "embedding_backward_into";
  check_gradient(dy, ids, op);
  MIXTRAIN_CHECK(dtable.defined() && dtable.dtype() == DType::kFloat32 && dtable.rank() == 2 &&
                     dtable.dim(1) == dy.dim(-1) && dtable.is_contiguous(),
                 op << ": dtable must be a contiguous float32 (input_dim, " << dy.dim(-1) << ") tensor, got "
                    << text(dtable));
  const Device device = common_device(op, {&dy, &ids, &dtable});
  MIXTRAIN_CHECK(device.is_cpu(), op << ": writes a gradient in host memory, got " << dtable.describe()
                                     << " (embedding_backward computes one on a device)");
  Tensor idc = ids.contiguous();
  const int64_t rows = dtable.dim(0), d = dtable.dim(1);
  check_ids_in_range(idc, rows, op);
  std::vector<int64_t> used(static_cast<size_t>(idc.numel()));
  for (int64_t i = 0; i < idc.numel(); ++i)
    used[static_cast<size_t>(i)] =
        idc.dtype() == DType::kInt64 ? idc.data<int64_t>()[i] : static_cast<int64_t>(idc.data<int32_t>()[i]);
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  float* table = dtable.data<float>();
  if (clear == nullptr) {
    int64_t next = 0;  // the gaps between the rows of ids
    for (int64_t r : used) {
      zero_rows(table, d, next, r);
      next = r + 1;
    }
    zero_rows(table, d, next, rows);
  } else {
    for (int64_t r : *clear) {
      MIXTRAIN_CHECK(r >= 0 && r < rows, op << ": row " << r << " to clear is outside [0, " << rows << ")");
      if (!std::binary_search(used.begin(), used.end(), r)) zero_rows(table, d, r, r + 1);
    }
  }
  kernel_for<Op::embedding_backward>(device)(dy.contiguous(), idc, dtable);
  return used;
}

}  // namespace mixtrain::ops
