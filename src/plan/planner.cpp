// planner.cpp — planning for one training run (see planner.h): the run's plan and micro-batch, its memory
// estimate, its cost model and prediction, `slimshard plan`'s search, and osdp's plan found on rank 0.
#include "slimshard/planner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "slimshard/comm.h"
#include "slimshard/common.h"

namespace slimshard {

int64_t per_rank_batch(const RunSpec& spec) {
  if (spec.cost.global_batch % spec.world() != 0)
    throw UsageError("--batch-size " + std::to_string(spec.cost.global_batch) + " is not divisible by the " +
                     std::to_string(spec.world()) + " ranks");
  return spec.cost.global_batch / spec.world();
}

Plan plan_of(const RunSpec& spec) {
  per_rank_batch(spec);
  Plan plan = spec.plan_file.empty() ? uniform_plan(parse_strategy(spec.strategy, "--strategy"))
                                     : load_plan(spec.plan_file);
  if (spec.cost.recompute != Recompute::auto_) {  // the flag overrides the plan's
    bool blocks = false;
    for (const OpShape& op : op_shapes(spec.model)) blocks = blocks || !block_of(op.name).empty();
    if (!blocks && spec.cost.recompute == Recompute::all)
      throw UsageError("--recompute all: " + spec.model.describe() +
                       " has no blocks to recompute (recomputation is per GPT block)");
    PlanEntry e;
    e.pattern = "*";
    e.has_recompute = true;
    e.recompute = spec.cost.recompute == Recompute::all;
    plan.entries.push_back(e);
  }
  if (plan.world != 0 && plan.world != spec.world())
    throw UsageError("--plan " + spec.plan_file + ": made for " + std::to_string(plan.world) +
                     " ranks, this run has " + std::to_string(spec.world()));
  if (plan.has_precision && plan.precision != spec.cost.precision)
    throw UsageError("--plan " + spec.plan_file + ": made for precision " + plan.precision.name() +
                     ", this run is " + spec.cost.precision.name() + " (give --precision/--reduce-dtype " +
                     "to match, or plan again)");
  return plan;
}

int64_t micro_batch_of(const RunSpec& spec, const Plan& plan) {
  const int64_t local = per_rank_batch(spec);
  const int64_t micro = spec.micro_batch > 0   ? spec.micro_batch
                        : plan.micro_batch > 0 ? plan.micro_batch
                                               : local;
  if (micro <= 0 || local % micro != 0)
    throw UsageError("--micro-batch " + std::to_string(micro) + " does not divide the per-rank batch of " +
                     std::to_string(local) + " rows");
  return micro;
}

MemoryEstimate estimate_for(const RunSpec& spec, ActivationProfile* probe_cache) {
  const Plan plan = plan_of(spec);
  const int64_t micro = micro_batch_of(spec, plan);
  const std::vector<OpShape> ops = op_shapes(spec.model);
  const auto choices = resolve_plan(plan, ops);
  ActivationProfile local;
  ActivationProfile& act = probe_cache ? *probe_cache : local;
  const std::set<std::string> recompute = recomputed_blocks(choices);
  if (act.micro_batch != micro || act.recompute != recompute)
    act = probe_activations(spec.model, micro, spec.seed, spec.cost.precision.compute, recompute);
  return estimate_memory(ops, choices, spec.world(), spec.cost.prefetch, spec.cost.optim_states,
                         per_rank_batch(spec) / micro, act, spec.cost.precision, spec.cost.fuse_bytes,
                         spec.cost.ranks_per_host);
}

CostModel cost_model_for(const RunSpec& spec, const CostSource& source) {
  if (source.profile.empty() == source.cluster.empty())
    throw UsageError("give one of --profile or --cluster");
  if (!source.profile.empty()) {
    Profile p = load_profile(source.profile);
    if (source.scale_profile) p = scale_profile(p, spec.world());
    return CostModel::from_profile(p, spec.cost);
  }
  return CostModel::from_cluster(load_cluster(source.cluster), spec.model, spec.cost, source.micro_batches);
}

// Filled to the last MiB, a plan stopped with "memory limit exceeded" when the estimate fell 0.1 % short
// (gpt-25m, 2 hosts x 2 ranks, 450 MiB: planned 449.9 MiB, docs/cluster.md). Devices of a --cluster spec are
// planned to their full memory: no allocator here measures them.
SearchOptions planning_options(int64_t mem_limit) {
  SearchOptions o;
  o.mem_limit = mem_limit > 0 ? mem_limit - mem_limit / 50 : 0;
  return o;
}

std::string planned_budget(int64_t mem_limit, int64_t planned) {
  const std::string limit = format_mib(static_cast<double>(mem_limit)) + " MiB";
  if (planned == mem_limit) return limit;
  return limit + " (planned to " + format_mib(static_cast<double>(planned)) +
         " MiB: 2 % kept for the estimate's error)";
}

SearchResult predicted_for(const CostModel& m, const RunSpec& spec) {
  const SearchOptions search = planning_options(spec.mem_limit);
  if (spec.strategy == "osdp" && spec.plan_file.empty()) return search_plan(m, search);
  const Plan plan = plan_of(spec);
  SearchResult r;
  r.choices = resolve_plan(plan, op_shapes(spec.model));
  r.cost = m.evaluate(r.choices, micro_batch_of(spec, plan));
  r.fits = spec.mem_limit <= 0 || r.cost.peak_bytes <= spec.mem_limit;
  return r;
}

PlanReport plan_offline(RunSpec spec, const CostSource& source) {
  if (!source.profile.empty() && spec.cost.world == 0) spec.cost.world = load_profile(source.profile).world;
  if (!source.cluster.empty()) {
    const ClusterSpec c = load_cluster(source.cluster);
    if (spec.cost.world == 0) spec.cost.world = c.devices;
    if (spec.mem_limit == 0) spec.mem_limit = c.memory_bytes;
  }
  if (spec.cost.world == 0) spec.cost.world = 1;
  per_rank_batch(spec);  // the batch must divide over the world before memory is worth discussing
  const auto t0 = std::chrono::steady_clock::now();
  PlanReport report{spec, cost_model_for(spec, source), {}, {}, 0, 0};
  SearchOptions search = planning_options(spec.mem_limit);
  if (!source.cluster.empty()) search.mem_limit = spec.mem_limit;  // simulated devices: their full memory
  report.result = search_plan(report.model, search);
  report.search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report.baselines = baselines(report.model, search);
  report.planned_limit = search.mem_limit;
  return report;
}

namespace {

// Rank 0's part of plan_for_run: the candidates as JSON text.
std::string search_on_rank0(const RunSpec& spec, const Profile* measured, const std::string& profile_path,
                            bool table) {
  const Profile p = measured ? *measured : load_profile(profile_path);
  const std::string what = measured ? "osdp profile" : "--profile " + profile_path;
  if (!(p.model.to_json() == spec.model.to_json()))
    throw UsageError(what + ": made for " + p.model.describe() + ", not " + spec.model.describe());
  const CostModel m = CostModel::from_profile(p, spec.cost);
  const SearchOptions search = planning_options(spec.mem_limit);
  const SearchResult r = search_plan(m, search);
  if (!r.fits)
    throw UsageError("--strategy osdp --mem-limit " + planned_budget(spec.mem_limit, search.mem_limit) +
                     ": " + r.explanation);
  std::printf("osdp plan (costs from %s):\n", m.source().c_str());
  const auto base = baselines(m, search);
  print_plan(m, r, base, spec.mem_limit, table);
  std::fflush(stdout);
  auto candidate = [&](const std::string& name, const SearchResult& x) {
    return nlohmann::ordered_json{{"name", name},
                                  {"plan", plan_to_json(m, x)},
                                  {"step_ms", x.cost.step_ms},
                                  {"peak_bytes", x.cost.peak_bytes}};
  };
  auto has_slim = [](const SearchResult& x) {
    return std::any_of(x.choices.begin(), x.choices.end(),
                       [](const auto& c) { return c.second.strategy == Strategy::slim; });
  };
  auto same = [](const SearchResult& a, const SearchResult& b) {
    return a.cost.micro_batch == b.cost.micro_batch && a.choices == b.choices;
  };
  nlohmann::ordered_json out = nlohmann::ordered_json::array({candidate("searched plan", r)});
  if (!has_slim(r)) {
    std::vector<const std::pair<std::string, SearchResult>*> uniform;
    for (const auto& b : base)
      if (b.second.fits && !has_slim(b.second) && !same(b.second, r)) uniform.push_back(&b);
    std::sort(uniform.begin(), uniform.end(),
              [](auto* a, auto* b) { return a->second.cost.step_ms < b->second.cost.step_ms; });
    for (const auto* b : uniform) out.push_back(candidate(b->first + " everywhere", b->second));
  }
  return out.dump();
}

}  // namespace

std::vector<PlanCandidate> plan_for_run(const RunSpec& spec, const Profile* measured,
                                        const std::string& profile_path, Communicator& comm, bool table) {
  std::string text, error;
  if (comm.rank() == 0) {
    try {
      text = search_on_rank0(spec, measured, profile_path, table);
    } catch (const UsageError& e) {
      error = e.what();
    }
  }
  error = broadcast_string(comm, error, 0);
  if (!error.empty()) throw UsageError(error);
  std::vector<PlanCandidate> out;
  for (const auto& c : nlohmann::ordered_json::parse(broadcast_string(comm, text, 0)))
    out.push_back(PlanCandidate{c["name"], parse_plan(c["plan"].dump(), "osdp plan"), c["plan"].dump(),
                                c["step_ms"], c["peak_bytes"]});
  return out;
}

void print_plan(const CostModel& m, const SearchResult& r,
                const std::vector<std::pair<std::string, SearchResult>>& base, int64_t mem_limit,
                bool table) {
  auto mib = [](int64_t b) { return format_mib(static_cast<double>(b)); };
  const PlanCost& c = r.cost;
  const bool hosts = m.options().hosts() > 1;
  double intra = 0, inter = 0;
  for (const ChoiceCost& cc : c.per_op) intra += cc.intra_bytes, inter += cc.inter_bytes;
  if (table) {
    std::printf("%-24s %11s %-10s %14s %13s %9s%s\n", "op", "params", "choice", "persistent MiB",
                "transient MiB", "time ms", hosts ? "  MiB/step in host  between hosts" : "");
    for (size_t i = 0; i < m.ops().size(); ++i) {
      const ChoiceCost& cc = c.per_op[i];
      int64_t params = 0;
      for (int64_t n : m.ops()[i].param_numels) params += n;
      const std::string choice = std::string(strategy_name(cc.choice.strategy)) +
                                 (cc.choice.splits > 1 ? " x" + std::to_string(cc.choice.splits) : "") +
                                 (cc.choice.recompute ? " rc" : "");
      std::printf("%-24s %11lld %-10s %14s %13s %9.2f", m.ops()[i].name.c_str(), (long long)params,
                  choice.c_str(), mib(cc.mem.persistent()).c_str(), mib(cc.transient_bytes).c_str(),
                  cc.time_ms);
      if (hosts) std::printf(" %16.2f %14.2f", cc.intra_bytes / 1048576.0, cc.inter_bytes / 1048576.0);
      std::printf("\n");
    }
  }
  std::printf(
      "plan: micro-batch %lld x %lld per step; predicted peak %s MiB per rank (persistent %s + activations "
      "%s + transient %s)%s; step %.1f ms, %.1f samples/s, %.0f tokens/s\n",
      (long long)c.micro_batch, (long long)c.accum, mib(c.peak_bytes).c_str(),
      mib(c.persistent_bytes).c_str(), mib(c.activation_bytes).c_str(), mib(c.transient_bytes).c_str(),
      mem_limit > 0 ? (" of " + mib(mem_limit) + " allowed").c_str() : "", c.step_ms, c.samples_per_s,
      c.tokens_per_s);
  if (hosts)
    std::printf(
        "  per step per rank: %.2f MiB within its host, %.2f MiB between hosts (%d hosts x %d ranks)\n",
        intra / 1048576.0, inter / 1048576.0, m.options().hosts(), m.options().per_host());
  // Which blocks recompute, and why: the activations it frees, for the forward it runs again.
  int blocks = 0, recomputed = 0;
  std::string which;  // "0-3, 6"
  int run_from = -1, run_to = -2;
  auto close_run = [&] {
    if (run_from < 0) return;
    which += (which.empty() ? "" : ", ") + std::to_string(run_from) +
             (run_to > run_from ? "-" + std::to_string(run_to) : "");
  };
  int64_t freed = 0;
  double again_ms = 0;
  for (size_t i = 0; i < m.ops().size(); ++i) {
    const int b = m.block_index(i);
    if (b < 0) continue;
    const bool new_block = i == 0 || m.block_index(i - 1) != b;
    blocks += new_block;
    if (!c.per_op[i].choice.recompute) continue;
    OpChoice kept = c.per_op[i].choice;  // the same op keeping its activations
    kept.recompute = false;
    again_ms += c.per_op[i].time_ms - m.cost(i, kept, c.micro_batch).time_ms;
    if (!new_block) continue;
    ++recomputed;
    if (b != run_to + 1) close_run(), run_from = b;
    run_to = b;
    freed += m.block_kept_bytes(b, false, c.micro_batch) - m.block_kept_bytes(b, true, c.micro_batch);
  }
  close_run();
  if (recomputed > 0)
    std::printf(
        "  recomputes %d of %d blocks (blocks %s): keeping their inputs alone frees %s MiB of "
        "activations "
        "%s; running their forward again adds %.1f ms per step (what communication does not hide)\n",
        recomputed, blocks, which.c_str(), mib(freed).c_str(),
        mem_limit > 0 ? "the budget needs" : "(asked for)", again_ms);
  for (const auto& [name, b] : base)
    std::printf("  %-18s peak %8s MiB, step %9.1f ms, %8.0f tokens/s%s\n", (name + " everywhere:").c_str(),
                mib(b.cost.peak_bytes).c_str(), b.cost.step_ms, b.cost.tokens_per_s,
                b.fits ? "" : "   does not fit");
}

}  // namespace slimshard
