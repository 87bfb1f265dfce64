// test_train.cpp — the training loop in-process: determinism from the seed, gradient accumulation equal to a
// larger batch, and learning on real data; the optimizer's fused AdamW pass against its op-by-op form.
#include <gtest/gtest.h>

#include "helpers.h"
#include "slimshard/comm.h"
#include "slimshard/optim.h"
#include "slimshard/sharded_param.h"
#include "slimshard/train.h"

using namespace slimshard;

namespace {

TrainSummary train(const TrainOptions& o) {
  auto comm = Communicator::create({});  // a world of one: the test is not under mpirun
  return slimshard::train(o, *comm);
}

TrainOptions tiny(int64_t steps) {
  TrainOptions o;
  o.model = ModelConfig::preset_config("gpt-tiny");
  o.data.spec = "kjv";
  o.data.eval_rows = 16;
  o.steps = steps;
  o.batch_size = 8;
  o.lr = 3e-3;
  o.log_every = 1000;
  return o;
}

}  // namespace

TEST(Train, SameSeedSameLossesDifferentSeedDifferent) {
  TrainOptions o = tiny(6);
  auto a = train(o).losses;
  auto b = train(o).losses;
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);  // bit for bit
  o.seed += 1;
  auto c = train(o).losses;
  EXPECT_NE(a, c);
}

TEST(Train, GradientAccumulationEqualsLargerBatch) {
  TrainOptions o = tiny(8);
  o.optim.name = "sgd";  // AdamW's normalisation would hide a wrong gradient scale; SGD shows it
  o.lr = 0.5;
  auto whole = train(o).losses;
  o.micro_batch = 2;  // 4 micro-batches of 2
  auto accum = train(o).losses;
  ASSERT_EQ(whole.size(), accum.size());
  for (size_t i = 0; i < whole.size(); ++i)
    EXPECT_NEAR(accum[i], whole[i], 1e-5 * whole[i]) << "step " << i + 1;
  EXPECT_LT(whole.back(), whole.front());  // it learns
}

// AdamW's one pass (adamw_kernel.h) against torch.optim.AdamW's op-by-op form written out in LibTorch, over
// three steps, one with the clipping's factor: masters and moments equal to the last bit; in bf16 the working
// copy the pass writes is, bit for bit, the cast of the new masters; the gradient is left zeroed; and once
// that copy has been taken as refreshed, a later change of the masters (a checkpoint, a Slim-DP round) is
// copied again.
TEST(Optim, FusedAdamWMatchesOpByOpAndWritesTheWorkingCopy) {
  for (Strategy s : {Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3}) {
    for (at::ScalarType compute : {at::kFloat, at::kBFloat16}) {
      const std::string what = std::string(strategy_name(s)) + " " + float_type_name(compute);
      at::manual_seed(1);
      ShardedParam p("w", at::randn({37, 5}), /*decay=*/true);
      p.shard(s, 0, 1, compute);
      const OptimConfig c;
      Optimizer opt(c);
      opt.init_state({&p});
      at::Tensor w = p.master().clone(), m = at::zeros_like(w), v = at::zeros_like(w);
      const double lr = 1e-2;
      for (int t = 1; t <= 3; ++t) {
        const at::Tensor g = at::randn(w.sizes());
        p.grad().copy_(g);
        const double scale = t == 2 ? 0.37 : 1.0;
        opt.step({&p}, lr, scale);
        const at::Tensor gs = g * scale;
        m.mul_(c.beta1).add_(gs, 1.0 - c.beta1);
        v.mul_(c.beta2).addcmul_(gs, gs, 1.0 - c.beta2);
        w.mul_(1.0 - lr * c.weight_decay);
        const double bc1 = 1.0 - std::pow(c.beta1, t), bc2 = 1.0 - std::pow(c.beta2, t);
        w.addcdiv_(m, v.sqrt().div_(std::sqrt(bc2)).add_(c.eps), -lr / bc1);
        // Within a few ulps of the largest element: LibTorch's add_ with alpha rounds once (a fused
        // multiply-add), the pass twice, and m's two terms can cancel.
        const auto near = [](const at::Tensor& a, const at::Tensor& b) {
          return (a - b).abs().max().item<float>() <= 5e-7f * b.abs().max().item<float>();
        };
        EXPECT_TRUE(near(p.master(), w)) << what << " step " << t;
        EXPECT_TRUE(near(p.optim_state()["exp_avg"], m)) << what << " step " << t;
        EXPECT_TRUE(near(p.optim_state()["exp_avg_sq"], v)) << what << " step " << t;
        EXPECT_EQ(p.grad().abs().max().item<float>(), 0.0f) << what << ": the gradient is left zeroed";
        p.refresh_working();
        const at::Tensor work = p.working_of_master();
        ASSERT_EQ(work.defined(), compute == at::kBFloat16) << what;
        if (work.defined()) {
          EXPECT_TRUE(at::equal(work, p.master().to(at::kBFloat16))) << what << " step " << t;
        }
      }
      if (compute != at::kBFloat16) continue;
      p.master().add_(0.25);
      p.refresh_working();
      EXPECT_TRUE(at::equal(p.working_of_master(), p.master().to(at::kBFloat16))) << what << ": copied again";
    }
  }
}
