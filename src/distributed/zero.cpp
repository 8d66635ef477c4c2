#include "mixtrain/distributed/zero.h"

#include "mixtrain/core/error.h"
#include "mixtrain/distributed/bfloat16_exchange.h"

namespace mixtrain {

namespace {
class CommunicatorShardGroup : public ShardGroup {
 public:
  explicit CommunicatorShardGroup(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void sum(double* data, int64_t n) override { comm_.all_reduce(data, n, ReduceOp::kSum); }
  void all_gather(void* data, const std::vector<int64_t>& byte_counts) override { comm_.all_gather(data, byte_counts); }

 private:
  Communicator& comm_;
};
}  // namespace

std::shared_ptr<ShardGroup> shard_group(Communicator& comm) { return std::make_shared<CommunicatorShardGroup>(comm); }

int64_t reduce_scatter_gradients(const ParameterArena& arena, Communicator& comm, float weight, DType wire) {
  MIXTRAIN_CHECK(wire == DType::kFloat32 || wire == DType::kBFloat16,
                 "reduce_scatter_gradients: gradients travel as float32 or bfloat16, not " << dtype_name(wire));
  int64_t bytes = 0;
  for (DType d : arena.dtypes()) {
    Tensor g = arena.gradient_buffer(d);
    MIXTRAIN_CHECK(g.device().is_cpu() && g.is_contiguous(),
                   "reduce_scatter_gradients: host buffers only, got " << g.describe());
    // MPI has no 16-bit float type: a float32 copy travels (as all_reduce_gradients does), rounded back once.
    Tensor f = g.dtype() == DType::kFloat32 ? g : g.to(DType::kFloat32);
    float* p = f.data<float>();
    if (weight != 1.0f)
      for (int64_t i = 0; i < f.numel(); ++i) p[i] *= weight;
    std::vector<int64_t> counts;
    for (int r = 0; r < comm.size(); ++r) counts.push_back(buffer_share(f.numel(), r, comm.size()).size());
    if (wire == DType::kBFloat16) {
      bytes += reduce_scatter_bfloat16(p, counts, comm);
    } else {
      comm.reduce_scatter(p, counts);
      bytes += f.numel() * static_cast<int64_t>(sizeof(float));
    }
    if (g.dtype() != DType::kFloat32) g.copy_from(f.to(g.dtype()));
  }
  return bytes;
}

}  // namespace mixtrain
