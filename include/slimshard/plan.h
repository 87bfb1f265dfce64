// plan.h — per-operator plans (strategy and splits for each op) and the memory estimate per rank.
// A plan file: { "world": N?, "micro_batch": b?, "ops": { "<op name or glob>": {"strategy": "zero3",
// "splits": 2}, ... } } — entries apply in file order, later ones winning; `*` matches any characters.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "slimshard/nn.h"
#include "slimshard/shard.h"

namespace slimshard {
class Communicator;
}

namespace slimshard {

struct OpChoice {
  Strategy strategy = Strategy::ddp;
  int splits = 1;
};

struct PlanEntry {
  std::string pattern;
  bool has_strategy = false, has_splits = false;
  Strategy strategy = Strategy::ddp;
  int splits = 1;
};

struct Plan {
  std::string source;  // file name, for messages
  int world = 0;       // 0 = any
  int64_t micro_batch = 0;
  std::vector<PlanEntry> entries;
};

// Reads and checks a plan file; problems -> UsageError naming the file and the entry.
Plan load_plan(const std::string& path);
// The same from the text of a plan; `source` names it in messages.
Plan parse_plan(const std::string& text, const std::string& source);
// The same plan everywhere.
Plan uniform_plan(Strategy s);
// True if `name` matches the glob `pattern` (`*` any run of characters, `?` one character).
bool glob_match(const std::string& pattern, const std::string& name);

// Each op's choice under `plan`. An entry matching no op, or splits an op cannot take -> UsageError.
std::map<std::string, OpChoice> resolve_plan(const Plan& plan, const Model& model);
// Applies splits to the model's ops and returns each param's strategy (in ParamSet order).
std::vector<Strategy> apply_plan(const std::map<std::string, OpChoice>& choices, Model& model);

// ---------------------------------------------------------------------------------------------------------------
// Memory per rank. Activations come from a probe: one forward and backward of the model at the micro-batch in
// this process, with the tracking allocator recording what each op leaves live (the same code and kernels the
// training runs, so no formula to drift from them).
struct ActivationProfile {
  int64_t micro_batch = 0;
  std::map<std::string, int64_t> op_bytes;  // kept for backward, attributed to the op that ends the span
  int64_t total_bytes = 0;                  // live at the end of forward, beyond params and grads
  int64_t backward_extra = 0;               // peak in backward beyond `total_bytes`
};
ActivationProfile probe_activations(const ModelConfig& config, int64_t micro_batch, uint64_t seed);

// Bytes one rank holds for one op under a choice, from its params' sizes (fp32): persistent (params, grads,
// optimizer state), and transient: with zero3, K+1 gathered blocks; with zero2/zero3, up to three full
// gradients of a block waiting to be reduce-scattered (the engine queues at most two besides the one
// produced).
struct ChoiceMemory {
  int64_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;
  int64_t gathered_block_bytes = 0, grad_block_bytes = 0;
  int64_t transient(int prefetch) const {
    return (prefetch + 1) * gathered_block_bytes + 3 * grad_block_bytes;
  }
  int64_t persistent() const { return param_bytes + grad_bytes + optim_bytes; }
};
// `param_numels`: the op's params at splits=1 (weight, bias); with splits k each is cut into k blocks.
ChoiceMemory choice_memory(const std::vector<int64_t>& param_numels, OpChoice c, int world, int optim_states);

struct OpMemory {
  std::string op;
  int64_t params = 0;  // elements
  OpChoice choice;
  int64_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;  // persistent, this rank
  int64_t transient_bytes = 0;  // gathered weights and full gradients in flight (see ChoiceMemory)
  int64_t activation_bytes = 0;
  int64_t persistent() const { return param_bytes + grad_bytes + optim_bytes; }
};

struct MemoryEstimate {
  std::vector<OpMemory> ops;
  int64_t persistent = 0, activations = 0, transient = 0, peak = 0;
};

// Estimate per rank for `choices` at `world` ranks with prefetch depth K and `optim_states` fp32 tensors of
// state per param element (AdamW 2, SGD with momentum 1). Peak = persistent + activations (with the
// backward's scratch) + the largest transient of any op.
MemoryEstimate estimate_memory(const Model& model, const std::map<std::string, OpChoice>& choices, int world,
                               int prefetch, int optim_states, const ActivationProfile& act);

// Each op's params at splits=1 (numel of weight, bias), whatever the model's current splits.
std::vector<int64_t> op_param_numels(const Op& op);
struct OpProfile;
// The ops of a model (name, kind, param sizes, output features) from its config alone, without allocating it
// (a 175B-parameter GPT is planned, not built). Times and activations are left empty.
std::vector<OpProfile> op_shapes(const ModelConfig& config);

// ---------------------------------------------------------------------------------------------------------------
// Profile: what the cost model is fitted to, measured on the real hardware under mpirun.
struct CollectiveFit {
  double alpha_ms = 0, beta_ms_per_byte = 0;
  double residual = 0;                            // RMS relative error of the fit over the measured points
  std::vector<std::pair<double, double>> points;  // (bytes of the full tensor, median ms)
  double ms(double bytes) const { return alpha_ms + beta_ms_per_byte * bytes; }
};

struct OpProfile {
  std::string name, kind;
  std::vector<int64_t> param_numels;  // at splits=1
  int64_t out_features = 0;           // linear ops (splits must divide it); 0 otherwise
  std::map<int64_t, double> fwd_ms,
      bwd_ms;                            // per micro-batch: time from the previous op's end to this op's end
  std::map<int64_t, int64_t> act_bytes;  // per micro-batch: what the op (and the code before it) keeps live
};

struct Profile {
  nlohmann::json machine;
  int world = 1, threads = 1;
  std::string libtorch, date;
  ModelConfig model;
  std::vector<int64_t> micro_batches;
  std::vector<OpProfile> ops;                          // model order
  std::map<int64_t, double> loss_fwd_ms, loss_bwd_ms;  // after the last op: loss; backward's tail
  std::map<int64_t, int64_t> loss_act_bytes, backward_extra_bytes;
  std::map<std::string, CollectiveFit> collectives;  // all_gather, reduce_scatter, all_reduce
  double overlap_slowdown = 1;        // compute time while communication runs / compute time alone
  double collective_overhead_ms = 0;  // latency of a zero3 gather waited for among busy threads (fitted)
  nlohmann::json measured_steps;      // the real steps that latency was fitted to
  double optimizer_ns_per_element = 0;
  double reduce_ns_per_byte = 0;  // the comm thread's own work per byte reduced (for scaling to other worlds)
};

struct ProfileOptions {
  int warmup = 2, repeats = 5;
  int64_t max_collective_bytes = 32 << 20;
};

// Every rank of `comm` must call it (collectives are timed). Per-op times are rank 0's.
Profile run_profile(const ModelConfig& model, const std::vector<int64_t>& micro_batches, Communicator& comm,
                    const ProfileOptions& o, uint64_t seed);
nlohmann::json profile_to_json(const Profile& p);
// Checks every field; problems -> UsageError naming `what` and the field.
Profile profile_from_json(const nlohmann::json& j, const std::string& what);
Profile load_profile(const std::string& path);
// The same profile for another world size: collective fits re-derived by the ring model from the measured
// bandwidth and latency (what `plan --scale-profile` does).
Profile scale_profile(const Profile& p, int world);

// ---------------------------------------------------------------------------------------------------------------
// Analytic device spec, for clusters we cannot run on.
struct ClusterSpec {
  std::string name;
  int devices = 1, devices_per_node = 1;
  int64_t memory_bytes = 0;
  double peak_flops = 0, achievable_fraction = 0.5;
  double memory_bandwidth = 1e12;                 // bytes/s, for memory-bound ops and the optimizer
  double intra_bandwidth = 0, intra_latency = 0;  // bytes/s, s
  double inter_bandwidth = 0, inter_latency = 0;
  double overlap_slowdown = 1.1;
  int activation_bytes_per_element = 2;  // 2 for fp16/bf16 activations on GPUs
};
ClusterSpec load_cluster(const std::string& path);

// ---------------------------------------------------------------------------------------------------------------
// Cost model: for each op and choice, time per step and bytes per rank; additive over ops (each op's
// communication overlaps its own compute), so that the search can be exact.
struct ChoiceCost {
  OpChoice choice;
  double time_ms = 0;  // this op's share of a step: compute, exposed communication, optimizer
  ChoiceMemory mem;
  int64_t transient_bytes = 0;
};

struct PlanCost {
  int64_t micro_batch = 0, accum = 1;
  double step_ms = 0, samples_per_s = 0, tokens_per_s = 0;
  int64_t peak_bytes = 0, persistent_bytes = 0, activation_bytes = 0, transient_bytes = 0;
  std::vector<ChoiceCost> per_op;  // model order
};

struct CostOptions {
  int world = 1;
  int64_t global_batch = 8;
  int prefetch = 1;
  int optim_states = 2;
  int64_t bucket_bytes = 25 << 20;
  bool allow_splits = true;
  // Slim-DP as a choice (plan --allow-slim): the fraction of elements a round exchanges, α + β(1 − α), the
  // bytes each travels in (4 fp32, 2 bf16), and τ.
  bool allow_slim = false;
  double slim_fraction = 0.325;
  double slim_wire_bytes = 4;
  int slim_period = 1;
};

class CostModel {
 public:
  static CostModel from_profile(const Profile& p, const CostOptions& o);
  static CostModel from_cluster(const ClusterSpec& c, const ModelConfig& model, const CostOptions& o,
                                const std::vector<int64_t>& micro_batches);
  const CostOptions& options() const { return o_; }
  const ModelConfig& model() const { return model_; }
  const std::vector<OpProfile>& ops() const { return ops_; }
  // Micro-batches the search may pick: measured or candidate sizes that divide the per-rank batch.
  std::vector<int64_t> micro_batches() const;
  std::vector<OpChoice> candidates(size_t op) const;
  ChoiceCost cost(size_t op, OpChoice c, int64_t micro) const;
  int64_t activation_bytes(int64_t micro) const;
  double fixed_ms(int64_t micro) const;  // per step, independent of choices (loss, optimizer-free parts)
  PlanCost evaluate(const std::map<std::string, OpChoice>& choices, int64_t micro) const;
  std::string source() const { return source_; }

 private:
  CostOptions o_;
  ModelConfig model_;
  std::vector<OpProfile> ops_;
  std::map<int64_t, double> loss_fwd_, loss_bwd_;
  std::map<int64_t, int64_t> loss_act_, bwd_extra_;
  std::map<std::string, CollectiveFit> coll_;
  double overlap_ = 1, opt_ns_ = 0, coll_overhead_ = 0;
  std::string source_;
  double interp(const std::map<int64_t, double>& m, int64_t b) const;
  int64_t interp_bytes(const std::map<int64_t, int64_t>& m, int64_t b) const;
};

// ---------------------------------------------------------------------------------------------------------------
// Search: per op a choice (strategy × splits) and one micro-batch, minimising the step time (maximising
// samples/s at the fixed global batch) with the peak under `mem_limit`. Exact for the cost model with memory
// rounded up to `memory_buckets` steps of the budget: a multiple-choice knapsack by dynamic programming, for
// every bound on the largest transient and every micro-batch.
struct SearchOptions {
  int64_t mem_limit = 0;  // 0 = unlimited
  int memory_buckets = 1024;
};

struct SearchResult {
  bool fits = false;
  std::map<std::string, OpChoice> choices;
  PlanCost cost;
  std::string explanation;  // when nothing fits: by how much, and what would
};

SearchResult search_plan(const CostModel& model, const SearchOptions& o);
// Every combination (tests only: small models).
SearchResult brute_force_plan(const CostModel& model, const SearchOptions& o);
// The same strategy everywhere, at the best micro-batch that fits (or the smallest if none does).
SearchResult uniform_baseline(const CostModel& model, Strategy s, const SearchOptions& o);

// A plan file for `result` (with the predicted figures alongside, for reading).
nlohmann::ordered_json plan_to_json(const CostModel& model, const SearchResult& result);
// An SVG page: memory per op by choice, and the plan's predicted throughput next to the baselines.
std::string plan_svg(const CostModel& model, const SearchResult& plan,
                     const std::vector<std::pair<std::string, SearchResult>>& baselines);

}  // namespace slimshard
