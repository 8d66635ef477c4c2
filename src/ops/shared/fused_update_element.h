// One element of the fused arena update (ops/fused_update.h), for the CPU reference kernel and the GPU kernel: what
// Optimizer::apply_flat_gradients does to an element on the CPU. The SGD and RMSprop element updates are
// src/optim/sgd.cpp's and src/optim/rmsprop.cpp's loops, operation for operation (each product, sum, quotient and
// square root rounded once, never fused), so a device gives the CPU optimizer's bits; Adam's is adam_update.h.
#pragma once

#include <cstdint>

#include "adam_update.h"
#include "float16_convert.h"
#include "host_device.h"
#include "kahan_round.h"
#include "mixtrain/ops/fused_update.h"
#include "stochastic_round.h"

namespace mixtrain::ops::shared {

// SGD: w -= g lr without momentum; with it v = v mu - g lr, then w += v, or w += v mu - g lr (Nesterov).
MIXTRAIN_HOST_DEVICE inline void sgd_update(float& w, float g, float* v, float lr, float mu, bool nesterov) {
  const float step = mul_rn(g, lr);
  if (v == nullptr) {
    w = sub_rn(w, step);
    return;
  }
  *v = sub_rn(mul_rn(*v, mu), step);
  w = nesterov ? add_rn(w, sub_rn(mul_rn(*v, mu), step)) : add_rn(w, *v);
}

// RMSprop (Keras): v = rho v + (1 - rho) g^2; centered: a = rho a + (1 - rho) g and the denominator
// sqrt((v - a^2) + eps), else sqrt(v + eps); then w -= (lr g) / denominator, or through the momentum
// m = mu m + (lr g) / denominator, w -= m.
MIXTRAIN_HOST_DEVICE inline void rmsprop_update(float& w, float g, float& v, float* m, float* a,
                                                const UpdateConstants& k, float lr) {
  v = add_rn(mul_rn(k.rho, v), mul_rn(k.one_minus_rho, mul_rn(g, g)));
  float denominator_sq = v;
  if (a != nullptr) {
    *a = add_rn(mul_rn(k.rho, *a), mul_rn(k.one_minus_rho, g));
    denominator_sq = sub_rn(v, mul_rn(*a, *a));
  }
  const float step = div_rn(mul_rn(lr, g), sqrt_rn(add_rn(denominator_sq, k.epsilon)));
  if (m == nullptr) {
    w = sub_rn(w, step);
    return;
  }
  *m = add_rn(mul_rn(k.momentum, *m), step);
  w = sub_rn(w, *m);
}

// Where one dtype group of a flat arena lives, as plain pointers (host memory for the CPU reference, device
// memory for the GPU kernel). values and the copies are float32 / float16 / bfloat16 (FloatCode); grads float32
// or the values' dtype; the slots float32 (Adam's bfloat16 under UpdateConstants::bfloat16_state: slot_code), in
// the rule's order (ops::slot_count).
struct UpdateGroupPointers {
  void* values = nullptr;
  int value_code = kCodeFloat32;
  const void* grads = nullptr;
  int grad_code = kCodeFloat32;
  void* slots[3] = {nullptr, nullptr, nullptr};
  int slot_code = kCodeFloat32;
  void* copies[2] = {nullptr, nullptr};  // compute copies of float32 values
  int copy_codes[2] = {kCodeFloat16, kCodeBFloat16};
  int copy_count = 0;
};

// x rounded into element i of p (dtype `code`): stochastically for bfloat16 under k.stochastic_rounding, drawing
// stream `stream` (rounding_bits: 0 the value, 1 and 2 Adam's m and v) of the element's hash at `counter` completed
// iterations; else to nearest.
MIXTRAIN_HOST_DEVICE inline void store_rounded(void* p, int code, int64_t i, float x, const UpdateConstants& k,
                                               int64_t counter, int stream) {
  if (k.stochastic_rounding && code == kCodeBFloat16) {
    static_cast<uint16_t*>(p)[i] = float_to_bfloat16_sr(x, k.rounding_seed, static_cast<uint64_t>(counter),
                                                        static_cast<uint64_t>(i), stream);
  } else {
    store_from_float(p, code, i, x);
  }
}

// Adam's moments of element i, widened from their dtype, updated with w, and rounded back once.
MIXTRAIN_HOST_DEVICE inline void adam_element(const UpdateGroupPointers& p, int64_t i, float& w, float g,
                                              const UpdateConstants& k, const AdamCoefficients& c, int64_t counter) {
  float m = load_as_float(p.slots[0], p.slot_code, i);
  float v = load_as_float(p.slots[1], p.slot_code, i);
  adam_update(w, g, m, v, c);
  store_rounded(p.slots[0], p.slot_code, i, m, k, counter, 1);
  store_rounded(p.slots[1], p.slot_code, i, v, k, counter, 2);
}

// Element i of the fused pass, in the CPU pass's order (src/optim/optimizer_arena.cpp): the value widened to
// float32; the gradient widened and, under global clipping (scaled), times factor; AdamW's decay when `decay`;
// the rule's update (c: Adam's coefficients of this step, lr its learning rate); the value rounded once into its
// dtype (store_rounded), or split with its Kahan compensation (kahan_round.h), and into each compute copy. Adam's
// moments are read and rounded in their dtype.
MIXTRAIN_HOST_DEVICE inline void fused_update_element(const UpdateGroupPointers& p, int64_t i, const UpdateConstants& k,
                                                      const AdamCoefficients& c, float lr, bool scaled, float factor,
                                                      bool decay, int64_t counter) {
  // Kahan compensation (k.kahan_summation) of a bfloat16 weight: the update runs on w + c, slot 2.
  uint16_t* compensation =
      k.kahan_summation && p.value_code == kCodeBFloat16 ? static_cast<uint16_t*>(p.slots[2]) : nullptr;
  float w = compensation != nullptr ? kahan_widen(static_cast<const uint16_t*>(p.values)[i], compensation[i])
                                    : load_as_float(p.values, p.value_code, i);
  float g = load_as_float(p.grads, p.grad_code, i);
  if (scaled) g = mul_rn(g, factor);
  switch (k.kind) {
    case UpdateKind::kAdam:
      if (decay) w = adamw_decay(w, k.weight_decay, lr);
      adam_element(p, i, w, g, k, c, counter);
      break;
    case UpdateKind::kSgd:  // float32 slots
      sgd_update(w, g, k.momentum > 0 ? static_cast<float*>(p.slots[0]) + i : nullptr, lr, k.momentum, k.nesterov);
      break;
    case UpdateKind::kRmsprop: {
      const bool has_momentum = k.momentum > 0;  // float32 slots
      float* m = has_momentum ? static_cast<float*>(p.slots[1]) + i : nullptr;
      float* a = k.centered ? static_cast<float*>(p.slots[has_momentum ? 2 : 1]) + i : nullptr;
      rmsprop_update(w, g, static_cast<float*>(p.slots[0])[i], m, a, k, lr);
      break;
    }
  }
  if (compensation != nullptr) {
    kahan_split(w, static_cast<uint16_t*>(p.values) + i, compensation + i);
  } else {
    store_rounded(p.values, p.value_code, i, w, k, counter, 0);
  }
  for (int n = 0; n < p.copy_count; ++n) store_from_float(p.copies[n], p.copy_codes[n], i, w);
}

}  // namespace mixtrain::ops::shared
