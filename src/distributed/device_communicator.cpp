#include "mixtrain/distributed/device_communicator.h"

#include <chrono>
#include <cstdlib>

#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {
using Clock = std::chrono::steady_clock;

void add(CommStats& to, const CommStats& after, const CommStats& before) {
  to.calls += after.calls - before.calls;
  to.bytes += after.bytes - before.bytes;
  to.seconds += after.seconds - before.seconds;
}

// A started host all-reduce whose wait is counted in the device communicator's stats as well as the host's.
class CountedRequest : public Communicator::Request {
 public:
  CountedRequest(std::unique_ptr<Communicator::Request> inner, const Communicator& host, CommStats& stats)
      : inner_(std::move(inner)), host_(host), stats_(stats) {}
  void wait() override {
    const CommStats before = host_.stats();
    inner_->wait();
    add(stats_, host_.stats(), before);
  }
  bool test() override {
    const CommStats before = host_.stats();
    const bool done = inner_->test();
    add(stats_, host_.stats(), before);
    return done;
  }

 private:
  std::unique_ptr<Communicator::Request> inner_;
  const Communicator& host_;
  CommStats& stats_;
};
}  // namespace

DeviceCommunicator::DeviceCommunicator(Communicator& host, const Device& device,
                                       std::unique_ptr<DeviceCollectives> collectives)
    : host_(host), device_(device), collectives_(std::move(collectives)) {
  MIXTRAIN_CHECK(!device.is_cpu(), "DeviceCommunicator: needs a device, got " << device.str());
  MIXTRAIN_CHECK(collectives_ != nullptr, "DeviceCommunicator: no device collectives for " << device.str());
}

std::string DeviceCommunicator::backend() const { return host_.backend() + "+" + collectives_->name(); }

template <typename F>
void DeviceCommunicator::counted(const F& host_call) {
  const CommStats before = host_.stats();
  host_call();
  add(stats_, host_.stats(), before);
}

void DeviceCommunicator::all_reduce(float* data, int64_t n, ReduceOp op) {
  counted([&] { host_.all_reduce(data, n, op); });
}
void DeviceCommunicator::all_reduce(double* data, int64_t n, ReduceOp op) {
  counted([&] { host_.all_reduce(data, n, op); });
}
std::unique_ptr<Communicator::Request> DeviceCommunicator::start_all_reduce(float* data, int64_t n, ReduceOp op) {
  std::unique_ptr<Request> r;
  counted([&] { r = host_.start_all_reduce(data, n, op); });
  return std::make_unique<CountedRequest>(std::move(r), host_, stats_);
}
void DeviceCommunicator::broadcast(void* data, int64_t bytes, int root) {
  counted([&] { host_.broadcast(data, bytes, root); });
}
void DeviceCommunicator::barrier() {
  counted([&] { host_.barrier(); });
}
void DeviceCommunicator::abort(int code) {
  host_.abort(code);
  std::exit(code);  // not reached: the host's abort ends the process
}

template <typename F>
void DeviceCommunicator::queue(const Tensor& t, const char* what, const F& device_call) {
  MIXTRAIN_CHECK(t.defined() && t.is_contiguous() && t.device() == device_,
                 what << ": needs a contiguous tensor on " << device_.str() << ", got " << t.describe());
  const auto start = Clock::now();
  device_call();
  ++stats_.calls;
  stats_.bytes += static_cast<int64_t>(t.nbytes());
  stats_.seconds += std::chrono::duration<double>(Clock::now() - start).count();
}

void DeviceCommunicator::all_reduce_on_device(Tensor& t, ReduceOp op) {
  MIXTRAIN_CHECK(t.defined() && t.dtype() == DType::kFloat32,
                 "all_reduce_on_device: reduces float32, got " << t.describe());
  queue(t, "all_reduce_on_device", [&] { collectives_->all_reduce(t, op); });
}

void DeviceCommunicator::start_all_reduce_on_device(Tensor& t, ReduceOp op) {
  MIXTRAIN_CHECK(t.defined() && t.dtype() == DType::kFloat32,
                 "start_all_reduce_on_device: reduces float32, got " << t.describe());
  queue(t, "start_all_reduce_on_device", [&] { collectives_->start_all_reduce(t, op); });
}

void DeviceCommunicator::join_device() { collectives_->join(); }

void DeviceCommunicator::broadcast_on_device(Tensor& t, int root) {
  MIXTRAIN_CHECK(root >= 0 && root < size(), "broadcast_on_device: root " << root << " is not a rank of " << size());
  queue(t, "broadcast_on_device", [&] { collectives_->broadcast(t, root); });
}

std::unique_ptr<Communicator> device_communicator(Communicator& host, const Device& device, std::string* why) {
  std::unique_ptr<DeviceCollectives> c = nccl_collectives(host, device, why);
  if (!c) return nullptr;
  return std::make_unique<DeviceCommunicator>(host, device, std::move(c));
}

}  // namespace mixtrain
