// test_recompute.cpp — activation recomputation per GPT block under mpirun: losses and final weights equal
// those without it bit for bit (ddp, zero3, a mixed plan with splits, with accumulation), zero3 sends no
// extra byte; a run saved with recomputation resumes without it bit for bit; the estimate and the measured
// peak fall together; plans and flags that ask for it wrongly exit 2 naming what.
#include <gtest/gtest.h>

#include "helpers.h"
#include "slimshard/common.h"
#include "slimshard/json.h"
#include "slimshard/memory_estimate.h"
#include "slimshard/planner.h"

using namespace slimshard;

namespace {

using test::train;
using Result = test::TrainRun;

const std::string kTiny = "--model gpt-tiny --data kjv --steps 12 --batch-size 8 --eval-rows 16";

std::string write_plan(const std::string& dir, const std::string& name, const std::string& json) {
  const std::string path = dir + "/" + name;
  write_file_atomic(path, json);
  return path;
}

// The same kernels on the same inputs: equal, not close. The bytes too, but for `extra_bytes` per step.
void expect_identical(const Result& want, const Result& got, const std::string& what,
                      int64_t extra_bytes = 0) {
  ASSERT_EQ(want.code, 0) << what << " (reference)\n" << want.output;
  ASSERT_EQ(got.code, 0) << what << "\n" << got.output;
  EXPECT_EQ(want.losses, got.losses) << what;
  test::expect_same_weights(want, got, what, 0.0);
  ASSERT_EQ(want.steps.size(), got.steps.size()) << what;
  for (size_t i = 0; i < want.steps.size(); ++i)
    EXPECT_EQ(want.steps[i]["comm_bytes"].get<int64_t>() + extra_bytes,
              got.steps[i]["comm_bytes"].get<int64_t>())
        << what << ", step " << i + 1;
}

}  // namespace

TEST(Recompute, EqualsNoRecomputeBitForBit) {
  const std::string dir = test::scratch_dir();
  // Blocks 0 and 1 under different strategies, one recomputed; zero3 with splits inside the recomputed one.
  const std::string mixed = write_plan(dir, "mixed.json", R"({"ops": {
      "*": {"strategy": "zero2"},
      "blocks.0.*": {"strategy": "zero3", "recompute": true},
      "blocks.0.mlp.*": {"splits": 2},
      "blocks.1.*": {"strategy": "ddp"},
      "lm_head": {"strategy": "zero3"}}})");
  const std::string plain = write_plan(dir, "plain.json", R"({"ops": {
      "*": {"strategy": "zero2"},
      "blocks.0.*": {"strategy": "zero3"},
      "blocks.0.mlp.*": {"splits": 2},
      "blocks.1.*": {"strategy": "ddp"},
      "lm_head": {"strategy": "zero3"}}})");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ddp", "--strategy ddp"},
      {"zero3", "--strategy zero3"},
      {"zero3-accum", "--strategy zero3 --micro-batch 2 --prefetch 2"},
      {"zero3-nofuse", "--strategy zero3 --fuse-kib 0 --prefetch 0"}};
  // zero3 gathers a recomputed block's weights once for its recomputed forward and its backward. Its biases,
  // which backward does not need, are gathered again for that forward: one fused collective per block with
  // the weights by default; unfused, their bytes show (gpt-tiny: 9·64 bias elements per block, 2 blocks,
  // fp32, a rank sending half of each gather).
  const int64_t unfused_biases = 2 * 9 * 64 * 4 / 2;
  for (const auto& [tag, args] : cases) {
    const Result base = train(2, kTiny + " " + args + " --recompute none", dir, tag + "-none", true);
    const Result rc = train(2, kTiny + " " + args + " --recompute all", dir, tag + "-all", true);
    expect_identical(base, rc, tag, tag == "zero3-nofuse" ? unfused_biases : 0);
    EXPECT_LT(rc.summary["peak_bytes"].get<int64_t>(), base.summary["peak_bytes"].get<int64_t>()) << tag;
  }
  expect_identical(train(2, kTiny + " --plan " + plain, dir, "plain", true),
                   train(2, kTiny + " --plan " + mixed, dir, "mixed", true), "mixed plan");
}

TEST(Recompute, CheckpointResumesWithoutIt) {
  const std::string dir = test::scratch_dir(), ck = dir + "/ck";
  const std::string args = kTiny + " --strategy zero3 --save-every 6 --ckpt-dir ";
  const Result full = train(2, args + dir + "/ck-full --recompute none", dir, "full", true);
  const Result a = train(2, args + ck + " --recompute all --exit-after-steps 6", dir, "a", true);
  const Result b = train(2, args + ck + " --recompute none --resume " + ck, dir, "b", true);
  ASSERT_EQ(a.code, 0) << a.output;
  ASSERT_EQ(b.code, 0) << b.output;
  std::vector<double> joined = a.losses;
  joined.insert(joined.end(), b.losses.begin(), b.losses.end());
  EXPECT_EQ(joined, full.losses);
  test::expect_same_weights(full, b, "resumed", 0.0);
}

TEST(Recompute, PlansAndFlagsSayWhatIsWrong) {
  const std::string dir = test::scratch_dir();
  const std::string half =
      write_plan(dir, "half.json", R"({"ops": {"blocks.0.attn.*": {"recompute": true}}})");
  test::expect_usage_error("train " + kTiny + " --plan " + half, "recompute is per block");
  const std::string outside = write_plan(dir, "outside.json", R"({"ops": {"lm_head": {"recompute": true}}})");
  test::expect_usage_error("train " + kTiny + " --plan " + outside, "lm_head is not in one");
  const std::string typed = write_plan(dir, "typed.json", R"({"ops": {"*": {"recompute": "yes"}}})");
  test::expect_usage_error("train " + kTiny + " --plan " + typed, "recompute must be true or false");
  test::expect_usage_error("memory --model mlp --recompute all", "no blocks to recompute");
  test::expect_usage_error("train " + kTiny + " --recompute some", "--recompute");
}

// gpt-small at T=128, 2 ranks: the estimate (a probe run with the same blocks recomputing) against the
// allocator's peak in training, with and without recomputation, for ddp, zero3 and half the blocks.
TEST(Recompute, PeakFallsAsEstimated) {
  const std::string dir = test::scratch_dir();
  const std::string half = write_plan(dir, "half.json", R"({"ops": {"*": {"strategy": "zero3"},
      "blocks.0.*": {"recompute": true}, "blocks.1.*": {"recompute": true}}})");
  const std::string shape = "--model gpt-small --batch-size 16";
  auto estimate = [&](const std::string& args, const std::string& tag) {
    const std::string json = dir + "/" + tag + "-estimate.json";
    const auto r = test::run(test::bin() + " memory --world 2 " + shape + " " + args + " --json " + json);
    EXPECT_EQ(r.code, 0) << r.output;
    return parse_json(read_file(json, "estimate"), json)["peak_bytes"].get<int64_t>();
  };
  auto measured = [&](const std::string& args, const std::string& tag) {
    const Result r = train(2, shape + " --data kjv --steps 2 --eval-rows 8 " + args, dir, tag);
    EXPECT_EQ(r.code, 0) << r.output;
    return r.code == 0 ? r.summary["peak_bytes"].get<int64_t>() : int64_t{0};
  };
  for (const std::string s : {"ddp", "zero3"}) {
    const int64_t est_none = estimate("--strategy " + s + " --recompute none", s + "-none");
    const int64_t est_all = estimate("--strategy " + s + " --recompute all", s + "-all");
    const int64_t got_none = measured("--strategy " + s + " --recompute none", s + "-none");
    const int64_t got_all = measured("--strategy " + s + " --recompute all", s + "-all");
    const double predicted_saving = static_cast<double>(est_none - est_all);
    const double saving = static_cast<double>(got_none - got_all);
    EXPECT_GT(predicted_saving, 0.25 * static_cast<double>(est_none)) << s;  // activations dominate here
    EXPECT_NEAR(saving, predicted_saving, 0.1 * predicted_saving) << s;
    for (auto [est, got] : {std::pair{est_none, got_none}, std::pair{est_all, got_all}})
      EXPECT_NEAR(static_cast<double>(est), static_cast<double>(got), 0.1 * static_cast<double>(got)) << s;
  }
  const int64_t est_half = estimate("--plan " + half, "half"), got_half = measured("--plan " + half, "half");
  EXPECT_NEAR(static_cast<double>(est_half), static_cast<double>(got_half),
              0.1 * static_cast<double>(got_half));
}
