// shard.h — ShardedParam: every learnable tensor of a model lives in one. It knows its logical name and
// shape, its strategy, the slice of the flattened tensor this rank owns, its fp32 master and optimizer state,
// and how to materialize() the full tensor for an op and release() it afterwards.
#pragma once
#include <ATen/core/Tensor.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace slimshard {

class Communicator;
class Work;
class ShardedParam;

// slim: replicated like ddp, but gradients stay local; Slim-DP (src/slim) synchronises the weights lightly.
enum class Strategy { ddp, zero1, zero2, zero3, slim };
const char* strategy_name(Strategy s);
// Throws UsageError naming `what` for anything but ddp|zero1|zero2|zero3|slim.
Strategy parse_strategy(const std::string& s, const std::string& what);

// Where a zero3 param's full value comes from when an op materializes it: the Prefetcher (gathers K ahead).
class ParamGatherer {
 public:
  virtual ~ParamGatherer() = default;
  // A padded flat buffer holding the full value (all ranks' shards gathered).
  virtual at::Tensor acquire(ShardedParam& p) = 0;
  virtual void release(ShardedParam& p) = 0;
};

class ShardedParam {
 public:
  // `init` is the full initial value, identical on every rank (models draw it from the shared seed).
  // `decay`: whether weight decay applies (matrices yes; biases, norms no).
  ShardedParam(std::string name, const at::Tensor& init, bool decay);

  const std::string& name() const { return name_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  bool decay() const { return decay_; }
  Strategy strategy() const { return strategy_; }

  // Lays the storage out for `s` as rank `rank` of `world`, from the full value held now (the same on every
  // rank). Sharded strategies flatten and pad to a multiple of `world`; rank r owns [r·S, (r+1)·S).
  //   ddp   full param, full grad (in a bucket), full optimizer state
  //   zero1 full param, full grad, 1/N grad shard and optimizer state
  //   zero2 full param, 1/N grad (the full grad exists only until reduce-scattered), 1/N optimizer state
  //   zero3 1/N param, 1/N grad, 1/N optimizer state; the full param only between materialize() and release()
  //   slim  as ddp, the gradient in its own storage (never reduced)
  void shard(Strategy s, int rank, int world);
  int64_t padded_numel() const { return padded_; }
  int64_t shard_numel() const { return shard_numel_; }
  int64_t shard_offset() const { return shard_offset_; }
  void set_gatherer(ParamGatherer* g) { gatherer_ = g; }

  // The full tensor in its logical shape, ready for compute (zero3: gathered, possibly prefetched).
  at::Tensor materialize();
  // Done with the full tensor until the next materialize() (zero3: the gathered buffer is dropped).
  void release();

  // Full-shaped buffer the op accumulates this param's gradient into (addmm_, index_add_, add_); zero2/zero3
  // allocate it on first use in a micro-batch.
  at::Tensor grad_buffer();
  // The op finished writing this micro-batch's gradient: the hook (set by the data-parallel engine) may start
  // its reduction now, while backward goes on.
  void grad_ready();
  void set_grad_ready_hook(std::function<void(ShardedParam&)> hook) { on_grad_ready_ = std::move(hook); }
  // zero1: the persistent padded full gradient. zero2/zero3: the one just produced, handed over (the param
  // keeps no reference, so it is freed once reduce-scattered).
  at::Tensor full_grad_flat();
  at::Tensor take_full_grad_flat();

  // The flat fp32 slice this rank owns and updates, its gradient, and its optimizer state.
  at::Tensor master() { return master_; }
  at::Tensor grad() { return grad_; }
  std::map<std::string, at::Tensor>& optim_state() { return optim_state_; }
  void zero_grad();
  // zero1/zero2: the padded flat full param; master() is its owned slice (all-gathered in place after a
  // step).
  at::Tensor flat_param() { return flat_; }

  // The full current value (a copy); not for zero3 (see DataParallel::full_values).
  at::Tensor full_value();
  // Overwrites the value (full, logical shape), e.g. from a saved model; before shard() only. A different
  // floating dtype re-lays the storage in that dtype (tests run ops in double).
  void set_value(const at::Tensor& full);

  // Bytes this rank holds persistently for this param (params + grads + optimizer state).
  int64_t resident_bytes() const;
  // ddp: makes the gradient live in `flat` (numel() elements, a slice of a bucket), zeroed.
  void set_grad_storage(const at::Tensor& flat);
  // ddp/slim: moves the value into `flat` (numel() elements, e.g. a slice of one buffer for many params), so
  // that work over many params is one op over that buffer. Before the optimizer state exists.
  void set_value_storage(const at::Tensor& flat);

 private:
  std::string name_;
  std::vector<int64_t> shape_;
  int64_t numel_;
  bool decay_;
  Strategy strategy_ = Strategy::ddp;
  int64_t padded_ = 0, shard_numel_ = 0, shard_offset_ = 0;
  at::Tensor flat_;       // the full param, flat (padded when sharded); zero3: the gathered buffer, if any
  at::Tensor full_;       // logical-shape view of flat_
  at::Tensor master_;     // owned slice (ddp: all of flat_; zero1/2: a view into flat_; zero3: own storage)
  at::Tensor grad_flat_;  // the full gradient, flat (padded when sharded)
  at::Tensor grad_full_;  // logical-shape view of grad_flat_
  at::Tensor grad_;       // owned gradient slice (ddp: the bucket view; zero: own storage)
  std::map<std::string, at::Tensor> optim_state_;
  std::function<void(ShardedParam&)> on_grad_ready_;
  ParamGatherer* gatherer_ = nullptr;
};

// Gathers zero3 params for the ops that materialize them. The order of materializations is recorded over the
// first forward+backward; from then on, acquiring the i-th param also issues the all-gathers of the next
// ones, so communication overlaps compute, with at most K+1 gathered buffers live (more only while one op
// holds several params at once). The window never crosses the end of a pass: the weights change at the
// optimizer step.
class Prefetcher final : public ParamGatherer {
 public:
  Prefetcher(Communicator& comm, int depth);
  at::Tensor acquire(ShardedParam& p) override;
  void release(ShardedParam& p) override;
  // After each micro-batch's backward: the first call fixes the recorded order.
  void end_pass();
  // Off during evaluation and generation (a different order): gathers on demand, recording nothing.
  void set_enabled(bool on) { enabled_ = on; }
  int max_live() const { return max_live_; }
  int64_t gathers() const { return gathers_; }

 private:
  struct Gathered {
    at::Tensor buf;
    std::shared_ptr<Work> work;
  };
  void issue(size_t key, ShardedParam& p);
  void fill(size_t limit);

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
  int max_live_ = 0;
  int64_t gathers_ = 0;
};

// Keeps a model's ShardedParams in step across ranks, each with its own strategy: identical initial weights
// (rank 0's, broadcast), gradients averaged over ranks, updated shards gathered back.
//   ddp   gradients in flat buckets (reverse creation order, the order backward produces them); a bucket's
//         all-reduce goes out as soon as all its gradients exist, while backward goes on, buckets in the same
//         order on every rank; nothing on non-final micro-batches.
//   zero1 the full gradient accumulates over micro-batches and is reduce-scattered on the last one.
//   zero2/zero3 each micro-batch's gradient is reduce-scattered as soon as it exists and then freed.
//   zero1/zero2 updated shards are all-gathered in place after the optimizer step; zero3 gathers on use.
class DataParallel {
 public:
  struct Options {
    int64_t bucket_bytes = 25 << 20;
    int prefetch = 1;
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
  // zero1/zero2: all-gathers the updated shards into the full params.
  void after_optimizer_step();
  // Evaluation and generation materialize in another order: no prefetch meanwhile.
  void set_prefetch_enabled(bool on);

  // Every param's full value (a collective: every rank must call); for saving and sampling.
  std::vector<std::pair<std::string, at::Tensor>> full_values();
  // Checksum of the replicated state (full params of ddp/zero1/zero2): equal on ranks that agree bit for bit.
  int64_t replicated_checksum();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  const Prefetcher* prefetcher() const { return prefetcher_.get(); }

 private:
  struct Bucket {
    at::Tensor flat;
    std::vector<ShardedParam*> params;
    int pending = 0;
    std::shared_ptr<Work> work;
  };
  void on_grad_ready(ShardedParam& p);
  void launch_ready_buckets();

  Communicator& comm_;
  std::vector<ShardedParam*> params_;
  std::vector<Bucket> buckets_;
  std::map<const ShardedParam*, int> bucket_of_;
  std::map<const ShardedParam*, bool> produced_;
  std::unique_ptr<Prefetcher> prefetcher_;
  std::deque<std::shared_ptr<Work>> scatters_;  // zero reduce-scatters in flight, oldest first
  int64_t micro_index_ = 0, micro_count_ = 1;
  bool any_sharded_ = false;
  int next_launch_ = 0;
};

}  // namespace slimshard
