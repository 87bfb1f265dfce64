// planner.h — planning for one training run: the library calls behind `train --strategy osdp`, `memory`,
// `plan` and `bench`. A RunSpec is what the planner knows of a run; from it come the plan the run trains
// under, its memory estimate, its cost model and predicted cost, and (osdp) the searched plan, found on rank
// 0 and given to every rank.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "slimshard/cost_model.h"
#include "slimshard/memory_estimate.h"
#include "slimshard/plan.h"
#include "slimshard/profile.h"
#include "slimshard/search.h"

namespace slimshard {

class Communicator;

struct RunSpec {
  ModelConfig model;
  CostOptions cost;         // world, global batch, prefetch, optimizer states, buckets, Slim-DP
  int64_t micro_batch = 0;  // 0: the plan's, else the whole per-rank batch
  int64_t mem_limit = 0;    // bytes; 0 = none
  uint64_t seed = 1337;
  std::string strategy = "ddp";  // one strategy everywhere (osdp: searched), unless plan_file is set
  std::string plan_file;
  int world() const { return cost.world; }
};

// Rows of the global batch each rank takes; a global batch the world does not divide is a usage error.
int64_t per_rank_batch(const RunSpec& spec);
// The plan the run trains under: the --plan file, or --strategy everywhere (not osdp: see plan_for_run). A
// plan made for another world size is a usage error.
Plan plan_of(const RunSpec& spec);
// Rows per forward/backward: the flag, else the plan's, else the whole per-rank batch; it must divide the
// per-rank batch.
int64_t micro_batch_of(const RunSpec& spec, const Plan& plan);
// The estimate `slimshard memory` prints for the run. `probe_cache` (optional) keeps the activation probe
// between calls at the same micro-batch.
MemoryEstimate estimate_for(const RunSpec& spec, ActivationProfile* probe_cache = nullptr);

// Where the costs come from: a profile file (taken at the run's world size, or re-derived with
// `scale_profile`) or a cluster spec with candidate micro-batches. Exactly one of the two.
struct CostSource {
  std::string profile, cluster;
  std::vector<int64_t> micro_batches{1, 2, 4, 8};  // with a cluster spec
  bool scale_profile = false;
};
CostModel cost_model_for(const RunSpec& spec, const CostSource& source);
// What the cost model predicts for the run: its own plan at its micro-batch, or (osdp) the search's result.
SearchResult predicted_for(const CostModel& m, const RunSpec& spec);
// The search's budget under a --mem-limit that this machine's allocator enforces: the limit less 2 %, the
// error the peak estimate is held to; and how an error message names the limit and what was planned to.
SearchOptions planning_options(int64_t mem_limit);
std::string planned_budget(int64_t mem_limit, int64_t planned);

// `slimshard plan`: the world size (given, or the profile's, or the cluster's devices) and budget (given, or
// the cluster's memory) filled in, the search run, the uniform baselines beside it.
struct PlanReport {
  RunSpec spec;
  CostModel model;
  SearchResult result;
  std::vector<std::pair<std::string, SearchResult>> baselines;
  double search_s = 0;
  int64_t planned_limit = 0;  // what the search planned to (planning_options, or a --cluster device's memory)
};
PlanReport plan_offline(RunSpec spec, const CostSource& source);

// A plan osdp may train under, with what the cost model predicts for it.
struct PlanCandidate {
  std::string name;  // "searched plan", "zero2 everywhere"
  Plan plan;
  std::string plan_json;  // the plan as a plan file holds it
  double predicted_ms = 0;
  int64_t predicted_peak = 0;
};

// --strategy osdp: the fastest plan for `spec` under its memory limit, found on rank 0 from `measured` (the
// profile just taken) or, if null, the profile file `profile_path`, printed there (with the per-op table when
// `table`), and given to every rank (a collective). The searched plan comes first, then every uniform plan
// that fits and differs from it (not slim: its rounds need a run's state), best predicted first: where the
// model's error is larger than their differences, the run measures them (train.h, time_plans). A profile of
// another model, or no plan that fits, is a usage error on every rank.
std::vector<PlanCandidate> plan_for_run(const RunSpec& spec, const Profile* measured,
                                        const std::string& profile_path, Communicator& comm, bool table);

// The plan's table (optional) and totals, with the uniform baselines for comparison.
void print_plan(const CostModel& m, const SearchResult& r,
                const std::vector<std::pair<std::string, SearchResult>>& base, int64_t mem_limit, bool table);

}  // namespace slimshard
