// NCCL's collectives behind DeviceCollectives (distributed/device_communicator.h), and NCCL's loading (nccl_api.h).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "mixtrain/core/dynamic_library.h"
#include "mixtrain/core/environment.h"
#include "mixtrain/core/error.h"
#include "mixtrain/distributed/device_communicator.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/side_stream.h"
#include "mixtrain/ops/transfer.h"
#include "nccl_api.h"

namespace mixtrain {

namespace nccl {
namespace {

std::vector<std::string> candidates() {
  std::vector<std::string> names;
  if (const auto path = env::mixtrain_nccl_library(); path && !path->empty()) names.push_back(*path);
  names.emplace_back("libnccl.so.2");
#ifdef MIXTRAIN_CUDA_LIBRARY_DIR
  names.push_back(std::string(MIXTRAIN_CUDA_LIBRARY_DIR) + "/libnccl.so.2");
#endif
  return names;
}

struct Loaded {
  Api api;
  bool ok = false;
  std::string why, library;
  int version = 0;
};

Loaded load_once() {
  Loaded l;
  std::string tried;
  void* lib = open_first_library(candidates(), &tried, &l.library);
  if (!lib) {
    l.why = "NCCL not found (tried " + tried + "; MIXTRAIN_NCCL_LIBRARY=/path/to/libnccl.so.2 names another)";
    return l;
  }
  std::string missing;
  Api& a = l.api;
  bool ok = resolve_symbol(lib, "ncclGetVersion", &a.get_version, &missing);
  ok &= resolve_symbol(lib, "ncclGetUniqueId", &a.get_unique_id, &missing);
  ok &= resolve_symbol(lib, "ncclCommInitRank", &a.comm_init_rank, &missing);
  ok &= resolve_symbol(lib, "ncclCommDestroy", &a.comm_destroy, &missing);
  ok &= resolve_symbol(lib, "ncclGetErrorString", &a.error_string, &missing);
  ok &= resolve_symbol(lib, "ncclAllReduce", &a.all_reduce, &missing);
  ok &= resolve_symbol(lib, "ncclBroadcast", &a.broadcast, &missing);
  ok &= resolve_symbol(lib, "ncclCommGetAsyncError", &a.comm_get_async_error, &missing);
  ok &= resolve_symbol(lib, "ncclCommAbort", &a.comm_abort, &missing);
  if (!ok) {
    close_library(lib);
    l.why = "NCCL lacks " + missing;
    return l;
  }
  // The ABI above is NCCL 2's.
  if (a.get_version(&l.version) != kSuccess || l.version < 20000 || l.version >= 30000) {
    close_library(lib);
    // Before 2.9 NCCL coded its version as X * 1000 + Y * 100 + Z (2.8.4: 2804), below the range above.
    l.why = "NCCL version code " + std::to_string(l.version) + " found (" + l.library +
            "), this build needs NCCL 2.9 or later (version 2)";
    return l;
  }
  l.ok = true;
  return l;
}

}  // namespace

const Api* load(std::string* why, std::string* library, int* version) {
  static const Loaded loaded = load_once();
  if (!loaded.ok) {
    *why = loaded.why;
    return nullptr;
  }
  if (library != nullptr) *library = loaded.library;
  if (version != nullptr) *version = loaded.version;
  return &loaded.api;
}

}  // namespace nccl

namespace {

nccl::RedOp nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return nccl::kSum;
    case ReduceOp::kMax: return nccl::kMax;
    case ReduceOp::kMin: return nccl::kMin;
  }
  return nccl::kSum;
}

// The collectives of one NCCL communicator, watched while it lives (nccl::Watchdog): a rank whose peer died fails
// with NCCL's reason, or after MIXTRAIN_NCCL_TIMEOUT, instead of waiting forever on a collective that cannot finish.
// They run on a stream of their own (ops::SideStream), ordered against the backend's kernels by events, so that a
// synchronous copy or a kernel that does not touch the buffer is not queued behind a collective, and NCCL's kernels
// are not serialized with every launch of the default stream.
class NcclCollectives final : public DeviceCollectives {
 public:
  NcclCollectives(const nccl::Api& api, nccl::Comm comm, const Device& device, double timeout_seconds,
                  ops::StreamDriver& streams)
      : api_(api), comm_(comm), device_(device), side_(streams, device.index),
        watchdog_(api, comm, device.str(), timeout_seconds) {}
  ~NcclCollectives() override {
    // Unwinding: an error is cutting the run short, and a peer may be gone; its collectives are not waited for. (An
    // exception that was already on its way when this communicator was made is not this one's.) The drain,
    // ops::synchronize, waits for every stream of the device, the side stream's collectives included.
    (void)watchdog_.end([this] { ops::synchronize(device_); }, std::uncaught_exceptions() > uncaught_at_start_);
  }
  std::string name() const override { return "nccl"; }

  void all_reduce(Tensor& t, ReduceOp op) override { queue_all_reduce(t, op, true); }
  // The backward pass's buckets: compute goes on while NCCL reduces, until join() (before the optimizer step reads).
  void start_all_reduce(Tensor& t, ReduceOp op) override { queue_all_reduce(t, op, false); }
  void join() override {
    ops::make_current(device_);
    side_.join();
  }
  void broadcast(Tensor& t, int root) override {
    ops::make_current(device_);
    watchdog_.enqueue([&] {
      side_.run(t.raw(), [&](void* stream) {
        check(api_.broadcast(t.raw(), t.raw(), t.nbytes(), nccl::kUint8, root, comm_, stream), "ncclBroadcast");
      });
    });
  }

 private:
  // ncclAllReduce in place on the side stream; compute waits for it at once when `joined`, else at join().
  void queue_all_reduce(Tensor& t, ReduceOp op, bool joined) {
    ops::make_current(device_);
    watchdog_.enqueue([&] {
      side_.start(t.raw(), [&](void* stream) {
        check(api_.all_reduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()), nccl::kFloat32, nccl_op(op), comm_,
                              stream),
              "ncclAllReduce");
      });
    });
    if (joined) side_.join();
  }
  void check(nccl::Result rc, const char* what) const {
    if (rc != nccl::kSuccess)
      MIXTRAIN_FAIL(kInternal, what << " on " << device_.str() << " failed: " << api_.error_string(rc),
                    "NCCL_DEBUG=WARN in the environment makes NCCL say more");
  }

  const nccl::Api& api_;
  nccl::Comm comm_;
  Device device_;
  ops::SideStream side_;  // declared before the watchdog: destroyed after the communicator is freed
  nccl::Watchdog watchdog_;
  const int uncaught_at_start_ = std::uncaught_exceptions();
};

// Whether every rank got here without a reason to stop: the ranks must agree, since one that skipped NCCL's start
// would leave the others waiting in it.
bool all_ranks_ok(Communicator& host, bool ok) {
  double failed = ok ? 0.0 : 1.0;
  host.all_reduce(&failed, 1, ReduceOp::kMax);
  return failed == 0.0;
}

}  // namespace

NcclStatus nccl_status() {
  NcclStatus s;
  std::string library;
  s.loaded = nccl::load(&s.detail, &library, &s.version) != nullptr;
  if (s.loaded)
    s.detail = "NCCL " + std::to_string(s.version / 10000) + "." + std::to_string(s.version / 100 % 100) + "." +
               std::to_string(s.version % 100) + " (" + library + ")";
  return s;
}

std::unique_ptr<DeviceCollectives> nccl_collectives(Communicator& host, const Device& device, std::string* why) {
  // A malformed setting fails here, before any collective (the CLI then aborts the job's other ranks).
  const double timeout = nccl::timeout_seconds();
  std::string reason;
  const nccl::Api* api = nullptr;
  if (device.type != DeviceType::kCuda) {
    reason = "NCCL serves CUDA devices, not " + device.str();
  } else if (const ops::CudaBackendStatus s = ops::load_cuda_backend(); !s.loaded) {
    reason = "the CUDA backend is not loaded (" + s.detail + ")";
  } else {
    api = nccl::load(&reason);
  }
  if (!all_ranks_ok(host, api != nullptr)) {
    *why = reason.empty() ? "another rank cannot use NCCL" : reason;
    return nullptr;
  }
  ops::make_current(device);
  // Rank 0 makes the id every rank's communicator is created from; its outcome travels with it.
  struct {
    int32_t rc = nccl::kSuccess;
    nccl::UniqueId id{};
  } start;
  if (host.rank() == 0) start.rc = api->get_unique_id(&start.id);
  host.broadcast(&start, static_cast<int64_t>(sizeof start), 0);
  if (start.rc != nccl::kSuccess) {
    *why = std::string("ncclGetUniqueId failed on rank 0: ") + api->error_string(start.rc);
    return nullptr;
  }
  nccl::Comm comm = nullptr;
  const nccl::Result rc = api->comm_init_rank(&comm, host.size(), start.id, host.rank());
  if (!all_ranks_ok(host, rc == nccl::kSuccess)) {
    if (rc == nccl::kSuccess) api->comm_destroy(comm);
    *why = rc != nccl::kSuccess ? std::string("ncclCommInitRank failed: ") + api->error_string(rc)
                                : "ncclCommInitRank failed on another rank";
    return nullptr;
  }
  try {
    return nccl::make_collectives(*api, comm, device, timeout, *ops::cuda_stream_driver());
  } catch (...) {  // the side stream or the watchdog's thread could not start: the communicator is not left behind
    api->comm_destroy(comm);
    throw;
  }
}

namespace nccl {
std::unique_ptr<DeviceCollectives> make_collectives(const Api& api, Comm comm, const Device& device,
                                                    double timeout_seconds, ops::StreamDriver& streams) {
  return std::make_unique<NcclCollectives>(api, comm, device, timeout_seconds, streams);
}
}  // namespace nccl

}  // namespace mixtrain
