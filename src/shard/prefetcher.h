// prefetcher.h — zero3's all-gathers, issued ahead of use in the order recorded over the first pass.
// Private to src/shard: DataParallel owns one and reports its statistics (data_parallel.h).
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "slimshard/comm.h"
#include "slimshard/sharded_param.h"

namespace slimshard {

// Gathers zero3 params for the ops that materialize them. The order of materializations is recorded over the
// first forward+backward; from then on, acquiring the i-th param also issues the all-gathers of the next
// ones, so communication overlaps compute, with at most K+1 gathered buffers live (more only while one op
// holds several params at once). The window never crosses the end of a pass: the weights change at the
// optimizer step. Fused params (small ones, fuse()) are gathered with their group in one collective when the
// first of them is needed, and kept until each is released; they are not in the recorded order.
class Prefetcher final : public ParamGatherer {
 public:
  Prefetcher(Communicator& comm, int depth);
  at::Tensor acquire(ShardedParam& p) override;
  void release(ShardedParam& p) override;
  // After each micro-batch's backward: the first call fixes the recorded order.
  void end_pass();
  // These params are gathered together (before the first pass).
  void fuse(const std::vector<ShardedParam*>& members);
  // Off during evaluation and generation (a different order): gathers on demand, recording nothing.
  void set_enabled(bool on) { enabled_ = on; }
  int depth() const { return depth_; }
  int max_live() const { return max_live_; }
  int64_t gathers() const { return gathers_; }

 private:
  struct Gathered {
    at::Tensor buf;
    std::shared_ptr<Work> work;
  };
  void issue(size_t key, ShardedParam& p);
  // Hybrid params are gathered among the host's ranks.
  static Group group_of(const ShardedParam& p) {
    return shards_within_host(p.strategy()) ? Group::host : Group::world;
  }
  void fill(size_t limit);
  // The members of p's group not gathered yet, in one collective.
  void gather_group(ShardedParam& p);

  Communicator& comm_;
  int depth_;
  bool enabled_ = true, recording_ = true, broken_ = false;
  std::vector<ShardedParam*> trace_;
  size_t pos_ = 0, issued_ = 0;
  // Gathered buffers by trace position (a param appears twice per pass: forward and backward), or by an id
  // above every position when gathered on demand; and the keys each param is using now.
  std::map<size_t, Gathered> live_;
  std::map<ShardedParam*, std::deque<size_t>> in_use_;
  size_t next_adhoc_ = size_t(1) << 62;
  std::map<ShardedParam*, size_t> group_of_;
  std::vector<std::vector<ShardedParam*>> groups_;
  std::map<ShardedParam*, Gathered> fused_live_;
  int max_live_ = 0;
  int64_t gathers_ = 0;
};

}  // namespace slimshard
