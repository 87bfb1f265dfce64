// stop_policy.h — what a run does at the end of each step and when it stops: evaluate (every --eval-every
// steps and at the end), save a checkpoint (every --save-every steps, at the end, before an early exit), stop
// early after --exit-after-steps of this run or --exit-after-mins (every rank agreeing on the clock); and the
// testing aid --fault (a rank that stalls, exits or dies at a step, or dies inside a checkpoint's save).
// Private to src/train.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

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
  bool time_up = false;  // the exit is --exit-after-mins'
};

class StopPolicy {
 public:
  StopPolicy(const TrainOptions& o, Communicator& comm, int64_t start_step);
  // Before step `step` runs: this rank stalls, exits or dies if the fault says so.
  void before_step(int64_t step) const;
  // Runs inside the checkpoint of step `step` after this rank's file is written (killsave).
  std::function<void()> inside_save(int64_t step) const;
  // After step `step` (0-based) has run. With --exit-after-mins a collective (every rank calls it).
  StepActions after_step(int64_t step);

 private:
  bool agreed_time_up();

  Communicator& comm_;
  Fault fault_;
  int64_t steps_, start_step_, eval_every_, save_every_, exit_after_steps_;
  double exit_after_mins_;
  bool checkpoints_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace slimshard
