// cmd_plan.cpp — `slimshard profile` (measure the hardware for the cost model, under mpirun) and `slimshard
// plan` (search the per-op plan under a memory budget; table, baselines, plan file, SVG).
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>

#include "commands.h"
#include "slimshard/common.h"
#include "slimshard/plan.h"

namespace slimshard::cli {
namespace {

std::string mib(int64_t b) { return format_mib(static_cast<double>(b)); }

std::vector<int64_t> parse_sizes(const std::string& list, const std::string& flag) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t pos = 0;
      const long long v = std::stoll(item, &pos);
      if (pos != item.size() || v <= 0) throw std::invalid_argument("size");
      out.push_back(v);
    } catch (const std::exception&) {
      throw UsageError(flag + ": '" + item + "' is not a positive integer (expected a list like 1,2,4)");
    }
  }
  if (out.empty()) throw UsageError(flag + ": empty list");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

void print_plan(const CostModel& m, const SearchResult& r,
                const std::vector<std::pair<std::string, SearchResult>>& base, int64_t mem_limit,
                bool table) {
  const PlanCost& c = r.cost;
  if (table) {
    std::printf("%-24s %11s %-10s %14s %13s %9s\n", "op", "params", "choice", "persistent MiB",
                "transient MiB", "time ms");
    for (size_t i = 0; i < m.ops().size(); ++i) {
      const ChoiceCost& cc = c.per_op[i];
      int64_t params = 0;
      for (int64_t n : m.ops()[i].param_numels) params += n;
      const std::string choice = std::string(strategy_name(cc.choice.strategy)) +
                                 (cc.choice.splits > 1 ? " x" + std::to_string(cc.choice.splits) : "");
      std::printf("%-24s %11lld %-10s %14s %13s %9.2f\n", m.ops()[i].name.c_str(), (long long)params,
                  choice.c_str(), mib(cc.mem.persistent()).c_str(), mib(cc.transient_bytes).c_str(),
                  cc.time_ms);
    }
  }
  std::printf(
      "plan: micro-batch %lld x %lld per step; predicted peak %s MiB per rank (persistent %s + activations "
      "%s + transient %s)%s; step %.1f ms, %.1f samples/s, %.0f tokens/s\n",
      (long long)c.micro_batch, (long long)c.accum, mib(c.peak_bytes).c_str(),
      mib(c.persistent_bytes).c_str(), mib(c.activation_bytes).c_str(), mib(c.transient_bytes).c_str(),
      mem_limit > 0 ? (" of " + mib(mem_limit) + " allowed").c_str() : "", c.step_ms, c.samples_per_s,
      c.tokens_per_s);
  for (const auto& [name, b] : base)
    std::printf("  %-18s peak %8s MiB, step %9.1f ms, %8.0f tokens/s%s\n", (name + " everywhere:").c_str(),
                mib(b.cost.peak_bytes).c_str(), b.cost.step_ms, b.cost.tokens_per_s,
                b.fits ? "" : "   does not fit");
}

std::vector<std::pair<std::string, SearchResult>> baselines(const CostModel& m, const SearchOptions& so) {
  std::vector<std::pair<std::string, SearchResult>> out;
  for (Strategy s : {Strategy::ddp, Strategy::slim, Strategy::zero1, Strategy::zero2, Strategy::zero3})
    if (s != Strategy::slim || m.options().allow_slim)
      out.emplace_back(strategy_name(s), uniform_baseline(m, s, so));
  return out;
}

Runner add_profile(CLI::App& app) {
  struct Flags {
    TrainFlags t;
    std::string micro = "1,2,4";
    std::string out = "profile.json";
    int repeats = 5;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub =
      app.add_subcommand("profile", "Measure op times, activations and collectives for the planner");
  sub->footer(
      "Run under mpirun with the world size you will train at:\n"
      "  mpirun -n 2 slimshard profile --model gpt-small --micro-batch 1,2,4,8 --out profile.json");
  add_model_flags(sub, f->t);
  sub->add_option("--micro-batch", f->micro, "micro-batch sizes to time (comma-separated)")
      ->capture_default_str();
  sub->add_option("--out", f->out, "profile file to write")->capture_default_str();
  sub->add_option("--repeats", f->repeats, "timed repeats per measurement (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  sub->add_option("--seed", f->t.o.seed, "seed")->capture_default_str();
  sub->add_option("--threads", f->t.o.threads, "LibTorch threads per process")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  add_comm_flags(sub, f->t.comm);
  return [f]() {
    const ModelConfig cfg = model_from_flags(f->t);
    const auto micro = parse_sizes(f->micro, "--micro-batch");
    Communicator& comm = start_comm(f->t.comm);
    at::set_num_threads(f->t.o.threads);
    ProfileOptions po;
    po.repeats = f->repeats;
    const auto t0 = std::chrono::steady_clock::now();
    Profile p = run_profile(cfg, micro, comm, po, f->t.o.seed);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (comm.rank() != 0) return 0;
    write_file_atomic(f->out, profile_to_json(p).dump(1));
    std::printf("profiled %s on %d rank(s) in %.1f s -> %s\n", cfg.describe().c_str(), p.world, secs,
                f->out.c_str());
    for (int64_t b : micro) {
      double fwd = 0, bwd = 0;
      for (const auto& op : p.ops) fwd += op.fwd_ms.at(b), bwd += op.bwd_ms.at(b);
      std::printf("  micro-batch %lld: forward %.1f ms, backward %.1f ms\n", (long long)b,
                  fwd + p.loss_fwd_ms.at(b), bwd + p.loss_bwd_ms.at(b));
    }
    for (const auto& [k, fit] : p.collectives)
      std::printf("  %-14s t = %.3f ms + bytes / %.2f GB/s   (fit residual %.1f%%)\n", k.c_str(),
                  fit.alpha_ms, fit.beta_ms_per_byte > 0 ? 1e-6 / fit.beta_ms_per_byte : 0.0,
                  100 * fit.residual);
    std::printf(
        "  compute runs %.2fx slower while communication runs; %.3f ms per collective in a step; "
        "AdamW and clipping %.2f ns per element\n",
        p.overlap_slowdown, p.collective_overhead_ms, p.optimizer_ns_per_element);
    return 0;
  };
}

CostOptions cost_options(const TrainOptions& o, int world) {
  CostOptions co;
  co.world = world;
  co.global_batch = o.batch_size;
  co.prefetch = o.prefetch;
  co.optim_states = o.optim.name == "adamw" ? 2 : (o.optim.momentum != 0 ? 1 : 0);
  co.bucket_bytes = o.bucket_bytes;
  co.allow_slim = o.allow_slim;
  co.slim_fraction = o.slim.core + o.slim.explore * (1 - o.slim.core);
  co.slim_wire_bytes = o.slim.wire_bytes();
  co.slim_period = o.slim.period;
  return co;
}

// The cost model a plan is made from: a profile or a cluster spec.
CostModel cost_model_for(const TrainOptions& o, int world, const std::string& profile,
                         const std::string& cluster, const std::string& micro, bool scale, bool splits) {
  if (profile.empty() == cluster.empty()) throw UsageError("give one of --profile or --cluster");
  CostOptions co = cost_options(o, world);
  co.allow_splits = splits;
  if (!profile.empty()) {
    Profile p = load_profile(profile);
    if (scale) p = scale_profile(p, world);
    return CostModel::from_profile(p, co);
  }
  return CostModel::from_cluster(load_cluster(cluster), o.model, co, parse_sizes(micro, "--micro-batch"));
}

Runner add_plan(CLI::App& app) {
  struct Flags {
    TrainFlags t;
    int world = 0;
    std::string profile, cluster, out = "plan.json", svg, micro = "1,2,4,8";
    bool scale = false, no_splits = false, quiet = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand("plan", "Find the fastest per-op plan (OSDP) that fits a memory budget");
  sub->footer(
      "Examples:\n"
      "  mpirun -n 2 slimshard profile --model gpt-25m --micro-batch 1,2,4 --out p.json\n"
      "  slimshard plan --model gpt-25m --world 2 --batch-size 8 --mem-limit 500MiB --profile p.json --svg "
      "plan.svg\n"
      "  slimshard plan --model gpt --n-layer 48 --n-embd 1536 --n-head 16 --seq-len 1024 --vocab 50257 \\\n"
      "      --cluster examples/clusters/8xgpu-24gb-pcie3.json --batch-size 32 --mem-limit 24GiB");
  add_model_flags(sub, f->t);
  TrainOptions& o = f->t.o;
  sub->add_option("--world", f->world, "ranks (default: the profile's, or the cluster's devices)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--mem-limit", f->t.mem_limit,
                  "memory budget per rank, e.g. 500MiB (default: none, or the cluster's)");
  sub->add_option("--profile", f->profile, "profile from `slimshard profile`");
  sub->add_option("--cluster", f->cluster, "analytic device spec (JSON) for hardware we cannot run on");
  sub->add_flag("--scale-profile", f->scale,
                "use a profile taken at another world size (collectives re-derived)");
  sub->add_option("--micro-batch", f->micro, "with --cluster: micro-batch candidates")->capture_default_str();
  sub->add_option("--batch-size", o.batch_size, "global batch in rows (kept; accumulation makes up the rest)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--prefetch", o.prefetch, "zero3 prefetch depth")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  sub->add_option("--optimizer", o.optim.name, "adamw | sgd")
      ->capture_default_str()
      ->check(CLI::IsMember({"adamw", "sgd"}));
  sub->add_flag("--no-splits", f->no_splits, "do not split operators");
  sub->add_flag("--allow-slim", o.allow_slim, "Slim-DP may be chosen for replicated ops (see --slim-*)");
  add_slim_flags(sub, o.slim);
  sub->add_option("--out", f->out, "plan file to write")->capture_default_str();
  sub->add_option("--svg", f->svg, "also draw the plan as an SVG page");
  sub->add_flag("--quiet", f->quiet, "totals only, no per-op table");
  return [f]() {
    TrainOptions o = train_options(f->t);
    int world = f->world;
    int64_t limit = o.mem_limit;
    if (!f->profile.empty() && world == 0) world = load_profile(f->profile).world;
    if (!f->cluster.empty()) {
      const ClusterSpec c = load_cluster(f->cluster);
      if (world == 0) world = c.devices;
      if (limit == 0) limit = c.memory_bytes;
    }
    if (world == 0) world = 1;
    const auto t0 = std::chrono::steady_clock::now();
    CostModel m = cost_model_for(o, world, f->profile, f->cluster, f->micro, f->scale, !f->no_splits);
    SearchOptions so;
    so.mem_limit = limit;
    SearchResult r = search_plan(m, so);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto base = baselines(m, so);
    if (!r.fits) {
      print_plan(m, base.back().second, base, limit, false);
      throw UsageError("--mem-limit " + mib(limit) + " MiB: " + r.explanation);
    }
    std::printf("%s on %d ranks, global batch %lld, costs from %s; searched in %.3f s\n",
                m.model().describe().c_str(), world, (long long)o.batch_size, m.source().c_str(), secs);
    print_plan(m, r, base, limit, !f->quiet);
    write_file_atomic(f->out, plan_to_json(m, r).dump(2));
    std::printf("wrote %s\n", f->out.c_str());
    if (!f->svg.empty()) {
      write_file_atomic(f->svg, plan_svg(m, r, base));
      std::printf("wrote %s\n", f->svg.c_str());
    }
    return 0;
  };
}

}  // namespace slimshard::cli
