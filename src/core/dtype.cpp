#include "mixtrain/core/dtype.h"

#include <array>

#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {
constexpr std::array<DTypeTraits, kNumDTypes> kTable = {{
    {DType::kFloat32, "float32", "F32", 4, true, false},
    {DType::kFloat16, "float16", "F16", 2, true, false},
    {DType::kBFloat16, "bfloat16", "BF16", 2, true, false},
    {DType::kInt32, "int32", "I32", 4, false, false},
    {DType::kUInt8, "uint8", "U8", 1, false, false},
    {DType::kInt64, "int64", "I64", 8, false, false},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", "F8_E4M3", 1, false, true},
    {DType::kFloat8E5M2, "float8_e5m2", "F8_E5M2", 1, false, true},
    {DType::kFloat8E8M0FNU, "float8_e8m0fnu", "F8_E8M0", 1, false, true},
}};
// Every enumerator has a row, in enumerator order.
static_assert(kTable.size() == kNumDTypes);
static_assert(kTable[static_cast<int>(DType::kUInt8)].dtype == DType::kUInt8);
static_assert(kTable[static_cast<int>(DType::kInt64)].dtype == DType::kInt64);
static_assert(kTable[static_cast<int>(DType::kFloat8E8M0FNU)].dtype == DType::kFloat8E8M0FNU);
}  // namespace

const DTypeTraits& traits(DType dtype) { return kTable[static_cast<size_t>(dtype)]; }

DType parse_dtype(std::string_view name) {
  for (const auto& t : kTable)
    if (name == t.name) return t.dtype;
  if (name == "f32" || name == "fp32" || name == "float") return DType::kFloat32;
  if (name == "f16" || name == "fp16" || name == "half") return DType::kFloat16;
  if (name == "bf16") return DType::kBFloat16;
  MIXTRAIN_FAIL(kInvalidInput, "unknown dtype '" << name << "'",
                "valid dtypes are float32, float16, bfloat16, int32, uint8, int64, float8_e4m3fn, float8_e5m2, "
                "float8_e8m0fnu");
}

DType parse_safetensors_dtype(std::string_view tag) {
  for (const auto& t : kTable)
    if (tag == t.safetensors) return t.dtype;
  MIXTRAIN_FAIL(kInvalidInput, "unsupported safetensors dtype '" << tag << "'",
                "mixtrain reads F32, F16, BF16, I32, I64, U8, F8_E4M3, F8_E5M2 and F8_E8M0 tensors");
}

void throw_unsupported_dtype(const char* op, DType dtype) {
  MIXTRAIN_FAIL(kInvalidInput, op << ": dtype " << dtype_name(dtype) << " is not supported",
                "this operation takes float32, float16 or bfloat16 tensors");
}

}  // namespace mixtrain
