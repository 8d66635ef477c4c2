// CPU kernel of the rotary embedding: rows of (batch, T, C) read as float32 (float_rows.h), each element turned with
// its partner through shared/rotary_math.h (the GPU's arithmetic), rounded once into the output's dtype. Rows run in
// parallel; every element is computed alone, so no result depends on the thread count.
#include <vector>

#include "../shared/rotary_math.h"
#include "cpu_backend.h"
#include "float_rows.h"
#include "mixtrain/ops/rotary_embedding.h"

namespace mixtrain::ops::cpu {

namespace {

constexpr int64_t kParallelMin = int64_t{1} << 15;  // elements; below this a thread team costs more than it saves

void rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t head_dim, int64_t rotated_width,
                      bool inverse, Tensor& y) {
  const int64_t length = x.dim(1), c = x.dim(2), rows = x.numel() / c, half = head_dim / 2;
  const float* cp = cos.data<float>();
  const float* sp = sin.data<float>();
#pragma omp parallel if (rows * c > kParallelMin)
  {
    std::vector<float> in(static_cast<size_t>(c)), out(static_cast<size_t>(c));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* v = float_rows::read_row(x, r, c, in.data());
      float* o = float_rows::row_out(y, r, c, out.data());
      const int64_t t = r % length;  // the row's position within its sequence
      for (int64_t j = 0; j < rotated_width; ++j) {
        const shared::RotaryPlace p = shared::rotary_place(j, head_dim);
        o[j] = shared::rotary_value(v[j], v[p.partner_col], cp[t * half + p.pair], sp[t * half + p.pair],
                                    p.first_half, inverse);
      }
      for (int64_t j = rotated_width; j < c; ++j) o[j] = v[j];
      float_rows::store_row(y, r, c, o);
    }
  }
}

}  // namespace

void register_rotary_embedding_kernels(Kernels& k) { k.set<Op::rotary_embedding>(&rotary_embedding); }

}  // namespace mixtrain::ops::cpu
