// step.h — one optimizer step of data-parallel training, the only copy: the trainer takes it every step and
// the profiler times it. Micro-batches with gradient accumulation, the reductions started from backward, the
// mean loss over the global batch, global-norm clipping, the optimizer over owned shards, the gathers after
// the step and Slim-DP's round. Private to src/train.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "slimshard/data.h"

namespace slimshard {

class Communicator;
class DataParallel;
class Model;
class Optimizer;
class ShardedParam;
class SlimSync;

// Where a step's time goes on this rank (ms): building the batch, forward, backward (with the gradient
// reductions it overlaps), waiting for the reductions still running after backward, clipping + optimizer,
// then the collectives after the step (Slim-DP's round, zero1/zero2's gathers of the updated slices).
struct StepTimes {
  double data = 0, forward = 0, backward = 0, comm_wait = 0, optimizer = 0, after_step = 0;
};

// Reasons to stop that one rank may see and every rank must act on: they travel with the step's loss (one
// all-reduce), so agreeing on them costs no extra message.
struct StopFlags {
  bool sigterm = false, sigint = false, time_up = false;
  bool any() const { return sigterm || sigint || time_up; }
};

struct StepResult {
  double loss = 0;       // mean over the global batch
  double grad_norm = 0;  // before clipping (slim params: this rank's own gradient)
  StopFlags stop;        // this rank's flags or'ed over every rank
  StepTimes times;
};

class TrainStep {
 public:
  // `slim` may be null (no slim params).
  TrainStep(Communicator& comm, Model& model, DataParallel& dp, Optimizer& optim, SlimSync* slim);
  // Step `step` (0-based): `accum` micro-batches, micro-batch m from `batch(m)`; learning rate `lr`; clip the
  // global gradient norm to `clip` (0 = off). `stop()` gives this rank's flags once backward is done.
  StepResult run(int64_t step, int64_t accum, const std::function<Batch(int64_t)>& batch, double lr,
                 double clip, const std::function<StopFlags()>& stop = nullptr);

 private:
  Communicator& comm_;
  Model& model_;
  DataParallel& dp_;
  Optimizer& optim_;
  SlimSync* slim_;
  std::vector<ShardedParam*> params_;
};

}  // namespace slimshard
