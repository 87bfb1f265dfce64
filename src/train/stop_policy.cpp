// stop_policy.cpp — evaluation, checkpoint and early-exit decisions after each step, stop signals, fault
// injection (see stop_policy.h).
#include "stop_policy.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "slimshard/comm.h"
#include "slimshard/common.h"
#include "slimshard/train.h"

namespace slimshard {
namespace {

std::atomic<int> g_signal{0};  // the first stop signal received, or 0

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  if (!g_signal.compare_exchange_strong(none, sig)) _exit(128 + sig);  // the second: at once
}

}  // namespace

Fault Fault::parse(const std::string& spec) {
  Fault f;
  if (spec.empty()) return f;
  const size_t a = spec.find(':'), b = spec.find(':', a + 1);
  try {
    if (a == std::string::npos || b == std::string::npos) throw std::invalid_argument("format");
    f.kind = spec.substr(0, a);
    f.rank = std::stoi(spec.substr(a + 1, b - a - 1));
    f.step = std::stoll(spec.substr(b + 1));
  } catch (const std::exception&) {
    throw UsageError("--fault: '" + spec + "' is not KIND:RANK:STEP");
  }
  if (f.kind != "sleep" && f.kind != "exit" && f.kind != "kill" && f.kind != "killsave")
    throw UsageError("--fault: unknown kind '" + f.kind + "' (expected sleep, exit, kill or killsave)");
  return f;
}

StopPolicy::StopPolicy(const TrainOptions& o, Communicator& comm, int64_t start_step)
    : comm_(comm),
      fault_(Fault::parse(o.fault)),
      steps_(o.steps),
      start_step_(start_step),
      eval_every_(o.eval_every),
      save_every_(o.save_every),
      exit_after_steps_(o.exit_after_steps),
      exit_after_mins_(o.exit_after_mins),
      checkpoints_(!o.ckpt_dir.empty()) {
  g_signal = 0;
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

StopPolicy::~StopPolicy() {
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
}

void StopPolicy::before_step(int64_t step) const {
  if (fault_.rank != comm_.rank() || fault_.step != step || fault_.kind == "killsave") return;
  std::fprintf(stderr, "[rank %d] --fault: %s at step %lld\n", comm_.rank(), fault_.kind.c_str(),
               (long long)step);
  std::fflush(stderr);
  if (fault_.kind == "sleep") std::this_thread::sleep_for(std::chrono::hours(1));
  if (fault_.kind == "exit") std::_Exit(3);
  if (fault_.kind == "kill") std::raise(SIGKILL);
}

StopFlags StopPolicy::local_flags() const {
  StopFlags f;
  f.sigterm = g_signal == SIGTERM, f.sigint = g_signal == SIGINT;
  f.time_up = exit_after_mins_ > 0 &&
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() >=
                  60 * exit_after_mins_;
  return f;
}

std::function<void()> StopPolicy::inside_save(int64_t step) const {
  if (fault_.kind != "killsave" || fault_.rank != comm_.rank() || fault_.step != step) return nullptr;
  const int rank = comm_.rank();
  return [rank, step] {
    std::fprintf(stderr, "[rank %d] --fault: killsave at step %lld\n", rank, (long long)step);
    std::fflush(stderr);
    std::raise(SIGKILL);
  };
}

StepActions StopPolicy::after_step(int64_t step, const StopFlags& agreed) const {
  StepActions a;
  const int64_t done = step + 1;
  const bool last = done == steps_;
  a.eval = (eval_every_ > 0 && done % eval_every_ == 0) || last;
  if (agreed.sigterm || agreed.sigint) {
    a.signal = agreed.sigterm ? SIGTERM : SIGINT;
    a.why = agreed.sigterm ? "SIGTERM" : "SIGINT";
    a.exit = true, a.eval = false;  // a scheduler's grace period is short: save and go
  } else if (!last && exit_after_steps_ > 0 && done - start_step_ >= exit_after_steps_) {
    a.exit = true, a.why = "--exit-after-steps";
  } else if (!last && agreed.time_up) {
    a.exit = true, a.why = "--exit-after-mins";
  }
  a.save = checkpoints_ && ((save_every_ > 0 && done % save_every_ == 0) || last || a.exit);
  return a;
}

}  // namespace slimshard
