// test_slim_mpi.cpp — SlimSync under mpirun (2 and 4 ranks, in comm_tests): every rank selects the same
// elements, the core is the top-α by the documented significance, the explorer is a uniform draw of the rest,
// the packed exchange equals a masked full all-reduce, α = 1 is periodic model averaging, and a full
// synchronisation leaves one model. Every rank perturbs its weights with values every rank can recompute, so
// each can check the result against a sequential oracle.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "slimshard/comm.h"
#include "slimshard/sharded_param.h"
#include "slimshard/slim.h"

using namespace slimshard;

extern Communicator* g_comm;

namespace {

const std::vector<std::vector<int64_t>> kShapes = {{64, 33}, {33}, {1000}, {7}, {5, 300}};

// Slim params with the same initial values on every rank, and their concatenation.
struct Model {
  std::vector<std::unique_ptr<ShardedParam>> owned;
  std::vector<ShardedParam*> params;
  at::Tensor init;  // flat, all params in order
};

Model make_model() {
  Model m;
  at::manual_seed(7);
  std::vector<at::Tensor> flat;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    at::Tensor v = at::randn(kShapes[i]);
    flat.push_back(v.reshape({-1}).clone());
    m.owned.push_back(std::make_unique<ShardedParam>("p" + std::to_string(i), v, true));
    m.owned.back()->shard(Strategy::slim, g_comm->rank(), g_comm->world());
    m.params.push_back(m.owned.back().get());
  }
  m.init = at::cat(flat);
  return m;
}

at::Tensor weights(const Model& m) {
  std::vector<at::Tensor> parts;
  for (ShardedParam* p : m.params) parts.push_back(p->master().reshape({-1}));
  return at::cat(parts);
}

// What rank r adds to its weights before round `round`: distinct per rank and round, known to every rank.
at::Tensor perturbation(int r, int round, int64_t n) {
  at::manual_seed(100 + 17 * round + r);
  return at::randn({n}) * 0.01;
}

void perturb(Model& m, int round) {
  at::Tensor d = perturbation(g_comm->rank(), round, m.init.numel());
  int64_t off = 0;
  for (ShardedParam* p : m.params) {
    p->master().add_(d.slice(0, off, off + p->numel()).view_as(p->master()));
    off += p->numel();
  }
}

// Every rank's copy of `t` (same size everywhere), rank by rank.
std::vector<at::Tensor> gather(const at::Tensor& t) {
  at::Tensor all = at::empty({g_comm->world() * t.numel()}, t.options());
  g_comm->all_gather(all, t.contiguous())->wait();
  return all.chunk(g_comm->world());
}

int64_t core_size() {
  int64_t k = 0;
  for (const auto& s : kShapes) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    k += static_cast<int64_t>(std::ceil(0.25 * static_cast<double>(n)));
  }
  return k;
}

// The original order: a round's average applied at once (the tests below check what it leaves right away).
SlimOptions options(double core, double explore, int period = 1, int refresh = 1000) {
  SlimOptions o;
  o.core = core, o.explore = explore, o.period = period, o.refresh = refresh;
  o.apply = "now";
  return o;
}

// Per tensor, the k largest of `score` (k = ceil(α·n)), as flat indices, sorted.
at::Tensor top_per_tensor(const at::Tensor& score, double alpha) {
  std::vector<at::Tensor> out;
  int64_t off = 0;
  for (const auto& s : kShapes) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    const auto k = static_cast<int64_t>(std::ceil(alpha * static_cast<double>(n)));
    out.push_back(std::get<1>(score.slice(0, off, off + n).topk(k)) + off);
    off += n;
  }
  return std::get<0>(at::cat(out).sort());
}

// What the round just run selected (with the core it used: refreshes happen at the start of a round).
at::Tensor last_selection(const SlimSync& sync) { return sync.selection(sync.rounds() - 1); }

at::Tensor mask_of(const at::Tensor& idx, int64_t n) {
  return at::zeros({n}, at::kBool).index_fill_(0, idx, true);
}

}  // namespace

TEST(Slim, EveryRankSelectsTheSameCoreAndExplorer) {
  Model m = make_model();
  SlimSync sync(*g_comm, m.params, options(0.25, 0.1));
  perturb(m, 0);
  sync.after_step(0);
  const at::Tensor sel = last_selection(sync), core = sync.core();
  const int64_t k = core_size(), n = m.init.numel();
  for (const at::Tensor& t : {sel, core})
    for (const at::Tensor& other : gather(at::tensor({t.numel()}, at::kLong)))
      ASSERT_EQ(other.item<int64_t>(), t.numel()) << "selection sizes differ across ranks";
  for (const at::Tensor& other : gather(sel))
    EXPECT_TRUE(other.equal(sel)) << "selections differ across ranks";
  // The first core: nothing has been exchanged yet, so significance is the magnitude of the initial weights.
  ASSERT_EQ(core.numel(), k);
  EXPECT_TRUE(core.equal(top_per_tensor(m.init.abs(), 0.25)));
  // The selection: the core and ~β of the rest (binomial: mean β(n − k), 5 standard deviations either side).
  const at::Tensor in_sel = mask_of(sel, n), in_core = mask_of(core, n);
  EXPECT_TRUE(in_sel.index_select(0, core).all().item<bool>()) << "core not all selected";
  EXPECT_EQ(std::get<0>(at::_unique(sel)).numel(), sel.numel());
  const double explored = static_cast<double>(sel.numel() - k), rest = static_cast<double>(n - k);
  EXPECT_NEAR(explored, 0.1 * rest, 5 * std::sqrt(rest * 0.1 * 0.9));
  EXPECT_NEAR(sync.last_fraction(), static_cast<double>(sel.numel()) / static_cast<double>(n), 1e-12);
  EXPECT_FALSE(in_sel.logical_and(in_core.logical_not()).equal(at::zeros({n}, at::kBool)));
}

TEST(Slim, ExplorerIsUniformOverTheRest) {
  Model m = make_model();
  SlimSync sync(*g_comm, m.params, options(0.25, 0.1));
  const int64_t n = m.init.numel();
  const at::Tensor not_core = mask_of(sync.core(), n).logical_not();
  at::Tensor count = at::zeros({n}, at::kLong);
  const int rounds = 200;
  for (int r = 0; r < rounds; ++r) {
    sync.after_step(r);
    const at::Tensor sel = last_selection(sync);
    count.index_add_(0, sel, at::ones({sel.numel()}, at::kLong));
  }
  const at::Tensor rest = count.masked_select(not_core);
  // Each non-core element is explored with probability 0.1 per round: mean 20 of 200, and none missed
  // (P(missed) = 0.9^200 ≈ 7e-10 per element); the core every round.
  EXPECT_NEAR(rest.to(at::kDouble).mean().item<double>(), 0.1 * rounds, 0.02 * rounds);
  EXPECT_GE(rest.min().item<int64_t>(), 1);
  EXPECT_LE(rest.max().item<int64_t>(), 3 * 0.1 * rounds);
  EXPECT_TRUE(count.masked_select(not_core.logical_not()).eq(rounds).all().item<bool>());
}

TEST(Slim, PackedExchangeEqualsAMaskedFullAllReduce) {
  Model m = make_model();
  SlimSync sync(*g_comm, m.params, options(0.25, 0.1, /*period=*/1, /*refresh=*/2));
  const int64_t n = m.init.numel();
  at::Tensor anchor = m.init.clone(), signal = at::zeros({n});
  for (int round = 0; round < 4; ++round) {
    at::Tensor score;
    if (round == 2) {
      // The core is refreshed before this round: per tensor, top-α of |a|/mean|a| + s/mean(s), from the
      // agreed anchor and the signal accumulated since the last refresh.
      score = at::zeros({n});
      int64_t off = 0;
      for (ShardedParam* p : m.params) {
        at::Tensor a = anchor.slice(0, off, off + p->numel()).abs(),
                   s = signal.slice(0, off, off + p->numel());
        score.slice(0, off, off + p->numel()).copy_(a / a.mean() + s / s.mean());
        off += p->numel();
      }
      signal.zero_();
    }
    perturb(m, round);
    const at::Tensor local = weights(m);
    // The oracle: every element's delta all-reduced, then applied only where selected.
    at::Tensor avg = local - anchor;
    g_comm->all_reduce(avg, ReduceOp::avg)->wait();
    sync.after_step(round);
    if (score.defined()) {
      EXPECT_TRUE(sync.core().equal(top_per_tensor(score, 0.25))) << "refreshed core";
    }
    const at::Tensor mask = mask_of(last_selection(sync), n);
    at::Tensor want = at::where(mask, anchor + avg, local);
    EXPECT_LE((weights(m) - want).abs().max().item<double>(), 1e-6) << "round " << round;
    // Unselected elements keep their local value exactly.
    EXPECT_TRUE(weights(m).masked_select(mask.logical_not()).equal(local.masked_select(mask.logical_not())));
    anchor = at::where(mask, weights(m), anchor);
    signal = at::where(mask, signal + avg.abs(), signal);
  }
}

TEST(Slim, AlphaOneIsPeriodicModelAveraging) {
  Model m = make_model();
  SlimSync sync(*g_comm, m.params, options(1.0, 0.1, /*period=*/3));
  for (int step = 0; step < 6; ++step) {
    perturb(m, step);
    const at::Tensor local = weights(m);
    sync.after_step(step);
    if ((step + 1) % 3 != 0) {
      EXPECT_TRUE(weights(m).equal(local)) << "no communication inside a period, step " << step;
      continue;
    }
    at::Tensor mean = local.clone();
    g_comm->all_reduce(mean, ReduceOp::avg)->wait();
    EXPECT_LE((weights(m) - mean).abs().max().item<double>(), 1e-6) << "step " << step;
    EXPECT_EQ(sync.last_fraction(), 1.0);
    for (const at::Tensor& other : gather(weights(m))) EXPECT_TRUE(other.equal(weights(m)));
  }
  EXPECT_EQ(sync.rounds(), 2);
}

TEST(Slim, FullSyncLeavesOneModel) {
  Model m = make_model();
  SlimSync sync(*g_comm, m.params, options(0.1, 0.05));
  for (int round = 0; round < 3; ++round) {
    perturb(m, round);
    sync.after_step(round);
  }
  EXPECT_GT(sync.divergence().max, 0.0) << "replicas should have drifted apart";
  at::Tensor mean = weights(m);
  g_comm->all_reduce(mean, ReduceOp::avg)->wait();
  sync.full_sync();
  EXPECT_LE((weights(m) - mean).abs().max().item<double>(), 1e-6);
  for (const at::Tensor& other : gather(weights(m))) EXPECT_TRUE(other.equal(weights(m)));
  const SlimSync::Divergence d = sync.divergence();
  EXPECT_EQ(d.max, 0.0);
  EXPECT_EQ(d.mean, 0.0);
}

// The bf16 wire: the packed deltas travel rounded to bf16 and each rank keeps its rounding remainder in its
// weights. Oracle: every rank's own rounded deltas, gathered and averaged in fp32. The agreed part (anchor +
// average) is the same on every rank up to the rounding of the average itself, the remainder is exactly the
// rank's own, and so the ranks' mean weight is what the fp32 wire would give: nothing is lost, only delayed.
TEST(Slim, Bf16WireKeepsEachRanksRemainder) {
  Model m = make_model();
  SlimOptions o = options(0.25, 0.1);
  o.wire = "bf16";
  SlimSync sync(*g_comm, m.params, o);
  const int64_t n = m.init.numel();
  at::Tensor anchor = m.init.clone();
  for (int round = 0; round < 3; ++round) {
    perturb(m, round);
    const at::Tensor local = weights(m), d = local - anchor;
    const at::Tensor rounded = d.to(at::kBFloat16).to(at::kFloat), remainder = d - rounded;
    at::Tensor avg = at::zeros({n}), sum_abs = at::zeros({n});
    for (const at::Tensor& other : gather(rounded)) avg += other / g_comm->world(), sum_abs += other.abs();
    at::Tensor mean_local = local.clone();
    g_comm->all_reduce(mean_local, ReduceOp::avg)->wait();
    sync.after_step(round);
    const at::Tensor mask = mask_of(last_selection(sync), n), w = weights(m);
    // The average arrives as bf16, rounded once (shared memory) or at each partial sum (MPI's reduction
    // tree): within 2^-9 of Σ|deltas| per rounding, at most N − 1 of them before the division by N, plus
    // float slack.
    const at::Tensor tol = sum_abs * std::ldexp(1.0, -8) + 1e-6;
    const at::Tensor agreed = w - remainder;
    EXPECT_TRUE(((agreed - (anchor + avg)).abs() <= tol).logical_or(mask.logical_not()).all().item<bool>())
        << "round " << round;
    EXPECT_TRUE(w.masked_select(mask.logical_not()).equal(local.masked_select(mask.logical_not())));
    EXPECT_GT(remainder.masked_select(mask).abs().max().item<double>(), 0.0) << "bf16 rounds something";
    at::Tensor mean_w = w.clone();
    g_comm->all_reduce(mean_w, ReduceOp::avg)->wait();
    EXPECT_TRUE(((mean_w - mean_local).abs() <= tol).all().item<bool>()) << "round " << round;
    // The anchor is identical everywhere: what every rank holds minus its own remainder, to float slack.
    for (const at::Tensor& other : gather(agreed.masked_select(mask)))
      EXPECT_LE((other - agreed.masked_select(mask)).abs().max().item<double>(), 1e-6);
    anchor = at::where(mask, agreed, anchor);
  }
  sync.full_sync();  // fp32: one model, the remainders included
  for (const at::Tensor& other : gather(weights(m))) EXPECT_TRUE(other.equal(weights(m)));
}

// --slim-apply next: a round's exchange runs while the next step computes. Its average is applied after that
// step, keeping what the rank did meanwhile: w[S] = w_now + mean − sent, so the agreed part (w minus the
// progress since sending) is anchor + mean on every rank; the anchor moves by the mean; outside S nothing
// changes. Oracle: each round's deltas all-reduced in full, applied where selected.
TEST(Slim, ApplyNextKeepsTheProgressMadeDuringTheExchange) {
  Model m = make_model();
  SlimOptions o = options(0.25, 0.1);
  o.apply = "next";
  SlimSync sync(*g_comm, m.params, o);
  const int64_t n = m.init.numel();
  at::Tensor anchor = m.init.clone();
  perturb(m, 0);
  at::Tensor local = weights(m), sent = local - anchor;
  sync.after_step(0);
  EXPECT_TRUE(weights(m).equal(local)) << "nothing is applied while the exchange runs";
  at::Tensor mask = mask_of(sync.selection(0), n);
  for (int round = 1; round < 4; ++round) {
    at::Tensor mean = sent.clone();
    g_comm->all_reduce(mean, ReduceOp::avg)->wait();
    perturb(m, round);  // the step computed while the round was in flight
    const at::Tensor before = weights(m), progress = before - (anchor + sent);
    sync.after_step(round);  // applies round - 1, launches round
    // (round's own deltas are packed after the apply: its value is what the next check expects.)
    const at::Tensor want = at::where(mask, before + mean - sent, before);
    EXPECT_LE((weights(m) - want).abs().max().item<double>(), 1e-6) << "round " << round;
    const at::Tensor agreed = (weights(m) - progress).masked_select(mask);
    for (const at::Tensor& other : gather(agreed))
      EXPECT_LE((other - agreed).abs().max().item<double>(), 1e-6) << "agreed part, round " << round;
    anchor = at::where(mask, anchor + mean, anchor);
    sent = weights(m) - anchor;
    mask = mask_of(sync.selection(round), n);
  }
  sync.full_sync();  // waits for the round in flight first: one model
  for (const at::Tensor& other : gather(weights(m))) EXPECT_TRUE(other.equal(weights(m)));
}
