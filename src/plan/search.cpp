// search.cpp — the exact search over per-op choices and micro-batches (multiple-choice knapsack by dynamic
// programming over discretised memory), a brute-force oracle, uniform baselines, and what to say when nothing
// fits. Peak = Σ persistent + activations(micro) + max transient: the max is handled by fixing a bound T on
// the largest transient (every distinct value in turn), allowing only choices under it, and giving the
// knapsack a budget of limit − activations − T; persistent bytes are rounded up to budget/buckets, so what it
// returns fits.
#include "slimshard/search.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "slimshard/common.h"

namespace slimshard {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Candidate {
  std::vector<std::vector<ChoiceCost>> per_op;  // every op's choices, costed at one micro-batch
  std::vector<int64_t> transients;              // distinct transient bounds, ascending
};

Candidate costed(const CostModel& m, int64_t micro) {
  Candidate c;
  for (size_t i = 0; i < m.ops().size(); ++i) {
    std::vector<ChoiceCost> v;
    for (OpChoice ch : m.candidates(i)) v.push_back(m.cost(i, ch, micro));
    for (const auto& cc : v) c.transients.push_back(cc.transient_bytes);
    c.per_op.push_back(std::move(v));
  }
  std::sort(c.transients.begin(), c.transients.end());
  c.transients.erase(std::unique(c.transients.begin(), c.transients.end()), c.transients.end());
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

// Best choices at one micro-batch: index per op, or empty if nothing fits.
std::vector<size_t> knapsack(const CostModel& m, const Candidate& cand, int64_t micro, const SearchOptions& o,
                             double* best_time) {
  const size_t n = cand.per_op.size();
  std::vector<size_t> best;
  *best_time = kInf;
  if (o.mem_limit <= 0) {  // no budget: the fastest choice of each op
    best.resize(n);
    double t = 0;
    for (size_t i = 0; i < n; ++i) {
      size_t b = 0;
      for (size_t c = 1; c < cand.per_op[i].size(); ++c)
        if (cand.per_op[i][c].time_ms < cand.per_op[i][b].time_ms) b = c;
      best[i] = b;
      t += cand.per_op[i][b].time_ms;
    }
    *best_time = t;
    return best;
  }
  const int64_t act = m.activation_bytes(micro);
  const int M = o.memory_buckets;
  std::vector<double> dp(static_cast<size_t>(M) + 1), next(static_cast<size_t>(M) + 1);
  std::vector<uint8_t> arg(n * (static_cast<size_t>(M) + 1));
  for (int64_t T : cand.transients) {
    const int64_t budget = o.mem_limit - act - T;
    if (budget < 0) break;  // larger bounds leave even less
    const int64_t unit = unit_for(budget, M);
    std::fill(dp.begin(), dp.end(), 0.0);
    bool possible = true;
    for (size_t i = 0; i < n && possible; ++i) {
      std::fill(next.begin(), next.end(), kInf);
      const auto& choices = cand.per_op[i];
      for (size_t c = 0; c < choices.size(); ++c) {
        if (choices[c].transient_bytes > T) continue;
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
      possible = dp[static_cast<size_t>(M)] < kInf;
    }
    if (!possible || dp[static_cast<size_t>(M)] >= *best_time) continue;
    *best_time = dp[static_cast<size_t>(M)];
    best.assign(n, 0);
    int64_t u = M;
    for (size_t i = n; i-- > 0;) {
      const size_t c = arg[i * (static_cast<size_t>(M) + 1) + static_cast<size_t>(u)];
      best[i] = c;
      u -= weight(cand.per_op[i][c], unit);
    }
  }
  return best;
}

// The smallest peak any plan reaches at a micro-batch (zero3 with the most splits is the most frugal choice).
PlanCost frugal(const CostModel& m, int64_t micro) {
  std::map<std::string, OpChoice> choices;
  for (size_t i = 0; i < m.ops().size(); ++i) {
    OpChoice best{Strategy::zero3, 1};
    int64_t best_peak = std::numeric_limits<int64_t>::max();
    for (OpChoice c : m.candidates(i)) {
      const ChoiceCost cc = m.cost(i, c, micro);
      const int64_t p = cc.mem.persistent() + cc.transient_bytes;
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
  if (best.activation_bytes >= o.mem_limit)
    return "nothing fits in " + mib(o.mem_limit) + " per rank: the activations of one micro-batch of " +
           std::to_string(best.micro_batch) + " alone take " + mib(best.activation_bytes) +
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
  for (int w = m.options().world * 2; w <= (1 << 16); w *= 2) {
    PeakMemory peak(w, m.options().prefetch, m.options().optim_states);
    for (const OpProfile& op : m.ops()) {
      int k = 1;
      for (int kk : {8, 4, 2})
        if (op.kind == "linear" && op.out_features % kk == 0) {
          k = kk;
          break;
        }
      peak.add(op.param_numels, OpChoice{Strategy::zero3, k});
    }
    if (peak.peak(best.activation_bytes) <= o.mem_limit) {
      msg += "; with " + std::to_string(w) + " ranks zero3 would need about " +
             mib(peak.peak(best.activation_bytes));
      break;
    }
  }
  return msg;
}

}  // namespace

SearchResult search_plan(const CostModel& m, const SearchOptions& o) {
  SearchResult best;
  double best_step = kInf;
  for (int64_t micro : m.micro_batches()) {
    const Candidate cand = costed(m, micro);
    double t = 0;
    std::vector<size_t> pick = knapsack(m, cand, micro, o, &t);
    if (pick.empty()) continue;
    SearchResult r = result_from(m, pick, cand, micro);
    if (o.mem_limit > 0 && r.cost.peak_bytes > o.mem_limit) continue;  // the optimizer's own scratch
    if (r.cost.step_ms < best_step) best_step = r.cost.step_ms, best = r, best.fits = true;
  }
  if (!best.fits) best.explanation = explain(m, o);
  return best;
}

SearchResult brute_force_plan(const CostModel& m, const SearchOptions& o) {
  SearchResult best;
  double best_step = kInf;
  for (int64_t micro : m.micro_batches()) {
    const Candidate cand = costed(m, micro);
    const size_t n = cand.per_op.size();
    const int64_t act = m.activation_bytes(micro);
    std::vector<size_t> idx(n, 0);
    for (;;) {
      double t = 0;
      int64_t tmax = 0;
      for (size_t i = 0; i < n; ++i)
        t += cand.per_op[i][idx[i]].time_ms, tmax = std::max(tmax, cand.per_op[i][idx[i]].transient_bytes);
      bool fits = o.mem_limit <= 0;
      for (int64_t T : cand.transients) {  // the search's rule: some bound T ≥ the plan's largest transient
        if (fits || T < tmax) continue;
        const int64_t budget = o.mem_limit - act - T;
        if (budget < 0) break;
        const int64_t unit = unit_for(budget, o.memory_buckets);
        int64_t units = 0;
        for (size_t i = 0; i < n; ++i) units += weight(cand.per_op[i][idx[i]], unit);
        fits = units <= o.memory_buckets;
      }
      const double step = t + m.fixed_ms(micro);
      if (fits && step < best_step) {
        SearchResult r = result_from(m, idx, cand, micro);
        if (o.mem_limit <= 0 || r.cost.peak_bytes <= o.mem_limit)
          best_step = step, best = r, best.fits = true;
      }
      size_t i = 0;
      while (i < n && ++idx[i] == cand.per_op[i].size()) idx[i++] = 0;
      if (i == n) break;
    }
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
  for (Strategy s : {Strategy::ddp, Strategy::slim, Strategy::zero1, Strategy::zero2, Strategy::zero3})
    if (s != Strategy::slim || m.options().allow_slim)
      out.emplace_back(strategy_name(s), uniform_baseline(m, s, o));
  return out;
}

nlohmann::ordered_json plan_to_json(const CostModel& m, const SearchResult& r) {
  nlohmann::ordered_json j;
  j["world"] = m.options().world;
  j["micro_batch"] = r.cost.micro_batch;
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
