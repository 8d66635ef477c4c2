// GradientSink (src/autograd/gradient_sink.h): gradients kept by variable id in the variable's dtype, summed in
// place, never aliasing a gradient someone else holds; and the sink in force on this thread.
#include <gtest/gtest.h>

#include "autograd/gradient_sink.h"

namespace mixtrain::detail {
namespace {

TEST(GradientSink, TakesEverythingButTheIntermediates) {
  GradientSink sink;
  int variable = 0, intermediate = 0;
  sink.intermediates.insert(&intermediate);
  EXPECT_TRUE(sink.takes(&variable));
  EXPECT_FALSE(sink.takes(&intermediate));
}

TEST(GradientSink, KeepsTheFirstGradientInTheVariablesDtypeAndSumsTheRest) {
  GradientSink sink;
  int id = 0;
  sink.add(&id, DType::kFloat16, Tensor::from_floats({3}, {1.0f, 2.0f, 0.5f}), /*owned=*/true);
  ASSERT_EQ(sink.grads.count(&id), 1u);
  EXPECT_EQ(sink.grads.at(&id).dtype(), DType::kFloat16);
  sink.add(&id, DType::kFloat16, Tensor::from_floats({3}, {0.25f, -2.0f, 1.0f}), /*owned=*/false);
  EXPECT_EQ(sink.grads.at(&id).to_floats(), (std::vector<float>{1.25f, 0.0f, 1.5f}));
}

TEST(GradientSink, CopiesAGradientItDoesNotOwn) {
  GradientSink sink;
  int id = 0;
  const Tensor shared = Tensor::from_floats({2}, {1.0f, 2.0f});
  sink.add(&id, DType::kFloat32, shared, /*owned=*/false);
  EXPECT_FALSE(sink.grads.at(&id).shares_storage(shared));
  sink.add(&id, DType::kFloat32, shared, /*owned=*/false);
  EXPECT_EQ(shared.to_floats(), (std::vector<float>{1.0f, 2.0f}));  // the sum went into the sink's copy
  EXPECT_EQ(sink.grads.at(&id).to_floats(), (std::vector<float>{2.0f, 4.0f}));

  int owned_id = 0;
  const Tensor owned = Tensor::from_floats({2}, {3.0f, 4.0f});
  sink.add(&owned_id, DType::kFloat32, owned, /*owned=*/true);
  EXPECT_TRUE(sink.grads.at(&owned_id).shares_storage(owned));
}

TEST(GradientSink, OneInForceAThread) {
  EXPECT_EQ(active_gradient_sink(), nullptr);
  GradientSink sink;
  set_active_gradient_sink(&sink);
  EXPECT_EQ(active_gradient_sink(), &sink);
  set_active_gradient_sink(nullptr);
  EXPECT_EQ(active_gradient_sink(), nullptr);
}

}  // namespace
}  // namespace mixtrain::detail
