// search.cpp — the exact search over per-op choices and micro-batches (multiple-choice knapsack by dynamic
// programming over discretised memory), a brute-force oracle, uniform baselines, and what to say when nothing
// fits. Peak = Σ persistent + the largest load of any op, an op's load being the most activations +
// transients at any of its moments (cost_model.h: ChoiceCost::load_bytes). The max is handled by fixing a
// bound B on the largest load (every distinct load in turn, thinned to kMaxBounds), allowing only choices
// under it, and giving the knapsack a budget of limit − B; persistent bytes are rounded up to budget/buckets.
// Each bound's best plan is then checked with the engine's own simulation (CostModel::evaluate), which also
// sees what neighbours of different strategies do to each other, and kept only if it fits.
#include "slimshard/search.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "slimshard/common.h"

namespace slimshard {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr size_t kMaxBounds = 256;

struct Candidate {
  std::vector<std::vector<ChoiceCost>> per_op;  // every op's choices, costed at one micro-batch
  std::vector<int64_t> bounds;                  // bounds on the largest load, ascending
};

Candidate costed(const CostModel& m, int64_t micro) {
  Candidate c;
  for (size_t i = 0; i < m.ops().size(); ++i) {
    std::vector<ChoiceCost> v;
    for (OpChoice ch : m.candidates(i)) v.push_back(m.cost(i, ch, micro));
    for (const auto& cc : v) c.bounds.push_back(cc.load_bytes);
    c.per_op.push_back(std::move(v));
  }
  c.bounds.push_back(m.activations(micro).loss);
  std::sort(c.bounds.begin(), c.bounds.end());
  c.bounds.erase(std::unique(c.bounds.begin(), c.bounds.end()), c.bounds.end());
  if (c.bounds.size() > kMaxBounds) {  // evenly thinned, the largest kept
    std::vector<int64_t> thin;
    for (size_t k = 0; k < kMaxBounds; ++k)
      thin.push_back(c.bounds[k * (c.bounds.size() - 1) / (kMaxBounds - 1)]);
    c.bounds = std::move(thin);
  }
  return c;
}

int64_t unit_for(int64_t budget, int buckets) {
  return std::max<int64_t>(1, (budget + buckets - 1) / buckets);
}

int64_t weight(const ChoiceCost& c, int64_t unit) { return (c.mem.persistent() + unit - 1) / unit; }

SearchResult result_from(const CostModel& m, const std::vector<size_t>& pick, const Candidate& cand,
                         int64_t micro) {
  SearchResult r;
  for (size_t i = 0; i < pick.size(); ++i) r.choices[m.ops()[i].name] = cand.per_op[i][pick[i]].choice;
  r.cost = m.evaluate(r.choices, micro);
  return r;
}

// The fastest choices of each op, memory aside.
std::vector<size_t> fastest(const Candidate& cand) {
  std::vector<size_t> best(cand.per_op.size(), 0);
  for (size_t i = 0; i < cand.per_op.size(); ++i)
    for (size_t c = 1; c < cand.per_op[i].size(); ++c)
      if (cand.per_op[i][c].time_ms < cand.per_op[i][best[i]].time_ms) best[i] = c;
  return best;
}

// The fastest choices with every load ≤ B and the persistent bytes within limit − B (rounded up to
// buckets): an index per op, or empty if none; *time its sum of op times.
std::vector<size_t> knapsack(const Candidate& cand, int64_t B, const SearchOptions& o, double* time) {
  const size_t n = cand.per_op.size();
  const int M = o.memory_buckets;
  const int64_t unit = unit_for(o.mem_limit - B, M);
  std::vector<double> dp(static_cast<size_t>(M) + 1, 0.0), next(static_cast<size_t>(M) + 1);
  std::vector<uint8_t> arg(n * (static_cast<size_t>(M) + 1));
  for (size_t i = 0; i < n; ++i) {
    std::fill(next.begin(), next.end(), kInf);
    const auto& choices = cand.per_op[i];
    for (size_t c = 0; c < choices.size(); ++c) {
      if (choices[c].load_bytes > B) continue;
      const int64_t w = weight(choices[c], unit);
      if (w > M) continue;
      const double t = choices[c].time_ms;
      for (int64_t u = w; u <= M; ++u) {
        const double v = dp[static_cast<size_t>(u - w)] + t;
        if (v < next[static_cast<size_t>(u)]) {
          next[static_cast<size_t>(u)] = v;
          arg[i * (static_cast<size_t>(M) + 1) + static_cast<size_t>(u)] = static_cast<uint8_t>(c);
        }
      }
    }
    std::swap(dp, next);
    if (!(dp[static_cast<size_t>(M)] < kInf)) return {};
  }
  *time = dp[static_cast<size_t>(M)];
  std::vector<size_t> pick(n, 0);
  int64_t u = M;
  for (size_t i = n; i-- > 0;) {
    pick[i] = arg[i * (static_cast<size_t>(M) + 1) + static_cast<size_t>(u)];
    u -= weight(cand.per_op[i][pick[i]], unit);
  }
  return pick;
}

// Keeps `r` if it fits (by the engine's simulation) and is faster than `best`.
void keep_if_better(SearchResult r, const SearchOptions& o, SearchResult& best) {
  if (o.mem_limit > 0 && r.cost.peak_bytes > o.mem_limit) return;
  if (best.fits && r.cost.step_ms >= best.cost.step_ms) return;
  best = std::move(r);
  best.fits = true;
}

// The smallest peak any plan reaches at a micro-batch (zero3 with the most splits is the most frugal choice).
PlanCost frugal(const CostModel& m, int64_t micro) {
  std::map<std::string, OpChoice> choices;
  for (size_t i = 0; i < m.ops().size(); ++i) {
    OpChoice best{Strategy::zero3, 1};
    int64_t best_peak = std::numeric_limits<int64_t>::max();
    for (OpChoice c : m.candidates(i)) {
      const ChoiceCost cc = m.cost(i, c, micro);
      const int64_t p = cc.mem.persistent() + cc.load_bytes;
      if (p < best_peak) best_peak = p, best = c;
    }
    choices[m.ops()[i].name] = best;
  }
  return m.evaluate(choices, micro);
}

std::string explain(const CostModel& m, const SearchOptions& o) {
  const auto mib = [](int64_t b) { return format_mib(static_cast<double>(b)) + " MiB"; };
  const int64_t local = m.options().global_batch / m.options().world;
  std::vector<int64_t> micros = m.micro_batches();
  if (micros.empty())
    return "no profiled micro-batch divides the per-rank batch of " + std::to_string(local) +
           " rows (profile with --micro-batch sizes that divide it)";
  PlanCost best = frugal(m, micros.front());
  for (int64_t b : micros) {
    PlanCost p = frugal(m, b);
    if (p.peak_bytes < best.peak_bytes) best = p;
  }
  const int64_t activations = m.activations(best.micro_batch).highest();
  if (activations >= o.mem_limit)
    return "nothing fits in " + mib(o.mem_limit) + " per rank: the activations of one micro-batch of " +
           std::to_string(best.micro_batch) + " alone take " + mib(activations) +
           "; more ranks do not shrink them (a shorter sequence would; activation recomputation is not "
           "implemented)";
  std::string msg = "nothing fits in " + mib(o.mem_limit) +
                    " per rank: the most frugal plan (zero3, largest splits) "
                    "at micro-batch " +
                    std::to_string(best.micro_batch) + " needs " + mib(best.peak_bytes) + ", " +
                    mib(best.peak_bytes - o.mem_limit) + " over (persistent " + mib(best.persistent_bytes) +
                    ", activations " + mib(best.activation_bytes) + ")";
  // Smaller micro-batches than were profiled (activations extrapolated linearly).
  for (int64_t b = std::min(local, micros.front()) - 1; b >= 1; --b) {
    if (local % b != 0) continue;
    const PlanCost p = frugal(m, b);
    if (p.peak_bytes <= o.mem_limit) {
      msg += "; a micro-batch of " + std::to_string(b) + " would fit (about " + mib(p.peak_bytes) +
             ", profile it with --micro-batch " + std::to_string(b) + ")";
      break;
    }
  }
  // More ranks: persistent bytes shrink with the world, activations stay.
  const std::vector<OpShape> shapes(m.ops().begin(), m.ops().end());
  const ActivationMoments act = m.activations(best.micro_batch);
  for (int w = m.options().world * 2; w <= (1 << 16); w *= 2) {
    std::vector<OpChoice> plan;
    int64_t persistent = 0, scratch = 0;
    for (const OpShape& op : shapes) {
      int k = 1;
      for (int kk : {8, 4, 2})
        if (op.kind == "linear" && op.out_features % kk == 0) {
          k = kk;
          break;
        }
      plan.push_back(OpChoice{Strategy::zero3, k});
      const ChoiceMemory cm = choice_memory(op.param_numels, plan.back(), w, m.options().optim_states,
                                            m.options().precision);  // zero3
      persistent += cm.persistent(), scratch = std::max(scratch, cm.optimizer_scratch_bytes);
    }
    const int64_t peak = peak_of(persistent, scratch, act,
                                 simulate_transients(shapes, plan, w, m.options().prefetch, best.accum,
                                                     m.options().precision, m.options().fuse_bytes),
                                 shapes)
                             .peak;
    if (peak <= o.mem_limit) {
      msg += "; with " + std::to_string(w) + " ranks zero3 would need about " + mib(peak);
      break;
    }
  }
  return msg;
}

}  // namespace

SearchResult search_plan(const CostModel& m, const SearchOptions& o) {
  SearchResult best;
  for (int64_t micro : m.micro_batches()) {
    const Candidate cand = costed(m, micro);
    if (o.mem_limit <= 0) {
      keep_if_better(result_from(m, fastest(cand), cand, micro), o, best);
      continue;
    }
    for (int64_t B : cand.bounds) {
      if (o.mem_limit - B < 0) break;  // larger bounds leave even less
      double t = 0;
      const std::vector<size_t> pick = knapsack(cand, B, o, &t);
      if (pick.empty() || (best.fits && t + m.fixed_ms(micro) >= best.cost.step_ms)) continue;
      keep_if_better(result_from(m, pick, cand, micro), o, best);
    }
  }
  if (!best.fits) best.explanation = explain(m, o);
  return best;
}

SearchResult brute_force_plan(const CostModel& m, const SearchOptions& o) {
  SearchResult best;
  for (int64_t micro : m.micro_batches()) {
    const Candidate cand = costed(m, micro);
    const size_t n = cand.per_op.size();
    // The search's rule, by enumeration: per bound B the fastest plan whose loads are ≤ B and whose rounded
    // persistent bytes fit in limit − B; then each bound's plan checked by the simulation.
    std::vector<double> best_time(cand.bounds.size(), kInf);
    std::vector<std::vector<size_t>> best_pick(cand.bounds.size());
    std::vector<size_t> idx(n, 0);
    for (;;) {
      double t = 0;
      int64_t most = 0;
      for (size_t i = 0; i < n; ++i)
        t += cand.per_op[i][idx[i]].time_ms, most = std::max(most, cand.per_op[i][idx[i]].load_bytes);
      for (size_t b = 0; b < cand.bounds.size(); ++b) {
        const int64_t B = cand.bounds[b];
        if (o.mem_limit <= 0) {
          if (b > 0) break;
        } else {
          if (B < most) continue;
          if (o.mem_limit - B < 0) break;
          const int64_t unit = unit_for(o.mem_limit - B, o.memory_buckets);
          int64_t units = 0;
          for (size_t i = 0; i < n; ++i) units += weight(cand.per_op[i][idx[i]], unit);
          if (units > o.memory_buckets) continue;
        }
        if (t < best_time[b]) best_time[b] = t, best_pick[b] = idx;
      }
      size_t i = 0;
      while (i < n && ++idx[i] == cand.per_op[i].size()) idx[i++] = 0;
      if (i == n) break;
    }
    for (size_t b = 0; b < cand.bounds.size(); ++b)
      if (!best_pick[b].empty()) keep_if_better(result_from(m, best_pick[b], cand, micro), o, best);
  }
  return best;
}

SearchResult uniform_baseline(const CostModel& m, Strategy s, const SearchOptions& o) {
  SearchResult best;
  for (int64_t micro : m.micro_batches()) {
    SearchResult r;
    for (const OpProfile& op : m.ops()) r.choices[op.name] = OpChoice{s, 1};
    r.cost = m.evaluate(r.choices, micro);
    r.fits = o.mem_limit <= 0 || r.cost.peak_bytes <= o.mem_limit;
    const bool better = best.choices.empty() || (r.fits && !best.fits) ||
                        (r.fits == best.fits && (r.fits ? r.cost.step_ms < best.cost.step_ms
                                                        : r.cost.peak_bytes < best.cost.peak_bytes));
    if (better) best = r;
  }
  return best;
}

std::vector<std::pair<std::string, SearchResult>> baselines(const CostModel& m, const SearchOptions& o) {
  std::vector<std::pair<std::string, SearchResult>> out;
  for (Strategy s : {Strategy::ddp, Strategy::slim, Strategy::zero1, Strategy::zero2, Strategy::zero3,
                     Strategy::hsdp, Strategy::hsdp2})
    if ((s != Strategy::slim || m.options().allow_slim) &&
        (!shards_within_host(s) || m.options().hosts() > 1))
      out.emplace_back(strategy_name(s), uniform_baseline(m, s, o));
  return out;
}

nlohmann::ordered_json plan_to_json(const CostModel& m, const SearchResult& r) {
  nlohmann::ordered_json j;
  j["world"] = m.options().world;
  j["micro_batch"] = r.cost.micro_batch;
  j["precision"] = float_type_name(m.options().precision.compute);
  j["reduce_dtype"] = float_type_name(m.options().precision.reduce);
  nlohmann::ordered_json ops = nlohmann::ordered_json::object();
  for (const OpProfile& op : m.ops()) {
    const std::string& name = op.name;
    const OpChoice c = r.choices.at(name);
    nlohmann::ordered_json e{{"strategy", strategy_name(c.strategy)}};
    if (c.splits != 1) e["splits"] = c.splits;
    ops[name] = e;
  }
  j["ops"] = ops;
  j["predicted"] = {{"step_ms", r.cost.step_ms},
                    {"peak_bytes", r.cost.peak_bytes},
                    {"samples_per_s", r.cost.samples_per_s},
                    {"tokens_per_s", r.cost.tokens_per_s}};
  return j;
}

}  // namespace slimshard
