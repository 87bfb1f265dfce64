// commands.h — each subcommand registers its flags on the CLI11 app and returns the function that runs it.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

#include "slimshard/comm.h"
#include "slimshard/plan.h"
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

// The flags of `train`, shared by the subcommands that describe a training run (memory, bench).
struct TrainFlags {
  TrainOptions o;
  std::string model = "gpt-small";
  int64_t n_layer = 0, n_head = 0, n_embd = 0, seq_len = 0, vocab = 0;
  std::string mem_limit;
  int64_t eval_rows = -1;
  double bucket_mib = 25;
  std::string profile;  // osdp
  CommOptions comm;
  CLI::Option *o_layer = nullptr, *o_head = nullptr, *o_embd = nullptr, *o_seq = nullptr, *o_vocab = nullptr;
};
void add_model_flags(CLI::App* sub, TrainFlags& f);
void add_train_flags(CLI::App* sub, TrainFlags& f);
ModelConfig model_from_flags(const TrainFlags& f);
TrainOptions train_options(const TrainFlags& f);
// The estimate `memory` prints for the run `o` describes at `world` ranks; `probe_cache` (optional) keeps the
// activation probe between calls at the same micro-batch.
MemoryEstimate estimate_for(const TrainOptions& o, int world, ActivationProfile* probe_cache);
// The cost model's options for a run at `world` ranks (batch, prefetch, optimizer states, buckets, Slim-DP).
CostOptions cost_options(const TrainOptions& o, int world);
// --slim-*: Slim-DP's parameters (train, plan).
void add_slim_flags(CLI::App* sub, SlimOptions& s);
// The cost model for a run: from a profile file or a cluster spec.
CostModel cost_model_for(const TrainOptions& o, int world, const std::string& profile,
                         const std::string& cluster, const std::string& micro, bool scale, bool splits);
// The plan's table (optional) and totals, with the uniform baselines for comparison.
void print_plan(const CostModel& m, const SearchResult& r,
                const std::vector<std::pair<std::string, SearchResult>>& base, int64_t mem_limit, bool table);
std::vector<std::pair<std::string, SearchResult>> baselines(const CostModel& m, const SearchOptions& so);
// The command line as given (bench forwards the training flags to its runs).
const std::vector<std::string>& raw_args();

}  // namespace slimshard::cli
