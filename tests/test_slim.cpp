// test_slim.cpp — Slim-DP end to end under mpirun: with α = 1, τ = 1 and plain SGD it is DDP (alone and
// inside a plan mixing slim with zero3); with the defaults it converges near DDP on gpt-tiny while sending
// far fewer bytes (about half again on the bf16 wire), every rank selecting the same elements and ending with
// the same weights; bad Slim-DP flags exit 2; `--slim-adam corrected` against DDP's AdamW on synthetic
// gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>

#include "helpers.h"
#include "slimshard/optim.h"
#include "slimshard/sharded_param.h"

using namespace slimshard;

namespace {

using test::train;
using SlimRun = test::TrainRun;

// The losses step by step and the final validation loss.
void expect_same_run(const SlimRun& a, const SlimRun& b, const std::string& what) {
  test::expect_same_losses(a, b, what);
  EXPECT_NEAR(b.summary["val_loss"].get<double>(), a.summary["val_loss"].get<double>(),
              1e-5 * a.summary["val_loss"].get<double>())
      << what;
}

const std::string kSgd =
    "--model gpt-tiny --data kjv --steps 20 --batch-size 8 --lr 0.05 --optimizer sgd --momentum 0 --clip 0 "
    "--eval-every 0 --eval-rows 64";

}  // namespace

TEST(Slim, AlphaOneTauOneWithSgdIsDdp) {
  const std::string dir = test::scratch_dir();
  SlimRun ddp = train(2, kSgd + " --strategy ddp", dir, "ddp");
  SlimRun slim = train(2, kSgd + " --strategy slim --slim-core 1", dir, "slim");
  expect_same_run(ddp, slim, "slim alpha=1 vs ddp");
  EXPECT_TRUE(slim.summary.value("weights_identical", false));
  EXPECT_EQ(slim.summary.value("slim_rounds", 0), 20 + 1);  // one per step, and the final full sync
  // The same in a plan: slim blocks, zero3 embeddings and head, ddp elsewhere.
  const std::string plan = dir + "/plan.json";
  std::ofstream(plan) << R"({"ops": {"*": {"strategy": "ddp"}, "blocks.*": {"strategy": "slim"},
                                "wte": {"strategy": "zero3"}, "lm_head": {"strategy": "zero3"}}})";
  SlimRun mixed = train(2, kSgd + " --plan " + plan + " --slim-core 1", dir, "mixed");
  expect_same_run(ddp, mixed, "plan with slim alpha=1 and zero3 vs ddp");
}

TEST(Slim, DefaultsConvergeNearDdpWithFarFewerBytes) {
  const std::string dir = test::scratch_dir();
  const std::string args =
      "--model gpt-tiny --data kjv --steps 200 --batch-size 16 --lr 3e-3 --eval-every 100";
  SlimRun ddp = train(2, args + " --strategy ddp", dir, "ddp");
  SlimRun slim = train(2, args + " --strategy slim", dir, "slim");
  ASSERT_FALSE(ddp.steps.empty());
  ASSERT_FALSE(slim.steps.empty());
  const double vd = ddp.summary["val_loss"].get<double>(), vs = slim.summary["val_loss"].get<double>();
  EXPECT_LT(vs, 1.05 * vd) << "slim val loss " << vs << " vs ddp " << vd;
  EXPECT_LT(slim.summary["comm_bytes"].get<double>(), 0.5 * ddp.summary["comm_bytes"].get<double>());
  EXPECT_TRUE(slim.summary.value("weights_identical", false));
  EXPECT_TRUE(slim.summary.value("slim_selection_identical", false));
  // α + β(1 − α) = 0.325 of the elements per round; the replicas drift between evaluations and are one model
  // again after each.
  const nlohmann::json& first = slim.steps.front();
  EXPECT_NEAR(first["slim_fraction"].get<double>(), 0.325, 0.001);
  const nlohmann::json& at_eval = slim.steps[99];
  ASSERT_TRUE(at_eval.contains("divergence_max"));
  EXPECT_GT(at_eval["divergence_max"].get<double>(), 0.0);
  EXPECT_GE(at_eval["divergence_max"].get<double>(), at_eval["divergence_mean"].get<double>());
  // The bf16 wire: about half of the fp32 wire's bytes (the full synchronisations before evaluations stay
  // fp32), converging as near, and one model at the end.
  SlimRun half = train(2, args + " --strategy slim --slim-wire bf16", dir, "bf16");
  ASSERT_FALSE(half.steps.empty());
  const double ratio = half.summary["comm_bytes"].get<double>() / slim.summary["comm_bytes"].get<double>();
  EXPECT_GT(ratio, 0.45);
  EXPECT_LT(ratio, 0.56);
  EXPECT_LT(half.summary["val_loss"].get<double>(), 1.05 * vd);
  EXPECT_TRUE(half.summary.value("weights_identical", false));
}

// --slim-apply forward keeps the original order — each block's average applied before the next forward
// reads the block — only the exchange is cut per block and waited for there: every loss and the final
// weights equal `now`'s bit for bit. At 4 ranks in fp32; at 2 in bf16 on the bf16 wire, slim blocks beside
// zero1 ops whose gathers are deferred into the same forward (and whose working copies the step refreshes
// while slim's are refreshed by their blocks' rounds).
TEST(Slim, ApplyForwardIsTheOriginalOrderBitForBit) {
  const std::string dir = test::scratch_dir();
  const std::string args =
      "--model gpt-tiny --data kjv --steps 20 --batch-size 16 --lr 3e-3 --eval-every 0 --eval-rows 64";
  const std::string plan = dir + "/plan.json";
  std::ofstream(plan) << R"({"ops": {"*": {"strategy": "zero1"}, "blocks.*": {"strategy": "slim"}}})";
  for (const auto& [ranks, flags] : std::vector<std::pair<int, std::string>>{
           {4, " --strategy slim"}, {2, " --plan " + plan + " --precision bf16 --slim-wire bf16"}}) {
    const std::string tag = std::to_string(ranks);
    SlimRun now = train(ranks, args + flags + " --slim-apply now", dir, "now" + tag);
    SlimRun forward = train(ranks, args + flags + " --slim-apply forward", dir, "forward" + tag);
    test::expect_same_losses(now, forward, "forward vs now, " + tag + " ranks", 0.0);
    EXPECT_EQ(now.summary["val_loss"], forward.summary["val_loss"]) << tag;
    EXPECT_EQ(now.summary["weights_checksum"], forward.summary["weights_checksum"]) << tag;
    EXPECT_EQ(now.summary["slim_selection_digest"], forward.summary["slim_selection_digest"]) << tag;
    EXPECT_TRUE(forward.summary.value("weights_identical", false)) << tag;
  }
}

TEST(Slim, BadFlagsExit2) {
  const std::string base = test::bin() + " train --model gpt-tiny --data kjv --steps 1 --strategy slim ";
  for (const std::string bad :
       {"--slim-core 0", "--slim-core 1.5", "--slim-explore -0.1", "--slim-period 0", "--slim-refresh 0",
        "--slim-full-sync -1", "--slim-adam global", "--slim-adam corrected --optimizer sgd",
        "--slim-wire fp16", "--slim-apply later"}) {
    auto r = test::run(base + bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.output;
    EXPECT_NE(r.output.find("--slim-"), std::string::npos) << bad << "\n" << r.output;
    EXPECT_EQ(test::count_lines(r.output), 1) << bad << "\n" << r.output;
  }
}

// `--slim-adam corrected`, against DDP's AdamW on synthetic gradients g_r = μ + σ·ε_r: the mean of N ranks'
// corrected steps has DDP's size where noise dominates (each rank's own AdamW is about √N too small there),
// and where there is no noise the corrected step is AdamW's exactly.
namespace {

struct StepSizes {
  double local = 0, corrected = 0, ddp = 0;  // RMS over the last half of the steps of the (mean) update
};

StepSizes step_sizes(double mu, double sigma, int ranks) {
  const int64_t n = 4096, steps = 200;
  at::manual_seed(5);
  auto make = [&](Strategy s) {
    auto p = std::make_unique<ShardedParam>("w", at::zeros({n}), /*decay=*/false);
    p->shard(s, 0, 1);
    return p;
  };
  // One simulated rank set per optimizer; each set's step is the mean of its ranks' updates.
  struct Ranks {
    Optimizer opt;
    std::vector<std::unique_ptr<ShardedParam>> params;
    at::Tensor step;
  };
  OptimConfig c;
  c.weight_decay = 0;
  Optimizer ddp_opt(c);
  Ranks local{Optimizer(c), {}, {}};
  c.slim_ranks = ranks;
  Ranks corrected{Optimizer(c), {}, {}};
  std::unique_ptr<ShardedParam> ddp = make(Strategy::ddp);
  for (int r = 0; r < ranks; ++r)
    local.params.push_back(make(Strategy::slim)), corrected.params.push_back(make(Strategy::slim));
  StepSizes out;
  for (int64_t t = 0; t < steps; ++t) {
    at::Tensor mean_grad = at::zeros({n});
    local.step = at::zeros({n}), corrected.step = at::zeros({n});
    for (int r = 0; r < ranks; ++r) {
      at::Tensor g = at::full({n}, mu) + sigma * at::randn({n});
      mean_grad += g / ranks;
      for (Ranks* set : {&local, &corrected}) {
        ShardedParam& p = *set->params[r];
        p.grad().copy_(g);
        at::Tensor before = p.master().clone();
        set->opt.set_steps_taken(t);  // every rank's optimizer is at step t: they are simulated one by one
        set->opt.step({&p}, 1e-3);
        set->step += (p.master() - before) / ranks;
      }
    }
    ddp->grad().copy_(mean_grad);
    at::Tensor before = ddp->master().clone();
    ddp_opt.step({ddp.get()}, 1e-3);
    if (t >= steps / 2) {
      out.local += local.step.pow(2).mean().item<double>();
      out.corrected += corrected.step.pow(2).mean().item<double>();
      out.ddp += (ddp->master() - before).pow(2).mean().item<double>();
    }
  }
  const double counted = static_cast<double>(steps - steps / 2);
  return {std::sqrt(out.local / counted), std::sqrt(out.corrected / counted), std::sqrt(out.ddp / counted)};
}

}  // namespace

TEST(Slim, CorrectedAdamStepMatchesDdpWhereNoiseDominates) {
  for (int ranks : {2, 4}) {
    const StepSizes s = step_sizes(/*mu=*/0.01, /*sigma=*/1.0, ranks);
    // Measured: local 0.71 / 0.50 of DDP's step, corrected 0.94 / 0.86 at 2 / 4 ranks (a rank's m̂² is noisier
    // than DDP's, so the correction slightly overestimates the second moment).
    EXPECT_GT(s.corrected / s.ddp, 0.8) << ranks << " ranks";
    EXPECT_LT(s.corrected / s.ddp, 1.1) << ranks << " ranks";
    EXPECT_LT(s.local / s.ddp, 1.2 / std::sqrt(ranks)) << ranks << " ranks: the gap being corrected";
  }
  const StepSizes clean = step_sizes(/*mu=*/0.5, /*sigma=*/0.0, 4);
  EXPECT_NEAR(clean.corrected, clean.ddp, 1e-6 * clean.ddp);
  EXPECT_NEAR(clean.local, clean.ddp, 1e-6 * clean.ddp);
}
