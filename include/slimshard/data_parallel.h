// data_parallel.h — DataParallel: keeps a model's ShardedParams in step across ranks, each with its own
// strategy (rank 0's initial weights broadcast, gradients averaged by all-reduce or reduce-scatter, updated
// shards gathered back), and owns zero3's prefetcher.
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "slimshard/comm.h"
#include "slimshard/sharded_param.h"

namespace slimshard {

class Prefetcher;

// Keeps a model's ShardedParams in step across ranks, each with its own strategy: identical initial weights
// (rank 0's, broadcast), gradients averaged over ranks, updated shards gathered back.
//   ddp   gradients in flat buckets (reverse creation order, the order backward produces them); a bucket's
//         all-reduce goes out as soon as all its gradients exist, while backward goes on, buckets in the same
//         order on every rank; nothing on non-final micro-batches.
//   zero1 the full gradient accumulates over micro-batches and is reduce-scattered on the last one.
//   zero2/zero3 each micro-batch's gradient is reduce-scattered as soon as it exists and then freed.
//   zero1/zero2 updated shards are all-gathered in place after the optimizer step, waited for where the next
//         forward uses them; zero3 gathers on use.
//   hsdp/hsdp2 as zero3/zero2 among the ranks of one host; the owned slice of each gradient is then averaged
//   with the ranks of the same local index on the other hosts (all-reduce among peers).
//   Small sharded params (Options::fuse_bytes) go together per block and strategy: their reduce-scatter
//   when the last of them has its gradient, their gathers in one collective (fusion_groups()).
class DataParallel {
 public:
  struct Options {
    int64_t bucket_bytes = 25 << 20;
    int prefetch = 1;
    // Working copies in precision.compute; gradients reduced in precision.reduce (a bf16 wire: each
    // gradient rounded once for the trip, the result added to the fp32 gradient).
    Precision precision;
    // Sharded params of at most this many bytes (fp32) are gathered and reduced together with the other small
    // params of their block and strategy (one collective per block, not one per bias); 0 = never.
    int64_t fuse_bytes = 256 << 10;
    // zero1/zero2/hsdp2: the all-gathers of the updated slices run on while the next forward computes, each
    // param's waited for where the forward first uses it (FSDP's SHARD_GRAD_OP gathers in the forward too);
    // false: they finish before after_optimizer_step() returns.
    bool defer_gathers = true;
  };
  // Params must not have been sharded yet; their strategies are given here (same order as `params`).
  DataParallel(Communicator& comm, std::vector<ShardedParam*> params, const std::vector<Strategy>& strategies,
               const Options& o);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Before micro-batch `index` of `count`'s backward.
  void begin_backward(int64_t index, int64_t count);
  // After each micro-batch's backward (prefetch bookkeeping); after the last one, waits for every reduction.
  void end_backward(bool last);
  // Sum of squared gradients over the whole model (for global-norm clipping), equal on every rank.
  double grad_sq_sum();
  // After the masters changed (optimizer step, loaded checkpoint): every working copy refreshed, and
  // zero1/zero2's updated shards all-gathered into the full params — left in flight (Options::defer_gathers)
  // until a param's first use, the next backward's end, or wait_gathers().
  void after_optimizer_step();
  // Every gather after_optimizer_step() left in flight, finished (before anything reads the params whole:
  // a checkpoint; full_values() and replicated_checksum() wait themselves).
  void wait_gathers();
  // Evaluation and generation materialize in another order: no prefetch meanwhile.
  void set_prefetch_enabled(bool on);

  // Every param's full value (a collective: every rank must call); for saving and sampling.
  std::vector<std::pair<std::string, at::Tensor>> full_values();
  // Checksum of the replicated state (full params of ddp/zero1/zero2): equal on ranks that agree bit for bit.
  int64_t replicated_checksum();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // The fused groups: the small sharded params of one block and strategy, in creation order.
  const std::vector<std::vector<ShardedParam*>>& fusion_groups() const { return groups_; }
  // zero3's gathers: depth, the most gathered buffers live at once, gathers issued, and the largest buffer.
  struct PrefetchStats {
    int depth = 0, max_live = 0;
    int64_t gathers = 0, largest_buffer_bytes = 0;
  };
  PrefetchStats prefetch_stats() const;

 private:
  struct Bucket {
    at::Tensor flat;
    at::Tensor wire;  // the bucket in the reduce dtype, when it is not the gradients' (sized at start)
    std::vector<ShardedParam*> params;
    int pending = 0;
    std::shared_ptr<Work> work;
  };
  void on_grad_ready(ShardedParam& p);
  // A fused group's gradients of this micro-batch (all it will get): one reduce-scatter.
  void flush_group(size_t g);
  // The ranks a param's shards are spread over, and whether its owned slice is also averaged across hosts.
  Group shard_group(Strategy s) const { return shards_within_host(s) ? Group::host : Group::world; }
  bool across_hosts(Strategy s) const { return shards_within_host(s) && comm_.topology().hosts > 1; }
  // Whether gradient `g` travels in a narrower dtype than it is accumulated in.
  bool narrow_wire(const at::Tensor& g) const {
    return reduce_ == at::kBFloat16 && g.scalar_type() == at::kFloat;
  }
  void launch_ready_buckets();
  // A reduction queued behind the others; `holds_full` when it keeps a full gradient alive until it runs.
  void queue_reduction(std::shared_ptr<Work> w, bool holds_full);
  void bound_full_grads_in_flight();
  void drain_reductions();

  Communicator& comm_;
  at::ScalarType reduce_;
  bool defer_gathers_;
  std::vector<ShardedParam*> params_;
  std::vector<Bucket> buckets_;
  std::map<const ShardedParam*, int> bucket_of_;
  std::map<const ShardedParam*, bool> produced_;
  std::vector<std::vector<ShardedParam*>> groups_;
  std::map<const ShardedParam*, size_t> group_of_;
  std::vector<std::vector<std::pair<ShardedParam*, at::Tensor>>> pending_;  // per group: (param, full grad)
  std::unique_ptr<Prefetcher> prefetcher_;
  // zero reductions in flight, oldest first, each with whether it holds a full gradient
  std::deque<std::pair<std::shared_ptr<Work>, bool>> scatters_;
  int64_t micro_index_ = 0, micro_count_ = 1;
  bool any_sharded_ = false;
  int next_launch_ = 0;
};

}  // namespace slimshard
