// test_ddp.cpp — data-parallel training under mpirun: 1 vs 2 vs 4 ranks give the same losses and weights,
// ranks end bit-identical, gradient accumulation across ranks equals one large batch, and the watchdog turns
// a stalled or dead rank into a non-zero exit instead of a hang.
#include <gtest/gtest.h>

#include <chrono>

#include "helpers.h"
#include "slimshard/ckpt.h"

using namespace slimshard;

namespace {

using test::mpirun;
using test::train;
using test::TrainRun;

void expect_same_training(const TrainRun& a, const TrainRun& b, const std::string& what) {
  test::expect_same_losses(a, b, what);
  test::expect_same_weights(a, b, what);
}

void check_equivalence(const std::string& args) {
  const std::string dir = test::scratch_dir();
  TrainRun one = train(1, args, dir, "n1", true);
  TrainRun two = train(2, args, dir, "n2", true);
  TrainRun four = train(4, args, dir, "n4", true);
  TrainRun accum = train(2, args + " --micro-batch 2", dir, "n2_accum", true);
  expect_same_training(one, two, "2 ranks vs 1");
  expect_same_training(one, four, "4 ranks vs 1");
  expect_same_training(one, accum, "2 ranks x 4 micro-batches vs 1 rank x 1");
  for (const TrainRun* r : {&two, &four, &accum}) {
    EXPECT_TRUE(r->summary.value("weights_identical", false)) << "ranks diverged";
    EXPECT_GT(r->summary.value("comm_bytes", 0), 0);
  }
  EXPECT_EQ(one.summary.value("comm_bytes", -1), 0);
}

}  // namespace

TEST(Ddp, GptTinySameAt1And2And4Ranks) {
  check_equivalence("--model gpt-tiny --data kjv --steps 20 --batch-size 16 --eval-rows 16");
}

TEST(Ddp, MlpSameAt1And2And4Ranks) {
  check_equivalence("--model mlp --data fashion-mnist --steps 20 --batch-size 16 --lr 2e-3 --eval-rows 512");
}

TEST(Ddp, MpiBackendMatchesSharedMemory) {
  const std::string dir = test::scratch_dir();
  const std::string args = "--model gpt-tiny --data kjv --steps 10 --batch-size 8 --eval-rows 8";
  TrainRun shm = train(2, args + " --comm-backend shm", dir, "shm", true);
  TrainRun mpi = train(2, args + " --comm-backend mpi", dir, "mpi", true);
  expect_same_training(shm, mpi, "mpi vs shm");
}

TEST(Ddp, WatchdogEndsAStalledJob) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto r = test::run(mpirun(2) +
                     " train --model gpt-tiny --data kjv --steps 50 --batch-size 8 --comm-timeout 3 "
                     "--fault sleep:1:4");
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_LT(secs, 3 + 30) << "the job must end within the timeout plus a margin";
  EXPECT_NE(r.output.find("[rank 0] watchdog: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("waiting on rank 1"), std::string::npos) << r.output;
}

TEST(Ddp, DeadRankEndsTheJob) {
  using Clock = std::chrono::steady_clock;
  for (const char* fault : {"exit:1:3", "kill:1:3"}) {
    const auto t0 = Clock::now();
    auto r = test::run(mpirun(2) +
                       " train --model gpt-tiny --data kjv --steps 50 --batch-size 8 --comm-timeout 5 "
                       "--fault " +
                       fault);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_NE(r.code, 0) << fault << "\n" << r.output;
    EXPECT_LT(secs, 5 + 30) << fault;
  }
}

TEST(Ddp, BadInputUnderMpirunExits2) {
  auto r = test::run(mpirun(4) + " train --model gpt-tiny --data kjv --steps 2 --batch-size 6");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--batch-size 6 is not divisible by the 4 ranks"), std::string::npos) << r.output;
  auto m = test::run(mpirun(2) + " train --model gpt-tiny --data /nonexistent.txt");
  EXPECT_EQ(m.code, 2) << m.output;
  EXPECT_NE(m.output.find("/nonexistent.txt: no such file"), std::string::npos) << m.output;
}
