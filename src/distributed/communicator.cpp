#include "mixtrain/distributed/communicator.h"

#include <cstdlib>
#include <cstring>

#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {
// A started all-reduce over one process: already complete.
class DoneRequest : public Communicator::Request {
 public:
  void wait() override {}
  bool test() override { return true; }
};
}  // namespace

namespace {
[[noreturn]] void fail_host_only(const Communicator& comm, const Tensor& t) {
  MIXTRAIN_FAIL(kInternal, "the " << comm.backend() << " communicator moves host memory only, not " << t.describe(),
                "stage device tensors through host copies, or use a DeviceCommunicator");
}
}  // namespace

bool Communicator::moves_memory_of(const Device&) const { return false; }
void Communicator::all_reduce_on_device(Tensor& t, ReduceOp) { fail_host_only(*this, t); }
void Communicator::broadcast_on_device(Tensor& t, int) { fail_host_only(*this, t); }

void Communicator::reduce_scatter(float* data, const std::vector<int64_t>& counts) {
  MIXTRAIN_CHECK(static_cast<int>(counts.size()) == size(),
                 "reduce_scatter: " << counts.size() << " block sizes for " << size() << " ranks");
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  all_reduce(data, n, ReduceOp::kSum);
}

void Communicator::all_gather(void* data, const std::vector<int64_t>& byte_counts) {
  MIXTRAIN_CHECK(static_cast<int>(byte_counts.size()) == size(),
                 "all_gather: " << byte_counts.size() << " block sizes for " << size() << " ranks");
  auto* p = static_cast<char*>(data);
  for (int r = 0; r < size(); ++r) {
    broadcast(p, byte_counts[static_cast<size_t>(r)], r);
    p += byte_counts[static_cast<size_t>(r)];
  }
}

void Communicator::all_to_all(const void* send, void* recv, const std::vector<int64_t>& block_bytes) {
  MIXTRAIN_CHECK(static_cast<int>(block_bytes.size()) == size(),
                 "all_to_all: " << block_bytes.size() << " block sizes for " << size() << " ranks");
  int64_t total = 0, offset = 0;
  for (int r = 0; r < size(); ++r) {
    if (r < rank()) offset += block_bytes[static_cast<size_t>(r)];
    total += block_bytes[static_cast<size_t>(r)];
  }
  const int64_t mine = block_bytes[static_cast<size_t>(rank())];
  std::vector<char> buffer(static_cast<size_t>(total));
  for (int s = 0; s < size(); ++s) {
    if (s == rank()) std::memcpy(buffer.data(), send, static_cast<size_t>(total));
    broadcast(buffer.data(), total, s);
    std::memcpy(static_cast<char*>(recv) + s * mine, buffer.data() + offset, static_cast<size_t>(mine));
  }
}

void SingleProcessCommunicator::all_reduce(float*, int64_t n, ReduceOp) {
  MIXTRAIN_CHECK(n >= 0, "all_reduce: negative element count " << n);
}
void SingleProcessCommunicator::all_reduce(double*, int64_t n, ReduceOp) {
  MIXTRAIN_CHECK(n >= 0, "all_reduce: negative element count " << n);
}
std::unique_ptr<Communicator::Request> SingleProcessCommunicator::start_all_reduce(float* data, int64_t n,
                                                                                  ReduceOp op) {
  all_reduce(data, n, op);
  return std::make_unique<DoneRequest>();
}
void SingleProcessCommunicator::broadcast(void*, int64_t bytes, int root) {
  MIXTRAIN_CHECK(bytes >= 0, "broadcast: negative byte count " << bytes);
  MIXTRAIN_CHECK(root == 0, "broadcast: root " << root << " does not exist in a single-process job");
}
void SingleProcessCommunicator::abort(int code) { std::exit(code); }

}  // namespace mixtrain
