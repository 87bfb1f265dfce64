// plan.cpp — plan files: reading, checking, resolving globs against a model's ops, applying splits.
#include <nlohmann/json.hpp>

#include "slimshard/common.h"
#include "slimshard/plan.h"

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
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("--plan " + path + ": not valid JSON (" + e.what() + ")");
  }
  Plan plan;
  plan.source = path;
  if (!j.is_object() || !j.contains("ops") || !j["ops"].is_object())
    throw UsageError("--plan " + path +
                     ": expected {\"ops\": {\"<op or glob>\": {\"strategy\": ..., \"splits\": ...}}}");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "ops" && it.key() != "world" && it.key() != "micro_batch" && it.key() != "predicted")
      throw UsageError("--plan " + path + ": unknown field '" + it.key() + "'");
  try {
    if (j.contains("world")) plan.world = j["world"].get<int>();
    if (j.contains("micro_batch")) plan.micro_batch = j["micro_batch"].get<int64_t>();
  } catch (const nlohmann::json::exception&) {
    throw UsageError("--plan " + path + ": world and micro_batch must be integers");
  }
  if (plan.world < 0 || plan.micro_batch < 0)
    throw UsageError("--plan " + path + ": negative world or micro_batch");
  for (auto it = j["ops"].begin(); it != j["ops"].end(); ++it) {
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
        if (!f->is_number_integer() || f->get<int>() < 1)
          throw UsageError(what + ": splits must be a positive integer");
        e.has_splits = true;
        e.splits = f->get<int>();
      } else if (f.key() != "note") {
        throw UsageError(what + ": unknown field '" + f.key() + "' (expected strategy, splits)");
      }
    }
    plan.entries.push_back(e);
  }
  return plan;
}

std::map<std::string, OpChoice> resolve_plan(const Plan& plan, const Model& model) {
  std::map<std::string, OpChoice> out;
  for (const Op* op : model.ops()) out[op->name()] = OpChoice{};
  for (const PlanEntry& e : plan.entries) {
    int matched = 0;
    for (const Op* op : model.ops()) {
      if (!glob_match(e.pattern, op->name())) continue;
      ++matched;
      OpChoice& c = out[op->name()];
      if (e.has_strategy) c.strategy = e.strategy;
      if (e.has_splits) {
        const auto* lin = dynamic_cast<const Linear*>(op);
        if (e.splits != 1 && !lin)
          throw UsageError("--plan " + plan.source + ": entry '" + e.pattern +
                           "': splits apply to linear ops, " + op->name() + " is " + op->kind());
        if (lin && lin->out_features() % e.splits != 0)
          throw UsageError("--plan " + plan.source + ": entry '" + e.pattern +
                           "': splits=" + std::to_string(e.splits) + " does not divide the " +
                           std::to_string(lin->out_features()) + " output features of " + op->name());
        c.splits = e.splits;
      }
    }
    if (matched == 0)
      throw UsageError("--plan " + plan.source + ": entry '" + e.pattern + "' matches no op of the model");
  }
  return out;
}

std::vector<Strategy> apply_plan(const std::map<std::string, OpChoice>& choices, Model& model) {
  for (Op* op : model.ops())
    if (auto* lin = dynamic_cast<Linear*>(op)) lin->set_splits(model.params(), choices.at(op->name()).splits);
  std::map<const ShardedParam*, Strategy> by_param;
  for (Op* op : model.ops())
    for (ShardedParam* p : op->params()) by_param[p] = choices.at(op->name()).strategy;
  std::vector<Strategy> out;
  for (ShardedParam* p : model.params().all()) out.push_back(by_param.at(p));
  return out;
}

}  // namespace slimshard
