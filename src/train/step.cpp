// step.cpp — one optimizer step of data-parallel training (see step.h).
#include "step.h"

#include <chrono>
#include <cmath>

#include "slimshard/comm.h"
#include "slimshard/data_parallel.h"
#include "slimshard/memory.h"
#include "slimshard/nn.h"
#include "slimshard/optim.h"
#include "slimshard/slim.h"

namespace slimshard {

TrainStep::TrainStep(Communicator& comm, Model& model, DataParallel& dp, Optimizer& optim, SlimSync* slim)
    : comm_(comm), model_(model), dp_(dp), optim_(optim), slim_(slim), params_(model.params().all()) {}

StepResult TrainStep::run(int64_t step, int64_t accum, const std::function<Batch(int64_t)>& batch, double lr,
                          double clip, const std::function<StopFlags()>& stop) {
  StepResult r;
  auto lap = std::chrono::steady_clock::now();
  auto split = [&lap](double& into) {
    const auto now = std::chrono::steady_clock::now();
    into += std::chrono::duration<double, std::milli>(now - lap).count();
    lap = now;
  };
  for (ShardedParam* p : params_) p->zero_grad();
  double loss_sum = 0;
  for (int64_t m = 0; m < accum; ++m) {
    Batch b = batch(m);
    split(r.times.data);
    at::Tensor loss;
    {
      memory::PhaseScope phase(memory::Phase::forward);
      loss = model_.loss(b.x, b.y);
    }
    split(r.times.forward);
    {
      memory::PhaseScope phase(memory::Phase::backward);
      dp_.begin_backward(m, accum);
      // Each micro-batch's mean is scaled by 1/accum so that the sum is the mean over the rank's slice.
      (accum > 1 ? loss / static_cast<double>(accum) : loss).backward();
    }
    loss_sum += loss.item<double>();
    split(r.times.backward);
    if (m < accum - 1) dp_.end_backward(/*last=*/false);
  }
  {
    memory::PhaseScope phase(memory::Phase::comm);
    dp_.end_backward(/*last=*/true);
  }
  split(r.times.comm_wait);
  // The loss reported is the mean over the global batch: every rank's mean, averaged; with it, the flags.
  const StopFlags mine = stop ? stop() : StopFlags{};
  at::Tensor shared = at::tensor({loss_sum / static_cast<double>(accum), double(mine.sigterm),
                                  double(mine.sigint), double(mine.time_up)},
                                 at::kDouble);
  WorkPtr loss_work = comm_.all_reduce(shared, ReduceOp::sum);
  {
    memory::PhaseScope phase(memory::Phase::optimizer);
    r.grad_norm = std::sqrt(dp_.grad_sq_sum());
    optim_.step(params_, lr, clip > 0 && r.grad_norm > clip ? clip / (r.grad_norm + 1e-6) : 1.0);
  }
  split(r.times.optimizer);
  {
    memory::PhaseScope phase(memory::Phase::comm);
    if (slim_) slim_->after_step(step);  // before the working copies are refreshed from the masters
    dp_.after_optimizer_step();
  }
  loss_work->wait();
  split(r.times.after_step);
  const double* v = shared.data_ptr<double>();
  r.loss = v[0] / static_cast<double>(comm_.world());
  r.stop = StopFlags{v[1] > 0, v[2] > 0, v[3] > 0};
  return r;
}

}  // namespace slimshard
