// shard.h — ShardedParam: every learnable tensor of a model lives in one. It knows its logical name and
// shape, its strategy, the slice of the flattened tensor this rank owns, its fp32 master and optimizer state,
// and how to materialize() the full tensor for an op and release() it afterwards.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace slimshard {

class Communicator;
class Work;

enum class Strategy { ddp, zero1, zero2, zero3 };
const char* strategy_name(Strategy s);
// Throws UsageError naming `what` for anything but ddp|zero1|zero2|zero3.
Strategy parse_strategy(const std::string& s, const std::string& what);

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

  // The full tensor in its logical shape, ready for compute.
  at::Tensor materialize();
  // Done with the full tensor until the next materialize().
  void release();

  // Full-shaped buffer the op accumulates this param's gradient into (addmm_, index_add_, add_).
  at::Tensor grad_buffer();
  // The op finished writing this micro-batch's gradient: the hook (set by the data-parallel engine) may start
  // its reduction now, while backward goes on.
  void grad_ready();
  void set_grad_ready_hook(std::function<void(ShardedParam&)> hook) { on_grad_ready_ = std::move(hook); }

  // The flat fp32 slice this rank owns and updates, its gradient, and its optimizer state.
  at::Tensor master() { return master_; }
  at::Tensor grad() { return grad_; }
  std::map<std::string, at::Tensor>& optim_state() { return optim_state_; }
  void zero_grad();

  // The full current value (a copy), for saving and checksums.
  at::Tensor full_value();
  // Overwrites the value (full, logical shape), e.g. from a saved model. A different floating dtype re-lays
  // the storage in that dtype (tests run ops in double). Optimizer state is left alone.
  void set_value(const at::Tensor& full);

  // Bytes this rank holds persistently for this param (params + grads + optimizer state).
  int64_t resident_bytes() const;
  // Makes the gradient live in `flat` (numel() elements, e.g. a slice of a DDP bucket), zeroed.
  void set_grad_storage(const at::Tensor& flat);

 private:
  std::string name_;
  std::vector<int64_t> shape_;
  int64_t numel_;
  bool decay_;
  Strategy strategy_ = Strategy::ddp;
  at::Tensor full_;    // logical shape; for ddp the parameter itself
  at::Tensor master_;  // flat owned slice (ddp: a view of full_)
  at::Tensor grad_;    // flat owned gradient slice (ddp: a view of the full gradient)
  at::Tensor grad_full_;
  std::map<std::string, at::Tensor> optim_state_;
  std::function<void(ShardedParam&)> on_grad_ready_;
};

// Keeps a model's ShardedParams in step across ranks: identical initial weights (broadcast from rank 0), and
// gradients averaged over ranks. DDP: gradients live in flat buckets (params in reverse order of creation,
// the order backward produces them); a bucket's all-reduce is issued as soon as all its gradients exist,
// while backward goes on, buckets always in the same order on every rank. No communication on non-final
// micro-batches.
class DataParallel {
 public:
  DataParallel(Communicator& comm, std::vector<ShardedParam*> params, int64_t bucket_bytes);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  void broadcast_from_rank0();
  // Before each micro-batch's backward: `sync` on the last one (its gradients are reduced as they appear).
  void begin_backward(bool sync);
  // After the last backward: issues what is left, waits for every reduction.
  void finish_backward();
  // Sum of squared gradients over the whole model (for global-norm clipping), equal on every rank.
  double grad_sq_sum();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  int64_t bucket_buffer_bytes() const;

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
  bool sync_ = false;
  int next_launch_ = 0;
};

}  // namespace slimshard
