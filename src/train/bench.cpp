// bench.cpp — one mpirun job per strategy or plan, the cost model's predictions and the memory estimate
// beside the measurements (see bench.h).
#include "slimshard/bench.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "slimshard/common.h"
#include "slimshard/train.h"

namespace slimshard {
namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string joined(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) out += " " + shell_quote(a);
  return out;
}

bool is_plan_file(const std::string& e) { return e.size() >= 5 && e.substr(e.size() - 5) == ".json"; }
// "osdp" plans with every choice; "osdp-nohybrid" without hybrid sharding (hsdp, hsdp2), "osdp-norecompute"
// without activation recomputation, to show what each adds.
bool is_osdp(const std::string& e) { return e == "osdp" || e == "osdp-nohybrid" || e == "osdp-norecompute"; }

struct RunResult {
  int code = -1;
  std::string output;
};

RunResult run_command(const std::string& cmd, const std::string& log) {
  RunResult r;
  const int status = std::system((cmd + " > " + shell_quote(log) + " 2>&1").c_str());
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  return r;
}

// The run's own error line (not the launcher's banners).
std::string last_error_line(const std::string& out) {
  std::istringstream in(out);
  std::string line, found;
  while (std::getline(in, line))
    if (line.find("slimshard: error: ") != std::string::npos ||
        line.find("] watchdog: ") != std::string::npos)
      found = line;
  return found;
}

std::string launch(const BenchOptions& o) {
  return o.launcher + " -n " + std::to_string(o.base.world()) + " " + shell_quote(o.self);
}

// The profile the predictions come from: given, or taken now at the micro-batches osdp would profile.
std::string profile_for(const BenchOptions& o, const std::string& dir) {
  if (!o.profile.empty()) return o.profile;
  std::string micro;
  for (int64_t b : profile_micro_batches(per_rank_batch(o.base)))
    micro += (micro.empty() ? "" : ",") + std::to_string(b);
  // --save-profile: the profile run writes it there itself (atomically, as every profile), read from there.
  const std::string path =
      o.save_profile.empty() ? dir + "/profile.json" : std::filesystem::absolute(o.save_profile).string();
  std::fprintf(stderr, "bench: profiling (micro-batches %s) ...\n", micro.c_str());
  const RunResult pr = run_command(launch(o) + " profile" + joined(o.model_args) + " --micro-batch " + micro +
                                       " --out " + shell_quote(path),
                                   dir + "/profile.log");
  if (pr.code != 0) throw RuntimeError("bench: profiling failed: " + last_error_line(pr.output));
  return path;
}

// One entry: its predictions, then its own training job. `base` is o.base with the profile's hosts.
nlohmann::json bench_entry(const BenchOptions& o, const RunSpec& base, const Profile& measured,
                           const std::string& e, const std::string& profile, const std::string& run_prefix,
                           ActivationProfile& probe) {
  RunSpec spec = base;
  spec.strategy = is_plan_file(e) ? "ddp" : is_osdp(e) ? "osdp" : e;
  spec.plan_file = is_plan_file(e) ? e : "";
  spec.cost.allow_hybrid = e != "osdp-nohybrid";
  if (e == "osdp-norecompute") spec.cost.recompute = Recompute::none;
  const SearchResult predicted = predicted_for(CostModel::from_profile(measured, spec.cost), spec);
  const int64_t estimate = is_osdp(e) ? predicted.cost.peak_bytes : estimate_for(spec, &probe).peak.peak;
  std::string what = is_plan_file(e) ? " --plan " + shell_quote(e)
                     : is_osdp(e)    ? " --strategy osdp --profile " + shell_quote(profile) +
                                        (spec.cost.allow_hybrid ? "" : " --no-hybrid")
                                  : " --strategy " + e;
  what += std::string(" --recompute ") + recompute_name(spec.cost.recompute);
  const std::string metrics = run_prefix + ".jsonl";
  std::fprintf(stderr, "bench: %s ...\n", e.c_str());
  const RunResult r =
      run_command(launch(o) + " train" + joined(o.train_args) + what + " --metrics " + shell_quote(metrics),
                  run_prefix + ".log");
  nlohmann::json row{{"strategy", e},
                     {"estimated_peak_bytes", estimate},
                     {"predicted_step_ms", predicted.cost.step_ms},
                     {"predicted_peak_bytes", predicted.cost.peak_bytes},
                     {"oom", false}};
  const nlohmann::json s = r.code == 0 ? metrics_summary(metrics) : nlohmann::json::object();
  if (r.code == 0 && !s.empty()) {
    row["tokens_per_s"] = s.contains("tokens_per_s") ? s["tokens_per_s"] : s["samples_per_s"];
    row["step_ms"] = s["step_ms"];
    row["peak_bytes"] = s["peak_bytes"];
    row["comm_bytes_per_step"] = s["comm_bytes_per_step"];
    row["comm_bytes_inter_per_step"] = s.value("comm_bytes_inter_per_step", int64_t{0});
    if (s.contains("osdp")) {  // osdp: the predictions of the plan the run trained (--tune-steps may swap it)
      row["osdp_choice"] = s["osdp"]["choice"];
      row["osdp_plan"] = s["osdp"]["plan"];
      row["predicted_step_ms"] = s["osdp"]["predicted_step_ms"];
      row["predicted_peak_bytes"] = s["osdp"]["predicted_peak_bytes"];
    }
  } else {
    row["oom"] = r.output.find("memory limit exceeded") != std::string::npos;
    row["error"] = r.code == 0 ? "no summary in " + metrics : last_error_line(r.output);
    row["exit_code"] = r.code;
  }
  return row;
}

}  // namespace

void check_bench_entries(const std::vector<std::string>& entries) {
  if (entries.empty()) throw UsageError("--strategies: empty list");
  for (const auto& e : entries)
    if (!is_plan_file(e) && !is_osdp(e)) parse_strategy(e, "--strategies");
}

namespace {

// One row from an entry's runs: the medians of throughput, step time and bytes, the highest peak; failed if
// any run failed (that run's message).
nlohmann::json merged(const std::vector<nlohmann::json>& runs) {
  nlohmann::json row = runs.front();
  std::vector<double> rate, ms, bytes, inter;
  int64_t peak = 0;
  for (const auto& r : runs) {
    if (!r.contains("tokens_per_s")) return r;
    rate.push_back(r["tokens_per_s"].get<double>()), ms.push_back(r["step_ms"].get<double>());
    bytes.push_back(r["comm_bytes_per_step"].get<double>());
    inter.push_back(r["comm_bytes_inter_per_step"].get<double>());
    peak = std::max(peak, r["peak_bytes"].get<int64_t>());
  }
  row["tokens_per_s"] = median(rate), row["step_ms"] = median(ms), row["comm_bytes_per_step"] = median(bytes);
  row["comm_bytes_inter_per_step"] = median(inter);
  row["peak_bytes"] = peak;
  row["runs_tokens_per_s"] = rate;
  if (row.contains("osdp_choice")) {
    nlohmann::json choices = nlohmann::json::array();
    for (const auto& r : runs) choices.push_back(r["osdp_choice"]);
    row["runs_osdp_choice"] = choices;
  }
  return row;
}

// What a plan file holds, in one line: "micro-batch 2: 14 zero3, 8 ddp, 2 hsdp; 3 split; 8 recompute".
std::string plan_mix(const nlohmann::json& plan) {
  std::vector<std::pair<std::string, int>> counts;  // most first; ties in order of first appearance
  int split = 0, recompute = 0;
  for (const auto& e : plan.at("ops")) {
    const std::string s = e.value("strategy", std::string("ddp"));
    auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == s; });
    if (it == counts.end()) counts.emplace_back(s, 0), it = counts.end() - 1;
    ++it->second;
    split += e.value("splits", 1) > 1;
    recompute += e.value("recompute", false);
  }
  std::stable_sort(counts.begin(), counts.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out = "micro-batch " + std::to_string(plan.value("micro_batch", 1)) + ":";
  for (size_t i = 0; i < counts.size(); ++i)
    out += (i ? ", " : " ") + std::to_string(counts[i].second) + " " + counts[i].first;
  if (split) out += "; " + std::to_string(split) + " split";
  if (recompute) out += "; " + std::to_string(recompute) + " recompute";
  return out;
}

}  // namespace

nlohmann::json run_bench(const BenchOptions& o) {
  check_bench_entries(o.entries);
  per_rank_batch(o.base);
  const std::string dir =
      std::filesystem::temp_directory_path() / ("slimshard-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  nlohmann::json results = nlohmann::json::array();
  try {
    const std::string profile = profile_for(o, dir);
    const Profile measured = load_profile(profile);
    RunSpec base = o.base;  // planned for the hosts the profile was taken on
    if (base.cost.ranks_per_host == 0) base.cost.ranks_per_host = measured.ranks_per_host;
    ActivationProfile probe;
    std::vector<std::vector<nlohmann::json>> runs(o.entries.size());
    for (int rep = 0; rep < std::max(1, o.repeat); ++rep)
      for (size_t i = 0; i < o.entries.size(); ++i)
        runs[i].push_back(
            bench_entry(o, base, measured, o.entries[i], profile, dir + "/run" + std::to_string(i), probe));
    for (const auto& r : runs) results.push_back(merged(r));
  } catch (...) {
    std::filesystem::remove_all(dir);
    throw;
  }
  std::filesystem::remove_all(dir);
  return results;
}

void print_bench(const nlohmann::json& results) {
  auto mib = [](const nlohmann::json& v) { return format_mib(v.get<double>()); };
  bool hosts = false;  // a column for the bytes between hosts when some run had any
  for (const auto& row : results) hosts |= row.value("comm_bytes_inter_per_step", 0.0) > 0;
  std::printf("%-18s %9s %9s %9s %10s %10s %10s %9s%s\n", "strategy", "tokens/s", "step ms", "predicted",
              "peak MiB", "predicted", "estimate", "comm MiB", hosts ? "  inter MiB" : "");
  for (const auto& row : results) {
    // osdp: which plan the run chose by measurement when it was not the searched one
    std::string name = row["strategy"].get<std::string>();
    const std::string choice = row.value("osdp_choice", std::string("searched plan"));
    if (choice != "searched plan") name += " [" + choice.substr(0, choice.find(' ')) + "]";
    const double pred_ms = row["predicted_step_ms"].get<double>();
    if (row.contains("tokens_per_s")) {
      std::printf("%-18s %9.0f %9.1f %9.1f %10s %10s %10s %9s", name.c_str(),
                  row["tokens_per_s"].get<double>(), row["step_ms"].get<double>(), pred_ms,
                  mib(row["peak_bytes"]).c_str(), mib(row["predicted_peak_bytes"]).c_str(),
                  mib(row["estimated_peak_bytes"]).c_str(), mib(row["comm_bytes_per_step"]).c_str());
      if (hosts) std::printf(" %10s", mib(row["comm_bytes_inter_per_step"]).c_str());
      std::printf("\n");
    } else {
      std::printf("%-18s %9s %9s %9.1f %10s %10s %10s %9s   %s\n", name.c_str(),
                  row["oom"].get<bool>() ? "OOM" : "FAILED", "-", pred_ms, "-",
                  mib(row["predicted_peak_bytes"]).c_str(), mib(row["estimated_peak_bytes"]).c_str(), "-",
                  row["error"].get<std::string>().c_str());
    }
  }
  for (const auto& row : results)  // what each osdp run trained, op by op (the plan itself: --json)
    if (row.contains("osdp_plan"))
      std::printf("%s trained %s\n", row["strategy"].get<std::string>().c_str(),
                  plan_mix(row["osdp_plan"]).c_str());
  std::printf(
      "step ms, peak MiB: measured. predicted: the OSDP cost model (from the profile). estimate: "
      "`slimshard memory`.%s\n",
      hosts ? " comm MiB: all bytes per step; inter MiB: those between hosts." : "");
}

}  // namespace slimshard
