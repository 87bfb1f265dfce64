// helpers.h — shared by the tests: running the slimshard binary, scratch directories, reading metrics.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

}  // namespace slimshard::test
