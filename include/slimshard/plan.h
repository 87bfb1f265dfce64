// plan.h — per-operator plans (strategy and splits for each op) and the memory estimate per rank.
// A plan file: { "world": N?, "micro_batch": b?, "ops": { "<op name or glob>": {"strategy": "zero3",
// "splits": 2}, ... } } — entries apply in file order, later ones winning; `*` matches any characters.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "slimshard/nn.h"
#include "slimshard/shard.h"

namespace slimshard {

struct OpChoice {
  Strategy strategy = Strategy::ddp;
  int splits = 1;
};

struct PlanEntry {
  std::string pattern;
  bool has_strategy = false, has_splits = false;
  Strategy strategy = Strategy::ddp;
  int splits = 1;
};

struct Plan {
  std::string source;  // file name, for messages
  int world = 0;       // 0 = any
  int64_t micro_batch = 0;
  std::vector<PlanEntry> entries;
};

// Reads and checks a plan file; problems -> UsageError naming the file and the entry.
Plan load_plan(const std::string& path);
// The same plan everywhere.
Plan uniform_plan(Strategy s);
// True if `name` matches the glob `pattern` (`*` any run of characters, `?` one character).
bool glob_match(const std::string& pattern, const std::string& name);

// Each op's choice under `plan`. An entry matching no op, or splits an op cannot take -> UsageError.
std::map<std::string, OpChoice> resolve_plan(const Plan& plan, const Model& model);
// Applies splits to the model's ops and returns each param's strategy (in ParamSet order).
std::vector<Strategy> apply_plan(const std::map<std::string, OpChoice>& choices, Model& model);

// ---------------------------------------------------------------------------------------------------------------
// Memory per rank. Activations come from a probe: one forward and backward of the model at the micro-batch in
// this process, with the tracking allocator recording what each op leaves live (the same code and kernels the
// training runs, so no formula to drift from them).
struct ActivationProfile {
  int64_t micro_batch = 0;
  std::map<std::string, int64_t> op_bytes;  // kept for backward, attributed to the op that ends the span
  int64_t total_bytes = 0;                  // live at the end of forward, beyond params and grads
  int64_t backward_extra = 0;               // peak in backward beyond `total_bytes`
};
ActivationProfile probe_activations(const ModelConfig& config, int64_t micro_batch, uint64_t seed);

struct OpMemory {
  std::string op;
  int64_t params = 0;  // elements
  OpChoice choice;
  int64_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;  // persistent, this rank
  int64_t gathered_bytes = 0;  // transient: full weights of one split while in use (zero3)
  int64_t grad_transient_bytes =
      0;  // transient: the full gradient before it is reduce-scattered (zero2/zero3)
  int64_t activation_bytes = 0;
  int64_t persistent() const { return param_bytes + grad_bytes + optim_bytes; }
};

struct MemoryEstimate {
  std::vector<OpMemory> ops;
  int64_t persistent = 0, activations = 0, transient = 0, peak = 0;
};

// Estimate per rank for `choices` at `world` ranks with prefetch depth K and `optim_states` fp32 tensors of
// state per param element (AdamW 2, SGD with momentum 1).
MemoryEstimate estimate_memory(const Model& model, const std::map<std::string, OpChoice>& choices, int world,
                               int prefetch, int optim_states, const ActivationProfile& act);

}  // namespace slimshard
