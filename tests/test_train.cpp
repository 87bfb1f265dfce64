// test_train.cpp — the training loop in-process: determinism from the seed, gradient accumulation equal to a
// larger batch, and learning on real data.
#include <gtest/gtest.h>

#include "helpers.h"
#include "slimshard/comm.h"
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
