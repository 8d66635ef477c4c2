#include "mixtrain/distributed/bfloat16_exchange.h"

#include "mixtrain/core/error.h"
#include "mixtrain/core/half.h"
#include "mixtrain/optim/shard_group.h"

namespace mixtrain {

namespace {

constexpr int64_t kWireBytes = 2;  // one bfloat16

struct Blocks {
  std::vector<int64_t> offset;  // elements before block r
  std::vector<int64_t> bytes;   // block r in bfloat16
  int64_t total = 0;            // elements
};

Blocks blocks_of(const std::vector<int64_t>& counts, Communicator& comm) {
  MIXTRAIN_CHECK(static_cast<int>(counts.size()) == comm.size(),
                 "bfloat16 exchange: " << counts.size() << " block sizes for " << comm.size() << " ranks");
  Blocks b;
  for (int64_t c : counts) {
    MIXTRAIN_CHECK(c >= 0, "bfloat16 exchange: negative block size " << c);
    b.offset.push_back(b.total);
    b.bytes.push_back(c * kWireBytes);
    b.total += c;
  }
  return b;
}

// This rank's block of data <- the float32 sum, in rank order, of every rank's block rounded to bfloat16.
int64_t sum_own_block(float* data, const Blocks& b, Communicator& comm) {
  std::vector<uint16_t> wire(static_cast<size_t>(b.total));
  for (int64_t i = 0; i < b.total; ++i) wire[static_cast<size_t>(i)] = float_to_bf16_bits(data[i]);
  const size_t r = static_cast<size_t>(comm.rank());
  const int64_t mine = b.bytes[r] / kWireBytes;
  std::vector<uint16_t> received(static_cast<size_t>(mine * comm.size()));  // (ranks, mine)
  comm.all_to_all(wire.data(), received.data(), b.bytes);
  float* out = data + b.offset[r];
  for (int64_t i = 0; i < mine; ++i) {
    float sum = bf16_bits_to_float(received[static_cast<size_t>(i)]);
    for (int s = 1; s < comm.size(); ++s) sum += bf16_bits_to_float(received[static_cast<size_t>(s * mine + i)]);
    out[i] = sum;
  }
  return b.total * kWireBytes;
}

}  // namespace

int64_t all_reduce_bfloat16(float* data, int64_t n, Communicator& comm) {
  MIXTRAIN_CHECK(n >= 0, "all_reduce_bfloat16: negative element count " << n);
  std::vector<int64_t> counts;  // which rank sums which elements: ZeRO's split
  for (int r = 0; r < comm.size(); ++r) counts.push_back(buffer_share(n, r, comm.size()).size());
  const Blocks b = blocks_of(counts, comm);
  const int64_t bytes = sum_own_block(data, b, comm);
  // Every rank's block rounded once for the wire and gathered; this rank's own block is rounded too, so it holds
  // the bits the others receive.
  std::vector<uint16_t> gathered(static_cast<size_t>(n));
  const size_t r = static_cast<size_t>(comm.rank());
  for (int64_t i = b.offset[r]; i < b.offset[r] + counts[r]; ++i)
    gathered[static_cast<size_t>(i)] = float_to_bf16_bits(data[i]);
  comm.all_gather(gathered.data(), b.bytes);
  for (int64_t i = 0; i < n; ++i) data[i] = bf16_bits_to_float(gathered[static_cast<size_t>(i)]);
  return bytes;
}

int64_t reduce_scatter_bfloat16(float* data, const std::vector<int64_t>& counts, Communicator& comm) {
  return sum_own_block(data, blocks_of(counts, comm), comm);
}

}  // namespace mixtrain
