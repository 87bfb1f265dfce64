// test_precision.cpp — mixed precision (--precision bf16): bf16 training tracks fp32 within what bf16's
// rounding allows, at 1, 2 and 4 ranks; every strategy, a mixed plan with splits and Slim-DP in bf16 track
// bf16 DDP; zero3's gathers (and, with --reduce-dtype bf16, its reductions) carry exactly half of fp32's
// bytes; the memory estimate in bf16 holds; a bf16 checkpoint resumes bit for bit and loads into an fp32
// run; export writes bf16 on request; a profile or plan of another precision is refused.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>

#include "helpers.h"
#include "slimshard/ckpt.h"
#include "slimshard/common.h"

using namespace slimshard;

namespace {

using test::train;
using TRun = test::TrainRun;

const std::string kTiny = "--model gpt-tiny --data kjv --batch-size 16 --eval-rows 16";

// How far a bf16 run's loss may be from the fp32 run's, relative. bf16 keeps 8 significant bits: every GEMM
// input is rounded to within 2^-9 relatively. The loss is a mean over 1,024 tokens of log-softmaxes of
// logits that carry a few such roundings each, and the weights after a step differ by what the bf16
// gradients changed in the update; over 50 steps the measured drift is ~0.06 % (gpt-tiny) — the bound is two
// bf16 ulps at 1.0, 2^-7 = 0.78 %: a model that stopped learning, or ran in fp32, would not be caught by it,
// so the tests also check that bf16 changed the losses at all.
constexpr double kBf16Rel = 1.0 / 128;

double max_rel_diff(const TRun& a, const TRun& b) {
  double m = 0;
  for (size_t i = 0; i < std::min(a.losses.size(), b.losses.size()); ++i)
    m = std::max(m, std::abs(a.losses[i] - b.losses[i]) / std::abs(a.losses[i]));
  return m;
}

nlohmann::json by_kind(const TRun& r) { return r.summary.at("comm_bytes_by_kind"); }

std::string write_text(const std::string& path, const std::string& text) {
  write_file_atomic(path, text);
  return path;
}

}  // namespace

TEST(Precision, Bf16TracksFp32AndMoreRanksTrackOneRank) {
  const std::string dir = test::scratch_dir();
  const std::string args = kTiny + " --steps 50";
  const TRun fp32 = train(1, args, dir, "fp32");
  const TRun bf16 = train(1, args + " --precision bf16", dir, "bf16");
  ASSERT_EQ(fp32.code, 0) << fp32.output;
  ASSERT_EQ(bf16.code, 0) << bf16.output;
  ASSERT_EQ(bf16.losses.size(), 50u);
  EXPECT_EQ(bf16.summary.value("precision", ""), "bf16");
  EXPECT_GT(max_rel_diff(fp32, bf16), 0.0) << "bf16 changed nothing: did it run in fp32?";
  EXPECT_LE(max_rel_diff(fp32, bf16), kBf16Rel);
  EXPECT_LT(bf16.losses.back(), 0.75 * bf16.losses.front()) << "bf16 did not learn";
  for (int n : {2, 4}) {
    const TRun r = train(n, args + " --precision bf16", dir, "bf16-" + std::to_string(n));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_LE(max_rel_diff(bf16, r), kBf16Rel) << n << " ranks";
    EXPECT_TRUE(r.summary.value("weights_identical", false)) << n << " ranks";
  }
}

// In bf16 every strategy computes on the same bf16 copies of the same fp32 masters and reduces fp32
// gradients: what differs from DDP is only the order of fp32 additions, as in fp32 (where they agree to
// 1e-5). Split linears run smaller GEMMs, which may block their accumulation differently: 1e-4.
TEST(Precision, EveryStrategyMixedPlanAndSlimTrackBf16Ddp) {
  const std::string dir = test::scratch_dir();
  const std::string bf16 = " --steps 20 --precision bf16";
  const TRun ddp = train(2, kTiny + bf16 + " --strategy ddp", dir, "ddp");
  ASSERT_EQ(ddp.code, 0) << ddp.output;
  for (std::string s : {"zero1", "zero2", "zero3"}) {
    const TRun r = train(2, kTiny + bf16 + " --strategy " + s, dir, s);
    test::expect_same_losses(ddp, r, s + " in bf16", 1e-4);
    EXPECT_TRUE(r.summary.value("weights_identical", false)) << s;
  }
  const std::string plan = write_text(dir + "/mixed.json", R"({"ops": {"*": {"strategy": "ddp"},
      "blocks.*.attn.*": {"strategy": "zero3", "splits": 2}, "blocks.*.mlp.fc": {"strategy": "zero2", "splits": 4},
      "w?e": {"strategy": "zero1"}, "lm_head": {"strategy": "zero3", "splits": 2}}})");
  test::expect_same_losses(ddp, train(2, kTiny + bf16 + " --plan " + plan, dir, "mixed"),
                           "mixed plan with splits in bf16", 1e-4);
  // Slim-DP at α = 1, τ = 1 with plain SGD averages what DDP averages (test_slim.cpp); in bf16 too, with its
  // anchor and signal in fp32.
  const std::string sgd = " --optimizer sgd --momentum 0 --clip 0 --lr 0.05";
  const TRun sgd_ddp = train(2, kTiny + bf16 + sgd + " --strategy ddp", dir, "sgd-ddp");
  const TRun slim = train(2, kTiny + bf16 + sgd + " --strategy slim --slim-core 1", dir, "slim");
  test::expect_same_losses(sgd_ddp, slim, "slim alpha=1 in bf16", 1e-4);
  EXPECT_TRUE(slim.summary.value("weights_identical", false));
}

TEST(Precision, Zero3Bf16SendsHalfTheBytes) {
  const std::string dir = test::scratch_dir();
  const std::string args = kTiny + " --steps 5 --strategy zero3";
  const TRun fp32 = train(2, args, dir, "fp32");
  const TRun bf16 = train(2, args + " --precision bf16", dir, "bf16");
  const TRun both = train(2, args + " --precision bf16 --reduce-dtype bf16", dir, "both");
  for (const TRun* r : {&fp32, &bf16, &both}) ASSERT_EQ(r->code, 0) << r->output;
  // DDP runs the same setup and end-of-run gathers (a few int64 and fp64 scalars) and no weight gathers.
  const TRun ddp = train(2, kTiny + " --steps 5 --precision bf16", dir, "ddp");
  const TRun ddp16 = train(2, kTiny + " --steps 5 --precision bf16 --reduce-dtype bf16", dir, "ddp16");
  ASSERT_EQ(ddp.code, 0) << ddp.output;
  ASSERT_EQ(ddp16.code, 0) << ddp16.output;
  const int64_t scalars = by_kind(ddp).at("all_gather");
  const int64_t gathers = by_kind(fp32).at("all_gather").get<int64_t>() - scalars;
  const int64_t scatters = by_kind(fp32).at("reduce_scatter");
  ASSERT_GT(gathers, 0);
  ASSERT_GT(scatters, 0);
  // Weights travel in bf16: half the gathered bytes; gradients in fp32 unless --reduce-dtype bf16.
  EXPECT_EQ(2 * (by_kind(bf16).at("all_gather").get<int64_t>() - scalars), gathers);
  EXPECT_EQ(by_kind(bf16).at("reduce_scatter").get<int64_t>(), scatters);
  EXPECT_EQ(2 * (by_kind(both).at("all_gather").get<int64_t>() - scalars), gathers);
  EXPECT_EQ(2 * by_kind(both).at("reduce_scatter").get<int64_t>(), scatters);
  // A bf16 wire rounds each gradient once: still learning, close to the fp32 reduction.
  EXPECT_LE(max_rel_diff(bf16, both), kBf16Rel);
  // DDP with a bf16 wire: half of the all-reduce's bytes.
  // (Not exactly: the loss's all-reduce each step and the evaluation's stay fp64.)
  EXPECT_NEAR(2.0 * by_kind(ddp16).at("all_reduce").get<double>(),
              by_kind(ddp).at("all_reduce").get<double>(),
              0.01 * by_kind(ddp).at("all_reduce").get<double>());
}

// The estimate knows the bf16 layout (fp32 masters, bf16 working copies, bf16 gathers) and the probe runs the
// model in bf16: within 10 % of the allocator's peak on gpt-small, and never more than 2 % below it.
TEST(Precision, Bf16MemoryEstimateHolds) {
  const std::string dir = test::scratch_dir();
  for (std::string s : {"ddp", "zero2", "zero3"}) {
    const std::string args = "--model gpt-small --batch-size 8 --precision bf16 --strategy " + s;
    const TRun r = train(2, args + " --data kjv --steps 3 --eval-rows 4", dir, s);
    ASSERT_EQ(r.code, 0) << r.output;
    const double measured = r.summary["peak_bytes"].get<double>();
    const double estimate = test::estimated_peak(args, 2, dir, s);
    EXPECT_LE(estimate, 1.10 * measured) << s << ": measured " << measured;
    EXPECT_GE(estimate, 0.98 * measured) << s << ": estimated " << estimate;
  }
}

// With a bf16 wire, a gradient's backward temporaries (the bf16 weight-gradient GEMM's output) and its
// hand-over's (the bf16 copy, the slice it lands in, a fused group's packed buffers) never coexist: the
// estimate pairs each with the activations of its own part of the op's backward (OpMoments::bwd_tail); added
// up, they had put the MLP's zero1 and zero2 estimates 5-12 % above the peak. The peak itself depends on how
// far the comm thread is behind (the estimate takes it as far behind as the engine lets it be): seen exact to
// 7 % below the estimate from run to run, so this holds the goal — within 10 %, never more than 2 % below,
// over 20 steps — on every strategy, zero3 included (whose comm thread once added a 4-byte copy of each
// reduced slice: 2.2 % above the estimate in 1 run of 16).
TEST(Precision, Bf16WireEstimateHoldsOnMixedPlans) {
  const std::string dir = test::scratch_dir();
  for (const auto& [fc1, fc2, fc3] : std::vector<std::array<std::string, 3>>{{"zero1", "zero1", "zero1"},
                                                                             {"zero2", "zero2", "zero2"},
                                                                             {"zero3", "zero3", "zero3"},
                                                                             {"zero1", "zero2", "ddp"}}) {
    const std::string tag = fc1 + "_" + fc2 + "_" + fc3;
    const std::string args = "--model mlp --batch-size 64 --precision bf16 --reduce-dtype bf16 --plan " +
                             test::write_mlp_plan(dir, tag, fc1, fc2, fc3);
    const TRun r = train(2, args + " --data fashion-mnist --steps 20 --eval-rows 64", dir, tag);
    ASSERT_EQ(r.code, 0) << r.output;
    const double measured = r.summary["peak_bytes"].get<double>();
    const double estimate = test::estimated_peak(args, 2, dir, tag);
    EXPECT_LE(estimate, 1.10 * measured) << tag << ": measured " << measured;
    EXPECT_GE(estimate, 0.98 * measured) << tag << ": estimated " << estimate;
  }
}

// fp32 masters are what a checkpoint holds: a bf16 run resumes bit for bit (its working copies are a function
// of the masters), and an fp32 run loads the same checkpoint.
TEST(Precision, Bf16CheckpointResumesBitForBitAndLoadsIntoFp32) {
  const std::string dir = test::scratch_dir(), ck = dir + "/ck", ck_full = dir + "/ck-full";
  const std::string args = kTiny + " --steps 20 --precision bf16 --strategy zero3 --save-every 5 --ckpt-dir ";
  const TRun full = train(2, args + ck_full, dir, "full");
  const TRun a = train(2, args + ck + " --exit-after-steps 10", dir, "a");
  const TRun b = train(2, args + ck + " --resume " + ck, dir, "b");
  for (const TRun* r : {&full, &a, &b}) ASSERT_EQ(r->code, 0) << r->output;
  ASSERT_EQ(a.losses.size() + b.losses.size(), full.losses.size());
  for (size_t i = 0; i < b.losses.size(); ++i)
    EXPECT_EQ(b.losses[i], full.losses[10 + i]) << "step " << 11 + i;
  // The same checkpoint in fp32 at 1 rank with DDP: it loads, and its first loss is the bf16 run's within
  // bf16's rounding.
  const TRun c = train(1, kTiny + " --steps 20 --resume " + ck + "/step-00000010", dir, "c");
  ASSERT_EQ(c.code, 0) << c.output;
  ASSERT_FALSE(c.losses.empty());
  EXPECT_NEAR(c.losses[0], full.losses[10], kBf16Rel * full.losses[10]);
  // export --dtype bf16: the fp32 masters rounded to bf16.
  auto e32 = test::run(test::bin() + " export " + ck_full + " " + dir + "/w32.safetensors");
  auto e16 = test::run(test::bin() + " export " + ck_full + " " + dir + "/w16.safetensors --dtype bf16");
  ASSERT_EQ(e32.code, 0) << e32.output;
  ASSERT_EQ(e16.code, 0) << e16.output;
  const SafeTensorsFile w32 = load_safetensors(dir + "/w32.safetensors");
  const SafeTensorsFile w16 = load_safetensors(dir + "/w16.safetensors");
  ASSERT_EQ(w32.tensors.size(), w16.tensors.size());
  for (size_t i = 0; i < w32.tensors.size(); ++i) {
    EXPECT_EQ(w16.tensors[i].second.scalar_type(), at::kBFloat16) << w16.tensors[i].first;
    EXPECT_TRUE(w16.tensors[i].second.equal(w32.tensors[i].second.to(at::kBFloat16))) << w16.tensors[i].first;
  }
}

TEST(Precision, ProfilesAndPlansOfAnotherPrecisionAreRefused) {
  const std::string dir = test::scratch_dir();
  const std::string profile = dir + "/p16.json";
  auto r = test::run(test::mpirun(2) +
                     " profile --model gpt-tiny --micro-batch 4 --repeats 1 --precision bf16 "
                     "--out " +
                     profile);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(read_file(profile, "test"))["precision"]["compute"], "bf16");
  // A plan made from it says bf16; planning for fp32 from it is refused, naming the profile.
  r = test::run(test::bin() + " plan --model gpt-tiny --batch-size 8 --profile " + profile + " --out " + dir +
                "/plan32.json");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(test::last_line(r.output).find("taken in bf16"), std::string::npos) << r.output;
  r = test::run(test::bin() + " plan --model gpt-tiny --batch-size 8 --precision bf16 --profile " + profile +
                " --out " + dir + "/plan16.json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(read_file(dir + "/plan16.json", "test"))["precision"], "bf16");
  const TRun ok = train(2,
                        "--model gpt-tiny --data kjv --steps 2 --batch-size 8 --eval-rows 8 --precision bf16 "
                        "--plan " +
                            dir + "/plan16.json",
                        dir, "ok");
  EXPECT_EQ(ok.code, 0) << ok.output;
  // Training fp32 under a bf16 plan: exit 2 naming the plan.
  const std::string hand =
      write_text(dir + "/hand.json", R"({"precision": "bf16", "ops": {"*": {"strategy": "zero3"}}})");
  test::expect_usage_error("train --model gpt-tiny --data kjv --steps 2 --batch-size 8 --plan " + hand,
                           "made for precision bf16");
  test::expect_usage_error("train --model gpt-tiny --data kjv --precision fp16", "--precision");
  test::expect_usage_error("train --model gpt-tiny --data kjv --reduce-dtype int8", "--reduce-dtype");
  const std::string bad =
      write_text(dir + "/bad.json", R"({"precision": "fp8", "ops": {"*": {"strategy": "ddp"}}})");
  test::expect_usage_error("train --model gpt-tiny --data kjv --steps 2 --plan " + bad, "precision");
}
