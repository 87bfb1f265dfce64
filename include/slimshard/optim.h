// optim.h — AdamW and SGD with momentum over ShardedParam shards (each rank updates the fp32 slice it owns),
// the learning-rate schedule (linear warmup, cosine decay), and global-norm clipping helpers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace slimshard {

class ShardedParam;

struct OptimConfig {
  std::string name = "adamw";  // adamw | sgd
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;  // decoupled for AdamW; L2 added to the gradient for SGD (as torch.optim.SGD)
  double momentum = 0.9;      // SGD
  // AdamW on slim params when > 1 (`--slim-adam corrected`): each rank's second moment is corrected to that
  // of the average of this many ranks' gradients, v̂_N = m̂² + max(v̂ − m̂², 0) / N (docs/slim-dp.md).
  int slim_ranks = 1;
};

class Optimizer {
 public:
  explicit Optimizer(OptimConfig c);
  // Allocates the state of every param (zeros), so that it is sized once at start.
  void init_state(const std::vector<ShardedParam*>& params);
  // Updates each param's owned slice with its owned gradient slice times grad_scale (the clipping's factor:
  // in AdamW's one pass, not a pass of its own). Same math as scaling, then torch.optim.AdamW / SGD.
  void step(const std::vector<ShardedParam*>& params, double lr, double grad_scale = 1.0);
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  const OptimConfig& config() const { return c_; }
  // Names of the state tensors kept per param (for memory estimates and checkpoints).
  std::vector<std::string> state_names() const { return state_names(c_); }
  static std::vector<std::string> state_names(const OptimConfig& c);

 private:
  OptimConfig c_;
  int64_t t_ = 0;
};

// Linear warmup from 0 over `warmup` steps, then cosine decay to min_lr at step `total`.
struct LrSchedule {
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup = 0, total = 1;
  double at(int64_t step) const;
};

// Sum of squares of the gradient slices this rank owns (the caller sums it across ranks where sharded).
double grad_sq_sum(const std::vector<ShardedParam*>& params);

}  // namespace slimshard
