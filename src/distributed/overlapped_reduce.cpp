#include "mixtrain/distributed/overlapped_reduce.h"

#include "mixtrain/ops/elementwise.h"

namespace mixtrain {

void OverlappedReduce::plan(const std::vector<int64_t>& segment_start, int64_t capacity, int64_t bucket_bytes) {
  buckets_.clear();
  int64_t hi = capacity;
  for (size_t s = segment_start.size(); s-- > 1;) {
    if ((hi - segment_start[s]) * static_cast<int64_t>(sizeof(float)) >= bucket_bytes && segment_start[s] > 0) {
      buckets_.push_back({s, segment_start[s], hi});
      hi = segment_start[s];
    }
  }
  buckets_.push_back({0, 0, hi});  // the first segments' bucket: ready when backward ends
}

std::vector<std::pair<int64_t, int64_t>> OverlappedReduce::bucket_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Bucket& b : buckets_) out.emplace_back(b.lo, b.hi);
  return out;
}

void OverlappedReduce::begin(Communicator& comm, float* grads, float weight) {
  comm_ = &comm;
  grads_ = grads;
  device_grads_ = Tensor();
  weight_ = weight;
  next_ = 0;
  inflight_.clear();
}

void OverlappedReduce::begin_on_device(Communicator& comm, const Tensor& grads, float weight) {
  begin(comm, nullptr, weight);
  device_grads_ = grads;
}

void OverlappedReduce::advance() {
  for (auto& r : inflight_) r->test();
}

void OverlappedReduce::start_final(size_t segment) {
  while (next_ < buckets_.size() && buckets_[next_].first_segment >= segment) {
    const Bucket& b = buckets_[next_++];
    if (device_grads_.defined()) {
      Tensor bucket = device_grads_.slice(0, b.lo, b.hi);  // a view: weighted and reduced in place
      if (weight_ != 1.0f) ops::scale_in_place(bucket, weight_);
      comm_->start_all_reduce_on_device(bucket, ReduceOp::kSum);
      continue;
    }
    float* p = grads_ + b.lo;
    const int64_t n = b.hi - b.lo;
    if (weight_ != 1.0f)
      for (int64_t i = 0; i < n; ++i) p[i] *= weight_;
    inflight_.push_back(comm_->start_all_reduce(p, n, ReduceOp::kSum));
  }
}

void OverlappedReduce::wait() {
  for (auto& r : inflight_) r->wait();
  inflight_.clear();
  if (device_grads_.defined()) comm_->join_device();
}

}  // namespace mixtrain
