// search.cpp — the exact search over per-op choices and micro-batches (multiple-choice knapsack by dynamic
// programming over discretised memory), a brute-force oracle, uniform baselines, and what to say when nothing
// fits. Peak = Σ persistent + the largest load of any op, an op's load being the most activations +
// transients at any of its moments (cost_model.h: ChoiceCost::load_bytes). The max is handled by fixing a
// bound B on the largest load (every distinct load in turn, thinned to kMaxBounds), allowing only choices
// under it, and giving the knapsack a budget of limit − B; persistent bytes are rounded up to budget/buckets.
// Each bound's best plan is then checked with the engine's own simulation (CostModel::evaluate), which also
// sees what neighbours of different strategies do to each other, and kept only if it fits. Last, a descent
// by that simulation finds the mixed plans the rule turned away (`descend`).
// Recomputation (a choice per GPT block): a block's ops are decided together — the knapsack runs the block
// once recomputing and once not, from the same state, and keeps the better at each weight. What a block keeps
// through the step then depends on its choice: it is charged as weight (beside the persistent bytes), and an
// op's load is what lies above the blocks' kept activations. So the rule counts every block's kept bytes at
// every moment: exact at the end of forward (all of them are live, and GPT's peak falls there or in the last
// blocks' backward), above the truth by the later blocks' share elsewhere — a plan the rule admits fits.
#include "slimshard/search.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "slimshard/common.h"

namespace slimshard {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr size_t kMaxBounds = 256;
// How often a bound's plan is searched again with the persistent budget cut by its overshoot.
constexpr int kTightenings = 4;
// The descent's repair (`descend`): how many stuck moves it tries per round, and the steps of its cover.
constexpr int kRepairMoves = 16;
constexpr int kRepairUnits = 64;
// ... and the least it must save, as a fraction of the step: below it each repair bought ~1e-6 of a 96 × 1536
// step and the descent's next round cost 0.6 s, 23 times over (the search took twice as long for nothing).
constexpr double kRepairMinGain = 5e-4;

struct Candidate {
  std::vector<std::vector<ChoiceCost>> per_op;  // every op's choices, costed at one micro-batch
  std::vector<int64_t> bounds;                  // bounds on the largest load, ascending
};

// Bounds above the budget admit nothing; the rest are thinned to kMaxBounds (evenly, the largest kept).
Candidate costed(const CostModel& m, int64_t micro, int64_t mem_limit) {
  Candidate c;
  for (size_t i = 0; i < m.ops().size(); ++i) {
    std::vector<ChoiceCost> all, v;
    for (OpChoice ch : m.candidates(i)) all.push_back(m.cost(i, ch, micro));
    // A choice no faster, no lighter and with no smaller load than another (deciding recomputation alike)
    // is never needed: the other serves wherever it would.
    std::stable_sort(all.begin(), all.end(),
                     [](const ChoiceCost& a, const ChoiceCost& b) { return a.time_ms < b.time_ms; });
    for (const ChoiceCost& cc : all) {
      bool dominated = false;
      for (const ChoiceCost& k : v)
        dominated = dominated || (k.choice.recompute == cc.choice.recompute && k.time_ms <= cc.time_ms &&
                                  k.mem.persistent() + k.kept_bytes <= cc.mem.persistent() + cc.kept_bytes &&
                                  k.load_bytes <= cc.load_bytes);
      if (!dominated) v.push_back(cc);
    }
    for (const auto& cc : v) c.bounds.push_back(cc.load_bytes);
    c.per_op.push_back(std::move(v));
  }
  c.bounds.push_back(m.loss_load(micro));
  std::sort(c.bounds.begin(), c.bounds.end());
  c.bounds.erase(std::unique(c.bounds.begin(), c.bounds.end()), c.bounds.end());
  if (mem_limit > 0)
    c.bounds.erase(std::upper_bound(c.bounds.begin(), c.bounds.end(), mem_limit), c.bounds.end());
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

int64_t weight(const ChoiceCost& c, int64_t unit) {
  return (c.mem.persistent() + c.kept_bytes + unit - 1) / unit;
}

// The ops decided together: a block's when recomputation is chosen per block, else each op alone. [begin,
// end)
std::vector<std::pair<size_t, size_t>> segments(const CostModel& m) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < m.ops().size(); ++i) {
    const int b = m.block_index(i);
    if (m.recompute_is_choice() && b >= 0 && !out.empty() && i > 0 && m.block_index(i - 1) == b)
      out.back().second = i + 1;
    else
      out.emplace_back(i, i + 1);
  }
  return out;
}

// The recomputation a segment's branch allows: -1 any (a segment decided op by op), else 0 or 1.
std::vector<int> branches(const CostModel& m, std::pair<size_t, size_t> seg) {
  if (m.recompute_is_choice() && m.block_index(seg.first) >= 0) return {0, 1};
  return {-1};
}

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

// The fastest choices with every load ≤ B and the persistent bytes within `budget` (limit − B, or less after
// a tightening; rounded up to buckets): an index per op, or empty if none; *time its sum of op times.
// What the knapsack writes its choices into, allocated once per search (only entries written are read).
struct KnapsackScratch {
  std::vector<uint8_t> arg[2];  // per branch: the choice of op i at weight u
  std::vector<uint8_t> branch;  // per segment: the branch kept at weight u
  void size_for(size_t ops, size_t segs, size_t W) {
    for (auto& a : arg)
      if (a.size() < ops * W) a.resize(ops * W);
    if (branch.size() < segs * W) branch.resize(segs * W);
  }
};

std::vector<size_t> knapsack(const CostModel& m, const Candidate& cand, int64_t B, int64_t budget,
                             const SearchOptions& o, KnapsackScratch& scratch, double* time) {
  const size_t n = cand.per_op.size(), W = static_cast<size_t>(o.memory_buckets) + 1;
  const int M = o.memory_buckets;
  const int64_t unit = unit_for(budget, M);
  const auto segs = segments(m);
  std::vector<double> dp(W, 0.0), cur(W), next(W), best(W);
  scratch.size_for(n, segs.size(), W);
  std::vector<uint8_t>* arg = scratch.arg;
  uint8_t* branch_of = scratch.branch.data();
  for (size_t s = 0; s < segs.size(); ++s) {
    std::fill(best.begin(), best.end(), kInf);
    for (int r : branches(m, segs[s])) {
      const size_t slot = r > 0 ? 1 : 0;
      cur = dp;
      for (size_t i = segs[s].first; i < segs[s].second; ++i) {
        std::fill(next.begin(), next.end(), kInf);
        const auto& choices = cand.per_op[i];
        for (size_t c = 0; c < choices.size(); ++c) {
          if (choices[c].load_bytes > B) continue;
          if (r >= 0 && choices[c].choice.recompute != (r == 1)) continue;
          const int64_t w = weight(choices[c], unit);
          if (w > M) continue;
          const double t = choices[c].time_ms;
          for (int64_t u = w; u <= M; ++u) {
            const double v = cur[static_cast<size_t>(u - w)] + t;
            if (v < next[static_cast<size_t>(u)]) {
              next[static_cast<size_t>(u)] = v;
              arg[slot][i * W + static_cast<size_t>(u)] = static_cast<uint8_t>(c);
            }
          }
        }
        std::swap(cur, next);
      }
      for (size_t u = 0; u < W; ++u)
        if (cur[u] < best[u]) best[u] = cur[u], branch_of[s * W + u] = static_cast<uint8_t>(slot);
    }
    std::swap(dp, best);
    if (!(dp[W - 1] < kInf)) return {};
  }
  *time = dp[W - 1];
  std::vector<size_t> pick(n, 0);
  int64_t u = M;
  for (size_t s = segs.size(); s-- > 0;) {
    const size_t slot = branch_of[s * W + static_cast<size_t>(u)];
    for (size_t i = segs[s].second; i-- > segs[s].first;) {
      pick[i] = arg[slot][i * W + static_cast<size_t>(u)];
      u -= weight(cand.per_op[i][pick[i]], unit);
    }
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
PlanCost frugal(const CostModel& m, int64_t micro, std::map<std::string, OpChoice>* plan = nullptr) {
  std::map<std::string, OpChoice> choices;
  for (size_t i = 0; i < m.ops().size(); ++i) {
    OpChoice best{Strategy::zero3, 1};
    int64_t best_peak = std::numeric_limits<int64_t>::max();
    for (OpChoice c : m.candidates(i)) {
      // Recomputing keeps less; a block decides it as a whole.
      if (m.recompute_is_choice() && m.block_index(i) >= 0 && !c.recompute) continue;
      const ChoiceCost cc = m.cost(i, c, micro);
      const int64_t p = cc.mem.persistent() + cc.load_bytes;
      if (p < best_peak) best_peak = p, best = c;
    }
    choices[m.ops()[i].name] = best;
  }
  if (plan) *plan = choices;
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
  const int64_t activations = best.activation_bytes;
  const bool recomputing = m.recompute_is_choice() || m.options().recompute == Recompute::all;
  if (activations >= o.mem_limit)
    return "nothing fits in " + mib(o.mem_limit) + " per rank: the activations of one micro-batch of " +
           std::to_string(best.micro_batch) + " alone take " + mib(activations) +
           "; more ranks do not shrink them (a shorter sequence would" +
           (recomputing ? "" : "; so would recomputation: --recompute auto or all") + ")";
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

// The rule above takes each op's load in a uniform neighbourhood, so it can turn away a mixed plan that fits
// (an op beside ones that prefetch nothing carries less than beside its own kind). The search's plan is then
// improved by the simulation itself: moves that change one op, or two adjacent ones (where the rule errs:
// neighbours), tried in order of the time they save (step time is additive over ops, so a move's gain is
// known before simulating it); a round takes every move that fits and touches no op an earlier move of the
// round changed, and the descent stops after a round that takes none. It never makes a plan slower or one
// that does not fit. A move is simulated only if the moments far from it (where its transients
// cannot reach; memory_estimate.cpp) leave room for its persistent bytes: with a tight budget most cannot.
SearchResult descend(const CostModel& m, const SearchOptions& o, SearchResult best,
                     bool with_repair = false) {
  if (!best.fits || o.mem_limit <= 0) return best;
  const int64_t micro = best.cost.micro_batch;
  const size_t n = m.ops().size();
  const CostOptions& co = m.options();
  const std::vector<OpShape> shapes(m.ops().begin(), m.ops().end());
  const size_t reach = static_cast<size_t>(std::max(0, co.prefetch)) + 8;
  std::vector<std::vector<ChoiceCost>> per_op(n);
  for (size_t i = 0; i < n; ++i)
    for (OpChoice ch : m.candidates(i)) per_op[i].push_back(m.cost(i, ch, micro));
  struct Move {
    double gain;
    size_t op;
    int first, second;  // indices into per_op[op], per_op[op + 1] (-1: unchanged)
  };
  std::vector<OpChoice> plan(n);
  std::vector<int64_t> before(n + 1, 0), after(n + 1, 0);
  const auto refresh = [&] {  // the plan as a vector, and each op's most activations + transients, cumulated
    for (size_t i = 0; i < n; ++i) plan[i] = best.choices.at(m.ops()[i].name);
    const ActivationMoments act = m.activations(micro, &best.choices);
    const TransientMoments tr = simulate_transients(shapes, plan, co.world, co.prefetch, best.cost.accum,
                                                    co.precision, co.fuse_bytes, co.ranks_per_host);
    for (size_t i = 0; i < n; ++i) before[i + 1] = std::max(before[i], paired_peak(act.ops[i], tr.ops[i]));
    for (size_t i = n; i-- > 0;) after[i] = std::max(after[i + 1], paired_peak(act.ops[i], tr.ops[i]));
  };
  const auto far_load = [&](size_t lo, size_t hi) {  // ops outside [lo − reach, hi + reach]
    return std::max(before[lo > reach ? lo - reach : 0], after[std::min(n, hi + reach + 1)]);
  };
  // Stuck (no move fits), the moves of one op that save the most are tried again with room made for them:
  // the other ops give up the persistent bytes the move overshoots the budget by, at the least time lost
  // (a cover by dynamic programming over those bytes in kRepairUnits steps), while the whole still saves
  // time; where the simulation finds the plan still over, by what it is over, again (kTightenings).
  // (A move two adjacent ops cannot make: the room it needs is spread over ops anywhere in the model.)
  const auto repair = [&](const std::vector<Move>& moves, const std::vector<bool>& touched) {
    const double min_gain = kRepairMinGain * best.cost.step_ms;
    int tried = 0;
    for (const Move& mv : moves) {
      if (mv.gain < min_gain) break;  // moves are in order of gain
      if (mv.second >= 0 || touched[mv.op] || ++tried > kRepairMoves) continue;
      std::map<std::string, OpChoice> moved = best.choices;
      moved[m.ops()[mv.op].name] = per_op[mv.op][static_cast<size_t>(mv.first)].choice;
      int64_t over = m.evaluate(moved, micro).peak_bytes - o.mem_limit, need = 0;
      for (int t = 0; t < kTightenings && over > 0; ++t) {
        need += over;
        const int64_t unit = (need + kRepairUnits - 1) / kRepairUnits;
        // least[j][k]: the least time lost by ops before j freeing at least k units; pick[j][k] op j-1's
        // choice there (-1: unchanged).
        std::vector<std::vector<double>> least(n + 1, std::vector<double>(kRepairUnits + 1, kInf));
        std::vector<std::vector<int>> pick(n + 1, std::vector<int>(kRepairUnits + 1, -1));
        std::vector<std::vector<int>> from(n + 1, std::vector<int>(kRepairUnits + 1, 0));
        least[0][0] = 0;
        for (size_t j = 0; j < n; ++j)
          for (int k = 0; k <= kRepairUnits; ++k) {
            if (least[j][k] == kInf) continue;
            if (least[j][k] < least[j + 1][k])
              least[j + 1][k] = least[j][k], pick[j + 1][k] = -1, from[j + 1][k] = k;
            if (j == mv.op) continue;
            for (size_t c = 0; c < per_op[j].size(); ++c) {
              const ChoiceCost& cc = per_op[j][c];
              const int64_t freed = best.cost.per_op[j].mem.persistent() - cc.mem.persistent();
              if (cc.choice.recompute != plan[j].recompute || freed < unit) continue;
              const int to = static_cast<int>(std::min<int64_t>(kRepairUnits, k + freed / unit));
              const double loss = least[j][k] + cc.time_ms - best.cost.per_op[j].time_ms;
              if (loss < least[j + 1][to])
                least[j + 1][to] = loss, pick[j + 1][to] = static_cast<int>(c), from[j + 1][to] = k;
            }
          }
        if (least[n][kRepairUnits] > mv.gain - min_gain) break;
        std::map<std::string, OpChoice> next = moved;
        for (size_t j = n, k = kRepairUnits; j > 0; --j) {
          if (pick[j][k] >= 0)
            next[m.ops()[j - 1].name] = per_op[j - 1][static_cast<size_t>(pick[j][k])].choice;
          k = static_cast<size_t>(from[j][k]);
        }
        const PlanCost c = m.evaluate(next, micro);
        over = c.peak_bytes - o.mem_limit;
        if (over > 0 || c.step_ms > best.cost.step_ms - min_gain) continue;
        best.choices = std::move(next), best.cost = c;
        refresh();
        return true;
      }
    }
    return false;
  };
  // Each round takes, in order of gain, every move that fits and touches no op an earlier move of the round
  // changed (its gain is then still what it was). The plan's moments are refreshed after every move taken.
  refresh();
  for (int round = 0; round < 256; ++round) {
    std::vector<Move> moves;
    for (size_t i = 0; i < n; ++i)
      for (size_t a = 0; a < per_op[i].size(); ++a) {
        const bool a_same = per_op[i][a].choice == plan[i];
        // A block recomputes as a whole: no move changes it.
        if (per_op[i][a].choice.recompute != plan[i].recompute) continue;
        const double ga = best.cost.per_op[i].time_ms - per_op[i][a].time_ms;
        if (!a_same && ga > 0) moves.push_back({ga, i, static_cast<int>(a), -1});
        if (a_same || i + 1 == n) continue;
        for (size_t b = 0; b < per_op[i + 1].size(); ++b) {
          const ChoiceCost& cb = per_op[i + 1][b];
          const double g = ga + best.cost.per_op[i + 1].time_ms - cb.time_ms;
          if (!(cb.choice == plan[i + 1]) && cb.choice.recompute == plan[i + 1].recompute && g > 0)
            moves.push_back({g, i, static_cast<int>(a), static_cast<int>(b)});
        }
      }
    std::stable_sort(moves.begin(), moves.end(),
                     [](const Move& x, const Move& y) { return x.gain > y.gain; });
    std::vector<bool> touched(n, false);
    bool moved = false;
    for (const Move& mv : moves) {
      const size_t i = mv.op, last = mv.second >= 0 ? i + 1 : i;
      if (touched[i] || touched[last]) continue;
      int64_t persistent = best.cost.persistent_bytes;
      persistent +=
          per_op[i][static_cast<size_t>(mv.first)].mem.persistent() - best.cost.per_op[i].mem.persistent();
      if (mv.second >= 0)
        persistent += per_op[i + 1][static_cast<size_t>(mv.second)].mem.persistent() -
                      best.cost.per_op[i + 1].mem.persistent();
      if (persistent + far_load(i, last) > o.mem_limit) continue;
      std::map<std::string, OpChoice> next = best.choices;
      next[m.ops()[i].name] = per_op[i][static_cast<size_t>(mv.first)].choice;
      if (mv.second >= 0) next[m.ops()[i + 1].name] = per_op[i + 1][static_cast<size_t>(mv.second)].choice;
      const PlanCost c = m.evaluate(next, micro);
      if (c.peak_bytes > o.mem_limit || c.step_ms >= best.cost.step_ms) continue;
      best.choices = std::move(next), best.cost = c;
      touched[i] = touched[last] = moved = true;
      refresh();
    }
    if (!moved && with_repair) moved = repair(moves, touched);
    if (!moved) break;
  }
  return best;
}

// With recomputation a choice, the rule charges every block's kept activations at every moment, which can
// turn away plans without recomputation that fit; those are searched by the exact rule too, and the faster
// fitting result kept (the first result seeds the second search, whose bounds it then prunes).
// Then the descent, from the result, at every other micro-batch from its most frugal plan, and at every
// micro-batch from every uniform plan the model offers, where they fit (the rule may have found nothing at a
// micro-batch where the simulation finds room; several starts escape the local optima of moves two ops wide).
// The fastest is kept.
using SearchFn = SearchResult (*)(const CostModel&, const SearchOptions&, SearchResult);
SearchResult better_of_both(const CostModel& m, const SearchOptions& o, SearchFn search) {
  SearchResult found;
  if (!m.recompute_is_choice()) {
    found = search(m, o, SearchResult{});
  } else {
    const CostModel none = m.without_recompute();
    SearchResult first = search(none, o, SearchResult{});
    m.adopt_caches(none);
    found = search(m, o, std::move(first));
  }
  if (o.mem_limit <= 0) return found;
  SearchResult best = descend(m, o, found);
  for (int64_t micro : m.micro_batches()) {
    if (found.fits && micro == found.cost.micro_batch) continue;
    SearchResult start;
    start.cost = frugal(m, micro, &start.choices);
    start.fits = start.cost.peak_bytes <= o.mem_limit;
    keep_if_better(descend(m, o, std::move(start)), o, best);
  }
  for (int64_t micro : m.micro_batches())
    for (Strategy s : {Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3, Strategy::hsdp,
                       Strategy::hsdp2}) {
      SearchResult start;
      bool offered = true;  // a start the model's choices allow (hybrid sharding off, one host: not)
      for (size_t i = 0; i < m.ops().size() && offered; ++i) {
        const OpChoice c{s, 1, m.block_index(i) >= 0 && m.options().recompute == Recompute::all};
        const std::vector<OpChoice> allowed = m.candidates(i);
        offered = std::find(allowed.begin(), allowed.end(), c) != allowed.end();
        start.choices[m.ops()[i].name] = c;
      }
      if (!offered) continue;
      start.cost = m.evaluate(start.choices, micro);
      start.fits = start.cost.peak_bytes <= o.mem_limit;
      keep_if_better(descend(m, o, std::move(start)), o, best);
    }
  // The repair (dear: a cover and simulations per stuck move) once, from the best of all starts.
  best = descend(m, o, std::move(best), /*repair=*/true);
  if (best.fits) best.explanation.clear();
  return best;
}

SearchResult search_one_rule(const CostModel& m, const SearchOptions& o, SearchResult best);
SearchResult brute_force_one_rule(const CostModel& m, const SearchOptions& o, SearchResult best);

}  // namespace

// With hybrid sharding among the choices, the search without it too, the faster kept: more choices give the
// descent other starts and it can stop in a worse local optimum (measured: gpt-25m on 2 x 2 hosts, 10,477 ms
// predicted with hybrid sharding against 10,472 without), and offering a choice must never cost.
SearchResult search_plan(const CostModel& m, const SearchOptions& o) {
  SearchResult found = better_of_both(m, o, search_one_rule);
  if (!m.options().allow_hybrid || m.options().hosts() < 2) return found;
  const CostModel flat = m.without_hybrid();
  flat.adopt_caches(m);
  SearchResult without = better_of_both(flat, o, search_one_rule);
  if (without.fits && (!found.fits || without.cost.step_ms < found.cost.step_ms)) return without;
  return found;
}

SearchResult brute_force_plan(const CostModel& m, const SearchOptions& o) {
  return better_of_both(m, o, brute_force_one_rule);
}

namespace {

SearchResult search_one_rule(const CostModel& m, const SearchOptions& o, SearchResult best) {
  KnapsackScratch scratch;
  for (int64_t micro : m.micro_batches()) {
    const Candidate cand = costed(m, micro, o.mem_limit);
    if (o.mem_limit <= 0) {
      keep_if_better(result_from(m, fastest(cand), cand, micro), o, best);
      continue;
    }
    for (int64_t B : cand.bounds) {
      if (o.mem_limit - B < 0) break;  // larger bounds leave even less
      if (best.fits) {  // memory aside, the fastest choices under this bound: if not faster, nothing is
        double fastest_ms = m.fixed_ms(micro);
        for (const auto& choices : cand.per_op) {
          double t_op = kInf;
          for (const ChoiceCost& c : choices)
            if (c.load_bytes <= B) t_op = std::min(t_op, c.time_ms);
          fastest_ms += t_op;
        }
        if (fastest_ms >= best.cost.step_ms) continue;
      }
      // The rule's loads are taken in uniform neighbourhoods: a mixed plan can peak above what it admits.
      // Then the bound is searched again with the persistent budget cut by the overshoot.
      int64_t budget = o.mem_limit - B;
      for (int attempt = 0; attempt < kTightenings && budget >= 0; ++attempt) {
        double t = 0;
        const std::vector<size_t> pick = knapsack(m, cand, B, budget, o, scratch, &t);
        if (pick.empty() || (best.fits && t + m.fixed_ms(micro) >= best.cost.step_ms)) break;
        SearchResult r = result_from(m, pick, cand, micro);
        const int64_t over = r.cost.peak_bytes - o.mem_limit;
        keep_if_better(std::move(r), o, best);
        if (over <= 0) break;
        budget -= over;
      }
    }
  }
  if (!best.fits) best.explanation = explain(m, o);
  return best;
}

SearchResult brute_force_one_rule(const CostModel& m, const SearchOptions& o, SearchResult best) {
  for (int64_t micro : m.micro_batches()) {
    const Candidate cand = costed(m, micro, o.mem_limit);
    const size_t n = cand.per_op.size(), nb = cand.bounds.size();
    // The search's rule, by enumeration: per bound B the fastest plan whose loads are ≤ B and whose rounded
    // persistent bytes fit in limit − B; then each bound's plan checked by the simulation, and a bound whose
    // plan overshoots enumerated again with its budget cut by the overshoot. Recomputation per block: every
    // assignment to the blocks in turn, each op's choices restricted to its block's.
    std::vector<int64_t> budget(nb);
    std::vector<bool> open(nb, true);
    for (size_t b = 0; b < nb; ++b) budget[b] = o.mem_limit - cand.bounds[b];
    int blocks = 0;
    for (size_t i = 0; i < n; ++i) blocks = std::max(blocks, m.block_index(i) + 1);
    const int assignments = m.recompute_is_choice() ? 1 << blocks : 1;
    for (int attempt = 0; attempt < kTightenings; ++attempt) {
      std::vector<double> best_time(nb, kInf);
      std::vector<std::vector<size_t>> best_pick(nb);
      for (int rc = 0; rc < assignments; ++rc) {
        std::vector<std::vector<size_t>> allowed(n);  // indices into cand.per_op[i]
        for (size_t i = 0; i < n; ++i)
          for (size_t c = 0; c < cand.per_op[i].size(); ++c) {
            const int b = m.block_index(i);
            if (!m.recompute_is_choice() || b < 0 ||
                cand.per_op[i][c].choice.recompute == (((rc >> b) & 1) == 1))
              allowed[i].push_back(c);
          }
        std::vector<size_t> pos(n, 0), idx(n, 0);
        for (;;) {
          for (size_t i = 0; i < n; ++i) idx[i] = allowed[i][pos[i]];
          double t = 0;
          int64_t most = 0;
          for (size_t i = 0; i < n; ++i)
            t += cand.per_op[i][idx[i]].time_ms, most = std::max(most, cand.per_op[i][idx[i]].load_bytes);
          for (size_t b = 0; b < nb; ++b) {
            if (!open[b]) continue;
            if (o.mem_limit <= 0) {
              if (b > 0) break;
            } else {
              if (cand.bounds[b] < most) continue;
              if (budget[b] < 0) continue;
              const int64_t unit = unit_for(budget[b], o.memory_buckets);
              int64_t units = 0;
              for (size_t i = 0; i < n; ++i) units += weight(cand.per_op[i][idx[i]], unit);
              if (units > o.memory_buckets) continue;
            }
            if (t < best_time[b]) best_time[b] = t, best_pick[b] = idx;
          }
          size_t i = 0;
          while (i < n && ++pos[i] == allowed[i].size()) pos[i++] = 0;
          if (i == n) break;
        }
      }
      bool again = false;
      for (size_t b = 0; b < nb; ++b) {
        if (!open[b]) continue;
        open[b] = false;
        if (best_pick[b].empty()) continue;
        SearchResult r = result_from(m, best_pick[b], cand, micro);
        const int64_t over = o.mem_limit > 0 ? r.cost.peak_bytes - o.mem_limit : 0;
        keep_if_better(std::move(r), o, best);
        if (over > 0 && budget[b] - over >= 0) budget[b] -= over, open[b] = again = true;
      }
      if (!again) break;
    }
  }
  return best;
}

}  // namespace

SearchResult uniform_baseline(const CostModel& m, Strategy s, const SearchOptions& o) {
  SearchResult best;
  for (int64_t micro : m.micro_batches()) {
    SearchResult r;
    for (size_t i = 0; i < m.ops().size(); ++i)  // recomputing where --recompute all says so
      r.choices[m.ops()[i].name] =
          OpChoice{s, 1, m.block_index(i) >= 0 && m.options().recompute == Recompute::all};
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
    if (c.recompute) e["recompute"] = true;
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
