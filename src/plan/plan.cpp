// plan.cpp — plan files: reading, checking, resolving globs against a model's ops, applying splits.
#include "slimshard/plan.h"

#include "slimshard/common.h"
#include "slimshard/json.h"

namespace slimshard {

bool glob_match(const std::string& pattern, const std::string& name) {
  // Iterative wildcard match with backtracking to the last '*'.
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p, ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, mark = n;
    } else if (star != std::string::npos) {
      p = star + 1, n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::none;
  if (s == "all") return Recompute::all;
  if (s == "auto") return Recompute::auto_;
  throw UsageError("--recompute: expected none, all or auto, got '" + s + "'");
}

const char* recompute_name(Recompute r) {
  return r == Recompute::none ? "none" : r == Recompute::all ? "all" : "auto";
}

Plan uniform_plan(Strategy s) {
  Plan p;
  p.source = std::string("--strategy ") + strategy_name(s);
  PlanEntry e;
  e.pattern = "*";
  e.has_strategy = true;
  e.strategy = s;
  p.entries.push_back(e);
  return p;
}

Plan load_plan(const std::string& path) { return parse_plan(read_file(path, "--plan"), path); }

Plan parse_plan(const std::string& text, const std::string& path) {
  const nlohmann::ordered_json j = parse_ordered_json(text, "--plan " + path);
  Plan plan;
  plan.source = path;
  if (!j.is_object() || !j.contains("ops") || !j.at("ops").is_object())
    throw UsageError("--plan " + path +
                     ": expected {\"ops\": {\"<op or glob>\": {\"strategy\": ..., \"splits\": ...}}}");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "ops" && it.key() != "world" && it.key() != "micro_batch" && it.key() != "predicted" &&
        it.key() != "precision" && it.key() != "reduce_dtype")
      throw UsageError("--plan " + path + ": unknown field '" + it.key() + "'");
  for (const char* key : {"precision", "reduce_dtype"}) {
    if (!j.contains(key)) continue;
    const std::string what = "--plan " + path + ": " + key;
    if (!j.at(key).is_string()) throw UsageError(what + " must be a string (fp32 or bf16)");
    (std::string(key) == "precision" ? plan.precision.compute : plan.precision.reduce) =
        parse_float_type(j.at(key).get<std::string>(), what);
    plan.has_precision = true;
  }
  if (j.contains("world"))
    plan.world = static_cast<int>(json_integer(j.at("world"), "--plan " + path + ": world", 1, 1 << 20));
  if (j.contains("micro_batch"))
    plan.micro_batch = json_integer(j.at("micro_batch"), "--plan " + path + ": micro_batch", 1, 1 << 30);
  for (auto it = j.at("ops").begin(); it != j.at("ops").end(); ++it) {
    const std::string what = "--plan " + path + ": entry '" + it.key() + "'";
    if (!it->is_object()) throw UsageError(what + ": expected an object");
    PlanEntry e;
    e.pattern = it.key();
    for (auto f = it->begin(); f != it->end(); ++f) {
      if (f.key() == "strategy") {
        if (!f->is_string()) throw UsageError(what + ": strategy must be a string");
        e.has_strategy = true;
        e.strategy = parse_strategy(f->get<std::string>(), what);
      } else if (f.key() == "splits") {
        e.has_splits = true;
        e.splits = static_cast<int>(json_integer(*f, what + ": splits", 1, 1 << 16));
      } else if (f.key() == "recompute") {
        if (!f->is_boolean()) throw UsageError(what + ": recompute must be true or false");
        e.has_recompute = true;
        e.recompute = f->get<bool>();
      } else if (f.key() != "note") {
        throw UsageError(what + ": unknown field '" + f.key() + "' (expected strategy, splits, recompute)");
      }
    }
    plan.entries.push_back(e);
  }
  return plan;
}

std::map<std::string, OpChoice> resolve_plan(const Plan& plan, const std::vector<OpShape>& ops) {
  std::map<std::string, OpChoice> out;
  for (const OpShape& op : ops) out[op.name] = OpChoice{};
  for (const PlanEntry& e : plan.entries) {
    int matched = 0;
    for (const OpShape& op : ops) {
      if (!glob_match(e.pattern, op.name)) continue;
      ++matched;
      OpChoice& c = out[op.name];
      if (e.has_strategy) c.strategy = e.strategy;
      if (e.has_splits) {
        const bool linear = op.kind == "linear";
        if (e.splits != 1 && !linear)
          throw UsageError("--plan " + plan.source + ": entry '" + e.pattern +
                           "': splits apply to linear ops, " + op.name + " is " + op.kind);
        if (linear && op.out_features % e.splits != 0)
          throw UsageError("--plan " + plan.source + ": entry '" + e.pattern +
                           "': splits=" + std::to_string(e.splits) + " does not divide the " +
                           std::to_string(op.out_features) + " output features of " + op.name);
        c.splits = e.splits;
      }
      if (e.has_recompute) {
        if (!block_of(op.name).empty())
          c.recompute = e.recompute;
        else if (e.recompute && e.pattern.find_first_of("*?") == std::string::npos)
          throw UsageError("--plan " + plan.source + ": entry '" + e.pattern + "': recompute applies to " +
                           "GPT blocks (blocks.<i>.*), " + op.name + " is not in one");
      }
    }
    if (matched == 0)
      throw UsageError("--plan " + plan.source + ": entry '" + e.pattern + "' matches no op of the model");
  }
  // A block recomputes as a whole.
  std::map<std::string, const OpShape*> first_of_block;
  for (const OpShape& op : ops) {
    const std::string block = block_of(op.name);
    if (block.empty()) continue;
    const OpShape*& first = first_of_block[block];
    if (!first) first = &op;
    if (out.at(op.name).recompute != out.at(first->name).recompute)
      throw UsageError("--plan " + plan.source + ": recompute is per block: " + first->name + " has " +
                       (out.at(first->name).recompute ? "true" : "false") + ", " + op.name + " has " +
                       (out.at(op.name).recompute ? "true" : "false") + " (set it on " + block + ".*)");
  }
  return out;
}

std::vector<Strategy> apply_plan(const std::map<std::string, OpChoice>& choices, Model& model) {
  for (Op* op : model.ops())
    if (auto* lin = dynamic_cast<Linear*>(op)) lin->set_splits(model.params(), choices.at(op->name()).splits);
  for (Block* b : model.blocks()) b->set_recompute(false);
  for (Op* op : model.ops())
    if (choices.at(op->name()).recompute)
      for (Block* b : model.blocks())
        if (b->name() == block_of(op->name())) b->set_recompute(true);
  std::map<const ShardedParam*, Strategy> by_param;
  for (Op* op : model.ops())
    for (ShardedParam* p : op->params()) by_param[p] = choices.at(op->name()).strategy;
  std::vector<Strategy> out;
  for (ShardedParam* p : model.params().all()) out.push_back(by_param.at(p));
  return out;
}

}  // namespace slimshard
