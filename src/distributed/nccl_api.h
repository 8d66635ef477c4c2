// NCCL, loaded at run time: the few functions and constants the device collectives use, declared here with
// NCCL's ABI (nccl.h's enums are ints, its id a 128-byte struct passed by value, its communicator and CUDA's
// stream opaque pointers), so that every build compiles the NCCL path without NCCL's header or library, and a
// binary runs where NCCL is missing (it then stages device memory through the host). nccl_api_test checks these
// values against nccl.h where that header is installed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "mixtrain/distributed/device_communicator.h"
#include "mixtrain/ops/side_stream.h"

namespace mixtrain::nccl {

using Result = int;     // ncclResult_t
using DataType = int;   // ncclDataType_t
using RedOp = int;      // ncclRedOp_t
using Comm = void*;     // ncclComm_t
using Stream = void*;   // cudaStream_t

inline constexpr int kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct UniqueId {
  char internal[kUniqueIdBytes];
};

inline constexpr Result kSuccess = 0;     // ncclSuccess
inline constexpr Result kInProgress = 7;  // ncclInProgress: a nonblocking communicator's call still running
inline constexpr DataType kUint8 = 1;     // ncclUint8
inline constexpr DataType kFloat32 = 7;   // ncclFloat32
inline constexpr RedOp kSum = 0;          // ncclSum
inline constexpr RedOp kMax = 2;          // ncclMax
inline constexpr RedOp kMin = 3;          // ncclMin

struct Api {
  Result (*get_version)(int* version) = nullptr;
  Result (*get_unique_id)(UniqueId* id) = nullptr;
  Result (*comm_init_rank)(Comm* comm, int nranks, UniqueId id, int rank) = nullptr;
  Result (*comm_destroy)(Comm comm) = nullptr;
  const char* (*error_string)(Result result) = nullptr;
  Result (*all_reduce)(const void* send, void* recv, size_t count, DataType type, RedOp op, Comm comm,
                       Stream stream) = nullptr;
  Result (*broadcast)(const void* send, void* recv, size_t count, DataType type, int root, Comm comm,
                      Stream stream) = nullptr;
  Result (*comm_get_async_error)(Comm comm, Result* async_error) = nullptr;
  Result (*comm_abort)(Comm comm) = nullptr;
};

// Loads NCCL once (later calls return the first call's outcome); null with the reason in *why when it cannot.
// *library (when given) is the name or path it was opened by, *version its NCCL_VERSION_CODE.
const Api* load(std::string* why, std::string* library = nullptr, int* version = nullptr);

// The collectives of comm (a communicator of api's) on `device`, queued on a side stream that `streams` makes and
// ordered against the device's kernels by its events (ops/side_stream.h), and watched (Watchdog): what
// nccl_collectives returns, from parts a test may stand in for. Frees comm when destroyed (Watchdog::end).
std::unique_ptr<DeviceCollectives> make_collectives(const Api& api, Comm comm, const Device& device,
                                                    double timeout_seconds, ops::StreamDriver& streams);

// What the watchdog finds about the collectives queued on comm while the host has waited waited_seconds for the
// GPU: "" when nothing is wrong; else why they will not finish (an asynchronous error NCCL reports, such as a peer's
// connection lost, or a wait longer than timeout_seconds; 0: no limit). It only asks: the watchdog aborts.
std::string check_progress(const Api& api, Comm comm, double waited_seconds, double timeout_seconds);

// The longest a host wait may last while NCCL collectives are queued: MIXTRAIN_NCCL_TIMEOUT in seconds (0: no
// limit), 600 when unset (a wait covers at most a logging interval's steps). Error (kInvalidInput) when malformed.
double timeout_seconds();

// Watches one communicator from a thread of its own while it lives: every `period` it asks check_progress, with the
// host's current wait for the GPU (ops::device_wait_seconds). On a finding it first records the reason, then
// aborts comm (ncclCommAbort ends its kernels), so a host blocked in a published wait is freed and that wait fails
// with the reason (an ops device wait check), as do later collectives (enqueue). A host blocked elsewhere in the
// driver (a kernel launch behind a full queue) is freed by the abort that NCCL's own error report brings; the
// timeout does not see it.
class Watchdog {
 public:
  Watchdog(const Api& api, Comm comm, std::string where, double timeout_seconds,
           std::chrono::milliseconds period = std::chrono::milliseconds(50));
  // Stops the thread and removes the check (comm stays the owner's: freed by end(), or by the owner).
  ~Watchdog();
  // Stops the thread (once; the check stays until destruction): after it, aborted() no longer changes.
  void stop();

  // How end() freed comm.
  enum class Ending { kAlreadyAborted, kDestroyed, kAborted };
  // Frees comm without hanging on a peer that is gone (call it once, from the owner's destructor; it does not
  // throw). ncclCommDestroy waits for comm's queued collectives, so they are drained first while the watchdog still
  // runs (drain: a published wait for the GPU, such as ops::synchronize), which bounds that wait by the timeout and
  // NCCL's own error reports (with MIXTRAIN_NCCL_TIMEOUT=0 only by the latter). Then destroyed, unless something went
  // wrong: when the stack is unwinding (an error cut the run short, and a queued collective may wait for a rank that
  // stopped: no drain then), when stop() came first (no drain either: nothing would watch it), when draining or a
  // collective's call failed, or when NCCL reports an asynchronous error, comm is aborted instead (its queued work
  // is dropped).
  Ending end(const std::function<void()>& drain, bool unwinding) noexcept;
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  bool aborted() const;
  std::string reason() const;  // why comm was aborted; empty while it works
  // Runs call, which queues a collective on comm, unless comm was aborted (then Error, kInternal, with the reason;
  // also when the abort came while call ran, whatever call raised). The abort waits for a call under way, so a
  // collective is not being queued on a communicator being freed; but for a second at most: a call stuck in the
  // driver (a kernel launch behind a full queue) is only freed by the abort, which NCCL's rules on one communicator
  // and two threads do not cover. A stuck rank is the worse outcome.
  void enqueue(const std::function<void()>& call);

 private:
  struct State;
  void run(double timeout_seconds, std::chrono::milliseconds period);

  const Api& api_;
  Comm comm_;
  std::shared_ptr<State> state_;  // shared with the device wait check, which may run after this is gone
  std::timed_mutex comm_mu_;      // held by enqueue's call and by the abort
  int check_ = 0;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mixtrain::nccl
