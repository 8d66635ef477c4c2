// ShardGroup: the data-parallel ranks among which one optimizer splits its state (ZeRO stage 1). Every rank keeps
// the slots of its share of each dtype group of the parameter arena (a contiguous range of the flat buffers) and
// updates only that share; the group sums the skip flag and global clipping's squared norm over the ranks, so each
// rank decides as one process would, and all-gathers the updated values. An interface here because the
// communicators (distributed/) sit above the optimizers; distributed/zero.h makes one of a Communicator.
#pragma once

#include <cstdint>
#include <vector>

namespace mixtrain {

class ShardGroup {
 public:
  virtual ~ShardGroup() = default;
  // This process's index in [0, size()) and the number of ranks sharing the state.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every rank ends with the sum over the ranks of data[0, n).
  virtual void sum(double* data, int64_t n) = 0;
  // In place: block r of data (byte_counts[r] bytes after the blocks of the ranks before it) ends as rank r's on
  // every rank.
  virtual void all_gather(void* data, const std::vector<int64_t>& byte_counts) = 0;
};

// Elements [begin, end) of a flat buffer of `elements` that `rank` of `size` keeps: contiguous and as even as
// possible (the first elements % size ranks keep one more), so the shares tile the buffer in rank order. The
// gradients' reduce-scatter and the optimizer's update use this one split.
struct BufferShare {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
BufferShare buffer_share(int64_t elements, int rank, int size);

// Every rank's share of a buffer of `elements` of `element_bytes` each, in bytes (what all_gather takes).
std::vector<int64_t> share_byte_counts(int64_t elements, int size, int64_t element_bytes);

}  // namespace mixtrain
