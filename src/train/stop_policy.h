// stop_policy.h — what a run does at the end of each step and when it stops: evaluate (every --eval-every
// steps and at the end), save a checkpoint (every --save-every steps, at the end, before an early exit), stop
// early after --exit-after-steps of this run, after --exit-after-mins, or on SIGTERM / SIGINT (what a
// scheduler sends before it kills a job: the step finishes, a checkpoint is written, every rank exits 143 /
// 130; a second signal ends the process at once). Every rank agrees: the flags travel with the step's loss.
// And the testing aid --fault (a rank that stalls, exits or dies at a step, or dies inside a checkpoint's
// save). Private to src/train.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "step.h"

namespace slimshard {

class Communicator;
struct TrainOptions;

struct Fault {
  std::string kind;  // sleep | exit | kill | killsave; empty: none
  int rank = -1;
  int64_t step = -1;
  // "KIND:RANK:STEP"; anything else is a usage error naming --fault.
  static Fault parse(const std::string& spec);
};

struct StepActions {
  bool eval = false, save = false, exit = false;
  std::string why;  // of an early exit: "--exit-after-steps", "--exit-after-mins", "SIGTERM", "SIGINT"
  int signal = 0;   // the signal that stopped the run (SIGTERM before SIGINT), or 0
};

class StopPolicy {
 public:
  // Installs the SIGTERM / SIGINT handlers for the life of the policy.
  StopPolicy(const TrainOptions& o, Communicator& comm, int64_t start_step);
  ~StopPolicy();
  StopPolicy(const StopPolicy&) = delete;
  StopPolicy& operator=(const StopPolicy&) = delete;
  // Before step `step` runs: this rank stalls, exits or dies if the fault says so.
  void before_step(int64_t step) const;
  // This rank's reasons to stop, for the step to share with the others.
  StopFlags local_flags() const;
  // Runs inside the checkpoint of step `step` after this rank's file is written (killsave).
  std::function<void()> inside_save(int64_t step) const;
  // After step `step` (0-based) has run, with the flags every rank agreed on.
  StepActions after_step(int64_t step, const StopFlags& agreed) const;

 private:
  Communicator& comm_;
  Fault fault_;
  int64_t steps_, start_step_, eval_every_, save_every_, exit_after_steps_;
  double exit_after_mins_;
  bool checkpoints_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace slimshard
