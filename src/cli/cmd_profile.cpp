// cmd_profile.cpp — `slimshard profile`: measure op times, activations, collectives and overlap on this
// machine for the planner, under mpirun at the world size that will train.
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "slimshard/common.h"

namespace slimshard::cli {

Runner add_profile(CLI::App& app) {
  struct Flags {
    TrainFlags t;
    std::string micro = "1,2,4";
    std::string out = "profile.json";
    int repeats = 5;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub =
      app.add_subcommand("profile", "Measure op times, activations and collectives for the planner");
  sub->footer(
      "Run under mpirun with the world size you will train at:\n"
      "  mpirun -n 2 slimshard profile --model gpt-small --micro-batch 1,2,4,8 --out profile.json");
  add_model_flags(sub, flags->t);
  sub->add_option("--micro-batch", flags->micro, "micro-batch sizes to time (comma-separated)")
      ->capture_default_str();
  sub->add_option("--out", flags->out, "profile file to write")->capture_default_str();
  sub->add_option("--repeats", flags->repeats, "timed repeats per measurement (median)")
      ->capture_default_str()
      ->check(integer(1, 100));
  sub->add_option("--seed", flags->t.train.seed, "seed")->capture_default_str()->check(seed_value());
  sub->add_option("--threads", flags->t.train.threads, "LibTorch threads per process")
      ->capture_default_str()
      ->check(integer(1, 256));
  add_precision_flags(sub, flags->t);
  add_comm_flags(sub, flags->t.comm);
  return [flags]() {
    const ModelConfig model = model_from_flags(flags->t);
    const auto micro = parse_sizes(flags->micro, "--micro-batch");
    check_output_file(flags->out, "--out");
    Communicator& comm = start_comm(flags->t.comm);
    at::set_num_threads(flags->t.train.threads);
    ProfileOptions profile_opts;
    profile_opts.repeats = flags->repeats;
    profile_opts.precision = precision_from_flags(flags->t);
    const auto t0 = std::chrono::steady_clock::now();
    const Profile p = profile_training(model, micro, comm, profile_opts, flags->t.train.seed);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (comm.rank() != 0) return 0;
    write_file_atomic(flags->out, profile_to_json(p).dump(1));
    std::printf("profiled %s in %s on %d rank(s) in %.1f s -> %s\n", model.describe().c_str(),
                p.precision.name().c_str(), p.world, secs, flags->out.c_str());
    print_profile(p);
    return 0;
  };
}

}  // namespace slimshard::cli
