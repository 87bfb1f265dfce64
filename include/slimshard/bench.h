// bench.h — `slimshard bench`: the same training run under several strategies or plans, each as its own
// mpirun job (an out-of-budget error or a crash in one cannot hang or stop the others), side by side:
// tokens/s, step time, measured peak memory per rank next to the cost model's prediction and the memory
// estimate, bytes per step, OOM.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slimshard/planner.h"

namespace slimshard {

struct BenchOptions {
  RunSpec base;                      // the run every entry shares (world = ranks per run)
  std::vector<std::string> entries;  // strategies, "osdp", "osdp-nohybrid", "osdp-norecompute" or plan files
  std::vector<std::string> train_args;  // training flags forwarded to every run
  std::vector<std::string> model_args;  // the model flags among them (for the profile run)
  std::string launcher;                 // e.g. "mpirun --oversubscribe"; "-n N" is added
  std::string self;                     // the slimshard executable
  std::string profile;                  // predict from this profile (else one is taken first)
  std::string save_profile;             // the profile taken first, kept here (to plan from it again)
  // Every entry this many times, round-robin (a slow moment of the machine hits one run of each, not all runs
  // of one): medians reported.
  int repeat = 1;
};

// Checks the entries (an unknown strategy is a usage error naming --strategies).
void check_bench_entries(const std::vector<std::string>& entries);
// Runs every entry; one JSON object per entry: strategy, estimated/predicted figures, and the measured ones
// (tokens_per_s, step_ms, peak_bytes, comm_bytes_per_step) or oom/error/exit_code; an osdp entry also the
// plan its (first) run trained, as a plan file holds it (osdp_plan).
nlohmann::json run_bench(const BenchOptions& o);
void print_bench(const nlohmann::json& results);

}  // namespace slimshard
