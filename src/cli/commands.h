// commands.h — each subcommand registers its flags on the CLI11 app and returns the function that runs it:
// flags -> one library call -> print. The flag tables shared by several subcommands are here too.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

#include "slimshard/comm.h"
#include "slimshard/train.h"

namespace slimshard::cli {

// The process's communicator, started by the subcommands that train (MPI under mpirun, else a world of one).
Communicator& start_comm(const CommOptions& opts);
// Flags of the communicator, shared by every subcommand that starts one.
void add_comm_flags(CLI::App* sub, CommOptions& opts);

using Runner = std::function<int()>;
Runner add_train(CLI::App& app);
Runner add_generate(CLI::App& app);
Runner add_memory(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_profile(CLI::App& app);
Runner add_plan(CLI::App& app);
Runner add_plot(CLI::App& app);
Runner add_export(CLI::App& app);

// The flags of `train`, shared by the subcommands that describe a training run (memory, bench, plan,
// profile): the options themselves and the flags that are parsed into them.
struct TrainFlags {
  TrainOptions train;
  std::string model = "gpt-small";
  int64_t n_layer = 0, n_head = 0, n_embd = 0, seq_len = 0, vocab = 0;
  std::string mem_limit;
  int64_t eval_rows = -1;
  double bucket_mib = 25;
  double fuse_kib = 256;
  std::string precision = "fp32", reduce_dtype = "fp32";
  CommOptions comm;
  CLI::Option *o_layer = nullptr, *o_head = nullptr, *o_embd = nullptr, *o_seq = nullptr, *o_vocab = nullptr;
};
void add_model_flags(CLI::App* sub, TrainFlags& flags);
void add_train_flags(CLI::App* sub, TrainFlags& flags);
// --precision and --reduce-dtype (train, bench, profile, plan, memory).
void add_precision_flags(CLI::App* sub, TrainFlags& flags);
// --fuse-kib (train, bench, memory).
void add_fuse_flag(CLI::App* sub, TrainFlags& flags);
// --recompute none|all|auto: activation recomputation per GPT block (train, bench, plan, memory).
void add_recompute_flag(CLI::App* sub, TrainFlags& flags);
Precision precision_from_flags(const TrainFlags& flags);
// --slim-*: Slim-DP's parameters (train, plan).
void add_slim_flags(CLI::App* sub, SlimOptions& slim);
ModelConfig model_from_flags(const TrainFlags& flags);
TrainOptions train_options(const TrainFlags& flags);
// Numbers from flags, read exactly (validators.cpp): an integer in [lo, hi] given as digits, a seed (any
// uint64), a finite real in [lo, hi] (open at either end when asked). Anything else: a usage error naming
// the flag.
CLI::Validator integer(int64_t lo, int64_t hi = INT64_MAX);
CLI::Validator seed_value();
CLI::Validator real(double lo, double hi = 1e308, bool open_lo = false, bool open_hi = false);
inline CLI::Validator positive_real(double hi = 1e308) { return real(0, hi, true); }
// "1,2,4" -> {1, 2, 4} (sorted, unique); anything but positive integers is a usage error naming `flag`.
std::vector<int64_t> parse_sizes(const std::string& list, const std::string& flag);
// The command line as given (bench forwards the training flags to its runs).
const std::vector<std::string>& raw_args();

}  // namespace slimshard::cli
