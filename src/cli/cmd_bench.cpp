// cmd_bench.cpp — `slimshard bench`: flags -> BenchOptions -> run_bench() -> the table (and JSON). Each entry
// of --strategies runs as its own `mpirun -n N slimshard train ...` with the training flags given here.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

#include "commands.h"
#include "slimshard/bench.h"
#include "slimshard/common.h"

namespace slimshard::cli {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// The flags of this command line (after "bench") whose name is in `names` (keep) or not (drop), with values.
std::vector<std::string> flags_among(const std::vector<std::string>& names, bool keep) {
  std::vector<std::string> out;
  const auto& args = raw_args();
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool named = std::find(names.begin(), names.end(), a.substr(0, a.find('='))) != names.end();
    const bool with_value = named && a.find('=') == std::string::npos && i + 1 < args.size();
    if (named == keep) {
      out.push_back(a);
      if (with_value) out.push_back(args[i + 1]);
    }
    if (with_value) ++i;
  }
  return out;
}

bool has_flag(const std::vector<std::string>& args, const std::string& flag) {
  for (const auto& a : args)
    if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
  return false;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  struct Flags {
    TrainFlags t;
    int ranks = 2;
    std::string strategies = "ddp,zero1,zero2,zero3", json, mpirun, save_profile;
    int repeat = 1;
  };
  auto flags = std::make_shared<Flags>();
  flags->t.train.steps = 10;
  CLI::App* sub =
      app.add_subcommand("bench", "Run the same training under several strategies or plans, side by side");
  sub->footer(
      "Each entry of --strategies runs as its own `mpirun -n N slimshard train ...` job with the other flags "
      "given\n"
      "here; a plan file (*.json) may stand in for a strategy.\n"
      "Example:\n  slimshard bench -n 2 --strategies ddp,zero1,zero2,zero3,plan.json --model gpt-25m --data "
      "kjv "
      "--batch-size 8 --json out.json");
  add_train_flags(sub, flags->t);
  sub->add_option("-n,--ranks", flags->ranks, "ranks per run")
      ->capture_default_str()
      ->check(integer(1, 4096));
  sub->add_option("--strategies", flags->strategies,
                  "comma-separated strategies (osdp, osdp-nohybrid, osdp-norecompute too) and plan files")
      ->capture_default_str();
  sub->add_option("--json", flags->json, "write the results as JSON");
  sub->add_option(
      "--save-profile", flags->save_profile,
      "keep the profile bench takes (when no --profile is given) in this file, to plan from again");
  sub->add_option("--repeat", flags->repeat, "run every entry this many times, round-robin; report medians")
      ->capture_default_str()
      ->check(integer(1, 100));
  sub->add_option("--mpirun", flags->mpirun,
                  "launcher prefix (default: mpirun --oversubscribe [--allow-run-as-root])");
  return [flags]() {
    if (!flags->json.empty()) check_output_file(flags->json, "--json");
    if (!flags->save_profile.empty()) {
      if (!flags->t.train.profile.empty())
        throw UsageError("--save-profile: bench takes no profile when --profile is given");
      check_output_file(flags->save_profile, "--save-profile");
    }
    BenchOptions bench;
    bench.base = run_spec(train_options(flags->t), flags->ranks);
    bench.entries = split_list(flags->strategies);
    check_bench_entries(bench.entries);
    // Bench's own flags and the ones each run sets itself are not forwarded.
    bench.train_args = flags_among(
        {"-n", "--ranks", "--strategies", "--json", "--mpirun", "--strategy", "--plan", "--metrics",
         "--save-model", "--sample-tokens", "--profile", "--repeat", "--recompute", "--save-profile"},
        false);
    if (!has_flag(bench.train_args, "--steps"))
      bench.train_args.push_back("--steps=" + std::to_string(flags->t.train.steps));
    if (!has_flag(bench.train_args, "--eval-rows")) bench.train_args.push_back("--eval-rows=8");
    bench.model_args = flags_among({"--model", "--n-layer", "--n-head", "--n-embd", "--seq-len", "--vocab",
                                    "--precision", "--reduce-dtype"},
                                   true);
    char self[4096];
    const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) throw RuntimeError("bench: cannot find the slimshard executable");
    bench.self.assign(self, static_cast<size_t>(len));
    bench.launcher = !flags->mpirun.empty() ? flags->mpirun
                                            : std::string("mpirun --oversubscribe") +
                                                  (::geteuid() == 0 ? " --allow-run-as-root" : "");
    bench.profile = flags->t.train.profile;
    bench.save_profile = flags->save_profile;
    bench.repeat = flags->repeat;
    std::fprintf(stderr, "bench: %s, %d ranks, global batch %lld, %lld steps per run (median after 2)\n",
                 bench.base.model.describe().c_str(), flags->ranks, (long long)bench.base.cost.global_batch,
                 (long long)flags->t.train.steps);
    const nlohmann::json results = run_bench(bench);
    print_bench(results);
    if (!flags->json.empty())
      write_file_atomic(flags->json, nlohmann::json{{"model", bench.base.model.to_json()},
                                                    {"world", flags->ranks},
                                                    {"batch_size", bench.base.cost.global_batch},
                                                    {"steps", flags->t.train.steps},
                                                    {"mem_limit", bench.base.mem_limit},
                                                    {"results", results}}
                                         .dump(2));
    return 0;
  };
}

}  // namespace slimshard::cli
