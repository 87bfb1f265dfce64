// test_sharded_checkpoints.cpp — sharded checkpoints under mpirun: an interrupted and resumed run equals the
// uninterrupted one bit for bit (ddp, zero3); a checkpoint loads at another world size and plan (losses
// within 1e-5); a killed rank ends the job and leaves the last complete checkpoint usable, a half-written one
// ignored; corrupted, truncated, missing or mismatched checkpoints exit 2 naming the file or tensor, and
// nothing is overwritten.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "helpers.h"
#include "slimshard/ckpt.h"

using namespace slimshard;
namespace fs = std::filesystem;

namespace {

using test::mpirun;
using CkptRun = test::TrainRun;

const std::string kArgs =
    "--model gpt-tiny --data kjv --steps 20 --batch-size 8 --eval-every 0 --eval-rows 64";

CkptRun train(int ranks, const std::string& args, const std::string& dir, const std::string& tag) {
  return test::train(ranks, kArgs + " " + args, dir, tag, /*save_weights=*/true);
}

// The first `a.losses.size()` losses of `full`, then `b`'s, against `full`: exact or within `rel`.
void expect_continues(const CkptRun& full, const CkptRun& a, const CkptRun& b, double rel,
                      const std::string& what) {
  std::vector<double> joined = a.losses;
  joined.insert(joined.end(), b.losses.begin(), b.losses.end());
  ASSERT_EQ(joined.size(), full.losses.size()) << what;
  for (size_t i = 0; i < joined.size(); ++i) {
    if (rel == 0)
      EXPECT_EQ(joined[i], full.losses[i]) << what << " step " << i + 1;
    else
      EXPECT_NEAR(joined[i], full.losses[i], rel * full.losses[i]) << what << " step " << i + 1;
  }
  test::expect_same_weights(full, b, what, rel == 0 ? 0.0 : 1e-5);
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(Checkpoint, ResumeIsBitExactDdpZero3AndSlim) {
  const std::string dir = test::scratch_dir();
  // Slim-DP at its defaults: the resumed run must get back each rank's own optimizer state and the agreed
  // signal, core, round count (the explorer's seed) and anchor. A slim save is a full synchronisation, so the
  // uninterrupted run saves on the same schedule (every 5 steps; the interrupted one exits after 10).
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ddp", "--strategy ddp"}, {"zero3", "--strategy zero3"}, {"slim", "--strategy slim --slim-refresh 3"}};
  for (const auto& [tag, st] : cases) {
    const std::string ck = dir + "/ck-" + tag, save = " --save-every 5 --ckpt-dir ";
    CkptRun full = train(2, st + save + dir + "/ck-full-" + tag, dir, tag + "-full");
    ASSERT_EQ(full.code, 0) << full.output;
    CkptRun a = train(2, st + save + ck + " --exit-after-steps 10", dir, tag + "-a");
    ASSERT_EQ(a.code, 0) << a.output;
    EXPECT_EQ(a.losses.size(), 10u);
    EXPECT_EQ(latest_checkpoint(ck), ck + "/step-00000010");
    EXPECT_TRUE(fs::exists(ck + "/step-00000005/index.json"));
    CkptRun b = train(2, st + save + ck + " --resume " + ck, dir, tag + "-b");
    ASSERT_EQ(b.code, 0) << b.output;
    EXPECT_NE(b.output.find("resumed from " + ck + "/step-00000010"), std::string::npos) << b.output;
    expect_continues(full, a, b, 0, tag + " resumed at step 10");
    if (tag != "slim") continue;
    EXPECT_NE(b.output.find("Slim-DP state restored"), std::string::npos) << b.output;
    // Saved with the default order (forward), resumed waiting for each round whole (now): the same values bit
    // for bit, so the state is taken and the run continues exactly.
    CkptRun n = train(2, st + save + dir + "/ck-now --resume " + ck + "/step-00000010 --slim-apply now", dir,
                      tag + "-now");
    ASSERT_EQ(n.code, 0) << n.output;
    EXPECT_NE(n.output.find("Slim-DP state restored"), std::string::npos) << n.output;
    expect_continues(full, a, n, 0, tag + " resumed at step 10 with --slim-apply now");
    // Other Slim-DP settings: the weights load, the core is chosen again, and the run says so.
    CkptRun c = train(2, st + " --slim-core 0.5 --resume " + ck + "/step-00000010", dir, tag + "-c");
    ASSERT_EQ(c.code, 0) << c.output;
    EXPECT_NE(c.output.find("the core is chosen again"), std::string::npos) << c.output;
  }
}

TEST(Checkpoint, KeepLastRotates) {
  const std::string dir = test::scratch_dir(), ck = dir + "/ck";
  CkptRun a = train(1, "--ckpt-dir " + ck + " --save-every 3 --keep-last 2", dir, "a");
  ASSERT_EQ(a.code, 0) << a.output;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ck)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000018", "step-00000020"}));
}

TEST(Checkpoint, LoadsAtAnotherWorldSizeAndPlan) {
  const std::string dir = test::scratch_dir();
  CkptRun full = train(1, "--strategy ddp", dir, "full");
  const std::string plan = dir + "/mixed.json";
  std::ofstream(plan)
      << R"({"ops": {"*": {"strategy": "ddp"}, "blocks.*.mlp.*": {"strategy": "zero3", "splits": 2},
                                "blocks.1.attn.*": {"strategy": "zero2"}, "lm_head": {"strategy": "zero1"}}})";
  struct Case {
    int from_ranks;
    std::string from;
    int to_ranks;
    std::string to;
  };
  for (const Case& c :
       {Case{4, "--strategy zero3", 2, "--strategy ddp"}, Case{2, "--strategy ddp", 4, "--plan " + plan},
        Case{2, "--plan " + plan, 1, "--strategy zero2"}}) {
    const std::string tag = std::to_string(c.from_ranks) + "to" + std::to_string(c.to_ranks);
    const std::string ck = dir + "/ck-" + tag;
    CkptRun a = train(c.from_ranks, c.from + " --ckpt-dir " + ck + " --exit-after-steps 10", dir, tag + "-a");
    ASSERT_EQ(a.code, 0) << a.output;
    CkptRun b = train(c.to_ranks, c.to + " --resume " + ck, dir, tag + "-b");
    ASSERT_EQ(b.code, 0) << b.output;
    expect_continues(full, a, b, 1e-5, tag + ": " + c.from + " -> " + c.to);
  }
}

TEST(Checkpoint, KilledRankEndsTheJobAndTheLastCheckpointResumes) {
  const std::string dir = test::scratch_dir(), ck = dir + "/ck";
  CkptRun full = train(2, "", dir, "full");
  // Killed between saves (step 12), then, resumed from step 10, during the save of step 15 (after its own
  // file, before the index).
  for (const std::string fault : {"kill:1:12", "killsave:1:15"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string resume = fault == "kill:1:12" ? "" : " --resume " + ck;
    CkptRun a = train(2, "--ckpt-dir " + ck + " --save-every 5 --comm-timeout 20 --fault " + fault + resume,
                      dir, "a");
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(a.code, 0) << fault << "\n" << a.output;
    EXPECT_LT(secs, 20 + 30) << fault;
  }
  // The half-written checkpoint of step 15 is there but not taken.
  EXPECT_TRUE(fs::exists(ck + "/step-00000015.partial"));
  EXPECT_FALSE(fs::exists(ck + "/step-00000015"));
  EXPECT_EQ(latest_checkpoint(ck), ck + "/step-00000010");
  CkptRun b = train(2, "--resume " + ck, dir, "b");
  ASSERT_EQ(b.code, 0) << b.output;
  CkptRun first10;
  first10.losses.assign(full.losses.begin(), full.losses.begin() + 10);
  expect_continues(full, first10, b, 0, "resumed after a killed rank");
}

TEST(Checkpoint, BadCheckpointsExit2NamingTheProblem) {
  const std::string dir = test::scratch_dir(), ck = dir + "/ck";
  CkptRun a = train(2, "--strategy zero3 --ckpt-dir " + ck + " --exit-after-steps 4", dir, "a");
  ASSERT_EQ(a.code, 0) << a.output;
  const std::string step = ck + "/step-00000004";
  const std::string good = dir + "/good";
  fs::copy(step, good, fs::copy_options::recursive);
  auto restore = [&] {
    fs::remove_all(step);
    fs::copy(good, step, fs::copy_options::recursive);
  };
  auto resume_fails = [&](const std::string& extra, const std::string& want, const std::string& what) {
    const std::string before = file_bytes(step + "/rank-00000.safetensors");
    auto r = test::run(mpirun(2) + " train " + kArgs + " --strategy zero3 --resume " + ck + " " + extra);
    EXPECT_EQ(r.code, 2) << what << "\n" << r.output;
    EXPECT_NE(r.output.find(want), std::string::npos) << what << ": expected '" << want << "' in\n"
                                                      << r.output;
    EXPECT_EQ(file_bytes(step + "/rank-00000.safetensors"), before) << what << ": checkpoint changed";
  };
  {  // a flipped byte in the data
    std::fstream f(step + "/rank-00001.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  resume_fails("", "rank-00001.safetensors: checksum mismatch", "corrupted");
  restore();
  fs::resize_file(step + "/rank-00001.safetensors", fs::file_size(step + "/rank-00001.safetensors") - 100);
  resume_fails("", "rank-00001.safetensors", "truncated");
  restore();
  fs::remove(step + "/rank-00001.safetensors");
  resume_fails("", "rank-00001.safetensors", "missing file");
  restore();
  resume_fails("--n-embd 32", "checkpoint of model", "model mismatch");
  resume_fails("--optimizer sgd", "optimizer", "optimizer mismatch");
  std::ofstream(step + "/index.json") << "{\"format\": \"slimshard-checkpoint\", \"tensors\": ";
  resume_fails("", "index.json: not valid JSON", "corrupt index");
  restore();
  {  // an index of another format version
    std::string index = file_bytes(step + "/index.json");
    const size_t at = index.find("\"version\": 2");
    ASSERT_NE(at, std::string::npos);
    index.replace(at, 12, "\"version\": 1");
    std::ofstream(step + "/index.json") << index;
  }
  resume_fails("", "checkpoint format version 1", "old format");
  restore();
  auto r = test::run(mpirun(2) + " train " + kArgs + " --resume " + dir + "/nothing-here");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no complete checkpoint"), std::string::npos) << r.output;
  r = test::run(test::bin() + " train " + kArgs + " --save-every 5");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--ckpt-dir"), std::string::npos) << r.output;
}

TEST(Checkpoint, ExportLoadsIntoPyTorchWithTheSameLoss) {
  const std::string dir = test::scratch_dir(), ck = dir + "/ck";
  // Saved sharded (zero3, mlp split in two) at 2 ranks, exported to one file with GPT-2/nanoGPT names.
  const std::string plan = dir + "/plan.json";
  std::ofstream(plan)
      << R"({"ops": {"*": {"strategy": "zero3"}, "blocks.*.mlp.fc": {"strategy": "zero3", "splits": 2}}})";
  CkptRun a = train(2, "--plan " + plan + " --ckpt-dir " + ck + " --exit-after-steps 6", dir, "a");
  ASSERT_EQ(a.code, 0) << a.output;
  const std::string text = dir + "/text.txt", out = dir + "/model.safetensors";
  {
    std::ofstream t(text);
    for (int i = 0; i < 40; ++i) t << "And God said, Let there be light: and there was light. " << i << "\n";
  }
  auto r = test::run(test::bin() + " export " + ck + " " + out + " --loss-on " + text);
  ASSERT_EQ(r.code, 0) << r.output;
  const size_t at = r.output.find("loss on " + text + ": ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string loss =
      r.output.substr(at + text.size() + 10, r.output.find('\n', at) - at - text.size() - 10);
  EXPECT_TRUE(fs::exists(dir + "/model.config.json"));
  const std::string peer = std::string(SLIMSHARD_SOURCE_DIR) + "/../shared/bench/torch_ddp_peer.py";
  auto py = test::run("/usr/bin/python3 " + std::string(SLIMSHARD_SOURCE_DIR) + "/tests/export_check.py " +
                      out + " " + text + " " + loss + " " + peer);
  EXPECT_EQ(py.code, 0) << py.output;
  EXPECT_NE(py.output.find("same"), std::string::npos) << py.output;
  // A directory with no checkpoint: exit 2.
  r = test::run(test::bin() + " export " + dir + "/none " + out);
  EXPECT_EQ(r.code, 2) << r.output;
}
