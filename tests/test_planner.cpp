// test_planner.cpp — the OSDP search against brute force on small models (profile- and spec-based costs),
// plans always within budget, the profile parser's checks, `plan` when nothing fits, and `train --strategy
// osdp` under a limit staying within it.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>

#include "helpers.h"
#include "slimshard/common.h"
#include "slimshard/planner.h"

using namespace slimshard;

namespace {

using test::mpirun;

// A profile with made-up but plausible figures for `cfg`, search the search is tested on many cost
// landscapes.
Profile synthetic_profile(const ModelConfig& cfg, int world, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.5, 2.0);
  Profile p;
  p.machine = {{"cpu", "synthetic"}};
  p.world = world;
  p.model = cfg;
  p.micro_batches = {1, 2, 4};
  p.ops = unmeasured(op_shapes(cfg));
  std::map<int64_t, int64_t> kept;  // activations so far, per micro-batch
  for (OpProfile& op : p.ops)
    for (int64_t b : p.micro_batches) {
      int64_t n = 0;
      for (int64_t k : op.param_numels) n += k;
      op.fwd_ms[b] = 1e-5 * static_cast<double>(n) * static_cast<double>(b) * u(rng);
      op.bwd_ms[b] = 2 * op.fwd_ms[b] * u(rng);
      op.act_bytes[b] = static_cast<int64_t>(2e5 * static_cast<double>(b) * u(rng));
      // A timeline that grows in forward and shrinks in backward, with scratch on top in each span.
      const int64_t before = kept[b], after = kept[b] += op.act_bytes[b];
      op.live_before[b] = before;
      const auto scratch = [&] { return static_cast<int64_t>(5e4 * static_cast<double>(b) * u(rng)); };
      op.act_moments[b] =
          OpMoments{before + scratch(), after + scratch(), after + scratch(), after + scratch()};
      op.act_moments[b].bwd_tail = op.act_moments[b].bwd;
    }
  for (int64_t b : p.micro_batches)
    p.loss_fwd_ms[b] = 0.1 * static_cast<double>(b), p.loss_bwd_ms[b] = 0.05, p.loss_act_bytes[b] = 1000 * b,
    p.backward_extra_bytes[b] = 5000 * b, p.loss_peak_bytes[b] = kept[b] + 1000 * b;
  // With every block recomputing, as the probe sees it: a block keeps a tenth of what it keeps otherwise;
  // live before each op is less by what the blocks before no longer keep; a block's forward moments stand on
  // that, its backward ones re-create the block's activations on top of it.
  std::map<int64_t, int64_t> less, block_none;  // kept without minus with, by the blocks before; this block's
  std::string block;
  for (OpProfile& op : p.ops) {
    const std::string name = block_of(op.name);
    if (name != block) {
      for (int64_t b : p.micro_batches) less[b] += block_none[b] - block_none[b] / 10, block_none[b] = 0;
      for (int64_t b : p.micro_batches)
        for (const OpProfile& o : p.ops)
          if (!name.empty() && block_of(o.name) == name) block_none[b] += o.act_bytes.at(b);
    }
    const bool first = name != block;
    block = name;
    for (int64_t b : p.micro_batches) {
      op.live_before_rc[b] = op.live_before.at(b) - less[b];
      if (name.empty()) continue;
      const OpMoments& m = op.act_moments[b];
      const int64_t kept_rc = op.live_before_rc[b] + (first ? block_none[b] / 10 : 0);
      op.act_moments_rc[b] =
          OpMoments{kept_rc, kept_rc, m.before_bwd - less[b], m.bwd - less[b], m.bwd_tail - less[b]};
    }
  }
  for (const char* k : {"all_gather", "reduce_scatter", "all_reduce"}) {
    CollectiveFit f;
    f.alpha_ms = 0.02 * u(rng);
    f.beta_ms_per_byte = 1e-6 * u(rng);
    p.collectives[k] = f;
  }
  p.overlap_slowdown = 1.0 + 0.3 * (u(rng) - 0.5);
  p.collective_overhead_ms = 0.05 * u(rng);
  p.optimizer_ns_per_element = 2 * u(rng);
  return p;
}

void expect_same(const SearchResult& dp, const SearchResult& brute, const std::string& what) {
  ASSERT_EQ(dp.fits, brute.fits) << what;
  if (!dp.fits) return;
  EXPECT_NEAR(dp.cost.step_ms, brute.cost.step_ms, 1e-9 * brute.cost.step_ms) << what;
}

// The fastest plan by the engine's simulation (CostModel::evaluate) over every combination of choices and
// micro-batches that fits `limit`: the oracle the search's rule is held to.
SearchResult exhaustive_best(const CostModel& m, int64_t limit) {
  SearchResult best;
  const size_t n = m.ops().size();
  std::vector<std::vector<OpChoice>> cands(n);
  for (size_t i = 0; i < n; ++i) cands[i] = m.candidates(i);
  for (int64_t micro : m.micro_batches()) {
    std::vector<size_t> pos(n, 0);
    for (;;) {
      std::map<std::string, OpChoice> choices;
      for (size_t i = 0; i < n; ++i) choices[m.ops()[i].name] = cands[i][pos[i]];
      const PlanCost c = m.evaluate(choices, micro);
      if (c.peak_bytes <= limit && (!best.fits || c.step_ms < best.cost.step_ms))
        best.fits = true, best.choices = choices, best.cost = c;
      size_t i = 0;
      while (i < n && ++pos[i] == cands[i].size()) pos[i++] = 0;
      if (i == n) break;
    }
  }
  return best;
}

// 2 hosts x 2 ranks: the host's collectives as fast as the world's were, the inter-host link (the world's
// collectives carry part of their bytes over it, the peers' all of theirs) 20x slower.
void on_two_hosts(Profile& p) {
  p.hosts = 2, p.ranks_per_host = 2;
  p.collectives["host_all_gather"] = p.collectives.at("all_gather");
  p.collectives["host_reduce_scatter"] = p.collectives.at("reduce_scatter");
  CollectiveFit peers = p.collectives.at("all_reduce");
  peers.beta_ms_per_byte *= 20;
  p.collectives["peers_all_reduce"] = peers;
}

// The world's collectives 10x slower (they cross the dear link).
void make_world_dear(Profile& p) {
  for (const char* k : {"all_gather", "reduce_scatter", "all_reduce"})
    p.collectives[k].beta_ms_per_byte *= 10;
}

int hybrid_ops(const SearchResult& r) {
  int k = 0;
  for (const auto& [op, c] : r.choices) k += shards_within_host(c.strategy);
  return k;
}

}  // namespace

TEST(Planner, OpShapesMatchTheBuiltModels) {
  for (const char* name : {"gpt-tiny", "mlp", "cnn"}) {
    const ModelConfig cfg = ModelConfig::preset_config(name);
    const auto shapes = op_shapes(cfg);
    auto model = build_model(cfg, 1);
    const auto built = op_shapes(*model);
    ASSERT_EQ(shapes.size(), built.size()) << name;
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(shapes[i].name, built[i].name);
      EXPECT_EQ(shapes[i].kind, built[i].kind) << shapes[i].name;
      EXPECT_EQ(shapes[i].param_numels, built[i].param_numels) << shapes[i].name;
      EXPECT_EQ(shapes[i].out_features, built[i].out_features) << shapes[i].name;
    }
    // Splitting the built model's linear ops into row blocks does not change what it reports.
    std::map<std::string, OpChoice> split;
    for (const OpShape& s : shapes) split[s.name] = OpChoice{Strategy::ddp, s.kind == "linear" ? 2 : 1};
    apply_plan(split, *model);
    EXPECT_TRUE(op_shapes(*model) == built) << name << " with splits 2";
  }
}

TEST(Planner, SearchEqualsBruteForce) {
  ModelConfig gpt = ModelConfig::preset_config("gpt-tiny");
  gpt.n_layer = 1;                                            // 10 ops
  const ModelConfig mlp = ModelConfig::preset_config("mlp");  // 3 ops, with splits
  int checked = 0, fitted = 0;
  for (unsigned seed = 1; seed <= 3; ++seed)
    for (const ModelConfig* cfg : std::vector<const ModelConfig*>{&gpt, &mlp}) {
      CostOptions cost_opts;
      cost_opts.world = 2;
      cost_opts.global_batch = 8;
      cost_opts.allow_splits = cfg == &mlp;  // 16 choices for 3 ops; 4 for the GPT's 10
      const CostModel m = CostModel::from_profile(synthetic_profile(*cfg, 2, seed), cost_opts);
      // Budgets from the smallest to the largest plan, and none.
      SearchOptions tiny;
      tiny.mem_limit = 1;  // nothing fits: the baseline reports its smallest peak over micro-batches
      const SearchResult frugal = uniform_baseline(m, Strategy::zero3, tiny);
      const SearchResult roomy = uniform_baseline(m, Strategy::ddp, SearchOptions{});
      for (double f : {0.0, 0.5, 0.98, 1.0, 1.05, 1.5, 2.0}) {
        SearchOptions search;
        search.memory_buckets = 64;  // coarse: the rounding itself is part of what must agree
        search.mem_limit = f == 0 ? 0 : static_cast<int64_t>(frugal.cost.peak_bytes * f);
        if (f == 2.0) search.mem_limit = roomy.cost.peak_bytes;
        const SearchResult dp = search_plan(m, search), brute = brute_force_plan(m, search);
        expect_same(dp, brute, cfg->arch + " seed " + std::to_string(seed) + " limit x" + std::to_string(f));
        if (dp.fits && search.mem_limit > 0) {
          EXPECT_LE(dp.cost.peak_bytes, search.mem_limit);
        }
        if (!dp.fits) {
          EXPECT_NE(dp.explanation.find("nothing fits"), std::string::npos);
        }
        ++checked, fitted += dp.fits;
      }
    }
  EXPECT_EQ(checked, 42);
  EXPECT_GT(fitted, 20);  // most budgets admit a plan; some do not
  EXPECT_LT(fitted, 42);
}

// Calibration makes the model's uniform plans take the steps measured for them. On one host: ddp (op times
// scaled, at every micro-batch), zero3 (its gathers' latency, then what the model's overlap hides of it as a
// residual), zero1 and zero2 (residuals) at the largest micro-batch. Across hosts every one of ddp, zero1-3,
// hsdp and hsdp2 by a residual at every micro-batch, the op times as profiled. The oracle is the measurement
// itself, from the model's own prediction offset by a factor that differs by strategy and micro-batch.
TEST(Planner, CalibrationReproducesEveryMeasuredUniformStep) {
  for (const char* name : {"gpt-tiny", "mlp"})
    for (unsigned seed = 1; seed <= 3; ++seed)
      for (const bool hosts : {false, true}) {
        const int world = hosts ? 4 : 2;
        Profile p = synthetic_profile(ModelConfig::preset_config(name), world, seed);
        if (hosts) on_two_hosts(p), make_world_dear(p);
        p.collective_overhead_ms = 0;
        const int64_t top = p.micro_batches.back();
        auto step = [&](const Profile& q, Strategy s, int64_t b) {
          CostOptions o;
          o.world = world, o.global_batch = world * b;
          std::map<std::string, OpChoice> choices;
          for (const OpProfile& op : q.ops) choices[op.name] = OpChoice{s, 1};
          return CostModel::from_profile(q, o).evaluate(choices, b).step_ms;
        };
        MeasuredSteps real;
        std::vector<Strategy> residual = residual_strategies(hosts);
        for (int64_t b : p.micro_batches) {
          if (!hosts) real.ddp_ms[b] = (1.05 + 0.05 * static_cast<double>(b)) * step(p, Strategy::ddp, b);
          if (b != top && !hosts) continue;
          for (size_t i = 0; i < residual.size(); ++i) {
            const double factor = 0.8 + 0.1 * static_cast<double>(i) + 0.15 * static_cast<double>(b);
            real.uniform_ms[strategy_name(residual[i])][b] = factor * step(p, residual[i], b);
          }
        }
        const Profile measured = p;
        calibrate_profile(p, real);
        const std::string what =
            std::string(name) + " seed " + std::to_string(seed) + (hosts ? " 2 hosts" : "");
        for (const auto& [b, ms] : real.ddp_ms) EXPECT_NEAR(step(p, Strategy::ddp, b), ms, 1e-6 * ms) << what;
        for (const auto& [s, by_b] : real.uniform_ms)
          for (const auto& [b, ms] : by_b)
            EXPECT_NEAR(step(p, parse_strategy(s, "test"), b), ms, 1e-6 * ms) << what << " " << s << " " << b;
        // On one host a residual measured at the largest micro-batch is lent to the others; across hosts the
        // op times are the profiled ones (ddp is a residual too).
        if (!hosts) {
          for (const auto& [s, by_b] : p.strategy_residual_ms) EXPECT_EQ(by_b.size(), 1u) << what << " " << s;
        } else {
          EXPECT_EQ(p.strategy_residual_ms.at("ddp").size(), p.micro_batches.size()) << what;
          for (size_t i = 0; i < p.ops.size(); ++i)
            EXPECT_EQ(p.ops[i].fwd_ms, measured.ops[i].fwd_ms) << what;
        }
        // What a profile file keeps plans the same.
        const Profile saved = profile_from_json(profile_to_json(p), "profile");
        EXPECT_EQ(saved.strategy_residual_ms, p.strategy_residual_ms) << what;
        // A profile from before residuals were kept by micro-batch (one number each) reads as the largest's.
        nlohmann::json old = profile_to_json(p);
        for (auto& [s, by_b] : old.at("strategy_residual_ms").items()) by_b = by_b.at(std::to_string(top));
        for (const auto& [s, by_b] : profile_from_json(old, "old profile").strategy_residual_ms)
          EXPECT_EQ(by_b, (std::map<int64_t, double>{{top, p.strategy_residual_ms.at(s).at(top)}})) << what;
        // A residual at a micro-batch the profile does not have is refused.
        nlohmann::json bad = profile_to_json(p);
        bad["strategy_residual_ms"]["zero1"]["3"] = 1.0;
        EXPECT_THROW(profile_from_json(bad, "bad profile"), UsageError) << what;
      }
}

// Slim-DP as a plan choice (plan --allow-slim): offered only when allowed, never split; its cost is one
// all-reduce of the selected fraction of the op's elements in the wire's bytes per τ steps, its optimizer the
// whole op's as DDP's; the search stays exact with it; and where all-reduces are dear, it is chosen.
TEST(Planner, SlimIsAChoiceOnlyWhenAllowedAndCostsItsWireBytes) {
  const ModelConfig mlp = ModelConfig::preset_config("mlp");
  Profile prof = synthetic_profile(mlp, 2, 4);
  CostOptions cost_opts;
  cost_opts.world = 2;
  cost_opts.global_batch = 8;
  cost_opts.slim_apply = SlimApply::now;  // the round after the step: its bytes are its whole cost
  auto strategies_offered = [&](const CostModel& m) {
    std::set<Strategy> out;
    for (size_t op = 0; op < m.ops().size(); ++op)
      for (const OpChoice& c : m.candidates(op)) {
        out.insert(c.strategy);
        EXPECT_FALSE(c.strategy == Strategy::slim && c.splits > 1) << "a split slim op";
      }
    return out;
  };
  EXPECT_EQ(strategies_offered(CostModel::from_profile(prof, cost_opts)).count(Strategy::slim), 0u);
  cost_opts.allow_slim = true;
  cost_opts.slim_fraction = 0.4;
  cost_opts.slim_period = 2;
  const CostModel fp32 = CostModel::from_profile(prof, cost_opts);
  EXPECT_EQ(strategies_offered(fp32).count(Strategy::slim), 1u);
  cost_opts.slim_wire_bytes = 2;
  const CostModel bf16 = CostModel::from_profile(prof, cost_opts);
  const CollectiveFit& ar = prof.collectives.at("all_reduce");
  // With free collectives slim and ddp are the same work: the forward, the backward and the optimizer over
  // every element of the op on every rank.
  Profile free = prof;
  for (auto& [name, fit] : free.collectives) fit = CollectiveFit{};
  free.collective_overhead_ms = 0;
  const CostModel no_comm = CostModel::from_profile(free, cost_opts);
  for (size_t op = 0; op < fp32.ops().size(); ++op) {
    double n = 0;
    for (int64_t k : fp32.ops()[op].param_numels) n += static_cast<double>(k);
    const double full = fp32.cost(op, {Strategy::slim, 1}, 2).time_ms,
                 half = bf16.cost(op, {Strategy::slim, 1}, 2).time_ms;
    EXPECT_NEAR(full - half, ar.beta_ms_per_byte * 2 * n * 0.4 / 2, 1e-9 * full) << fp32.ops()[op].name;
    EXPECT_NEAR(no_comm.cost(op, {Strategy::slim, 1}, 2).time_ms,
                no_comm.cost(op, {Strategy::ddp, 1}, 2).time_ms, 1e-12);
  }
  // Exact with slim among the choices (17 per op: 4 strategies × 4 splits, and slim).
  for (double f : {0.0, 0.6, 1.0}) {
    SearchOptions search;
    search.memory_buckets = 64;
    search.mem_limit =
        f == 0 ? 0 : static_cast<int64_t>(uniform_baseline(bf16, Strategy::ddp, {}).cost.peak_bytes * f);
    expect_same(search_plan(bf16, search), brute_force_plan(bf16, search),
                "slim allowed, limit x" + std::to_string(f));
  }
  // All-reduce 100× dearer and no memory limit: the bytes slim saves decide, and every op with weights is
  // slim.
  for (auto& [name, fit] : prof.collectives) fit.beta_ms_per_byte *= 100;
  const SearchResult r = search_plan(CostModel::from_profile(prof, cost_opts), SearchOptions{});
  ASSERT_TRUE(r.fits);
  for (const auto& [op, choice] : r.choices) EXPECT_EQ(choice.strategy, Strategy::slim) << op;
}

// The three orders of a Slim-DP round (--slim-apply) are charged what the compute before the round's use
// hides: `now` the whole round after the step, `forward` less the op's first forward (the round is waited
// for where the next forward first uses the block), `next` less the op's whole next step (forward of every
// micro-batch and backward). With overlap free (slowdown 1), on rounds shorter and longer than that compute.
TEST(Planner, SlimRoundOrdersAreChargedWhatTheComputeBeforeTheirUseHides) {
  Profile prof = synthetic_profile(ModelConfig::preset_config("mlp"), 2, 4);
  prof.overlap_slowdown = 1;
  CostOptions o;
  o.world = 2;
  o.global_batch = 8;  // 4 rows per rank: 2 micro-batches of 2
  o.allow_slim = true;
  o.slim_fraction = 0.4;
  for (double scale : {0.01, 1.0, 100.0}) {
    Profile p = prof;
    for (auto& [name, fit] : p.collectives) fit.beta_ms_per_byte *= scale;
    std::map<SlimApply, CostModel> by_order;
    for (SlimApply a : {SlimApply::now, SlimApply::forward, SlimApply::next}) {
      o.slim_apply = a;
      by_order.emplace(a, CostModel::from_profile(p, o));
    }
    const CostModel& m = by_order.at(SlimApply::now);
    const CollectiveFit& ar = p.collectives.at("all_reduce");
    int hidden_some = 0;
    for (size_t op = 0; op < m.ops().size(); ++op) {
      double n = 0;
      for (int64_t k : m.ops()[op].param_numels) n += static_cast<double>(k);
      if (n == 0) continue;
      const double round = ar.ms(4 * n * 0.4), fwd = m.ops()[op].fwd_ms.at(2), bwd = m.ops()[op].bwd_ms.at(2);
      auto charged = [&](SlimApply a) { return by_order.at(a).cost(op, {Strategy::slim, 1}, 2).time_ms; };
      const double now = charged(SlimApply::now), tol = 1e-9 * now;
      EXPECT_NEAR(now - charged(SlimApply::forward), std::min(round, fwd), tol) << m.ops()[op].name;
      EXPECT_NEAR(now - charged(SlimApply::next), std::min(round, 2 * fwd + bwd), tol) << m.ops()[op].name;
      hidden_some += round > fwd ? 1 : 0;
      // Orders of a round that is not slim's: ddp's cost does not depend on them.
      EXPECT_EQ(by_order.at(SlimApply::forward).cost(op, {Strategy::ddp, 1}, 2).time_ms,
                m.cost(op, {Strategy::ddp, 1}, 2).time_ms);
    }
    if (scale == 100.0) {
      EXPECT_GT(hidden_some, 0) << "no round longer than its op's forward";
    }
  }
  EXPECT_EQ(parse_slim_apply("forward"), SlimApply::forward);
  EXPECT_THROW(parse_slim_apply("later"), UsageError);
}

// Compute overlapped with a collective runs at 1/f of its speed while the collective lasts (f the profile's
// overlap_slowdown): DDP's backward is charged max(M, C + M·(1 - 1/f)) beside its all-reduce M — never more
// than the two one after the other however large f (charging the slowdown over the whole overlapped span did
// above f = 2), and nothing beyond the collective once it outlasts the slowed compute (M >= f·C).
TEST(Planner, OverlapSlowsComputeOnlyWhileTheCollectiveLasts) {
  const Profile prof = synthetic_profile(ModelConfig::preset_config("mlp"), 2, 5);
  CostOptions o;
  o.world = 2;
  o.global_batch = 4;  // one micro-batch of 2 rows per rank
  int checked = 0, outlasted = 0;
  for (double scale : {0.01, 1.0, 100.0}) {
    for (double f : {1.5, 3.0}) {
      Profile p = prof, free = prof;
      for (Profile* q : {&p, &free})
        for (auto& [name, fit] : q->collectives) fit.beta_ms_per_byte *= scale;
      p.overlap_slowdown = f, free.overlap_slowdown = 1;
      const CostModel m = CostModel::from_profile(p, o), m1 = CostModel::from_profile(free, o);
      const CollectiveFit& ar = p.collectives.at("all_reduce");
      for (size_t op = 0; op < m.ops().size(); ++op) {
        double comm = 0;  // the op's share of its buckets' all-reduce, in fp32
        for (int64_t k : m.ops()[op].param_numels) {
          const double bytes = 4.0 * static_cast<double>(k);
          comm += ar.beta_ms_per_byte * bytes +
                  ar.alpha_ms * std::min(1.0, bytes / static_cast<double>(o.bucket_bytes));
        }
        if (comm == 0) continue;
        const double bwd = m.ops()[op].bwd_ms.at(2);
        const double extra =
            m.cost(op, {Strategy::ddp, 1}, 2).time_ms - m1.cost(op, {Strategy::ddp, 1}, 2).time_ms;
        const std::string what = m.ops()[op].name + " f " + std::to_string(f) + " x" + std::to_string(scale);
        EXPECT_NEAR(extra, std::max(comm, bwd + comm * (1 - 1 / f)) - std::max(bwd, comm),
                    1e-9 * (bwd + comm))
            << what;
        EXPECT_LE(extra, std::min(bwd, comm) * (1 + 1e-9)) << what;
        ++checked, outlasted += comm >= f * bwd ? 1 : 0;
      }
    }
  }
  EXPECT_GT(checked, 0);
  EXPECT_GT(outlasted, 0) << "no all-reduce outlasted its op's slowed backward";
}

// Recomputation per block among the choices (--recompute auto): the search equals brute force over every
// assignment of blocks, at budgets from the most frugal plan with recomputation to the roomiest without;
// under a budget that no plan without recomputation fits, the plan recomputes and fits; under some budget
// that one fits, it still recomputes (the memory buys a faster strategy); with no budget it never recomputes
// (it only costs time); --recompute none and all pin it.
TEST(Planner, RecomputeIsAChoicePerBlock) {
  ModelConfig gpt = ModelConfig::preset_config("gpt-tiny");
  gpt.n_layer = 1;  // 10 ops, 4 strategies each, x 2 for the block's recomputation
  int checked = 0, recomputed = 0, required = 0;
  for (unsigned seed = 1; seed <= 3; ++seed) {
    CostOptions opts;
    opts.world = 2, opts.global_batch = 8, opts.allow_splits = false;
    Profile prof = synthetic_profile(gpt, 2, seed);
    // A link dear enough that memory freed by recomputing can buy a faster strategy elsewhere.
    for (auto& [name, fit] : prof.collectives) fit.beta_ms_per_byte *= 10;
    const CostModel m = CostModel::from_profile(prof, opts);
    ASSERT_TRUE(m.recompute_is_choice());
    CostOptions none_opts = opts, all_opts = opts;
    none_opts.recompute = Recompute::none, all_opts.recompute = Recompute::all;
    const CostModel none = CostModel::from_profile(prof, none_opts),
                    all = CostModel::from_profile(prof, all_opts);
    SearchOptions tiny;
    tiny.mem_limit = 1;
    const int64_t frugal = uniform_baseline(all, Strategy::zero3, tiny).cost.peak_bytes;
    const int64_t roomy = uniform_baseline(none, Strategy::ddp, SearchOptions{}).cost.peak_bytes;
    const int64_t frugal_none = uniform_baseline(none, Strategy::zero3, tiny).cost.peak_bytes;
    ASSERT_LT(frugal, frugal_none);
    for (double f : {0.0, 0.99, 1.02, 1.1, 1.3, 1.0001 * static_cast<double>(frugal_none) / frugal, 2.0}) {
      SearchOptions search;
      search.memory_buckets = 64;
      search.mem_limit = f == 0 ? 0 : static_cast<int64_t>(static_cast<double>(frugal) * f);
      if (f == 2.0) search.mem_limit = roomy;
      const SearchResult dp = search_plan(m, search), brute = brute_force_plan(m, search);
      expect_same(dp, brute, "seed " + std::to_string(seed) + " limit x" + std::to_string(f));
      ++checked;
      if (!dp.fits) continue;
      if (search.mem_limit > 0) {
        EXPECT_LE(dp.cost.peak_bytes, search.mem_limit);
      }
      bool rc = false;
      for (const auto& [op, c] : dp.choices) rc = rc || c.recompute;
      recomputed += rc;
      if (search.mem_limit == 0) {
        EXPECT_FALSE(rc) << "recomputing with no budget";
      }
      if (search.mem_limit > 0 && search.mem_limit < frugal_none) {
        EXPECT_TRUE(rc) << "fits only recomputing";
        ++required;
      }
      // Pinned: none never recomputes, all always does.
      for (const auto& [op, c] : search_plan(none, search).choices) EXPECT_FALSE(c.recompute) << op;
      const SearchResult pinned = search_plan(all, search);
      for (const auto& [op, c] : pinned.choices) EXPECT_EQ(c.recompute, !block_of(op).empty()) << op;
    }
  }
  EXPECT_EQ(checked, 21);
  EXPECT_GT(required, 0);
  EXPECT_GT(recomputed, required) << "recomputation never chosen where a plan without it fits";
}

// Hybrid sharding across hosts (hsdp, hsdp2: zero3, zero2 within a host, the owned slice all-reduced among
// the peers): offered only with several hosts; the search stays exact with it; with a free link between hosts
// it brings nothing (zero3's collectives cost what the host's do, and hsdp holds more); with a dear one it is
// chosen where it fits, and the plan is faster for it.
TEST(Planner, HybridShardingIsAChoiceAcrossHosts) {
  const ModelConfig mlp = ModelConfig::preset_config("mlp"), cnn = ModelConfig::preset_config("cnn");
  auto offered = [](const CostModel& m) {
    std::set<Strategy> out;
    for (size_t op = 0; op < m.ops().size(); ++op)
      for (const OpChoice& c : m.candidates(op)) out.insert(c.strategy);
    return out;
  };
  CostOptions one_host;
  one_host.world = 4, one_host.global_batch = 16;
  EXPECT_EQ(offered(CostModel::from_profile(synthetic_profile(mlp, 4, 1), one_host)).count(Strategy::hsdp),
            0u);
  int hybrid_wins = 0;
  for (unsigned seed = 1; seed <= 2; ++seed)
    for (const ModelConfig* cfg : {&mlp, &cnn}) {
      Profile p = synthetic_profile(*cfg, 4, seed);
      on_two_hosts(p);
      Profile dear = p;
      make_world_dear(dear);
      CostOptions o;
      o.world = 4, o.global_batch = 16;
      const CostModel m = CostModel::from_profile(dear, o);
      ASSERT_EQ(m.options().hosts(), 2);
      // A profile file keeps the hosts it was taken on: planned from it, hybrid sharding is offered too.
      // ... and, calibrated across hosts, what hybrid sharding's steps cost beyond the model.
      Profile calibrated = dear;
      calibrated.strategy_residual_ms = {
          {"zero2", {{4, 1.5}}}, {"zero3", {{2, 2}, {4, 2.5}}}, {"hsdp", {{1, 2.5}}}, {"hsdp2", {{4, 3.5}}}};
      const Profile saved = profile_from_json(profile_to_json(calibrated), "profile");
      EXPECT_EQ(saved.strategy_residual_ms, calibrated.strategy_residual_ms);
      EXPECT_EQ(saved.hosts, 2);
      EXPECT_EQ(saved.ranks_per_host, 2);
      EXPECT_EQ(offered(CostModel::from_profile(saved, o)).count(Strategy::hsdp), 1u);
      EXPECT_EQ(offered(m).count(Strategy::hsdp), 1u);
      EXPECT_EQ(offered(m).count(Strategy::hsdp2), 1u);
      const std::string what = cfg->arch + " seed " + std::to_string(seed);
      // The smallest peak of each over micro-batches (a budget of 1 byte fits none).
      SearchOptions tiny;
      tiny.mem_limit = 1;
      const SearchResult frugal = uniform_baseline(m, Strategy::zero3, tiny);
      const SearchResult roomy = uniform_baseline(m, Strategy::ddp, tiny);
      for (double f : {0.0, 1.0, 1.3, 2.0}) {
        SearchOptions search;
        search.memory_buckets = 64;
        search.mem_limit = f == 0 ? 0 : static_cast<int64_t>(frugal.cost.peak_bytes * f);
        if (f == 2.0) search.mem_limit = (frugal.cost.peak_bytes + roomy.cost.peak_bytes) / 2;
        expect_same(search_plan(m, search), brute_force_plan(m, search),
                    what + " limit x" + std::to_string(f));
      }
      // A dear inter-host link, a budget that uniform hsdp fits but ddp does not. The search, offered hybrid
      // sharding, is within 1 % of the fastest plan by the simulation (every combination); never slower for
      // the choice; and where that fastest plan shards within hosts, so does the search's, beating the best
      // plan without hybrid sharding.
      SearchOptions mid;
      mid.mem_limit = uniform_baseline(m, Strategy::hsdp, tiny).cost.peak_bytes;
      ASSERT_LT(mid.mem_limit, roomy.cost.peak_bytes) << what;
      CostOptions no_hybrid = o;
      no_hybrid.allow_hybrid = false;
      const SearchResult with = search_plan(m, mid),
                         without = search_plan(CostModel::from_profile(dear, no_hybrid), mid),
                         oracle = exhaustive_best(m, mid.mem_limit);
      ASSERT_TRUE(with.fits && without.fits && oracle.fits) << what;
      EXPECT_LE(with.cost.step_ms, 1.01 * oracle.cost.step_ms) << what;
      EXPECT_LE(with.cost.step_ms, without.cost.step_ms) << what;
      EXPECT_EQ(hybrid_ops(without), 0) << what;  // not offered: not chosen, not even as a start
      if (hybrid_ops(oracle) > 0) {
        ++hybrid_wins;
        EXPECT_GT(hybrid_ops(with), 0) << what;
        EXPECT_LT(with.cost.step_ms, without.cost.step_ms) << what;
      }
      // A free inter-host link: the world's collectives cost the host's, the peers' nothing. Hybrid sharding
      // saves nothing there and holds more: the best plan is no faster for having it.
      Profile free = p;
      free.collectives["peers_all_reduce"] = CollectiveFit{};
      const SearchResult free_with = search_plan(CostModel::from_profile(free, o), mid),
                         free_without = search_plan(CostModel::from_profile(free, no_hybrid), mid);
      EXPECT_NEAR(free_with.cost.step_ms, free_without.cost.step_ms, 1e-9 * free_without.cost.step_ms)
          << what;
    }
  // Not vacuous: on most of these shapes the dear link makes a hybrid plan the fastest.
  EXPECT_GE(hybrid_wins, 2);
}

// A param split in k pieces runs k collectives where one would do: each one more pays the latency of a
// collective issued among busy threads (the profile's collective_overhead_ms), even where the back-to-back
// fits have no α, unless the pieces are small enough to travel in their block's fused group. So with no
// budget the search never splits a sharded op: splits only buy memory.
TEST(Planner, SplitsPayALatencyPerExtraCollective) {
  for (const bool hosts : {false, true}) {
    Profile p = synthetic_profile(ModelConfig::preset_config("mlp"), 4, 3);
    if (hosts) on_two_hosts(p), make_world_dear(p);
    for (auto& [name, fit] : p.collectives) fit.alpha_ms = 0;
    p.collective_overhead_ms = 7;
    CostOptions o;
    o.world = 4, o.global_batch = 16, o.fuse_bytes = 0;
    CostOptions all_fused = o;
    all_fused.fuse_bytes = int64_t{1} << 40;
    // Time alone: no bytes, no optimizer, communication hidden behind nothing it does not exceed.
    Profile latency_only = p;
    for (auto& [name, fit] : latency_only.collectives) fit.beta_ms_per_byte = 0;
    latency_only.optimizer_ns_per_element = 0, latency_only.overlap_slowdown = 1;
    const CostModel m = CostModel::from_profile(latency_only, o),
                    fused = CostModel::from_profile(latency_only, all_fused);
    const std::string where = hosts ? "2 hosts" : "1 host";
    int checked = 0;
    for (size_t op = 0; op < m.ops().size(); ++op)
      for (const OpChoice& c : m.candidates(op)) {
        if (c.splits == 1) continue;
        const OpChoice whole{c.strategy, 1, c.recompute};
        const double extra = m.cost(op, c, 4).time_ms - m.cost(op, whole, 4).time_ms;
        const double fused_extra = fused.cost(op, c, 4).time_ms - fused.cost(op, whole, 4).time_ms;
        const std::string what = where + " " + m.ops()[op].name + " " + strategy_name(c.strategy) + " x" +
                                 std::to_string(c.splits);
        // zero3's gathers pay the latency per piece fused or not: it is calibrated counting every param.
        if (c.strategy != Strategy::zero3) {
          EXPECT_NEAR(fused_extra, 0, 1e-9) << what;
        }
        EXPECT_GE(extra, -1e-9) << what;
        if (c.strategy == Strategy::zero1 || c.strategy == Strategy::zero2) {
          // The after-step gathers alone, charged whole: k - 1 more per param.
          const double params = static_cast<double>(m.ops()[op].param_numels.size());
          EXPECT_GE(extra, (c.splits - 1) * 7.0 * params - 1e-9) << what;
          ++checked;
        }
      }
    EXPECT_GT(checked, 0) << where;
    // With bytes on the links again and no budget: no sharded op is split.
    const SearchResult r = search_plan(CostModel::from_profile(p, o), SearchOptions{});
    ASSERT_TRUE(r.fits) << where;
    for (const auto& [op, c] : r.choices)
      EXPECT_TRUE(c.splits == 1 || !is_sharded(c.strategy)) << where << " " << op << " split " << c.splits;
  }
}

TEST(Planner, ClusterSpecPlansFitAndBeatUniformZero3) {
  const std::string spec = std::string(SLIMSHARD_SOURCE_DIR) + "/examples/clusters/8xgpu-24gb-pcie3.json";
  ModelConfig cfg = ModelConfig::preset_config("gpt");
  cfg.n_layer = 12, cfg.n_embd = 1536, cfg.n_head = 16, cfg.seq_len = 1024, cfg.vocab = 50257;
  CostOptions cost_opts;
  cost_opts.world = 8;
  cost_opts.global_batch = 32;
  const ClusterSpec c = load_cluster(spec);
  const CostModel m = CostModel::from_cluster(c, cfg, cost_opts, {1, 2, 4});
  for (int64_t limit : {c.memory_bytes, c.memory_bytes / 2, c.memory_bytes / 4}) {
    SearchOptions search;
    search.mem_limit = limit;
    const SearchResult r = search_plan(m, search);
    const SearchResult z3 = uniform_baseline(m, Strategy::zero3, search);
    // The whole device's memory holds this GPT under zero3 (and search under some plan): a budget that fits.
    if (limit == c.memory_bytes) {
      ASSERT_TRUE(r.fits) << r.explanation;
      ASSERT_TRUE(z3.fits);
    }
    if (!r.fits) {
      EXPECT_FALSE(z3.fits);
      continue;
    }
    EXPECT_LE(r.cost.peak_bytes, limit);
    if (z3.fits) {  // zero3 everywhere is one candidate
      EXPECT_LE(r.cost.step_ms, z3.cost.step_ms * (1 + 1e-9));
    }
  }
}

TEST(Planner, PlanCommandBadProfilesAndBudgets) {
  const std::string dir = test::scratch_dir();
  auto prof = test::run(mpirun(2) + " profile --model gpt-tiny --micro-batch 2,4 --repeats 2 --out " + dir +
                        "/p.json");
  ASSERT_EQ(prof.code, 0) << prof.output;
  const std::string base = test::bin() + " plan --model gpt-tiny --batch-size 8 ";
  auto ok = test::run(base + "--profile " + dir + "/p.json --mem-limit 64MiB --out " + dir +
                      "/plan.json --svg " + dir + "/plan.svg");
  ASSERT_EQ(ok.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("zero3 everywhere"), std::string::npos) << ok.output;
  const std::string svg = read_file(dir + "/plan.svg", "test");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("Predicted throughput"), std::string::npos);
  // The plan file is a plan `train` accepts.
  EXPECT_NO_THROW(load_plan(dir + "/plan.json"));

  // Under a budget this machine enforces the search keeps 2 % for the estimate's error: given exactly the
  // peak of the plan it found under a roomier budget, it plans under 98 % of it (or says it planned to that).
  auto peak_of = [](const std::string& plan_file) {
    return nlohmann::json::parse(read_file(plan_file, "test"))["predicted"]["peak_bytes"].get<int64_t>();
  };
  const int64_t roomy = peak_of(dir + "/plan.json");
  auto tight = test::run(base + "--profile " + dir + "/p.json --mem-limit " + std::to_string(roomy) +
                         " --out " + dir + "/tight.json");
  if (tight.code == 0)
    EXPECT_LE(peak_of(dir + "/tight.json"), roomy - roomy / 50) << tight.output;
  else
    EXPECT_NE(tight.output.find("2 % kept for the estimate's error"), std::string::npos) << tight.output;

  auto none = test::run(base + "--profile " + dir + "/p.json --mem-limit 1MiB");
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_NE(none.output.find("nothing fits in 1.0 MiB per rank"), std::string::npos) << none.output;
  // It says why: by how much the most frugal plan misses, or that one micro-batch's activations alone do.
  EXPECT_TRUE(none.output.find(" over (persistent") != std::string::npos ||
              none.output.find("alone take") != std::string::npos)
      << none.output;

  auto other_world = test::run(base + "--profile " + dir + "/p.json --world 4 --mem-limit 64MiB");
  EXPECT_EQ(other_world.code, 2) << other_world.output;
  EXPECT_NE(other_world.output.find("--scale-profile"), std::string::npos) << other_world.output;
  EXPECT_EQ(test::run(base + "--profile " + dir +
                      "/p.json --world 4 --scale-profile --mem-limit 64MiB --out " + dir + "/p4.json")
                .code,
            0);

  // Broken profiles: each is refused with exit 2 naming the file and what is wrong.
  const std::string good = read_file(dir + "/p.json", "test");
  auto j = nlohmann::json::parse(good);
  auto expect_bad = [&](const std::string& name, const std::string& text, const std::string& needle) {
    write_file_atomic(dir + "/" + name, text);
    auto r = test::run(base + "--profile " + dir + "/" + name + " --mem-limit 64MiB");
    EXPECT_EQ(r.code, 2) << name << "\n" << r.output;
    EXPECT_NE(r.output.find(name), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << name << "\n" << r.output;
  };
  expect_bad("trunc.json", good.substr(0, good.size() / 2), "not valid JSON");
  auto k = j;
  k["format"] = "something";
  expect_bad("format.json", k.dump(), "not a slimshard profile");
  k = j;
  k.erase("collectives");
  expect_bad("missing.json", k.dump(), "missing or mistyped");
  k = j;
  k["ops"][3]["fwd_ms"]["2"] = -1.0;
  expect_bad("negative.json", k.dump(), "negative");
  k = j;
  k["model"]["n_layer"] = 3;
  expect_bad("model.json", k.dump(), "ops");
  k = j;
  k["overlap_slowdown"] = 0.5;
  expect_bad("overlap.json", k.dump(), "overlap_slowdown");
}

// `train --strategy osdp` under a budget that stops DDP, timing its candidates (--tune-steps): the plan
// trains, and its measured peak is the one the plan predicted (the allocator enforcing the budget alone would
// let any plan that happens to fit pass).
TEST(Planner, TrainOsdpFitsABudgetThatStopsDdp) {
  const std::string dir = test::scratch_dir();
  const std::string args =
      "--model gpt-small --data kjv --batch-size 8 --eval-rows 4 --mem-limit " + std::to_string(72 << 20);
  auto ddp = test::run(mpirun(2) + " train " + args + " --steps 3 --strategy ddp");
  EXPECT_EQ(ddp.code, 1) << ddp.output;
  EXPECT_NE(ddp.output.find("memory limit exceeded"), std::string::npos) << ddp.output;
  const test::TrainRun r = test::train(2, args + " --steps 3 --strategy osdp --tune-steps 2", dir, "osdp");
  ASSERT_EQ(r.code, 0) << r.output;
  // The candidates' measured times: the searched plan first; another is trained only if every step of it ran
  // faster than every step of the searched plan (the fastest median of those).
  const std::string measured = "osdp: measured step ms, median [range] (predicted): ";
  const size_t m = r.output.find(measured);
  ASSERT_NE(m, std::string::npos) << r.output;
  const std::string line = r.output.substr(m + measured.size(), r.output.find('\n', m) - m - measured.size());
  const std::regex item(" ?([a-z0-9 ]+) ([0-9.]+) \\[([0-9.]+)-([0-9.]+)\\] \\(([0-9.]+)\\);?");
  struct Timed {
    std::string name;
    double median, fastest, slowest;
  };
  std::vector<Timed> times;
  for (auto it = std::sregex_iterator(line.begin(), line.end(), item); it != std::sregex_iterator(); ++it)
    times.push_back(Timed{(*it)[1].str(), std::stod((*it)[2].str()), std::stod((*it)[3].str()),
                          std::stod((*it)[4].str())});
  ASSERT_GE(times.size(), 2u) << r.output;
  EXPECT_EQ(times.front().name, "searched plan");
  size_t want = 0;
  for (size_t i = 1; i < times.size(); ++i)
    if (times[i].slowest < times[0].fastest && times[i].median < times[want].median) want = i;
  EXPECT_EQ(r.summary["osdp"]["choice"], times[want].name) << r.output;
  const std::string trains = "osdp: trains the " + times[want].name;
  const size_t at = r.output.find("predicted peak ", r.output.find(trains));
  ASSERT_NE(r.output.find(trains), std::string::npos) << r.output;
  const double predicted_mib = std::stod(r.output.substr(at + 15));
  const double measured_mib = r.summary["peak_bytes"].get<double>() / (1 << 20);
  EXPECT_NEAR(measured_mib, predicted_mib, 0.10 * measured_mib) << r.output;
  // Timing the candidates leaves the run itself alone: the plan it chose, given as a file, trains the same
  // losses bit for bit.
  const std::string plan = dir + "/chosen.json";
  std::ofstream(plan) << r.summary["osdp"]["plan"].dump();
  const test::TrainRun again = test::train(2, args + " --steps 3 --plan " + plan, dir, "again");
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_EQ(again.losses, r.losses);
  // --tune-steps 0: the searched plan, untimed.
  const test::TrainRun trusted =
      test::train(2, args + " --strategy osdp --tune-steps 0 --steps 1", dir, "trusted");
  ASSERT_EQ(trusted.code, 0) << trusted.output;
  EXPECT_EQ(trusted.summary["osdp"]["choice"], "searched plan");
  EXPECT_EQ(trusted.output.find("osdp: timing"), std::string::npos) << trusted.output;
  // With a budget nothing fits: exit 2 and the explanation, on every rank's behalf.
  auto none = test::run(mpirun(2) +
                        " train --model gpt-small --data kjv --batch-size 8 --steps 3 --strategy osdp "
                        "--mem-limit 8MiB");
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_NE(none.output.find("nothing fits"), std::string::npos) << none.output;
}

// `slimshard bench` keeps what its osdp runs came from: the profile it took (--save-profile) and the plan
// each trained (osdp_plan in --json). Oracle: `slimshard plan` from the kept profile under the same budget
// finds the plan the bench's osdp run trained.
TEST(Planner, BenchKeepsItsProfileAndTheTrainedPlan) {
  const std::string dir = test::scratch_dir();
  // A budget between zero3's peak (4.3 MiB) and ddp's (5.2): a mixed plan.
  const std::string model = "--model gpt-tiny --batch-size 8 ", budget = "--mem-limit 4.8MiB ";
  auto b = test::run(test::mpi_env() + test::bin() + " bench -n 2 --strategies zero3,osdp " + model + budget +
                     "--data kjv --steps 3 --eval-rows 4 --save-profile " + dir + "/p.json --json " + dir +
                     "/b.json");
  ASSERT_EQ(b.code, 0) << b.output;
  const auto rows = nlohmann::json::parse(read_file(dir + "/b.json", "test"))["results"];
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_FALSE(rows[0].contains("osdp_plan"));
  ASSERT_TRUE(rows[1].contains("osdp_plan")) << rows.dump();
  const nlohmann::json trained = rows[1]["osdp_plan"];
  auto p = test::run(test::bin() + " plan " + model + budget + "--profile " + dir + "/p.json --out " + dir +
                     "/plan.json");
  ASSERT_EQ(p.code, 0) << p.output;
  const auto planned = nlohmann::json::parse(read_file(dir + "/plan.json", "test"));
  EXPECT_EQ(trained["ops"], planned["ops"]);
  EXPECT_EQ(trained["micro_batch"], planned["micro_batch"]);
  // The table's line under it counts the plan's ops by strategy.
  std::map<std::string, int> count;
  for (const auto& e : trained["ops"]) ++count[e["strategy"].get<std::string>()];
  const std::string line =
      "osdp trained micro-batch " + std::to_string(trained["micro_batch"].get<int>()) + ":";
  const size_t at = b.output.find(line);
  ASSERT_NE(at, std::string::npos) << b.output;
  const std::string printed = b.output.substr(at, b.output.find('\n', at) - at);
  for (const auto& [strategy, n] : count)
    EXPECT_NE(printed.find(" " + std::to_string(n) + " " + strategy), std::string::npos) << printed;
  // A profile given is not taken again, so there is none to keep.
  auto both = test::run(test::bin() + " bench -n 2 --data kjv " + model + "--profile " + dir +
                        "/p.json --save-profile " + dir + "/q.json");
  EXPECT_EQ(both.code, 2) << both.output;
  EXPECT_NE(test::last_line(both.output).find("--save-profile"), std::string::npos) << both.output;
}

// The search against the simulation's own best plan (every combination, every micro-batch) on 8 draws of the
// MLP's and CNN's profiles, on one host and on two with a dear link between them, at five budgets from just
// above uniform zero3 to halfway to ddp. The rule alone (loads in uniform neighbourhoods) found it on 111 of
// the 160, 18 of them more than 2 % slower, 52.5 % at worst (a micro-batch where the rule admitted nothing
// that fits); with the descent, 158 of 160, 1.9 % slower at worst. A cost model that charged zero1/zero2's
// gathers after the step as hidden under each op's next forward (tried 2026-12-07) left the descent 4.35 %
// short on one (cnn, seed 3, one host: fc1's better choice needed room from three other ops); the repair
// closes it (159 of 160, 1.85 % at worst there; 158 of 160, 1.87 % with the model as it is).
TEST(Planner, SearchFindsTheSimulationsBestOnMixedPlans) {
  const ModelConfig mlp = ModelConfig::preset_config("mlp"), cnn = ModelConfig::preset_config("cnn");
  int total = 0, exact = 0;
  double worst = 1;
  for (unsigned seed = 1; seed <= 8; ++seed)
    for (const ModelConfig* cfg : {&mlp, &cnn})
      for (int hosts : {1, 2}) {
        Profile p = synthetic_profile(*cfg, 4, seed);
        if (hosts == 2) on_two_hosts(p), make_world_dear(p);
        CostOptions o;
        o.world = 4, o.global_batch = 16;
        const CostModel m = CostModel::from_profile(p, o);
        SearchOptions tiny;
        tiny.mem_limit = 1;
        const int64_t frugal = uniform_baseline(m, Strategy::zero3, tiny).cost.peak_bytes;
        const int64_t roomy = uniform_baseline(m, Strategy::ddp, tiny).cost.peak_bytes;
        for (double f : {1.05, 1.15, 1.3, 1.5, 0.0}) {
          SearchOptions budget;
          budget.mem_limit =
              f > 0 ? static_cast<int64_t>(static_cast<double>(frugal) * f) : (frugal + roomy) / 2;
          const SearchResult found = search_plan(m, budget), oracle = exhaustive_best(m, budget.mem_limit);
          const std::string what = cfg->arch + " seed " + std::to_string(seed) + " hosts " +
                                   std::to_string(hosts) + " budget " + std::to_string(budget.mem_limit);
          ASSERT_EQ(found.fits, oracle.fits) << what;
          if (!oracle.fits) continue;
          EXPECT_LE(found.cost.peak_bytes, budget.mem_limit) << what;
          const double ratio = found.cost.step_ms / oracle.cost.step_ms;
          ++total, exact += ratio <= 1 + 1e-9, worst = std::max(worst, ratio);
          EXPECT_LE(ratio, 1.02) << what;
        }
      }
  EXPECT_GE(total, 150);
  EXPECT_GE(exact, total - 3) << "of " << total;
  std::printf("search = the simulation's best on %d of %d; worst %.4f\n", exact, total, worst);
}
