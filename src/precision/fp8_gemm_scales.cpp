#include "mixtrain/precision/fp8_gemm_scales.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>

#include "mixtrain/autograd/remat.h"
#include "mixtrain/core/error.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/precision/mx_block_scaling.h"

namespace mixtrain {

namespace {
std::atomic<Fp8Recipe>& recipe_slot() {
  static std::atomic<Fp8Recipe> slot{Fp8Recipe::kDelayed};
  return slot;
}
}  // namespace

Fp8Recipe parse_fp8_recipe(std::string_view name) {
  if (name == "delayed") return Fp8Recipe::kDelayed;
  if (name == "current") return Fp8Recipe::kCurrent;
  if (name == "block") return Fp8Recipe::kBlock;
  MIXTRAIN_FAIL(kInvalidInput, "unknown FP8 recipe '" << name << "'; valid recipes: delayed, current, block",
                "delayed scales from an amax history (the default), current from each tensor's own amax, block "
                "(MXFP8) from each block of 32 elements' amax");
}

const char* fp8_recipe_name(Fp8Recipe recipe) {
  switch (recipe) {
    case Fp8Recipe::kDelayed: return "delayed";
    case Fp8Recipe::kCurrent: return "current";
    case Fp8Recipe::kBlock: return "block";
  }
  return "?";
}

void set_fp8_recipe(Fp8Recipe recipe) { recipe_slot().store(recipe); }

Fp8Recipe fp8_recipe() { return recipe_slot().load(); }

Fp8TensorScale::Fp8TensorScale(DType format, Fp8Recipe recipe, DelayedScalingOptions options)
    : format_(format), recipe_(recipe), delayed_(format, options) {}

// Both formats saturate, as Transformer Engine casts: under delayed scaling a tensor that grew past its history's
// amax would otherwise put infinities into an E5M2 gradient, and with no loss scaler to skip the update, into the
// weights.
Fp8Quantized Fp8TensorScale::quantize(const Tensor& x, const Tensor& into) {
  return quantize_at(x, scale_for(x), into);
}

float Fp8TensorScale::scale_for(const Tensor& x) const {
  MIXTRAIN_CHECK(recipe_ != Fp8Recipe::kBlock, "Fp8TensorScale::quantize: the block recipe quantizes a matrix along "
                                               "a reduction dimension (quantize_copies)");
  if (recipe_ == Fp8Recipe::kCurrent)
    return scale_from_amax(ops::fp8_amax(x), float8_format_max(format_), delayed_.options().margin, 1.0f);
  return delayed_.scale();
}

Fp8Quantized Fp8TensorScale::quantize_at(const Tensor& part, float scale, const Tensor& into) {
  MIXTRAIN_CHECK(recipe_ != Fp8Recipe::kBlock, "Fp8TensorScale::quantize_at: not under the block recipe");
  ops::Fp8Operand q = ops::fp8_quantize(part, format_, scale, Float8Overflow::kSaturate, into);
  // A recomputation (autograd/remat.h) casts the same tensor again: its amax is in the history already.
  if (recipe_ == Fp8Recipe::kDelayed && !in_recomputation()) delayed_.record(q.amax);
  return {std::move(q.values), scale};
}

Fp8Copies Fp8TensorScale::quantize_copies(const Tensor& x) {
  if (recipe_ == Fp8Recipe::kBlock)
    return {{ops::mx_block_quantize(x, format_, false), 1.0f}, {ops::mx_block_quantize(x, format_, true), 1.0f}};
  Fp8Quantized q = quantize(x);
  return {q, q};
}

Fp8Quantized Fp8TensorScale::quantize_columns(const Tensor& x) {
  if (recipe_ == Fp8Recipe::kBlock) return {ops::mx_block_quantize(x, format_, true), 1.0f};
  return quantize(x);
}

Fp8Quantized Fp8SavedOperand::widened() const {
  if (block_scales.defined()) return {ops::mx_block_decode({data, block_scales, blocks_down}), scale};
  return {data.dtype() == DType::kBFloat16 ? data : ops::cast(data, DType::kBFloat16), scale};
}

Fp8SavedOperand Fp8SavedOperand::columns(int64_t begin, int64_t end) const {
  MIXTRAIN_CHECK(!block_scales.defined() || blocks_down,
                 "Fp8SavedOperand::columns: the blocks run along the rows, so a column slice would cut them");
  return {data.slice(1, begin, end), scale, block_scales.defined() ? block_scales.slice(1, begin, end) : Tensor()};
}

// The values are codes widened exactly, so the cast back to the format is exact too (no rounding, no overflow).
Fp8SavedOperand Fp8TensorScale::saved(const Fp8Quantized& q) const {
  if (recipe_ == Fp8Recipe::kBlock) return {q.values, q.scale, Tensor()};
  return {ops::cast(q.values, format_), q.scale, Tensor()};
}

Fp8Quantized Fp8TensorScale::quantize_columns_over(Tensor& x) {
  if (x.dtype() != DType::kBFloat16 || !x.is_contiguous()) return quantize_columns(x);
  if (recipe_ == Fp8Recipe::kBlock) return {ops::mx_block_quantize(x, format_, true, x), 1.0f};
  return quantize(x, x);
}

Fp8Copies Fp8TensorScale::quantize_copies_over(Tensor& x) {
  if (x.dtype() != DType::kBFloat16 || !x.is_contiguous()) return quantize_copies(x);
  if (recipe_ == Fp8Recipe::kBlock) {
    // The row-blocked copy first, while x still holds the high-precision values.
    Fp8Quantized rows{ops::mx_block_quantize(x, format_, false), 1.0f};
    return {rows, quantize_columns_over(x)};
  }
  Fp8Quantized q = quantize(x, x);
  return {q, q};
}

void Fp8TensorScale::update() {
  if (recipe_ == Fp8Recipe::kDelayed) delayed_.update();
}

Fp8GemmScales::Fp8GemmScales(const DTypePolicy& policy, Fp8Recipe recipe)
    : input(policy.float8_forward_format(), recipe),
      weight(policy.float8_forward_format(), recipe),
      grad(policy.float8_backward_format(), recipe) {
  MIXTRAIN_CHECK(policy.uses_float8(), "Fp8GemmScales: the policy " << policy.name() << " quantizes no GEMM operand");
}

const std::shared_ptr<Fp8GemmScales>& Fp8LayerScales::for_policy(const DTypePolicy& policy) {
  if (!scales_ || scales_->input.format() != policy.float8_forward_format() ||
      scales_->grad.format() != policy.float8_backward_format())
    scales_ = std::make_shared<Fp8GemmScales>(policy, recipe_);
  scales_->input_record = input_record_;
  return scales_;
}

Fp8CastRecord Fp8LayerScales::take_input_record() const {
  Fp8CastRecord r = *input_record_;
  *input_record_ = Fp8CastRecord{r.on};
  return r;
}

void Fp8CastRecord::add(const Fp8CastStats& stats) {
  saturated = std::max(saturated, stats.saturated_fraction());
  flushed = std::max(flushed, stats.flushed_fraction());
  ++casts;
}

void record_input_cast(const Fp8GemmScales& scales, const Tensor& x, float scale) {
  if (!scales.input_record || !scales.input_record->on) return;
  // (rows, cols), read on the host: on a GPU a copy of x to the host for each cast, only while the guard records.
  const std::vector<float> v = ops::to_device(x, Device::cpu()).to_floats();
  const int64_t n = static_cast<int64_t>(v.size()), cols = x.rank() > 0 ? x.dim(-1) : 1;
  const DType format = scales.input.format();
  scales.input_record->add(scales.input.recipe() == Fp8Recipe::kBlock
                               ? mx_cast_stats(v.data(), cols > 0 ? n / cols : 0, cols, format, false)
                               : fp8_cast_stats(v.data(), n, format, scale));
}

std::vector<DelayedScaling*> Fp8LayerScales::delayed_scalings(const DTypePolicy& policy) {
  if (recipe_ != Fp8Recipe::kDelayed || !policy.uses_float8()) return {};
  Fp8GemmScales& s = *for_policy(policy);
  return {&s.input.delayed(), &s.weight.delayed(), &s.grad.delayed()};
}

void Fp8GemmScales::update() {
  input.update();
  weight.update();
  grad.update();
}

namespace {

// The three operands by the names their state is saved under.
struct NamedScale {
  const char* name;
  Fp8TensorScale Fp8GemmScales::*member;
};
constexpr NamedScale kNamedScales[] = {
    {"input", &Fp8GemmScales::input}, {"weight", &Fp8GemmScales::weight}, {"grad", &Fp8GemmScales::grad}};

std::string history_key(const char* tensor) { return std::string("fp8/") + tensor + "/amax_history"; }
std::string scale_key(const char* tensor) { return std::string("fp8/") + tensor + "/scale"; }

Tensor float_tensor(const std::vector<float>& values) {
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(values.size())}, DType::kFloat32);
  std::memcpy(t.raw(), values.data(), values.size() * sizeof(float));
  return t;
}

// The float32 vector entry `key` of `state` holding `n` values; Error when it is missing or has another shape.
std::vector<float> float_entry(const std::map<std::string, const Tensor*>& state, const std::string& key, size_t n) {
  auto it = state.find(key);
  MIXTRAIN_CHECK(it != state.end(), "no '" << key << "' entry");
  const Tensor& t = *it->second;
  MIXTRAIN_CHECK(t.dtype() == DType::kFloat32 && t.shape() == Shape{static_cast<int64_t>(n)},
                 "'" << key << "' is " << t.describe() << ", expected float32 (" << n << ")");
  const Tensor c = t.contiguous();
  std::vector<float> out(n);
  std::memcpy(out.data(), c.raw(), n * sizeof(float));
  return out;
}

}  // namespace

Fp8State Fp8LayerScales::state(const DTypePolicy& policy) const {
  Fp8State out;
  if (!scales_ || !policy.uses_float8() || recipe_ != Fp8Recipe::kDelayed) return out;
  for (const NamedScale& s : kNamedScales) {
    const DelayedScaling& d = ((*scales_).*s.member).delayed();
    out.emplace_back(history_key(s.name), float_tensor(d.history()));
    out.emplace_back(scale_key(s.name), float_tensor({d.scale()}));
  }
  return out;
}

std::shared_ptr<Fp8GemmScales> Fp8LayerScales::restored(const DTypePolicy& policy, const Fp8State& state) const {
  MIXTRAIN_CHECK(policy.uses_float8(), "FP8 scaling state for a layer under " << policy.name()
                                                                              << ", which quantizes nothing");
  MIXTRAIN_CHECK(recipe_ == Fp8Recipe::kDelayed,
                 "delayed-scaling amax histories for a layer under the " << fp8_recipe_name(recipe_)
                                                                        << " FP8 recipe (pass --fp8-recipe delayed)");
  std::map<std::string, const Tensor*> by_key;
  for (const auto& [key, t] : state) by_key[key] = &t;
  auto scales = std::make_shared<Fp8GemmScales>(policy, recipe_);
  for (const NamedScale& s : kNamedScales) {
    Fp8TensorScale& tensor = (*scales).*s.member;
    const size_t length = static_cast<size_t>(tensor.delayed().options().history_length);
    const std::vector<float> history = float_entry(by_key, history_key(s.name), length);
    const std::vector<float> scale = float_entry(by_key, scale_key(s.name), 1);
    try {
      tensor.restore(history, scale[0]);
    } catch (const Error& e) {
      MIXTRAIN_FAIL(kInvalidInput, "FP8 " << s.name << " scaling state: " << e.message(), "");
    }
    by_key.erase(history_key(s.name));
    by_key.erase(scale_key(s.name));
  }
  MIXTRAIN_CHECK(by_key.empty(), "unknown layer state entry '" << by_key.begin()->first << "'");
  return scales;
}

void Fp8LayerScales::check_state(const DTypePolicy& policy, const Fp8State& state) const {
  if (!state.empty()) (void)restored(policy, state);
}

void Fp8LayerScales::load_state(const DTypePolicy& policy, const Fp8State& state) {
  if (!state.empty()) scales_ = restored(policy, state);
}

Fp8CastView fp8_cast_view(const Fp8LayerScales& scales, const DTypePolicy& policy, std::string_view tensor,
                          const std::vector<float>& x, int64_t cols) {
  Fp8CastView v;
  v.format = tensor == "grad" ? policy.float8_backward_format() : policy.float8_forward_format();
  const int64_t n = static_cast<int64_t>(x.size());
  if (scales.recipe() == Fp8Recipe::kBlock) {
    v.stats = mx_cast_stats(x.data(), cols > 0 ? n / cols : 0, cols, v.format, tensor == "weight");
    return v;
  }
  if (scales.recipe() == Fp8Recipe::kCurrent) {
    v.scale = current_scale(x.data(), n, v.format);
  } else if (const Fp8GemmScales* s = scales.get(); s && s->input.format() == policy.float8_forward_format()) {
    const Fp8TensorScale& t = tensor == "input" ? s->input : tensor == "weight" ? s->weight : s->grad;
    v.scale = t.delayed().scale();
  }  // else: the layer has not quantized yet, and its first cast uses scale 1
  v.stats = fp8_cast_stats(x.data(), n, v.format, v.scale);
  return v;
}

}  // namespace mixtrain
