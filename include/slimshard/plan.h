// plan.h — per-operator plans: the strategy and splits of every op, read from a plan file or made uniform,
// resolved against a model's ops and applied to it. A plan file: { "world": N?, "micro_batch": b?,
// "precision": "fp32"|"bf16"?, "reduce_dtype": "fp32"|"bf16"?,
// "ops": { "<op name or glob>": {"strategy": "zero3", "splits": 2, "recompute": true}, ... } } — entries
// apply in file order, later ones winning; `*` matches any run of characters, `?` one. "recompute" is a
// choice per GPT block (nn.h's Block): every op of a block must agree; a glob reaching ops outside blocks
// leaves them be, an exact name outside blocks is an error. Problems are usage errors naming file and entry.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "slimshard/nn.h"
#include "slimshard/sharded_param.h"

namespace slimshard {

// --recompute: none, all (every GPT block), auto (a plan file's choice; osdp: the search's).
enum class Recompute { none, all, auto_ };
// "none" | "all" | "auto"; anything else is a UsageError.
Recompute parse_recompute(const std::string& s);
const char* recompute_name(Recompute r);

struct OpChoice {
  Strategy strategy = Strategy::ddp;
  int splits = 1;
  bool recompute = false;  // the op's block recomputes its forward in backward
  bool operator==(const OpChoice& o) const {
    return strategy == o.strategy && splits == o.splits && recompute == o.recompute;
  }
};

struct PlanEntry {
  std::string pattern;
  bool has_strategy = false, has_splits = false, has_recompute = false;
  Strategy strategy = Strategy::ddp;
  int splits = 1;
  bool recompute = false;
};

struct Plan {
  std::string source;  // file name, for messages
  int world = 0;       // 0 = any
  int64_t micro_batch = 0;
  bool has_precision = false;  // checked against the run's when given
  Precision precision;
  std::vector<PlanEntry> entries;
};

// Reads and checks a plan file.
Plan load_plan(const std::string& path);
// The same from the text of a plan; `source` names it in messages.
Plan parse_plan(const std::string& text, const std::string& source);
// The same strategy everywhere.
Plan uniform_plan(Strategy s);
// True if `name` matches the glob `pattern` (`*` any run of characters, `?` one character).
bool glob_match(const std::string& pattern, const std::string& name);

// Each op's choice under `plan`. An entry matching no op, or splits an op cannot take -> UsageError.
std::map<std::string, OpChoice> resolve_plan(const Plan& plan, const std::vector<OpShape>& ops);
// Applies splits and recomputation to the model's ops and blocks and returns each param's strategy (in
// ParamSet order).
std::vector<Strategy> apply_plan(const std::map<std::string, OpChoice>& choices, Model& model);

}  // namespace slimshard
