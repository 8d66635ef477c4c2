// mixtrain_gpu_bench: the loss-scaling step on a GPU, checked against the CPU backend, then timed. Needs only the
// library (no test or benchmark framework), so scripts/gpu-check.sh can build it on a machine that has the CUDA
// toolkit and little else.
//
// For each dtype (float32, float16, bfloat16) and flat gradient buffer size n: fill, unscale_and_check and
// update_loss_scale, as LossScaleOptimizer::apply_arena chains them, run `steps` times with one read-back at the
// end (the step itself reads nothing back). The first size is also run on the CPU with an inf planted in the
// buffer on every third step: the GPU's unscaled values, flag, scale and counters must be bit-identical, or the
// program exits 1. Prints one JSON line per case.
//   mixtrain_gpu_bench [steps]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/loss_scale.h"
#include "mixtrain/ops/transfer.h"

using namespace mixtrain;

namespace {

bool same_bits(const Tensor& gpu, const Tensor& cpu) {
  const Tensor h = ops::to_device(gpu, Device::cpu());
  return h.nbytes() == cpu.nbytes() && std::memcmp(h.raw(), cpu.raw(), cpu.nbytes()) == 0;
}

// The loss-scale state of one device.
struct Step {
  Tensor grads, out, state, counters, flag;
  Step(const Tensor& host_grads, const Device& d)
      : grads(ops::to_device(host_grads, d)),
        out(Tensor::empty({host_grads.numel()}, DType::kFloat32, d)),
        state(ops::to_device(Tensor::from_floats({2}, {32768.0f, 32768.0f}), d)),
        counters(ops::to_device(initial_counters(), d)),
        flag(ops::to_device(Tensor::zeros({1}, DType::kFloat32), d)) {}
  // As a LossScaleOptimizer starts: the hysteresis (1) to spend, everything else zero.
  static Tensor initial_counters() {
    Tensor c = Tensor::zeros({ops::kLsNumCounters}, DType::kInt32);
    c.data<int32_t>()[ops::kLsHysteresisLeft] = 1;
    return c;
  }
  void run(const ops::LossScaleRule& rule) {
    ops::fill(flag, 0.0f);
    ops::unscale_and_check(grads, state, flag, out);
    ops::update_loss_scale(state, counters, flag, rule);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const ops::CudaBackendStatus status = ops::load_cuda_backend();
  if (!status.loaded) {
    std::fprintf(stderr, "mixtrain_gpu_bench: %s\n", status.detail.c_str());
    return 2;
  }
  std::printf("{\"what\": \"gpu\", \"detail\": \"%s\"}\n", status.detail.c_str());
  const Device gpu = Device::cuda(0);
  ops::LossScaleRule rule;
  rule.growth_steps = 5;  // growth and backoff both happen within the checked steps
  int failures = 0;
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    bool first = true;
    for (int64_t n : {int64_t{1} << 20, int64_t{1} << 24, int64_t{1} << 27}) {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 101 - 50) * 0.25f;
      const Tensor finite = Tensor::from_floats({n}, v, dt);
      Step g(finite, gpu);
      if (first) {
        v[static_cast<size_t>(n / 3)] = std::numeric_limits<float>::infinity();
        const Tensor overflowing = Tensor::from_floats({n}, v, dt);
        const Tensor d_overflowing = ops::to_device(overflowing, gpu), d_finite = g.grads;
        Step c(finite, Device::cpu());
        bool ok = true;
        for (int i = 0; i < 30 && ok; ++i) {
          const bool inf = i % 3 == 2;
          c.grads = inf ? overflowing : finite;
          g.grads = inf ? d_overflowing : d_finite;
          c.run(rule);
          g.run(rule);
          ok = same_bits(g.out, c.out) && same_bits(g.flag, c.flag) && same_bits(g.state, c.state) &&
               same_bits(g.counters, c.counters);
        }
        g.grads = d_finite;
        std::printf("{\"what\": \"mixtrain_unscale_check\", \"dtype\": \"%s\", \"n\": %lld, \"bit_identical\": %s}\n",
                    dtype_name(dt), static_cast<long long>(n), ok ? "true" : "false");
        failures += ok ? 0 : 1;
        first = false;
      }
      for (int i = 0; i < 10; ++i) g.run(rule);
      (void)ops::to_device(g.flag, Device::cpu());  // waits for the warm-up
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) g.run(rule);
      const float flag_value = ops::to_device(g.flag, Device::cpu()).item();  // the one read-back
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double bytes = static_cast<double>(n) * (static_cast<double>(dtype_size(dt)) + 4.0);
      std::printf(
          "{\"what\": \"mixtrain_unscale_step\", \"dtype\": \"%s\", \"n\": %lld, \"us_per_step\": %.3f, "
          "\"gb_per_s\": %.1f, \"found_inf\": %g}\n",
          dtype_name(dt), static_cast<long long>(n), 1e6 * s / steps, bytes * steps / s / 1e9, flag_value);
    }
  }
  return failures == 0 ? 0 : 1;
}
