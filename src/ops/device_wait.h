// The host's waits for a GPU while device wait checks are registered (ops/cuda_backend.h): each wait is published
// (when it began, for device_wait_seconds) while it blocks, and the checks run when it returns. Plain C++: tested
// on every machine (tests/ops/device_wait_test.cpp); the CUDA backend wraps its blocking calls in checked_wait.
#pragma once

#include <functional>

namespace mixtrain::ops {

// Whether any check is registered.
bool device_waits_checked();

// Runs blocking(), a call that returns when work queued on a GPU is done, as a published wait, then every check.
// Without a registered check it only runs blocking(). When blocking() throws, the checks run first: the reason the
// queued work was cut short outranks the error that caused.
void checked_wait(const std::function<void()>& blocking);

// Runs blocking() as a published wait without running the checks: for a call whose caller cannot take an error once
// the call has done its work (cudaFree of a segment the allocator has already let go). The next checked wait
// reports what a check finds.
void published_wait(const std::function<void()>& blocking);

}  // namespace mixtrain::ops
