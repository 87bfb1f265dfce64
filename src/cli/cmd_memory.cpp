// cmd_memory.cpp — `slimshard memory`: the bytes each rank holds under a strategy or plan, per op and in
// total (the estimate the planner uses), from the model's shapes and an activation probe at the micro-batch.
#include <cstdio>
#include <fstream>
#include <memory>

#include "commands.h"
#include "slimshard/common.h"
#include "slimshard/plan.h"

namespace slimshard::cli {

MemoryEstimate estimate_for(const TrainOptions& o, int world, ActivationProfile* probe_cache) {
  auto model = build_model(o.model, o.seed);
  Plan plan =
      o.plan_file.empty() ? uniform_plan(parse_strategy(o.strategy, "--strategy")) : load_plan(o.plan_file);
  if (plan.world != 0 && plan.world != world)
    throw UsageError("--plan " + o.plan_file + ": made for " + std::to_string(plan.world) + " ranks, not " +
                     std::to_string(world));
  if (o.batch_size % world != 0)
    throw UsageError("--batch-size " + std::to_string(o.batch_size) + " is not divisible by " +
                     std::to_string(world) + " ranks");
  int64_t micro = o.micro_batch > 0      ? o.micro_batch
                  : plan.micro_batch > 0 ? plan.micro_batch
                                         : o.batch_size / world;
  auto choices = resolve_plan(plan, *model);
  apply_plan(choices, *model);
  ActivationProfile local;
  ActivationProfile& act = probe_cache ? *probe_cache : local;
  if (act.micro_batch != micro) act = probe_activations(o.model, micro, o.seed);
  const int states = o.optim.name == "adamw" ? 2 : (o.optim.momentum != 0 ? 1 : 0);
  return estimate_memory(*model, choices, world, o.prefetch, states, act);
}

Runner add_memory(CLI::App& app) {
  struct Flags {
    TrainFlags t;
    int world = 1;
    std::string json;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand("memory", "Estimate the memory per rank of a strategy or plan, per op");
  sub->footer(
      "Example:\n  slimshard memory --model gpt-25m --world 2 --strategy zero3 --batch-size 8\n"
      "  slimshard memory --model gpt-small --world 4 --plan plan.json");
  add_model_flags(sub, f->t);
  TrainOptions& o = f->t.o;
  sub->add_option("--world", f->world, "ranks")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  sub->add_option("--strategy", o.strategy, "ddp | zero1 | zero2 | zero3 for every op")
      ->capture_default_str()
      ->check(CLI::IsMember({"ddp", "zero1", "zero2", "zero3", "slim"}));
  sub->add_option("--plan", o.plan_file, "per-op strategies and splits (JSON)");
  sub->add_option("--batch-size", o.batch_size, "global batch in rows")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--micro-batch", o.micro_batch, "rows per forward/backward (default: the per-rank batch)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--prefetch", o.prefetch, "zero3 prefetch depth")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  sub->add_option("--optimizer", o.optim.name, "adamw | sgd")
      ->capture_default_str()
      ->check(CLI::IsMember({"adamw", "sgd"}));
  sub->add_option("--seed", o.seed, "seed")->capture_default_str();
  sub->add_option("--json", f->json, "also write the estimate as JSON");
  return [f]() {
    TrainOptions o = f->t.o;
    o.model = model_from_flags(f->t);
    const MemoryEstimate est = estimate_for(o, f->world, nullptr);
    auto mib = [](int64_t b) { return format_mib(static_cast<double>(b)); };
    std::printf(
        "%s on %d rank(s), %s, per rank:\n", o.model.describe().c_str(), f->world,
        o.plan_file.empty() ? ("--strategy " + o.strategy).c_str() : ("--plan " + o.plan_file).c_str());
    std::printf("%-22s %10s %-9s %6s %9s %9s %9s %11s %11s\n", "op", "params", "strategy", "splits",
                "param MiB", "grad MiB", "optim MiB", "transient", "activations");
    nlohmann::json ops = nlohmann::json::array();
    int64_t pb = 0, gb = 0, ob = 0;
    for (const OpMemory& m : est.ops) {
      std::printf("%-22s %10lld %-9s %6d %9s %9s %9s %11s %11s\n", m.op.c_str(), (long long)m.params,
                  strategy_name(m.choice.strategy), m.choice.splits, mib(m.param_bytes).c_str(),
                  mib(m.grad_bytes).c_str(), mib(m.optim_bytes).c_str(), mib(m.transient_bytes).c_str(),
                  mib(m.activation_bytes).c_str());
      pb += m.param_bytes, gb += m.grad_bytes, ob += m.optim_bytes;
      ops.push_back({{"op", m.op},
                     {"params", m.params},
                     {"strategy", strategy_name(m.choice.strategy)},
                     {"splits", m.choice.splits},
                     {"param_bytes", m.param_bytes},
                     {"grad_bytes", m.grad_bytes},
                     {"optim_bytes", m.optim_bytes},
                     {"transient_bytes", m.transient_bytes},
                     {"activation_bytes", m.activation_bytes}});
    }
    std::printf("%-22s %10s %-9s %6s %9s %9s %9s\n", "total", "", "", "", mib(pb).c_str(), mib(gb).c_str(),
                mib(ob).c_str());
    std::printf(
        "predicted peak per rank: %s MiB = persistent %s + activations %s + largest transient %s "
        "(LibTorch tensors; the shared-memory staging of the communicator is extra)\n",
        mib(est.peak).c_str(), mib(est.persistent).c_str(), mib(est.activations).c_str(),
        mib(est.transient).c_str());
    if (!f->json.empty())
      write_file_atomic(f->json, nlohmann::json{{"world", f->world},
                                                {"peak_bytes", est.peak},
                                                {"persistent_bytes", est.persistent},
                                                {"activation_bytes", est.activations},
                                                {"transient_bytes", est.transient},
                                                {"ops", ops}}
                                     .dump(2));
    return 0;
  };
}

}  // namespace slimshard::cli
