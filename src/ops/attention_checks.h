// The packed layout's checks, shared by the attention entries (attention.cpp defines them; flash_attention.cpp calls
// them too): one place says what q, k, v and their gradients must be.
#pragma once

#include <cstdint>
#include <string>

#include "mixtrain/core/tensor.h"

namespace mixtrain::ops {
struct AttentionOptions;
}

namespace mixtrain::ops::attention_checks {

std::string text(const Tensor& t);

struct Dims {
  int64_t b, t, s, h, dk, dv;
};

// Checks the packed layout and returns its dimensions.
Dims check_layout(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, const char* op);
// Whether the kernel can read (or write) t in place: (B, L, W) with dense rows (unit stride along W) that
// do not overlap (row stride >= W) and batches that do not overlap either.
bool rows_in_place(const Tensor& t);
// t itself when the kernel reads it in place, else a contiguous copy.
Tensor readable(const Tensor& t);
// g must have like's shape and dtype, with dense rows.
void check_gradient_target(const Tensor& g, const Tensor& like, const char* what, const char* op);

}  // namespace mixtrain::ops::attention_checks
