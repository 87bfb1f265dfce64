// cmd_plan.cpp — `slimshard plan`: search the per-op plan under a memory budget from a profile or a cluster
// spec; print the table and the uniform baselines, write the plan file and (optionally) its SVG.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "slimshard/charts.h"
#include "slimshard/common.h"

namespace slimshard::cli {

Runner add_plan(CLI::App& app) {
  struct Flags {
    TrainFlags t;
    int world = 0;
    std::string profile, cluster, out = "plan.json", svg, micro = "1,2,4,8";
    bool scale = false, no_splits = false, quiet = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand("plan", "Find the fastest per-op plan (OSDP) that fits a memory budget");
  sub->footer(
      "Examples:\n"
      "  mpirun -n 2 slimshard profile --model gpt-25m --micro-batch 1,2,4 --out p.json\n"
      "  slimshard plan --model gpt-25m --world 2 --batch-size 8 --mem-limit 500MiB --profile p.json --svg "
      "plan.svg\n"
      "  slimshard plan --model gpt --n-layer 48 --n-embd 1536 --n-head 16 --seq-len 1024 --vocab 50257 \\\n"
      "      --cluster examples/clusters/8xgpu-24gb-pcie3.json --batch-size 32 --mem-limit 24GiB");
  add_model_flags(sub, flags->t);
  TrainOptions& train = flags->t.train;
  sub->add_option("--world", flags->world, "ranks (default: the profile's, or the cluster's devices)")
      ->check(integer(1, 1 << 20));
  sub->add_option("--mem-limit", flags->t.mem_limit,
                  "memory budget per rank, e.g. 500MiB (default: none, or the cluster's)");
  sub->add_option("--profile", flags->profile, "profile from `slimshard profile`");
  sub->add_option("--cluster", flags->cluster, "analytic device spec (JSON) for hardware we cannot run on");
  sub->add_flag("--scale-profile", flags->scale,
                "use a profile taken at another world size (collectives re-derived)");
  sub->add_option("--micro-batch", flags->micro, "with --cluster: micro-batch candidates")
      ->capture_default_str();
  sub->add_option("--batch-size", train.batch_size,
                  "global batch in rows (kept; accumulation makes up the rest)")
      ->capture_default_str()
      ->check(integer(1, 1 << 30));
  sub->add_option("--prefetch", train.prefetch, "zero3 prefetch depth")
      ->capture_default_str()
      ->check(integer(0, 64));
  sub->add_option("--optimizer", train.optim.name, "adamw | sgd")
      ->capture_default_str()
      ->check(CLI::IsMember({"adamw", "sgd"}));
  sub->add_flag("--no-splits", flags->no_splits, "do not split operators");
  sub->add_flag("--allow-slim", train.allow_slim, "Slim-DP may be chosen for replicated ops (see --slim-*)");
  sub->add_flag("!--no-hybrid", train.allow_hybrid,
                "across hosts, do not offer hybrid sharding (hsdp, hsdp2)");
  add_slim_flags(sub, train.slim);
  add_precision_flags(sub, flags->t);
  add_recompute_flag(sub, flags->t);
  sub->add_option("--out", flags->out, "plan file to write")->capture_default_str();
  sub->add_option("--svg", flags->svg, "also draw the plan as an SVG page");
  sub->add_flag("--quiet", flags->quiet, "totals only, no per-op table");
  return [flags]() {
    check_output_file(flags->out, "--out");
    if (!flags->svg.empty()) check_output_file(flags->svg, "--svg");
    RunSpec spec = run_spec(train_options(flags->t), flags->world);
    spec.cost.allow_splits = !flags->no_splits;
    const PlanReport rep = plan_offline(
        spec,
        CostSource{flags->profile, flags->cluster, parse_sizes(flags->micro, "--micro-batch"), flags->scale});
    const int64_t limit = rep.spec.mem_limit;
    if (!rep.result.fits) {
      print_plan(rep.model, rep.baselines.back().second, rep.baselines, limit, false);
      throw UsageError("--mem-limit " + planned_budget(limit, rep.planned_limit) + ": " +
                       rep.result.explanation);
    }
    std::printf("%s on %d ranks, global batch %lld, costs from %s; searched in %.3f s\n",
                rep.model.model().describe().c_str(), rep.spec.world(), (long long)spec.cost.global_batch,
                rep.model.source().c_str(), rep.search_s);
    print_plan(rep.model, rep.result, rep.baselines, limit, !flags->quiet);
    write_file_atomic(flags->out, plan_to_json(rep.model, rep.result).dump(2));
    std::printf("wrote %s\n", flags->out.c_str());
    if (!flags->svg.empty()) {
      write_file_atomic(flags->svg, plan_svg(rep.model, rep.result, rep.baselines));
      std::printf("wrote %s\n", flags->svg.c_str());
    }
    return 0;
  };
}

}  // namespace slimshard::cli
