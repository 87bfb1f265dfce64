// search.h — OSDP's search: per op a choice (strategy × splits) and one micro-batch, minimising the step time
// (maximising samples/s at the fixed global batch) with the peak under `mem_limit`. A multiple-choice knapsack
// by dynamic programming (exact for its rule: loads in uniform neighbourhoods, memory rounded up to
// `memory_buckets` steps of the budget), for every bound on the largest load and every micro-batch, then a
// descent by the engine's simulation over moves of one or two adjacent ops. A brute-force oracle of the rule
// for tests, the uniform baselines, and the plan file a result is written as.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "slimshard/cost_model.h"

namespace slimshard {

struct SearchOptions {
  int64_t mem_limit = 0;  // 0 = unlimited
  int memory_buckets = 1024;
};

struct SearchResult {
  bool fits = false;
  std::map<std::string, OpChoice> choices;
  PlanCost cost;
  std::string explanation;  // when nothing fits: by how much, and what would
};

SearchResult search_plan(const CostModel& model, const SearchOptions& o);
// Every combination (tests only: small models).
SearchResult brute_force_plan(const CostModel& model, const SearchOptions& o);
// The same strategy everywhere, at the best micro-batch that fits (or the smallest if none does).
SearchResult uniform_baseline(const CostModel& model, Strategy s, const SearchOptions& o);
// The uniform baselines a plan is shown next to: ddp, slim (when allowed), zero1, zero2, zero3.
std::vector<std::pair<std::string, SearchResult>> baselines(const CostModel& model, const SearchOptions& o);

// A plan file for `result` (with the predicted figures alongside, for reading).
nlohmann::ordered_json plan_to_json(const CostModel& model, const SearchResult& result);

}  // namespace slimshard
