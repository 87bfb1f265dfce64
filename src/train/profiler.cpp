// profiler.cpp — a model's profile taken with the training step itself: the op, collective, overlap and
// optimizer measurements of plan/profile.cpp, then whole steps timed with TrainStep (the trainer's own) to
// calibrate them (see profile.h, train.h); and osdp's candidate plans timed the same way.
#include <chrono>
#include <map>

#include "slimshard/comm.h"
#include "slimshard/common.h"
#include "slimshard/data_parallel.h"
#include "slimshard/json.h"
#include "slimshard/memory.h"
#include "slimshard/optim.h"
#include "slimshard/train.h"
#include "step.h"

namespace slimshard {
namespace {

// The times (ms) of `steps` training steps after one warm-up: the model laid out by `plan`, `accum`
// micro-batches of `micro` rows per rank (random rows; the weights are this call's own).
std::vector<double> time_steps(const ModelConfig& cfg, const Plan& plan, int64_t micro, int64_t accum,
                               Communicator& comm, uint64_t seed, int steps,
                               const DataParallel::Options& dp_opts) {
  auto model = build_model(cfg, seed);
  const std::vector<Strategy> strategies = apply_plan(resolve_plan(plan, op_shapes(*model)), *model);
  const auto [x, y] = random_inputs(cfg, micro, seed + static_cast<uint64_t>(comm.rank()));
  const auto params = model->params().all();
  DataParallel dp(comm, params, strategies, dp_opts);
  Optimizer optim(OptimConfig{});
  optim.init_state(params);
  TrainStep step(comm, *model, dp, optim, nullptr);
  const Batch batch{x, y};
  // Steps back to back after one barrier, as training runs them: a barrier before each would hold the ranks
  // in lock step, which on shared cores favours plans with many synchronisation points (zero3) over those
  // whose ranks drift apart and fill each other's waits (docs/osdp.md, the grid).
  std::vector<double> times;
  step.run(
      0, accum, [&](int64_t) { return batch; }, 1e-4, 1.0);
  comm.barrier()->wait();
  auto t = std::chrono::steady_clock::now();
  for (int it = 1; it <= steps; ++it) {
    step.run(
        it, accum, [&](int64_t) { return batch; }, 1e-4, 1.0);
    const auto now = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::milli>(now - t).count());
    t = now;
  }
  return times;
}

}  // namespace

Profile profile_training(const ModelConfig& model, const std::vector<int64_t>& micro_batches,
                         Communicator& comm, const ProfileOptions& o, uint64_t seed) {
  Profile p = measure_profile(model, micro_batches, comm, o, seed);
  MeasuredSteps steps;
  const int64_t top = micro_batches.back();
  const bool across_hosts = comm.topology().hosts > 1 && comm.topology().uniform;
  // The strategies compared — ddp (on one host: the compute scale), zero3 (its gathers' latency) and, for
  // their residuals, zero1 and zero2 (across hosts also hybrid sharding: its peers' all-reduces, timed alone,
  // ran faster than inside a step; uncalibrated, uniform hsdp and hsdp2 were predicted 6-20 % short at
  // 100 Mbit/s, docs/cluster.md) — at the largest micro-batch, across hosts at every one (profile.h,
  // MeasuredSteps; one round below the largest: a step there takes seconds). Timed in turn, two steps each
  // per round: a slow spell of this shared machine lands on all of them, not in one strategy's residual
  // (timed one after the other, zero2's calibration once ran 29-46 % slower than its training steps:
  // docs/osdp.md, the grid). On one host ddp alone at the smaller micro-batches (its step scales op times).
  std::vector<Strategy> turn = residual_strategies(across_hosts);
  if (!across_hosts) turn.insert(turn.begin(), Strategy::ddp);
  DataParallel::Options dp_opts;
  dp_opts.precision = o.precision;
  for (int64_t b : micro_batches) {
    const bool in_turn = comm.world() > 1 && (b == top || across_hosts);
    if (!in_turn) {
      steps.ddp_ms[b] =
          median(time_steps(model, uniform_plan(Strategy::ddp), b, 1, comm, seed, o.repeats, dp_opts));
      continue;
    }
    std::map<Strategy, std::vector<double>> ms;
    const int rounds = b == top ? std::max(1, (o.repeats + 1) / 2) : 1;
    for (int round = 0; round < rounds; ++round)
      for (Strategy s : turn) {
        const std::vector<double> t = time_steps(model, uniform_plan(s), b, 1, comm, seed, 2, dp_opts);
        ms[s].insert(ms[s].end(), t.begin(), t.end());
      }
    for (Strategy s : turn)
      (s == Strategy::ddp && !across_hosts ? steps.ddp_ms[b] : steps.uniform_ms[strategy_name(s)][b]) =
          median(ms[s]);
  }
  calibrate_profile(p, steps);
  return p;
}

std::vector<std::vector<double>> time_plans(const TrainOptions& o,
                                            const std::vector<PlanCandidate>& candidates, int64_t local,
                                            Communicator& comm) {
  const DataParallel::Options dp_opts{o.bucket_bytes, o.prefetch, o.precision, o.fuse_bytes, o.defer_gathers};
  nlohmann::json times = nlohmann::json::array();
  for (const PlanCandidate& c : candidates) {
    const int64_t micro = c.plan.micro_batch > 0 ? c.plan.micro_batch : local;
    times.push_back(time_steps(o.model, c.plan, micro, local / micro, comm, o.seed, o.tune_steps, dp_opts));
  }
  memory::release_cache();  // the candidates' blocks, sized for other layouts
  // Rank 0's figures for all: every rank then chooses the same plan.
  return nlohmann::json::parse(broadcast_string(comm, times.dump(), 0))
      .get<std::vector<std::vector<double>>>();
}

}  // namespace slimshard
