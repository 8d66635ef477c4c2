// Fixture for tests that set dtype policies: the CPU precision warning is silenced while they run, and
// the global policy is float32 again afterwards, whatever the test set.
#pragma once

#include <gtest/gtest.h>

#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/precision/policy.h"

namespace mixtrain {

class QuietPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override { set_precision_warning_sink([](const std::string&) {}); }
  void TearDown() override {
    set_global_policy("float32");
    set_precision_warning_sink(nullptr);
  }
};

}  // namespace mixtrain
