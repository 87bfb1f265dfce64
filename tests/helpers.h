// helpers.h — shared by the tests: running the slimshard binary (alone or under mpirun), scratch directories,
// reading metrics, and the oracle comparisons most multi-rank tests make (losses step by step, final
// weights).
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slimshard/ckpt.h"

namespace slimshard::test {

struct CmdResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command; SLIMSHARD_BIN is the path of the built executable.
inline CmdResult run(const std::string& cmd) {
  CmdResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline std::string bin() { return SLIMSHARD_BIN; }

// The environment of an mpirun command: as root; in a sanitizer build, no leak report from processes that
// start MPI (OpenMPI's components allocate and are unloaded before LeakSanitizer can name them; errors stay
// fatal).
inline std::string mpi_env() {
  const char* asan = std::getenv("ASAN_OPTIONS");
  return std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") +
         (asan ? "ASAN_OPTIONS='" + std::string(asan) + ":detect_leaks=0' " : "");
}

// The binary under `mpirun -n n` (as root, oversubscribed: more ranks than cores).
inline std::string mpirun(int n) {
  return mpi_env() + "mpirun --oversubscribe -n " + std::to_string(n) + " " + bin();
}

// A fresh directory per test under the build tree.
inline std::string scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = std::string(SLIMSHARD_TEST_TMP) + "/" + info->test_suite_name() + "." + info->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Number of lines of `text` that are not empty.
inline int count_lines(const std::string& text) {
  int n = 0;
  bool any = false;
  for (char c : text) {
    if (c == '\n')
      n += any, any = false;
    else
      any = true;
  }
  return n + any;
}

// The last line of the output; it must be the error, alone on its line.
inline std::string last_line(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1);
}

// `slimshard memory ARGS --world WORLD --json DIR/TAG_est.json`: the estimated peak per rank in bytes (a
// failed command fails the test and gives -1).
inline double estimated_peak(const std::string& args, int world, const std::string& dir,
                             const std::string& tag) {
  const std::string json = dir + "/" + tag + "_est.json";
  const auto r = run(bin() + " memory " + args + " --world " + std::to_string(world) + " --json " + json);
  EXPECT_EQ(r.code, 0) << r.output;
  if (r.code != 0) return -1;
  std::ifstream in(json);
  return nlohmann::json::parse(in)["peak_bytes"].get<double>();
}

// A plan for the MLP at micro-batch 32, fc1, fc2 and fc3 under the given strategies: written to DIR/TAG.json.
inline std::string write_mlp_plan(const std::string& dir, const std::string& tag, const std::string& fc1,
                                  const std::string& fc2, const std::string& fc3) {
  const std::string path = dir + "/" + tag + ".json";
  std::ofstream(path) << R"({"micro_batch":32,"ops":{"fc1":{"strategy":")" << fc1
                      << R"("},"fc2":{"strategy":")" << fc2 << R"("},"fc3":{"strategy":")" << fc3
                      << R"("}}})";
  return path;
}

// `slimshard ARGS` exits 2 with one error line naming `needle` last, and no uncaught exception.
inline void expect_usage_error(const std::string& args, const std::string& needle) {
  auto r = run(bin() + " " + args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  const std::string line = last_line(r.output);
  EXPECT_EQ(line.rfind("slimshard: error: ", 0), 0u) << args << "\n" << r.output;
  EXPECT_NE(line.find(needle), std::string::npos) << args << "\n" << r.output;
  EXPECT_EQ(r.output.find("terminate"), std::string::npos) << r.output;
}

// One `slimshard train` run and what it left: its exit code and output, the per-step records of its metrics
// file (losses extracted), the summary line and, when saved, the final weights.
struct TrainRun {
  int code = -1;
  std::string output;
  std::vector<nlohmann::json> steps;
  std::vector<double> losses;
  nlohmann::json summary;
  SafeTensorsFile weights;
};

// `mpirun -n RANKS slimshard train ARGS --metrics DIR/TAG.jsonl`, with
// `--save-model DIR/TAG.safetensors` when `save_weights`.
inline TrainRun train(int ranks, const std::string& args, const std::string& dir, const std::string& tag,
                      bool save_weights = false) {
  const std::string m = dir + "/" + tag + ".jsonl", w = dir + "/" + tag + ".safetensors";
  const auto r =
      run(mpirun(ranks) + " train " + args + " --metrics " + m + (save_weights ? " --save-model " + w : ""));
  TrainRun out;
  out.code = r.code, out.output = r.output;
  if (r.code != 0) return out;
  out.steps = read_jsonl(m);
  if (!out.steps.empty() && out.steps.back().value("summary", false)) {
    out.summary = out.steps.back();
    out.steps.pop_back();
  }
  for (const auto& s : out.steps) out.losses.push_back(s["loss"].get<double>());
  if (save_weights && std::filesystem::exists(w)) out.weights = load_safetensors(w);
  return out;
}

// Both runs succeeded and their losses agree step by step within `rel` (relative).
inline void expect_same_losses(const TrainRun& want, const TrainRun& got, const std::string& what,
                               double rel = 1e-5) {
  ASSERT_EQ(want.code, 0) << what << " (reference)\n" << want.output;
  ASSERT_EQ(got.code, 0) << what << "\n" << got.output;
  ASSERT_EQ(want.losses.size(), got.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], rel * std::abs(want.losses[i])) << what << ", step " << i + 1;
}

// The final weights (saved with save_weights) agree to `tol` (absolute, per element).
inline void expect_same_weights(const TrainRun& want, const TrainRun& got, const std::string& what,
                                double tol = 1e-5) {
  ASSERT_EQ(want.weights.tensors.size(), got.weights.tensors.size()) << what;
  ASSERT_FALSE(want.weights.tensors.empty()) << what << ": no weights saved";
  for (size_t i = 0; i < want.weights.tensors.size(); ++i) {
    const double d =
        (want.weights.tensors[i].second - got.weights.tensors[i].second).abs().max().item<double>();
    EXPECT_LE(d, tol) << what << ": " << want.weights.tensors[i].first;
  }
}

}  // namespace slimshard::test
