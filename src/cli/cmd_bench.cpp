// cmd_bench.cpp — `slimshard bench`: the same training run under several strategies or plans, each as its own
// mpirun job (an out-of-budget error or a crash in one cannot hang or stop the others), side by side:
// tokens/s, step time, measured peak memory per rank next to the estimate, bytes per step, OOM.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "slimshard/common.h"
#include "slimshard/plan.h"

namespace slimshard::cli {
namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// The training flags of this command line, without bench's own options and the ones each run sets itself.
std::vector<std::string> forwarded_args() {
  static const std::vector<std::string> own = {"-n",           "--ranks",         "--strategies", "--json",
                                               "--mpirun",     "--strategy",      "--plan",       "--metrics",
                                               "--save-model", "--sample-tokens", "--profile"};
  std::vector<std::string> out;
  const auto& args = raw_args();
  for (size_t i = 1; i < args.size(); ++i) {  // args[0] is "bench"
    const std::string& a = args[i];
    const std::string key = a.substr(0, a.find('='));
    if (std::find(own.begin(), own.end(), key) != own.end()) {
      if (a.find('=') == std::string::npos) ++i;  // skip its value too
      continue;
    }
    out.push_back(a);
  }
  return out;
}

// The model-shape flags as given, for the profile run.
std::string shape_args(const TrainFlags& f) {
  std::string out;
  auto add = [&](CLI::Option* o, const char* flag, int64_t v) {
    if (o && o->count()) out += std::string(" ") + flag + " " + std::to_string(v);
  };
  add(f.o_layer, "--n-layer", f.n_layer);
  add(f.o_head, "--n-head", f.n_head);
  add(f.o_embd, "--n-embd", f.n_embd);
  add(f.o_seq, "--seq-len", f.seq_len);
  add(f.o_vocab, "--vocab", f.vocab);
  return out;
}

bool has_flag(const std::vector<std::string>& args, const std::string& flag) {
  for (const auto& a : args)
    if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
  return false;
}

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

}  // namespace

Runner add_bench(CLI::App& app) {
  struct Flags {
    TrainFlags t;
    int ranks = 2;
    std::string strategies = "ddp,zero1,zero2,zero3";
    std::string json;
    std::string mpirun;
  };
  auto f = std::make_shared<Flags>();
  f->t.o.steps = 10;
  CLI::App* sub =
      app.add_subcommand("bench", "Run the same training under several strategies or plans, side by side");
  sub->footer(
      "Each entry of --strategies runs as its own `mpirun -n N slimshard train ...` job with the other flags "
      "given\n"
      "here; a plan file (*.json) may stand in for a strategy.\n"
      "Example:\n  slimshard bench -n 2 --strategies ddp,zero1,zero2,zero3,plan.json --model gpt-25m --data "
      "kjv "
      "--batch-size 8 --json out.json");
  add_train_flags(sub, f->t);
  sub->add_option("-n,--ranks", f->ranks, "ranks per run")->capture_default_str()->check(CLI::Range(1, 4096));
  sub->add_option("--strategies", f->strategies, "comma-separated strategies and plan files")
      ->capture_default_str();
  sub->add_option("--json", f->json, "write the results as JSON");
  sub->add_option("--mpirun", f->mpirun,
                  "launcher prefix (default: mpirun --oversubscribe [--allow-run-as-root])");
  return [f]() {
    TrainOptions base = train_options(f->t);
    const std::vector<std::string> entries = split_list(f->strategies);
    if (entries.empty()) throw UsageError("--strategies: empty list");
    for (const auto& e : entries)
      if ((e.size() < 5 || e.substr(e.size() - 5) != ".json") && e != "osdp")
        parse_strategy(e, "--strategies");
    char self[4096];
    const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) throw RuntimeError("bench: cannot find the slimshard executable");
    self[len] = 0;
    const std::string launcher = !f->mpirun.empty() ? f->mpirun
                                                    : std::string("mpirun --oversubscribe") +
                                                          (::geteuid() == 0 ? " --allow-run-as-root" : "");
    std::vector<std::string> args = forwarded_args();
    if (!has_flag(args, "--steps")) args.push_back("--steps=" + std::to_string(base.steps));
    if (!has_flag(args, "--eval-rows")) args.push_back("--eval-rows=8");
    std::string common;
    for (const auto& a : args) common += " " + shell_quote(a);
    const std::string dir =
        std::filesystem::temp_directory_path() / ("slimshard-bench-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);

    std::fprintf(stderr, "bench: %s, %d ranks, global batch %lld, %lld steps per run (median after 2)\n",
                 base.model.describe().c_str(), f->ranks, (long long)base.batch_size, (long long)base.steps);
    // The cost model's predictions come from a profile of this machine (taken now unless --profile is given).
    if (base.batch_size % f->ranks != 0) throw UsageError("--batch-size is not divisible by -n");
    const int64_t local = base.batch_size / f->ranks;
    std::string profile_path = f->t.profile;
    if (profile_path.empty()) {
      std::string micro;
      int count = 0;
      for (int64_t b = local; b >= 1 && count < 4; b /= 2)
        if (local % b == 0) micro = std::to_string(b) + (micro.empty() ? "" : ",") + micro, ++count;
      profile_path = dir + "/profile.json";
      std::fprintf(stderr, "bench: profiling (micro-batches %s) ...\n", micro.c_str());
      const std::string cmd = launcher + " -n " + std::to_string(f->ranks) + " " + shell_quote(self) +
                              " profile --model " + shell_quote(f->t.model) + shape_args(f->t) +
                              " --micro-batch " + micro + " --out " + shell_quote(profile_path);
      RunResult pr = run_command(cmd, dir + "/profile.log");
      if (pr.code != 0) throw RuntimeError("bench: profiling failed: " + last_error_line(pr.output));
    }
    const CostModel cost = CostModel::from_profile(load_profile(profile_path), cost_options(base, f->ranks));
    nlohmann::json results = nlohmann::json::array();
    ActivationProfile probe;
    for (size_t i = 0; i < entries.size(); ++i) {
      const std::string& e = entries[i];
      const bool is_plan = e.size() >= 5 && e.substr(e.size() - 5) == ".json";
      TrainOptions o = base;
      const bool osdp = e == "osdp";
      // Predicted figures: the plan's (osdp: the search's, as `train --strategy osdp` will find it).
      SearchOptions so;
      so.mem_limit = base.mem_limit;
      SearchResult predicted;
      if (osdp) {
        predicted = search_plan(cost, so);
      } else {
        Plan plan = is_plan ? load_plan(e) : uniform_plan(parse_strategy(e, "--strategies"));
        for (const OpProfile& op : cost.ops()) {
          OpChoice c;
          for (const PlanEntry& pe : plan.entries)
            if (glob_match(pe.pattern, op.name)) {
              if (pe.has_strategy) c.strategy = pe.strategy;
              if (pe.has_splits) c.splits = pe.splits;
            }
          predicted.choices[op.name] = c;
        }
        const int64_t micro = base.micro_batch > 0   ? base.micro_batch
                              : plan.micro_batch > 0 ? plan.micro_batch
                                                     : local;
        predicted.cost = cost.evaluate(predicted.choices, micro);
      }
      int64_t estimate = predicted.cost.peak_bytes;
      if (!osdp) {
        if (is_plan)
          o.plan_file = e;
        else
          o.strategy = e, o.plan_file.clear();
        estimate = estimate_for(o, f->ranks, &probe).peak;
      }
      const std::string metrics = dir + "/run" + std::to_string(i) + ".jsonl";
      const std::string what = is_plan ? " --plan " + shell_quote(e)
                               : osdp  ? " --strategy osdp --profile " + shell_quote(profile_path)
                                       : " --strategy " + e;
      const std::string cmd = launcher + " -n " + std::to_string(f->ranks) + " " + shell_quote(self) +
                              " train" + common + what + " --metrics " + shell_quote(metrics);
      std::fprintf(stderr, "bench: %s ...\n", e.c_str());
      RunResult r = run_command(cmd, dir + "/run" + std::to_string(i) + ".log");
      nlohmann::json row{{"strategy", e},
                         {"estimated_peak_bytes", estimate},
                         {"predicted_step_ms", predicted.cost.step_ms},
                         {"predicted_peak_bytes", predicted.cost.peak_bytes},
                         {"oom", false}};
      if (r.code == 0) {
        std::ifstream in(metrics);
        std::string line, last;
        while (std::getline(in, line))
          if (!line.empty()) last = line;
        const auto s = nlohmann::json::parse(last);
        row["tokens_per_s"] = s.contains("tokens_per_s") ? s["tokens_per_s"] : s["samples_per_s"];
        row["step_ms"] = s["step_ms"];
        row["peak_bytes"] = s["peak_bytes"];
        row["comm_bytes_per_step"] = s["comm_bytes_per_step"];
      } else {
        row["oom"] = r.output.find("memory limit exceeded") != std::string::npos;
        row["error"] = last_error_line(r.output);
        row["exit_code"] = r.code;
      }
      results.push_back(row);
    }
    std::filesystem::remove_all(dir);

    auto mib = [](const nlohmann::json& v) { return format_mib(v.get<double>()); };
    std::printf("%-18s %9s %9s %9s %10s %10s %10s %9s\n", "strategy", "tokens/s", "step ms", "predicted",
                "peak MiB", "predicted", "estimate", "comm MiB");
    for (const auto& row : results) {
      const std::string name = row["strategy"].get<std::string>();
      const double pred_ms = row["predicted_step_ms"].get<double>();
      if (row.contains("tokens_per_s")) {
        std::printf("%-18s %9.0f %9.1f %9.1f %10s %10s %10s %9s\n", name.c_str(),
                    row["tokens_per_s"].get<double>(), row["step_ms"].get<double>(), pred_ms,
                    mib(row["peak_bytes"]).c_str(), mib(row["predicted_peak_bytes"]).c_str(),
                    mib(row["estimated_peak_bytes"]).c_str(), mib(row["comm_bytes_per_step"]).c_str());
      } else {
        std::printf("%-18s %9s %9s %9.1f %10s %10s %10s %9s   %s\n", name.c_str(),
                    row["oom"].get<bool>() ? "OOM" : "FAILED", "-", pred_ms, "-",
                    mib(row["predicted_peak_bytes"]).c_str(), mib(row["estimated_peak_bytes"]).c_str(), "-",
                    row["error"].get<std::string>().c_str());
      }
    }
    std::printf(
        "step ms, peak MiB: measured. predicted: the OSDP cost model (from the profile). estimate: "
        "`slimshard memory`.\n");
    if (!f->json.empty())
      write_file_atomic(f->json, nlohmann::json{{"model", base.model.to_json()},
                                                {"world", f->ranks},
                                                {"batch_size", base.batch_size},
                                                {"steps", base.steps},
                                                {"mem_limit", base.mem_limit},
                                                {"results", results}}
                                     .dump(2));
    return 0;
  };
}

}  // namespace slimshard::cli
