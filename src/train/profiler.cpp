// profiler.cpp — a model's profile taken with the training step itself: the op, collective, overlap and
// optimizer measurements of plan/profile.cpp, then whole steps timed with TrainStep (the trainer's own) to
// calibrate them (see profile.h, train.h).
#include <chrono>

#include "slimshard/comm.h"
#include "slimshard/common.h"
#include "slimshard/data_parallel.h"
#include "slimshard/optim.h"
#include "slimshard/train.h"
#include "step.h"

namespace slimshard {
namespace {

// Median ms of `steps` training steps after one warm-up, one strategy everywhere, micro-batch b per rank.
double time_steps(const ModelConfig& cfg, Strategy s, int64_t b, Communicator& comm, uint64_t seed, int steps,
                  const Precision& prec) {
  auto model = build_model(cfg, seed);
  const auto [x, y] = random_inputs(cfg, b, seed + static_cast<uint64_t>(comm.rank()));
  const auto params = model->params().all();
  DataParallel::Options dp_opts;
  dp_opts.precision = prec;
  DataParallel dp(comm, params, std::vector<Strategy>(params.size(), s), dp_opts);
  Optimizer optim(OptimConfig{});
  optim.init_state(params);
  TrainStep step(comm, *model, dp, optim, nullptr);
  const Batch batch{x, y};
  std::vector<double> times;
  for (int it = 0; it <= steps; ++it) {
    comm.barrier()->wait();
    const auto t = std::chrono::steady_clock::now();
    step.run(
        it, 1, [&](int64_t) { return batch; }, 1e-4, 1.0);
    if (it > 0)
      times.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
  }
  return median(times);
}

}  // namespace

Profile profile_training(const ModelConfig& model, const std::vector<int64_t>& micro_batches,
                         Communicator& comm, const ProfileOptions& o, uint64_t seed) {
  Profile p = measure_profile(model, micro_batches, comm, o, seed);
  MeasuredSteps steps;
  for (int64_t b : micro_batches)
    steps.ddp_ms[b] = time_steps(model, Strategy::ddp, b, comm, seed, o.repeats, o.precision);
  if (comm.world() > 1) {
    steps.zero3_ms =
        time_steps(model, Strategy::zero3, micro_batches.back(), comm, seed, o.repeats, o.precision);
    for (Strategy s : {Strategy::zero1, Strategy::zero2})
      steps.uniform_ms[strategy_name(s)] =
          time_steps(model, s, micro_batches.back(), comm, seed, o.repeats, o.precision);
  }
  calibrate_profile(p, steps);
  return p;
}

}  // namespace slimshard
