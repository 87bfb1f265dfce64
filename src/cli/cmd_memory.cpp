// cmd_memory.cpp — `slimshard memory`: the bytes each rank holds under a strategy or plan, per op and in
// total (the estimate the planner uses), from the model's shapes and an activation probe at the micro-batch.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "slimshard/common.h"

namespace slimshard::cli {

Runner add_memory(CLI::App& app) {
  struct Flags {
    TrainFlags t;
    int world = 1, per_host = 0;
    std::string json;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand("memory", "Estimate the memory per rank of a strategy or plan, per op");
  sub->footer(
      "Example:\n  slimshard memory --model gpt-25m --world 2 --strategy zero3 --batch-size 8\n"
      "  slimshard memory --model gpt-small --world 4 --plan plan.json");
  add_model_flags(sub, flags->t);
  TrainOptions& train = flags->t.train;
  sub->add_option("--world", flags->world, "ranks")->capture_default_str()->check(integer(1, 1 << 20));
  sub->add_option("--strategy", train.strategy,
                  "ddp | zero1 | zero2 | zero3 | slim | hsdp | hsdp2 for every op")
      ->capture_default_str()
      ->check(CLI::IsMember({"ddp", "zero1", "zero2", "zero3", "slim", "hsdp", "hsdp2"}));
  sub->add_option("--ranks-per-host", flags->per_host,
                  "ranks on each host (hsdp, hsdp2 shard over them; default: all on one host)")
      ->check(integer(1, 1 << 20));
  sub->add_option("--plan", train.plan_file, "per-op strategies and splits (JSON)");
  sub->add_option("--batch-size", train.batch_size, "global batch in rows")
      ->capture_default_str()
      ->check(integer(1, 1 << 30));
  sub->add_option("--micro-batch", train.micro_batch,
                  "rows per forward/backward (default: the per-rank batch)")
      ->check(integer(1, 1 << 30));
  sub->add_option("--prefetch", train.prefetch, "zero3 prefetch depth")
      ->capture_default_str()
      ->check(integer(0, 64));
  sub->add_option("--optimizer", train.optim.name, "adamw | sgd")
      ->capture_default_str()
      ->check(CLI::IsMember({"adamw", "sgd"}));
  sub->add_option("--seed", train.seed, "seed")->capture_default_str()->check(seed_value());
  add_precision_flags(sub, flags->t);
  add_fuse_flag(sub, flags->t);
  add_recompute_flag(sub, flags->t);
  sub->add_option("--json", flags->json, "also write the estimate as JSON");
  return [flags]() {
    TrainOptions train = flags->t.train;
    train.model = model_from_flags(flags->t);
    train.precision = precision_from_flags(flags->t);
    train.fuse_bytes = static_cast<int64_t>(flags->t.fuse_kib * 1024);
    if (!flags->json.empty()) check_output_file(flags->json, "--json");
    if (flags->per_host > 0 && flags->world % flags->per_host != 0)
      throw UsageError("--ranks-per-host " + std::to_string(flags->per_host) + " does not divide --world " +
                       std::to_string(flags->world));
    const int per_host = flags->per_host > 0 && flags->per_host < flags->world ? flags->per_host : 0;
    const MemoryEstimate est = estimate_for(run_spec(train, flags->world, per_host));
    std::printf("%s on %d rank(s), %s, %s, per rank:\n", train.model.describe().c_str(), flags->world,
                train.plan_file.empty() ? ("--strategy " + train.strategy).c_str()
                                        : ("--plan " + train.plan_file).c_str(),
                train.precision.name().c_str());
    print_memory_estimate(est);
    if (!flags->json.empty()) write_file_atomic(flags->json, memory_estimate_json(est, flags->world).dump(2));
    return 0;
  };
}

}  // namespace slimshard::cli
