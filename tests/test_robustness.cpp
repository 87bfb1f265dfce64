// test_robustness.cpp — nothing crashes, nothing is lost, every number is checked: each problem a probe of
// bad inputs and faults found, as a test that failed before its fix (exit code, and the flag or file named in
// one line). Bucket sizes, empty datasets, numbers from flags and files, crafted model files and checkpoint
// indexes, outputs that cannot be written, inputs that are not regular files, usage errors under mpirun,
// checkpoint directories that belong to a run, SIGTERM / SIGINT.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "helpers.h"
#include "slimshard/ckpt.h"
#include "slimshard/common.h"
#include "slimshard/data.h"

using namespace slimshard;
namespace fs = std::filesystem;
using test::bin;
using test::expect_usage_error;
using test::run;

namespace {

const std::string kTiny = "--model gpt-tiny --data kjv --batch-size 4 --eval-rows 8";

// mpirun as the README runs it for a one-line error: -q keeps mpirun's own notices out of the output.
std::string mpirun_q(int n) {
  return test::mpi_env() + "mpirun -q --oversubscribe -n " + std::to_string(n) + " " + bin();
}

void write_gz(const std::string& path, const std::string& raw) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, raw.data(), static_cast<unsigned>(raw.size()));
  gzclose(f);
}

std::string be32(uint32_t v) { return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; }

}  // namespace

TEST(Robustness, BucketSizesThatRoundToNothingOrOverflowExit2) {
  for (const std::string v : {"1e-12", "nan", "1e30", "0", "-1"}) {
    expect_usage_error("train " + kTiny + " --steps 1 --bucket-mib " + v, "--bucket-mib");
    auto r = run(mpirun_q(2) + " train " + kTiny + " --steps 1 --bucket-mib " + v);
    EXPECT_EQ(r.code, 2) << v << "\n" << r.output;
    EXPECT_EQ(test::count_lines(r.output), 1) << v << "\n" << r.output;
  }
  // The smallest bucket allowed trains: every param its own bucket.
  EXPECT_EQ(run(bin() + " train " + kTiny + " --steps 1 --bucket-mib 0.001").code, 0);
}

TEST(Robustness, NumbersFromFlagsAreExactFiniteAndInRange) {
  const std::string t = "train " + kTiny + " --steps 2 ";
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{{"--weight-decay", "nan"},
                                                        {"--beta1", "nan"},
                                                        {"--beta2", "1"},
                                                        {"--clip", "nan"},
                                                        {"--lr", "inf"},
                                                        {"--lr", "0"},
                                                        {"--steps", "0"},
                                                        {"--steps", "99999999999999999999"},
                                                        {"--steps", "1.5"},
                                                        {"--steps", "1e3"},
                                                        {"--batch-size", "-4"},
                                                        {"--warmup", "nan"},
                                                        {"--seed", "-1"},
                                                        {"--comm-timeout", "1e300"},
                                                        {"--n-embd", "1000000000"},
                                                        {"--exit-after-mins", "inf"},
                                                        {"--slim-core", "nan"},
                                                        {"--eval-rows", "2.5"}}) {
    auto r = run(bin() + " " + t + flag + " " + value);
    EXPECT_EQ(r.code, 2) << flag << " " << value << "\n" << r.output;
    EXPECT_NE(r.output.find(flag), std::string::npos) << r.output;
    EXPECT_EQ(test::count_lines(r.output), 1) << r.output;
    EXPECT_LT(r.output.size(), 300u) << "a range a user can read: " << r.output;
  }
  expect_usage_error("generate --model-file x --temperature nan", "--temperature");
  expect_usage_error("plot --mean-of 1.5 x.jsonl", "--mean-of");
}

TEST(Robustness, NumbersInPlansAndCheckpointIndexesAreExact) {
  const std::string dir = test::scratch_dir();
  for (const auto& [json, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"({"world": 1.5, "ops": {}})", "world"},
           {R"({"world": 1e30, "ops": {}})", "world"},
           {R"({"micro_batch": -1, "ops": {}})", "micro_batch"},
           {R"({"ops": {"lm_head": {"splits": 2.0}}})", "splits"},
           {R"({"ops": {"lm_head": {"splits": 18446744073709551616}}})", "splits"}}) {
    write_file_atomic(dir + "/p.json", json);
    expect_usage_error("train " + kTiny + " --steps 1 --plan " + dir + "/p.json", needle);
  }
  // A checkpoint, then its index with a step that is negative or fractional: exit 2 naming the field.
  ASSERT_EQ(run(bin() + " train " + kTiny + " --steps 2 --ckpt-dir " + dir + "/ck").code, 0);
  const std::string index = dir + "/ck/step-00000002/index.json";
  const std::string good = read_file(index, "test");
  for (const std::string bad : {"-5", "1.5", "1e20"}) {
    auto j = nlohmann::json::parse(good);
    j["step"] = nlohmann::json::parse(bad);
    write_file_atomic(index, j.dump());
    expect_usage_error("train " + kTiny + " --steps 4 --resume " + dir + "/ck", "step");
  }
}

TEST(Robustness, EmptyFashionMnistSetsExit2NamingTheFile) {
  const std::string dir = test::scratch_dir();
  const std::string src = "/usr/share/datasets/fashion-mnist/";
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    fs::copy_file(src + f, dir + "/" + f);
  const std::string images = be32(0x803) + be32(0) + be32(28) + be32(28), labels = be32(0x801) + be32(0);
  write_gz(dir + "/train-images-idx3-ubyte.gz", images);
  write_gz(dir + "/train-labels-idx1-ubyte.gz", labels);
  expect_usage_error("train --model mlp --data fashion-mnist --steps 1 --mnist-dir " + dir,
                     "train-images-idx3-ubyte.gz: no images");
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"})
    fs::copy_file(src + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  write_gz(dir + "/t10k-images-idx3-ubyte.gz", images);
  write_gz(dir + "/t10k-labels-idx1-ubyte.gz", labels);
  expect_usage_error("train --model mlp --data fashion-mnist --steps 1 --mnist-dir " + dir,
                     "t10k-images-idx3-ubyte.gz: no images");
  // Sizes whose product overflows 32 bits are checked, not multiplied blindly.
  write_gz(dir + "/t10k-images-idx3-ubyte.gz", be32(0x803) + be32(0x10000) + be32(0x10000) + be32(0x10000));
  expect_usage_error("train --model mlp --data fashion-mnist --steps 1 --mnist-dir " + dir,
                     "IDX size mismatch");
}

TEST(Robustness, InputsThatAreNotRegularFilesAreRefused) {
  const std::string dir = test::scratch_dir();
  expect_usage_error("train --model gpt-tiny --steps 1 --data " + dir, "is a directory");
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0644), 0);
  const auto t0 = std::chrono::steady_clock::now();
  expect_usage_error("train --model gpt-tiny --steps 1 --data " + dir + "/fifo", "not a regular file");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30)
      << "it must not block";
  expect_usage_error("train --model gpt-tiny --steps 1 --data /dev/zero", "not a regular file");
  expect_usage_error("train " + kTiny + " --steps 1 --plan " + dir + "/fifo", "not a regular file");
  // --val-data's problems are named --val-data.
  write_file_atomic(dir + "/text.txt", std::string(5000, 'a'));
  write_file_atomic(dir + "/short.txt", "ab");
  expect_usage_error(
      "train --model gpt-tiny --steps 1 --data " + dir + "/text.txt --val-data " + dir + "/short.txt",
      "--val-data " + dir + "/short.txt: too short");
  expect_usage_error("train --model gpt-tiny --steps 1 --data " + dir + "/text.txt --val-data " + dir,
                     "--val-data " + dir + ": is a directory");
}

TEST(Robustness, OutputsAreCheckedBeforeTheFirstStep) {
  const std::string dir = test::scratch_dir();
  write_file_atomic(dir + "/a-file", "x");
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--ckpt-dir " + dir + "/a-file", "--ckpt-dir"},
           {"--save-model /proc/slimshard/m.safetensors", "--save-model"},
           {"--save-model " + dir, "--save-model"},
           {"--metrics " + dir + "/no/such/dir/m.jsonl", "--metrics"}}) {
    auto r = run(bin() + " train " + kTiny + " --steps 50 " + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(test::last_line(r.output).find(needle), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "trained before failing:\n" << r.output;
  }
  // A metrics file that stops taking writes (a full disk) fails the run loudly.
  auto full = run(bin() + " train " + kTiny + " --steps 3 --metrics /dev/full");
  EXPECT_EQ(full.code, 1) << full.output;
  EXPECT_NE(test::last_line(full.output).find("--metrics /dev/full: cannot write"), std::string::npos)
      << full.output;
}

TEST(Robustness, ModelFilesAreChecksummedAndCheckedBeforeUse) {
  const std::string dir = test::scratch_dir(), m = dir + "/m.safetensors";
  ASSERT_EQ(run(bin() + " train " + kTiny + " --steps 2 --save-model " + m).code, 0);
  ASSERT_EQ(run(bin() + " generate --model-file " + m + " --tokens 5").code, 0);
  std::string raw = read_file(m, "test");
  std::string flipped = raw;
  for (size_t i = flipped.size() - 200; i < flipped.size() - 136; ++i)
    flipped[i] = static_cast<char>(~flipped[i]);
  write_file_atomic(dir + "/flipped.safetensors", flipped);
  expect_usage_error("generate --model-file " + dir + "/flipped.safetensors", "checksum mismatch");
  // A config asking for a model far larger than its tensors: refused before anything is built.
  const SafeTensorsFile f = load_safetensors(m);
  auto config = nlohmann::json::parse(f.metadata.at("slimshard.model"));
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"n_embd", 131072}, {"n_embd", 1.5}, {"n_layer", "x"}, {"vocab", 100000000000}}) {
    auto c = config;
    c[key] = value;
    std::map<std::string, std::string> meta = f.metadata;
    meta["slimshard.model"] = c.dump();
    save_safetensors(dir + "/crafted.safetensors", f.tensors, meta);
    auto r = run(bin() + " generate --model-file " + dir + "/crafted.safetensors");
    EXPECT_EQ(r.code, 2) << key << "\n" << r.output;
    EXPECT_NE(r.output.find("crafted.safetensors"), std::string::npos) << r.output;
    EXPECT_EQ(test::count_lines(r.output), 1) << r.output;
  }
  // Shapes whose element count overflows, a block name that is not a number.
  std::string header = R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_file_atomic(dir + "/overflow.safetensors", bytes + header);
  expect_usage_error("generate --model-file " + dir + "/overflow.safetensors", "overflow.safetensors");
  NamedTensors odd = f.tensors;
  odd[0].first += "#x";
  save_safetensors(dir + "/block.safetensors", odd, f.metadata);
  expect_usage_error("generate --model-file " + dir + "/block.safetensors", "block.safetensors");
}

TEST(Robustness, ExportChecksEverythingBeforeWritingAnything) {
  const std::string dir = test::scratch_dir(), ck = dir + "/ck", out = dir + "/e.safetensors";
  ASSERT_EQ(run(bin() + " train " + kTiny + " --steps 2 --ckpt-dir " + ck).code, 0);
  expect_usage_error("export " + ck + " " + out + " --loss-on " + dir + "/absent.txt", "absent.txt");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(dir + "/e.config.json"));
  fs::create_directories(dir + "/e.config.json");  // the config cannot be written: nothing is
  expect_usage_error("export " + ck + " " + out, "e.config.json");
  EXPECT_FALSE(fs::exists(out));
  fs::remove(dir + "/e.config.json");
  EXPECT_EQ(run(bin() + " export " + ck + " " + out).code, 0);
  EXPECT_TRUE(fs::exists(out) && fs::exists(dir + "/e.config.json"));
}

TEST(Robustness, PlotAndPlanSayWhatIsWrong) {
  const std::string dir = test::scratch_dir();
  write_file_atomic(dir + "/m.jsonl", "{\"step\":\"one\",\"loss\":2}\n");
  expect_usage_error("plot --y loss --out " + dir + "/p.svg " + dir + "/m.jsonl",
                     "m.jsonl:1: step is not a number");
  const std::string spec = std::string(SLIMSHARD_SOURCE_DIR) + "/examples/clusters/8xgpu-24gb-pcie3.json";
  expect_usage_error("plan --model gpt-tiny --cluster " + spec + " --batch-size 4 --out " + dir + "/p.json",
                     "--batch-size 4 is not divisible by the 8 ranks");
  auto r = run(bin() + " frobnicate");
  EXPECT_NE(r.output.find("plot or export"), std::string::npos) << r.output;
}

TEST(Robustness, AUsageErrorUnderMpirunIsOneLineOnceExit2) {
  for (const std::string& args :
       std::vector<std::string>{"train --model gpt-tiny --data /nonexistent.txt",
                                "train --model gpt-tiny --data kjv --batch-size 6 --steps 1",
                                "train " + kTiny + " --steps 1 --plan /nonexistent.json"}) {
    auto r = run(mpirun_q(4) + " " + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_EQ(test::count_lines(r.output), 1) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << r.output;
  }
}

TEST(Robustness, CheckpointDirectoriesBelongToARun) {
  const std::string dir = test::scratch_dir(), d = dir + "/ck";
  const std::string args = " train " + kTiny + " --save-every 5 --keep-last 2 --ckpt-dir " + d;
  ASSERT_EQ(run(test::mpirun(2) + args + " --steps 20").code, 0);
  // A fresh run into the directory: refused, naming what is there.
  expect_usage_error("train " + kTiny + " --steps 20 --ckpt-dir " + d, "holds checkpoints of another run");
  // Another run's checkpoint of a higher step in the same directory is never pruned by this run.
  ASSERT_EQ(run(bin() + " train " + kTiny + " --steps 3 --ckpt-dir " + dir + "/other").code, 0);
  fs::rename(dir + "/other/step-00000003", d + "/step-00000099");
  auto r = run(test::mpirun(2) + args + " --steps 30 --resume " + d + "/step-00000020");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000025", "step-00000030", "step-00000099"}));
}

// SIGTERM (or SIGINT) to every rank, as a scheduler sends it: the step finishes, a checkpoint is written,
// every rank exits 143 (130), and the run resumes from that checkpoint with the losses of an uninterrupted
// run.
TEST(Robustness, PreemptionSavesAndExits) {
  const std::string dir = test::scratch_dir();
  // gpt-small (~60 ms a step here), so that the signal lands early in a run of 200 steps.
  const std::string args =
      "--model gpt-small --data kjv --batch-size 4 --eval-rows 8 --eval-every 0 --steps 200";
  const auto full =
      test::train(2, args + " --exit-after-steps 40 --ckpt-dir " + dir + "/ck-full", dir, "full");
  ASSERT_EQ(full.code, 0) << full.output;
  for (const auto& [sig, code] : std::vector<std::pair<std::string, int>>{{"TERM", 143}, {"INT", 130}}) {
    const std::string d = dir + "/ck-" + sig, m = dir + "/" + sig + ".jsonl";
    test::CmdResult r;
    std::thread job(
        [&] { r = run(mpirun_q(2) + " train " + args + " --ckpt-dir " + d + " --metrics " + m); });
    // Once a few steps are done, the signal to both ranks (their command lines carry the metrics path).
    for (int i = 0; i < 1200 && test::count_lines(fs::exists(m) ? read_file(m, "test") : "") < 3; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    run("pkill -" + sig + " -f '^" + bin() + " train.*" + m + "'");  // the ranks, not mpirun
    job.join();
    EXPECT_EQ(r.code, code) << sig << "\n" << r.output;
    const std::string saved = latest_checkpoint(d);
    ASSERT_FALSE(saved.empty()) << r.output;
    const int64_t at = checkpoint_meta(saved).step;
    EXPECT_GE(at, 3);
    ASSERT_LT(at, 30) << "the signal came late";
    const auto rest = test::train(2, args + " --exit-after-steps 10 --ckpt-dir " + d + " --resume " + d, dir,
                                  sig + "-rest");
    ASSERT_EQ(rest.code, 0) << rest.output;
    ASSERT_EQ(rest.losses.size(), 10u);
    for (size_t i = 0; i < rest.losses.size(); ++i)
      EXPECT_EQ(rest.losses[i], full.losses[static_cast<size_t>(at) + i]) << sig << " step " << at + i + 1;
  }
  // A second signal ends the process at once: no checkpoint after the first one's.
  const std::string d = dir + "/ck-twice", m = dir + "/twice.jsonl";
  test::CmdResult r;
  std::thread job([&] { r = run(mpirun_q(1) + " train " + args + " --ckpt-dir " + d + " --metrics " + m); });
  for (int i = 0; i < 1200 && test::count_lines(fs::exists(m) ? read_file(m, "test") : "") < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  const std::string ranks = "'^" + bin() + " train.*" + m + "'";
  run("pkill -TERM -f " + ranks + "; pkill -TERM -f " + ranks);
  job.join();
  EXPECT_EQ(r.code, 143) << r.output;
  EXPECT_TRUE(latest_checkpoint(d).empty()) << "the second signal waited for the checkpoint:\n" << r.output;
}
