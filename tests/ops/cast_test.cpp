// ops::cast, and the backward passes that convert an incoming gradient of another dtype with it. On the CPU the
// cast is Tensor::to's conversion; what these tests pin down is that the ops reach it through the cast table,
// whose CUDA entry is what lets a float32 gradient into a 16-bit op on a GPU (Tensor::to reads host memory only).
// A counting kernel installed in the table's CPU entry sees every conversion; the results must not change.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/conv2d.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/loss_scale.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/transfer.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;

bool same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.dtype() == cb.dtype() && ca.shape() == cb.shape() && std::memcmp(ca.raw(), cb.raw(), ca.nbytes()) == 0;
}

int g_casts = 0;
void counting_cast(const Tensor& src, Tensor& dst) {
  ++g_casts;
  dst.copy_from(src);
}

// Installs the counting kernel for its lifetime, then puts the CPU's back.
class CountingCast {
 public:
  CountingCast() : override_(cpu_backend(), &counting_cast) { g_casts = 0; }
  CountingCast(const CountingCast&) = delete;
  CountingCast& operator=(const CountingCast&) = delete;
  int count() const { return g_casts; }

 private:
  KernelOverride<Op::cast> override_;
};

TEST(Cast, GivesTheBitsOfTensorToAndLeavesTheSameDtypeAlone) {
  const Tensor base = random_tensor({5, 7}, 3, DType::kFloat32, -70000.0f, 70000.0f);  // float16 overflows too
  for (DType from : kFloatDTypes) {
    const Tensor x = base.to(from);
    for (DType to : kFloatDTypes) {
      const std::string what = std::string(dtype_name(from)) + " -> " + dtype_name(to);
      const Tensor y = cast(x, to);
      EXPECT_TRUE(same_bits(y, x.to(to))) << what;
      if (from == to) {
        EXPECT_EQ(y.raw(), x.raw()) << what;  // no copy
      }
      // A transposed view is read through its strides.
      const Tensor t = x.transpose(0, 1);
      const Tensor yt = cast(t, to);
      EXPECT_TRUE(same_bits(yt, t.to(to))) << what << " (view)";
      if (from != to) {
        EXPECT_TRUE(yt.is_contiguous()) << what;
      }
    }
  }
  EXPECT_THROW(cast(Tensor(), DType::kFloat32), Error);
}

// Each backward pass given a float32 gradient for float16 operands converts it through the cast table (once at
// least) and returns what it returns for the gradient converted beforehand; a gradient already in the operands'
// dtype is not converted at all.
TEST(Cast, BackwardPassesConvertAMixedDtypeGradientThroughTheCastTable) {
  const DType h = DType::kFloat16;
  {
    const Tensor x = random_tensor({3, 4, 5}, 1, h), w = random_tensor({5, 6}, 2, h);
    const Tensor dy = random_tensor({3, 4, 6}, 3, DType::kFloat32);
    const LinearGrads want = linear_backward(dy.to(h), x, w, true, true);
    CountingCast counter;
    const LinearGrads got = linear_backward(dy, x, w, true, true);
    EXPECT_GE(counter.count(), 1) << "linear_backward";
    EXPECT_TRUE(same_bits(got.dx, want.dx) && same_bits(got.dw, want.dw) && same_bits(got.dbias, want.dbias));
    const int before = counter.count();
    linear_backward(dy.to(h), x, w, true, true);
    EXPECT_EQ(counter.count(), before) << "a float16 gradient needs no conversion";
  }
  {
    const Tensor a = random_tensor({2, 3, 4}, 4, h), b = random_tensor({2, 4, 5}, 5, h);
    const Tensor dc = random_tensor({2, 3, 5}, 6, DType::kFloat32);
    const BmmGrads want = bmm_backward(dc.to(h), a, b, false, false, true, true);
    CountingCast counter;
    const BmmGrads got = bmm_backward(dc, a, b, false, false, true, true);
    EXPECT_GE(counter.count(), 1) << "bmm_backward";
    EXPECT_TRUE(same_bits(got.da, want.da) && same_bits(got.db, want.db));
  }
  {
    const Tensor x = random_tensor({2, 6, 5, 3}, 7, h), k = random_tensor({3, 3, 3, 4}, 8, h);
    Conv2dOptions o;
    o.padding = Padding::kSame;
    const Tensor dy = random_tensor({2, 6, 5, 4}, 9, DType::kFloat32);
    const Conv2dGrads want = conv2d_backward(dy.to(h), x, k, o, true, true);
    CountingCast counter;
    const Conv2dGrads got = conv2d_backward(dy, x, k, o, true, true);
    EXPECT_GE(counter.count(), 1) << "conv2d_backward";
    EXPECT_TRUE(same_bits(got.dx, want.dx) && same_bits(got.dkernel, want.dkernel) &&
                same_bits(got.dbias, want.dbias));
  }
  {
    const Tensor q = random_tensor({2, 5, 8}, 10, h), k = random_tensor({2, 5, 8}, 11, h);
    const Tensor v = random_tensor({2, 5, 8}, 12, h);
    AttentionOptions o;
    o.num_heads = 2;
    o.causal = true;
    o.scale = 0.5f;
    const Tensor probs = scaled_dot_product_attention(q, k, v, o).probs;
    const Tensor dout = random_tensor({2, 5, 8}, 13, DType::kFloat32);
    const AttentionGrads want = scaled_dot_product_attention_backward(dout.to(h), q, k, v, probs, o);
    CountingCast counter;
    const AttentionGrads got = scaled_dot_product_attention_backward(dout, q, k, v, probs, o);
    EXPECT_GE(counter.count(), 1) << "scaled_dot_product_attention_backward";
    EXPECT_TRUE(same_bits(got.dq, want.dq) && same_bits(got.dk, want.dk) && same_bits(got.dv, want.dv));
  }
  {
    const Tensor x = random_tensor({4, 7}, 14, h);
    const Tensor dy = random_tensor({4, 7}, 15, DType::kFloat32);
    CountingCast counter;
    const Tensor dx = activation_backward(dy, x, x, Activation::kLinear);
    EXPECT_GE(counter.count(), 1) << "activation_backward (linear)";
    EXPECT_TRUE(same_bits(dx, dy.to(h)));
  }
  {
    const Tensor loss = Tensor::from_floats({2}, {2.5f, -3.0f}, h);
    const Tensor state = Tensor::from_floats({2}, {1024.0f, 1024.0f});
    CountingCast counter;
    const Tensor out = apply_loss_scale(loss, state);
    EXPECT_GE(counter.count(), 1) << "apply_loss_scale";
    EXPECT_TRUE(same_bits(out, Tensor::from_floats({2}, {2560.0f, -3072.0f})));
  }
}

}  // namespace
}  // namespace mixtrain::ops
