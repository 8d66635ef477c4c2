// The float8 array conversions give the scalar code's bits at every instruction-set level the CPU runs (the AVX-512
// paths against float8.h's portable code), over every code, every bfloat16 pattern (all specials and every tie), and
// random float32 patterns, at lengths that leave vector tails; and tensors of the new dtypes convert through them.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "mixtrain/core/float8.h"
#include "mixtrain/core/isa_level.h"
#include "mixtrain/core/random.h"
#include "mixtrain/core/tensor.h"

namespace mixtrain {
namespace {

struct ResetIsa {
  ~ResetIsa() { set_isa_level_for_testing(std::nullopt); }
};

struct Inputs {
  std::vector<float> f32;
  std::vector<bfloat16> bf16;
  std::vector<uint8_t> codes;
};

Inputs make_inputs() {
  Inputs in;
  for (uint32_t i = 0; i < 65536; ++i) {
    in.bf16.push_back(bfloat16{static_cast<uint16_t>(i)});
    for (uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u}) {  // near the bfloat16 points, and ties below them
      const uint32_t bits = i << 16 | low;
      float f;
      std::memcpy(&f, &bits, 4);
      in.f32.push_back(f);
    }
  }
  Rng rng(88);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng.next_u64());
    float f;
    std::memcpy(&f, &bits, 4);
    in.f32.push_back(f);
  }
  for (int rep = 0; rep < 3; ++rep)
    for (int c = 0; c < 256; ++c) in.codes.push_back(static_cast<uint8_t>(c * 7 + rep));
  return in;
}

// Every conversion of one level, as bytes (lengths 1..33 first, so each vector tail runs, then the whole arrays).
std::vector<uint8_t> run_all(const Inputs& in) {
  std::vector<uint8_t> out;
  const auto append = [&](const void* p, size_t bytes) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + bytes);
  };
  for (bool e5m2 : {false, true}) {
    for (auto overflow : {Float8Overflow::kSaturate, Float8Overflow::kNonSaturating}) {
      std::vector<uint8_t> a(in.f32.size()), b(in.bf16.size());
      for (int64_t n = 1; n <= 33; ++n) {
        float8_from_float(in.f32.data() + 1000 * n, a.data(), n, e5m2, overflow);
        append(a.data(), static_cast<size_t>(n));
      }
      float8_from_float(in.f32.data(), a.data(), static_cast<int64_t>(a.size()), e5m2, overflow);
      float8_from_bfloat16(in.bf16.data(), b.data(), static_cast<int64_t>(b.size()), e5m2, overflow);
      append(a.data(), a.size());
      append(b.data(), b.size());
    }
    std::vector<float> f(in.codes.size());
    std::vector<bfloat16> h(in.codes.size());
    // Lengths below, at and past the vector steps (16 lanes decoding to float32, 32 looking bfloat16 up), tails after
    // whole steps included.
    for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, int64_t{31}, int64_t{33}, int64_t{63},
                      static_cast<int64_t>(in.codes.size()) - 1, static_cast<int64_t>(in.codes.size())}) {
      float8_to_float(in.codes.data(), f.data(), n, e5m2);
      float8_to_bfloat16(in.codes.data(), h.data(), n, e5m2);
      append(f.data(), static_cast<size_t>(n) * 4);
      append(h.data(), static_cast<size_t>(n) * 2);
    }
  }
  return out;
}

TEST(Float8Isa, EveryLevelGivesTheScalarBits) {
  ResetIsa reset;
  const Inputs in = make_inputs();
  ASSERT_EQ(set_isa_level_for_testing(IsaLevel::kScalar), IsaLevel::kScalar);
  const std::vector<uint8_t> scalar = run_all(in);
  for (IsaLevel l : {IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (set_isa_level_for_testing(l) != l) {
      std::printf("[ note ] %s not supported here: its float8 conversions are not compared\n", isa_level_name(l));
      continue;
    }
    const std::vector<uint8_t> got = run_all(in);
    ASSERT_EQ(got.size(), scalar.size());
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != scalar[i] && mismatches++ == 0) first = i;
    EXPECT_EQ(mismatches, 0u) << isa_level_name(l) << ": first differing byte " << first;
  }
}

// Tensors convert to and from the new dtypes through the same code (each format's default overflow), contiguous or
// strided, at every level.
TEST(Float8Isa, TensorsConvertThroughTheFormats) {
  ResetIsa reset;
  const std::vector<float> values = {0.0f, -0.0f, 1.0f, 0.3f, -448.0f, 500.0f, 1e-3f, -7e4f, 3.0f, 1e-9f, 2.5f};
  for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    set_isa_level_for_testing(l);
    const Tensor t = Tensor::from_floats({11}, values);
    const Tensor e4 = t.to(DType::kFloat8E4M3FN), e5 = t.to(DType::kFloat8E5M2);
    const Tensor scale = t.to(DType::kFloat8E8M0FNU);
    for (int64_t i = 0; i < 11; ++i) {
      const float x = values[static_cast<size_t>(i)];
      EXPECT_EQ(e4.data<float8_e4m3fn>()[i].bits, float_to_e4m3_bits(x, Float8Overflow::kSaturate)) << x;
      EXPECT_EQ(e5.data<float8_e5m2>()[i].bits, float_to_e5m2_bits(x, Float8Overflow::kNonSaturating)) << x;
      EXPECT_EQ(scale.data<float8_e8m0fnu>()[i].bits, float_to_e8m0_bits(x)) << x;
      EXPECT_EQ(e4.to(DType::kFloat32).at(i), e4m3_bits_to_float(e4.data<float8_e4m3fn>()[i].bits));
      const float b = bf16_bits_to_float(float_to_bf16_bits(x));
      EXPECT_EQ(t.to(DType::kBFloat16).to(DType::kFloat8E5M2).data<float8_e5m2>()[i].bits, float_to_e5m2_bits(b)) << x;
    }
    // A strided view (every second element) converts element by element.
    std::vector<float> grid(22);
    for (size_t i = 0; i < grid.size(); ++i) grid[i] = 0.1f * static_cast<float>(i) - 1.0f;
    const Tensor m = Tensor::from_floats({11, 2}, grid);
    const Tensor col = m.transpose(0, 1).to(DType::kFloat8E4M3FN);  // a strided source
    for (int64_t i = 0; i < 11; ++i)
      EXPECT_EQ(col.data<float8_e4m3fn>()[11 + i].bits, float_to_e4m3_bits(grid[static_cast<size_t>(2 * i + 1)]));
    EXPECT_EQ(col.to(DType::kInt32).data<int32_t>()[0], -1);  // -1 is exact, and integers truncate
  }
}

}  // namespace
}  // namespace mixtrain
