// Communicator on MPI's world communicator. Compiled only when the build found MPI (MIXTRAIN_HAVE_MPI).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <vector>

#include "mixtrain/core/error.h"
#include "mpi_world.h"

namespace mixtrain::detail {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  MIXTRAIN_FAIL(kInternal, what << " failed: " << std::string(text, static_cast<size_t>(len)), "");
}

// MPI counts are int: a larger buffer travels in pieces.
constexpr int64_t kMaxCount = std::numeric_limits<int>::max() / 2;

class MpiCommunicator;

class MpiRequest : public Communicator::Request {
 public:
  MpiRequest(std::vector<MPI_Request> requests, CommStats* stats) : requests_(std::move(requests)), stats_(stats) {}
  ~MpiRequest() override {
    // An unwaited request would leave its buffer in MPI's hands: finish it (errors cannot leave a destructor).
    if (!requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void wait() override {
    const auto t = Clock::now();
    check(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    requests_.clear();
    stats_->seconds += since(t);
  }
  bool test() override {
    if (requests_.empty()) return true;
    const auto t = Clock::now();
    int done = 0;
    check(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE),
          "MPI_Testall");
    if (done) requests_.clear();  // completed requests are freed by MPI_Testall
    stats_->seconds += since(t);
    return done != 0;
  }

 private:
  std::vector<MPI_Request> requests_;
  CommStats* stats_;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      owns_mpi_ = true;
    }
    // Errors come back as codes (turned into mixtrain::Error) instead of aborting inside MPI.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_mpi_ && !finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce(float* data, int64_t n, ReduceOp op) override { reduce(data, n, MPI_FLOAT, sizeof(float), op); }
  void all_reduce(double* data, int64_t n, ReduceOp op) override {
    reduce(data, n, MPI_DOUBLE, sizeof(double), op);
  }

  std::unique_ptr<Request> start_all_reduce(float* data, int64_t n, ReduceOp op) override {
    MIXTRAIN_CHECK(n >= 0, "start_all_reduce: negative element count " << n);
    const auto t = Clock::now();
    std::vector<MPI_Request> requests;
    for (int64_t done = 0; done < n; done += kMaxCount) {
      MPI_Request r;
      const int count = static_cast<int>(std::min(kMaxCount, n - done));
      check(MPI_Iallreduce(MPI_IN_PLACE, data + done, count, MPI_FLOAT, mpi_op(op), MPI_COMM_WORLD, &r),
            "MPI_Iallreduce");
      requests.push_back(r);
    }
    ++stats_.calls;
    stats_.bytes += n * static_cast<int64_t>(sizeof(float));
    stats_.seconds += since(t);
    return std::make_unique<MpiRequest>(std::move(requests), &stats_);
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    MIXTRAIN_CHECK(bytes >= 0, "broadcast: negative byte count " << bytes);
    MIXTRAIN_CHECK(root >= 0 && root < size_, "broadcast: root " << root << " is not a rank of " << size_);
    const auto t = Clock::now();
    auto* p = static_cast<char*>(data);
    for (int64_t done = 0; done < bytes; done += kMaxCount)
      check(MPI_Bcast(p + done, static_cast<int>(std::min(kMaxCount, bytes - done)), MPI_BYTE, root, MPI_COMM_WORLD),
            "MPI_Bcast");
    ++stats_.calls;
    stats_.bytes += bytes;
    stats_.seconds += since(t);
  }

  void reduce_scatter(float* data, const std::vector<int64_t>& counts) override {
    const std::vector<int> c = int_counts(counts, "reduce_scatter");
    const auto t = Clock::now();
    int64_t offset = 0;
    for (int r = 0; r < rank_; ++r) offset += c[static_cast<size_t>(r)];
    // Into a block of its own, then back in place: MPI_IN_PLACE puts the result at the start of the buffer.
    std::vector<float> mine(static_cast<size_t>(c[static_cast<size_t>(rank_)]));
    check(MPI_Reduce_scatter(data, mine.data(), c.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Reduce_scatter");
    std::copy(mine.begin(), mine.end(), data + offset);
    ++stats_.calls;
    for (int v : c) stats_.bytes += static_cast<int64_t>(v) * static_cast<int64_t>(sizeof(float));
    stats_.seconds += since(t);
  }

  void all_gather(void* data, const std::vector<int64_t>& byte_counts) override {
    const std::vector<int> c = int_counts(byte_counts, "all_gather");
    std::vector<int> displs(c.size(), 0);
    for (size_t r = 1; r < c.size(); ++r) displs[r] = displs[r - 1] + c[r - 1];
    const auto t = Clock::now();
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, data, c.data(), displs.data(), MPI_BYTE, MPI_COMM_WORLD),
          "MPI_Allgatherv");
    ++stats_.calls;
    stats_.bytes += c[static_cast<size_t>(rank_)];
    stats_.seconds += since(t);
  }

  void all_to_all(const void* send, void* recv, const std::vector<int64_t>& block_bytes) override {
    const std::vector<int> c = int_counts(block_bytes, "all_to_all");
    const int mine = c[static_cast<size_t>(rank_)];
    MIXTRAIN_CHECK(static_cast<int64_t>(mine) * size_ <= std::numeric_limits<int>::max(),
                   "all_to_all: " << mine << " bytes from each of " << size_ << " ranks exceed one MPI call's int count");
    std::vector<int> send_displs(c.size(), 0), recv_counts(c.size(), mine), recv_displs(c.size(), 0);
    for (size_t r = 1; r < c.size(); ++r) {
      send_displs[r] = send_displs[r - 1] + c[r - 1];
      recv_displs[r] = recv_displs[r - 1] + mine;
    }
    const auto t = Clock::now();
    check(MPI_Alltoallv(send, c.data(), send_displs.data(), MPI_BYTE, recv, recv_counts.data(), recv_displs.data(),
                        MPI_BYTE, MPI_COMM_WORLD),
          "MPI_Alltoallv");
    ++stats_.calls;
    for (size_t r = 0; r < c.size(); ++r)
      if (static_cast<int>(r) != rank_) stats_.bytes += c[r];  // a rank's own block does not travel
    stats_.seconds += since(t);
  }

  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
  }

 private:
  void reduce(void* data, int64_t n, MPI_Datatype type, size_t elem, ReduceOp op) {
    MIXTRAIN_CHECK(n >= 0, "all_reduce: negative element count " << n);
    const auto t = Clock::now();
    auto* p = static_cast<char*>(data);
    for (int64_t done = 0; done < n; done += kMaxCount)
      check(MPI_Allreduce(MPI_IN_PLACE, p + done * static_cast<int64_t>(elem),
                          static_cast<int>(std::min(kMaxCount, n - done)), type, mpi_op(op), MPI_COMM_WORLD),
            "MPI_Allreduce");
    ++stats_.calls;
    stats_.bytes += n * static_cast<int64_t>(elem);
    stats_.seconds += since(t);
  }

  // One count per rank, each (and their sum: the displacements are int too) within MPI's int.
  std::vector<int> int_counts(const std::vector<int64_t>& counts, const char* what) const {
    MIXTRAIN_CHECK(static_cast<int>(counts.size()) == size_, what << ": " << counts.size() << " block sizes for "
                                                                     << size_ << " ranks");
    int64_t total = 0;
    std::vector<int> out;
    for (int64_t v : counts) {
      MIXTRAIN_CHECK(v >= 0, what << ": negative block size " << v);
      total += v;
      out.push_back(static_cast<int>(v));
    }
    MIXTRAIN_CHECK(total <= std::numeric_limits<int>::max(),
                   what << ": " << total << " elements or bytes exceed one MPI call's int count");
    return out;
  }

  int rank_ = 0, size_ = 1;
  bool owns_mpi_ = false;
};
}  // namespace

Communicator& mpi_world() {
  // A function-local static: constructed (MPI_Init) on first use, destroyed (MPI_Finalize) at exit.
  static MpiCommunicator world;
  return world;
}

}  // namespace mixtrain::detail
