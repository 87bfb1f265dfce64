// test_sharding.cpp — ZeRO-1/2/3 per op under mpirun: every strategy and a mixed plan give DDP's losses;
// splits and prefetch change nothing; measured peak memory matches the estimate and orders ddp > zero1 >
// zero2 > zero3; a budget between zero3's and ddp's peak stops ddp and lets zero3 train; bad plans exit 2.
#include <gtest/gtest.h>

#include <array>
#include <fstream>

#include "helpers.h"
#include "slimshard/common.h"
#include "slimshard/plan.h"

using namespace slimshard;

namespace {

using test::expect_same_losses;
using test::train;
using Result = test::TrainRun;

std::string write_plan(const std::string& dir, const std::string& name, const std::string& json) {
  const std::string path = dir + "/" + name;
  write_file_atomic(path, json);
  return path;
}

const std::string kTiny = "--model gpt-tiny --data kjv --steps 20 --batch-size 16 --eval-rows 16";

}  // namespace

TEST(Plan, GlobMatching) {
  EXPECT_TRUE(glob_match("blocks.*.mlp.*", "blocks.3.mlp.fc"));
  EXPECT_TRUE(glob_match("*", "wte"));
  EXPECT_TRUE(glob_match("blocks.?.attn.qkv", "blocks.1.attn.qkv"));
  EXPECT_FALSE(glob_match("blocks.?.attn.qkv", "blocks.12.attn.qkv"));
  EXPECT_FALSE(glob_match("blocks.*.mlp.*", "blocks.3.attn.proj"));
  EXPECT_TRUE(glob_match("*proj", "blocks.0.attn.proj"));
  EXPECT_FALSE(glob_match("wte", "wpe"));
}

TEST(Sharding, EveryStrategyAndMixedPlanEqualDdp) {
  const std::string dir = test::scratch_dir();
  const std::string mixed = write_plan(dir, "mixed.json", R"({"ops": {
      "*": {"strategy": "ddp"},
      "blocks.*.attn.*": {"strategy": "zero3"},
      "blocks.*.mlp.*": {"strategy": "ddp"},
      "w?e": {"strategy": "zero2"},
      "lm_head": {"strategy": "zero1"}}})");
  for (int n : {2, 4}) {
    const Result ddp = train(n, kTiny + " --strategy ddp", dir, "ddp" + std::to_string(n));
    ASSERT_EQ(ddp.code, 0) << ddp.output;
    for (std::string s : {"zero1", "zero2", "zero3"}) {
      const Result r = train(n, kTiny + " --strategy " + s, dir, s + std::to_string(n));
      expect_same_losses(ddp, r, s + " at " + std::to_string(n) + " ranks");
      EXPECT_TRUE(r.summary.value("weights_identical", false)) << s;
    }
    expect_same_losses(ddp, train(n, kTiny + " --plan " + mixed, dir, "mixed" + std::to_string(n)),
                       "mixed plan at " + std::to_string(n) + " ranks");
  }
}

// On one host hybrid sharding is ZeRO: hsdp lays out and communicates as zero3, hsdp2 as zero2.
TEST(Sharding, HybridOnOneHostIsZero) {
  const std::string dir = test::scratch_dir();
  for (auto [hybrid, zero] : {std::pair{"hsdp", "zero3"}, std::pair{"hsdp2", "zero2"}}) {
    const Result h = train(2, kTiny + " --strategy " + hybrid, dir, hybrid);
    const Result z = train(2, kTiny + " --strategy " + zero, dir, zero);
    ASSERT_EQ(h.code, 0) << h.output;
    ASSERT_EQ(z.code, 0) << z.output;
    EXPECT_EQ(h.losses, z.losses) << hybrid;
    EXPECT_EQ(h.summary["comm_bytes"], z.summary["comm_bytes"]) << hybrid;
  }
}

TEST(Sharding, AccumulationWithShardedGradients) {
  const std::string dir = test::scratch_dir();
  const Result ddp = train(2, kTiny + " --strategy ddp", dir, "ddp");
  for (std::string s : {"zero1", "zero2", "zero3"})
    expect_same_losses(ddp, train(2, kTiny + " --strategy " + s + " --micro-batch 2", dir, s + "_accum"),
                       s + " with 4 micro-batches");
}

TEST(Sharding, SplitsAndPrefetchChangeNothing) {
  const std::string dir = test::scratch_dir();
  const Result base = train(2, kTiny + " --strategy zero3", dir, "base");
  ASSERT_EQ(base.code, 0) << base.output;
  for (int k : {2, 4}) {
    const std::string plan =
        write_plan(dir, "split" + std::to_string(k) + ".json",
                   R"({"ops": {"*": {"strategy": "zero3"}, "blocks.*.mlp.*": {"splits": )" +
                       std::to_string(k) + R"(}, "blocks.*.attn.qkv": {"splits": )" + std::to_string(k) +
                       R"(}, "lm_head": {"splits": )" + std::to_string(k) + "}}}");
    expect_same_losses(base, train(2, kTiny + " --plan " + plan, dir, "split" + std::to_string(k)),
                       "splits=" + std::to_string(k));
  }
  for (int k : {0, 2}) {
    const Result r =
        train(2, kTiny + " --strategy zero3 --prefetch " + std::to_string(k), dir, "pf" + std::to_string(k));
    expect_same_losses(base, r, "prefetch " + std::to_string(k));
    // At most K+1 gathered weights live, or the two params (weight, bias) one op holds at once.
    EXPECT_LE(r.summary["prefetch"]["max_live"].get<int>(), std::max(k + 1, 2)) << "prefetch " << k;
  }
  EXPECT_LE(base.summary["prefetch"]["max_live"].get<int>(), 2);
}

TEST(Sharding, PeakMemoryMatchesEstimateAndOrders) {
  const std::string dir = test::scratch_dir();
  for (int n : {2, 4}) {
    std::map<std::string, int64_t> measured;
    for (std::string s : {"ddp", "zero1", "zero2", "zero3"}) {
      const std::string args = "--model gpt-small --batch-size " + std::to_string(4 * n) + " --strategy " + s;
      const Result r = train(n, args + " --data kjv --steps 3 --eval-rows 4", dir, s + std::to_string(n));
      ASSERT_EQ(r.code, 0) << r.output;
      measured[s] = r.summary["peak_bytes"].get<int64_t>();
      const auto estimate = static_cast<int64_t>(test::estimated_peak(args, n, dir, s + std::to_string(n)));
      EXPECT_NEAR(double(measured[s]), double(estimate), 0.10 * double(measured[s]))
          << s << " at " << n << " ranks: measured " << measured[s] << ", estimated " << estimate;
    }
    EXPECT_GT(measured["ddp"], measured["zero1"]) << n;
    EXPECT_GT(measured["zero1"], measured["zero2"]) << n;
    EXPECT_GT(measured["zero2"], measured["zero3"]) << n;
  }
}

// The estimate on shapes unlike gpt-small: wide and shallow with short sequences (the params dominate; the
// transients are whole 4C² blocks), and deep and narrow with long ones (the activations dominate). Within 10
// % of the allocator's peak, and never more than 2 % below it (a plan that "fits" must fit).
TEST(Sharding, EstimateHoldsOnWideShallowAndDeepNarrowShapes) {
  const std::string dir = test::scratch_dir();
  const std::vector<std::string> shapes = {
      "--model gpt --n-layer 1 --n-head 4 --n-embd 512 --seq-len 32 --batch-size 4",
      "--model gpt --n-layer 8 --n-head 2 --n-embd 64 --seq-len 256 --batch-size 8"};
  for (size_t k = 0; k < shapes.size(); ++k)
    for (std::string s : {"ddp", "zero2", "zero3"}) {
      const std::string args = shapes[k] + " --strategy " + s, tag = s + std::to_string(k);
      const Result r = train(2, args + " --data kjv --steps 3 --eval-rows 4", dir, tag);
      ASSERT_EQ(r.code, 0) << r.output;
      const double measured = r.summary["peak_bytes"].get<double>();
      const double estimate = test::estimated_peak(args, 2, dir, tag);
      EXPECT_LE(estimate, 1.10 * measured) << shapes[k] << " " << s << ": measured " << measured;
      EXPECT_GE(estimate, 0.98 * measured) << shapes[k] << " " << s << ": estimated " << estimate;
    }
}

// Mixed plans where a fused group of small gradients (fc2's, at most --fuse-kib) meets a neighbour of another
// strategy: the moment of packing (the gradients beside the packed buffers) and the gathered weight's release
// are what the estimate has to see. The MLP's estimate is exact to a few KiB here; within 2 % either way.
// One moment is timing-dependent: when fc2 is zero3, its gathered weight and full gradient are still held at
// fc1's backward (the estimate's moment) only if the comm thread has not yet reduce-scattered that gradient;
// when it has, the peak is lower by up to those two tensors (zero2 · zero3 · zero1 measured 4,035,476 or
// 3,562,388 B run to run, 2026-12-06; estimated 4,057,060). The estimate takes the later, and may be above
// the measured peak by that much more, never below it.
TEST(Sharding, EstimateHoldsOnMixedPlansAroundAFusedGroup) {
  const std::string dir = test::scratch_dir();
  for (const auto& [fc1, fc2, fc3] : std::vector<std::array<std::string, 3>>{
           {"zero1", "zero2", "ddp"}, {"ddp", "zero3", "ddp"}, {"zero2", "zero3", "zero1"}}) {
    const std::string tag = fc1 + "_" + fc2 + "_" + fc3;
    const std::string args =
        "--model mlp --batch-size 64 --plan " + test::write_mlp_plan(dir, tag, fc1, fc2, fc3);
    const Result r = train(2, args + " --data fashion-mnist --steps 3 --eval-rows 64", dir, tag);
    ASSERT_EQ(r.code, 0) << r.output;
    const double measured = r.summary["peak_bytes"].get<double>();
    const double estimate = test::estimated_peak(args, 2, dir, tag);
    const double fc2_bytes = (256.0 * 256 + 256) * 4, in_flight = fc2 == "zero3" ? 2 * fc2_bytes : 0;
    EXPECT_GE(estimate, 0.98 * measured) << tag;
    EXPECT_LE(estimate, 1.02 * measured + in_flight) << tag;
  }
}

TEST(Sharding, BudgetStopsDdpButNotZero3) {
  const std::string dir = test::scratch_dir();
  const std::string args = "--model gpt-small --data kjv --steps 2 --batch-size 8 --eval-rows 4";
  const Result ddp = train(2, args + " --strategy ddp", dir, "ddp");
  const Result z3 = train(2, args + " --strategy zero3", dir, "z3");
  ASSERT_EQ(ddp.code, 0) << ddp.output;
  ASSERT_EQ(z3.code, 0) << z3.output;
  const int64_t limit =
      (ddp.summary["peak_bytes"].get<int64_t>() + z3.summary["peak_bytes"].get<int64_t>()) / 2;
  const std::string budget = " --mem-limit " + std::to_string(limit);
  const Result ddp_limited = train(2, args + " --strategy ddp" + budget, dir, "ddp_limited");
  EXPECT_EQ(ddp_limited.code, 1) << ddp_limited.output;
  EXPECT_NE(ddp_limited.output.find("memory limit exceeded "), std::string::npos) << ddp_limited.output;
  const Result z3_limited = train(2, args + " --strategy zero3" + budget, dir, "z3_limited");
  EXPECT_EQ(z3_limited.code, 0) << z3_limited.output;
}

TEST(Sharding, BadPlansExit2NamingTheEntry) {
  const std::string dir = test::scratch_dir();
  auto expect_bad = [&](const std::string& json, const std::string& needle) {
    const std::string plan = write_plan(dir, "bad.json", json);
    auto r = test::run(test::bin() + " train --model gpt-tiny --data kjv --steps 1 --plan " + plan);
    EXPECT_EQ(r.code, 2) << json << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << json << "\n" << r.output;
  };
  expect_bad(R"({"ops": {"blocks.*.mlp.fcc": {"strategy": "zero3"}}})", "'blocks.*.mlp.fcc' matches no op");
  expect_bad(R"({"ops": {"wte": {"strategy": "zero4"}}})", "unknown strategy 'zero4'");
  expect_bad(R"({"ops": {"lm_head": {"splits": 3}}})", "splits=3 does not divide the 256 output features");
  expect_bad(R"({"ops": {"ln_f": {"splits": 2}}})", "splits apply to linear ops");
  expect_bad(R"({"ops": {"wte": {"strategy": "zero3", "shards": 2}}})", "unknown field 'shards'");
  expect_bad(R"({"ops": {"wte": )", "not valid JSON");
  expect_bad(R"({"world": 8, "ops": {}})", "made for 8 ranks");
  auto missing = test::run(test::bin() + " train --model gpt-tiny --data kjv --plan " + dir + "/absent.json");
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.output.find("absent.json"), std::string::npos);
}
