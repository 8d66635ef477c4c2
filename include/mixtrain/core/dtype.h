// DType: the element type of a tensor, as run-time data. One traits table describes every dtype;
// templates appear only inside kernels, reached through dispatch_float().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "mixtrain/core/float8.h"
#include "mixtrain/core/half.h"

namespace mixtrain {

// The float8 formats come last so that the older dtypes keep their numbers.
enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16,
  kBFloat16,
  kInt32,
  kUInt8,
  kInt64,
  kFloat8E4M3FN,
  kFloat8E5M2,
  kFloat8E8M0FNU
};
constexpr int kNumDTypes = 9;

struct DTypeTraits {
  DType dtype;
  const char* name;         // Keras / NumPy spelling: "float32", "float16", ...
  const char* safetensors;  // safetensors header spelling: "F32", "F16", "BF16", ...
  size_t size;              // bytes per element
  bool is_float;            // a floating dtype the ops compute in: float32, float16, bfloat16
  bool is_float8;           // an 8-bit floating storage format (core/float8.h), reached through casts
};

const DTypeTraits& traits(DType dtype);
inline const char* dtype_name(DType dtype) { return traits(dtype).name; }
inline size_t dtype_size(DType dtype) { return traits(dtype).size; }
inline bool is_float(DType dtype) { return traits(dtype).is_float; }
// float8_e4m3fn, float8_e5m2 and float8_e8m0fnu: not is_float (no op computes in them, so every op's dtype check
// refuses them); tensors of them are converted to and from the other dtypes (Tensor::to, ops::cast).
inline bool is_float8(DType dtype) { return traits(dtype).is_float8; }
// 16-bit floating types (float16, bfloat16): the "low precision" compute dtypes.
inline bool is_low_precision(DType dtype) { return dtype == DType::kFloat16 || dtype == DType::kBFloat16; }

// Integer dtypes that index (token ids, class labels): int32 and int64.
inline bool is_index(DType dtype) { return dtype == DType::kInt32 || dtype == DType::kInt64; }

// Parses "float32" (also "f32", "fp32"), "float16" ("half"), "bfloat16" ("bf16"), "int32", "uint8", "int64",
// "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu".
// Throws mixtrain::Error listing the valid names when the name is unknown.
DType parse_dtype(std::string_view name);
// Parses a safetensors dtype tag ("F32", "BF16", ..., "F8_E4M3", "F8_E5M2", "F8_E8M0").
DType parse_safetensors_dtype(std::string_view tag);

// C++ storage type of a dtype, for kernels.
template <DType D>
struct StorageOf;
template <>
struct StorageOf<DType::kFloat32> {
  using type = float;
};
template <>
struct StorageOf<DType::kFloat16> {
  using type = float16;
};
template <>
struct StorageOf<DType::kBFloat16> {
  using type = bfloat16;
};
template <>
struct StorageOf<DType::kInt32> {
  using type = int32_t;
};
template <>
struct StorageOf<DType::kUInt8> {
  using type = uint8_t;
};
template <>
struct StorageOf<DType::kInt64> {
  using type = int64_t;
};

template <>
struct StorageOf<DType::kFloat8E4M3FN> {
  using type = float8_e4m3fn;
};
template <>
struct StorageOf<DType::kFloat8E5M2> {
  using type = float8_e5m2;
};
template <>
struct StorageOf<DType::kFloat8E8M0FNU> {
  using type = float8_e8m0fnu;
};

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType dtype_of<float16>() {
  return DType::kFloat16;
}
template <>
constexpr DType dtype_of<bfloat16>() {
  return DType::kBFloat16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::kUInt8;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType dtype_of<float8_e4m3fn>() {
  return DType::kFloat8E4M3FN;
}
template <>
constexpr DType dtype_of<float8_e5m2>() {
  return DType::kFloat8E5M2;
}
template <>
constexpr DType dtype_of<float8_e8m0fnu>() {
  return DType::kFloat8E8M0FNU;
}

[[noreturn]] void throw_unsupported_dtype(const char* op, DType dtype);

// Calls fn(T{}) with T the storage type of a floating dtype; throws for non-floating dtypes.
template <typename Fn>
decltype(auto) dispatch_float(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat16:
      return fn(float16{});
    case DType::kBFloat16:
      return fn(bfloat16{});
    default:
      throw_unsupported_dtype(op, dtype);
  }
}

}  // namespace mixtrain
