// The host's waits for a GPU while device wait watches are registered (ops/cuda_backend.h): instead of blocking in
// the driver until the queued work is done, which never happens when a collective's peer has died, the wait polls
// and runs the watches between polls. Plain C++: tested on every machine (tests/ops/device_wait_test.cpp); the
// CUDA backend supplies the poll (cudaStreamQuery).
#pragma once

#include <functional>

namespace mixtrain::ops {

// Whether any watch is registered (else a wait may block in the driver as it always did).
bool device_waits_watched();

// Returns once done() says true. Between polls (at first every few microseconds, then backing off to every 2 ms)
// it calls every watch with the seconds waited so far; an exception from done() or a watch ends the wait.
void wait_watched(const std::function<bool()>& done);

}  // namespace mixtrain::ops
