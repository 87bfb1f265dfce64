// test_cli.cpp — the executable end to end: learning on real data, the memory limit, text generation, and bad
// input of every kind giving exit code 2 and one line naming the flag or the file.
#include <gtest/gtest.h>

#include <filesystem>

#include "helpers.h"
#include "slimshard/common.h"
#include "slimshard/data.h"

using namespace slimshard;
using test::bin;
using test::run;

using test::expect_usage_error;
using test::last_line;

TEST(Cli, GptTinyLearnsKjv) {
  const std::string dir = test::scratch_dir();
  auto r = run(bin() +
               " train --model gpt-tiny --data kjv --steps 300 --batch-size 16 --lr 3e-3 --eval-every 100 "
               "--metrics " +
               dir + "/m.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  auto lines = test::read_jsonl(dir + "/m.jsonl");
  ASSERT_EQ(lines.size(), 301u);
  for (const char* key : {"step", "loss", "lr", "tokens_per_s", "step_ms", "peak_bytes", "comm_bytes"})
    EXPECT_TRUE(lines[0].contains(key)) << key;
  EXPECT_TRUE(lines[99].contains("val_loss"));
  const auto& summary = lines.back();
  EXPECT_TRUE(summary.value("summary", false));
  EXPECT_LT(summary["val_loss"].get<double>(), 2.5) << "nats/byte";
  EXPECT_GT(summary["peak_bytes"].get<int64_t>(), 0);
}

TEST(Cli, CnnFashionMnistReaches80Percent) {
  const std::string dir = test::scratch_dir();
  auto r = run(bin() +
               " train --model cnn --data fashion-mnist --steps 500 --batch-size 64 --lr 2e-3 "
               "--metrics " +
               dir + "/m.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  auto summary = test::read_jsonl(dir + "/m.jsonl").back();
  EXPECT_GE(summary["val_acc"].get<double>(), 0.80) << "test accuracy over all 10000 test images";
  EXPECT_NE(r.output.find("val acc"), std::string::npos);
}

TEST(Cli, MemoryLimitFailsCleanlyWithExit1) {
  auto r = run(bin() + " train --model gpt-tiny --data kjv --steps 3 --batch-size 16 --mem-limit 6MiB");
  EXPECT_EQ(r.code, 1) << r.output;
  const std::string line = last_line(r.output);
  EXPECT_NE(line.find("[rank 0] memory limit exceeded "), std::string::npos) << r.output;
  EXPECT_NE(line.find(" op '"), std::string::npos) << "names the op running or the one before: " << r.output;
  EXPECT_NE(line.find("limit 6.0 MiB"), std::string::npos) << r.output;
  // The same run fits in a larger budget.
  EXPECT_EQ(
      run(bin() + " train --model gpt-tiny --data kjv --steps 3 --batch-size 16 --mem-limit 64MiB").code, 0);
}

TEST(Cli, GenerateFromSavedModel) {
  const std::string dir = test::scratch_dir();
  auto r = run(bin() + " train --model gpt-tiny --data kjv --steps 20 --batch-size 8 --save-model " + dir +
               "/m.safetensors --sample-tokens 20 --prompt Jesus");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--- sample"), std::string::npos);
  auto g =
      run(bin() + " generate --model-file " + dir + "/m.safetensors --prompt 'In the beginning' --tokens 40");
  ASSERT_EQ(g.code, 0) << g.output;
  EXPECT_EQ(g.output.rfind("In the beginning", 0), 0u) << g.output;
  EXPECT_GE(g.output.size(), 16u + 40u);
  expect_usage_error("generate --model-file " + dir + "/missing.safetensors", "missing.safetensors");
}

TEST(Cli, HelpExitsZero) {
  EXPECT_EQ(run(bin() + " --help").code, 0);
  auto r = run(bin() + " train --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("--mem-limit"), std::string::npos);
}

TEST(Cli, BadFlagsExit2NamingTheFlag) {
  const std::string base = "train --data kjv ";
  expect_usage_error(base + "--model gpt-huge", "unknown model 'gpt-huge'");
  expect_usage_error(base + "--steps abc", "--steps");
  expect_usage_error(base + "--steps -3", "--steps");
  expect_usage_error(base + "--lr 0", "--lr");
  expect_usage_error(base + "--mem-limit 12XB", "--mem-limit");
  expect_usage_error(base + "--model gpt-tiny --batch-size 10 --micro-batch 4", "--micro-batch");
  expect_usage_error(base + "--model gpt-tiny --n-head 5", "--n-embd");
  expect_usage_error(base + "--optimizer adam", "--optimizer");
  expect_usage_error(base + "--strategy zero9", "--strategy");
  expect_usage_error("train --model gpt-tiny", "--data");
  expect_usage_error(base + "--model mlp", "does not suit");
  expect_usage_error("frobnicate", "frobnicate");
}

TEST(Cli, BadDataFilesExit2NamingTheFile) {
  const std::string dir = test::scratch_dir();
  expect_usage_error("train --model gpt-tiny --data " + dir + "/absent.txt", "absent.txt: no such file");
  write_llmc_bin(dir + "/tok.bin", std::vector<uint16_t>(5000, 7));
  std::string raw = read_file(dir + "/tok.bin", "test");
  write_file_atomic(dir + "/trunc.bin", raw.substr(0, raw.size() - 100));
  expect_usage_error("train --model gpt-tiny --data " + dir + "/trunc.bin", "trunc.bin: truncated");
  // Fashion-MNIST with one corrupt gzip member.
  const std::string m = dir + "/mnist";
  std::filesystem::create_directories(m);
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    std::filesystem::copy_file(std::string("/usr/share/datasets/fashion-mnist/") + f, m + "/" + f);
  std::string gz = read_file(m + "/t10k-labels-idx1-ubyte.gz", "test");
  for (size_t i = 60; i < 160; ++i) gz[i] = static_cast<char>(~gz[i]);
  write_file_atomic(m + "/t10k-labels-idx1-ubyte.gz", gz);
  expect_usage_error("train --model mlp --data fashion-mnist --mnist-dir " + m, "t10k-labels-idx1-ubyte.gz");
  // A .bin run with a valid file trains (the reader is not just rejecting everything).
  EXPECT_EQ(run(bin() + " train --model gpt-tiny --data " + dir + "/tok.bin --steps 2 --batch-size 2").code,
            0);
}

// `plot`: the curve's points (counted as circles) and the last point's value (in the legend) against the
// metrics written; --mean-of averages consecutive points and drops a short tail; bad input exits 2.
TEST(Cli, PlotDrawsTheMetricsAndTheirMeans) {
  const std::string dir = test::scratch_dir(), metrics = dir + "/m.jsonl", svg = dir + "/p.svg";
  std::string lines;
  for (int step = 1; step <= 5; ++step)
    lines += "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(step) +
             ",\"comm_bytes\":1048576}\n";
  lines += "{\"summary\":true,\"step\":5,\"loss\":99}\n";
  write_file_atomic(metrics, lines);
  auto count = [](const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  };
  auto r = run(bin() + " plot --y loss --out " + svg + " " + metrics + ":run");
  ASSERT_EQ(r.code, 0) << r.output;
  std::string out = read_file(svg, "test");
  EXPECT_EQ(count(out, "<circle"), 5u);
  EXPECT_NE(out.find("run (5 at 5)"), std::string::npos) << out;
  r = run(bin() + " plot --x bytes --y loss --mean-of 2 --out " + svg + " " + metrics + ":run");
  ASSERT_EQ(r.code, 0) << r.output;
  out = read_file(svg, "test");
  EXPECT_EQ(count(out, "<circle"), 2u);  // (1+2)/2 at 2 MiB, (3+4)/2 at 4 MiB; the lone 5th dropped
  EXPECT_NE(out.find("run (3.5 at 4)"), std::string::npos) << out;
  EXPECT_NE(out.find("loss (mean of 2)"), std::string::npos) << out;
  expect_usage_error("plot --y loss --mean-of 0 " + metrics, "--mean-of");
  expect_usage_error("plot --y loss " + dir + "/absent.jsonl", "absent.jsonl");
  expect_usage_error("plot --y val_acc " + metrics, "no step records");
  write_file_atomic(dir + "/bad.jsonl", "{\"step\":1,\"loss\":2}\n{\"step\":2,\"lo");
  expect_usage_error("plot --y loss " + dir + "/bad.jsonl", "bad.jsonl:2");
}
