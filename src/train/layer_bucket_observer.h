// A stack model's side of the overlapped gradient all-reduce (distributed/overlapped_reduce.h): its layers are the
// buffer's segments. The arena lays variables out in layer order, so a bucket is a range of offsets covering whole
// layers; the backward pass reaches layer L's output gradient (the network observer's on_gradient) only after
// every operation recorded after L's output has run, which in a stack includes every use of the later layers'
// variables: from then on, the gradients of the layers after L are final.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "mixtrain/distributed/overlapped_reduce.h"
#include "mixtrain/nn/network.h"
#include "mixtrain/optim/parameter_arena.h"

namespace mixtrain {

class LayerBucketObserver : public LayerObserver {
 public:
  // Whether `network` qualifies (a stack, one float32 group, every variable in exactly one layer), planning its
  // buckets when the arena's layout or the bucket size changed; false leaves the caller on the
  // reduce-after-backward path.
  bool prepare(const Network& network, const ParameterArena& arena, int64_t bucket_bytes);
  OverlappedReduce& reduce() { return reduce_; }
  // Layer `layer`'s output gradient exists: every later layer's gradients are final.
  void on_gradient(const Layer& layer, const Tensor&) override;

 private:
  uint64_t layout_ = 0;
  int64_t bucket_bytes_ = 0;
  bool qualifies_ = false;
  std::unordered_map<const Layer*, size_t> layer_index_;
  OverlappedReduce reduce_;
};

}  // namespace mixtrain
