// cost_model.h — time and memory of every op under every choice (strategy × splits) at a micro-batch, from a
// measured profile or an analytic device spec (ClusterSpec, for clusters we cannot run on). Additive over
// ops — each op's communication overlaps its own compute — so that the search can be exact.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "slimshard/memory_estimate.h"
#include "slimshard/plan.h"
#include "slimshard/profile.h"

namespace slimshard {

// Analytic device spec.
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
// The same from parsed JSON; `what` names it in messages.
ClusterSpec cluster_from_json(const nlohmann::json& j, const std::string& what);

struct ChoiceCost {
  OpChoice choice;
  double time_ms = 0;  // this op's share of a step: compute, exposed communication, optimizer
  // Bytes this rank sends per step for the op, within its host and between hosts (comm.h's convention).
  double intra_bytes = 0, inter_bytes = 0;
  ChoiceMemory mem;  // persistent
  // While the op runs, its neighbours taking the same strategy (transients_in_uniform_neighbourhood): the
  // most transient bytes, and the most activations + transients at any of its moments — what the search
  // charges.
  int64_t transient_bytes = 0, load_bytes = 0;
  // When recomputation is the search's choice (CostModel::recompute_is_choice), the activations a block keeps
  // through the step, charged on its first op beside the persistent bytes, and load_bytes counts only what
  // lies above the blocks' kept activations (see search.cpp).
  int64_t kept_bytes = 0;
};

struct PlanCost {
  int64_t micro_batch = 0, accum = 1;
  double step_ms = 0, samples_per_s = 0, tokens_per_s = 0;
  // The peak and its parts at the moment it falls at (memory_estimate.h: peak_of).
  int64_t peak_bytes = 0, persistent_bytes = 0, activation_bytes = 0, transient_bytes = 0;
  std::string peak_at;
  std::vector<ChoiceCost> per_op;  // model order
};

// When a Slim-DP round's average is applied (--slim-apply): after the step (now), block by block as the next
// forward reaches it (forward), or one step late (next).
enum class SlimApply { now, forward, next };
SlimApply parse_slim_apply(const std::string& s);

// What the cost model knows of the run: world, global batch, prefetch, optimizer, buckets, Slim-DP.
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
  SlimApply slim_apply = SlimApply::forward;
  // Working copies gathered in precision.compute, gradients reduced in precision.reduce; a profile taken in
  // another precision is refused.
  Precision precision;
  // Small sharded params fused per block (DataParallel::Options::fuse_bytes): the memory simulation, and
  // split pieces that travel fused pay no latency of their own.
  int64_t fuse_bytes = 256 << 10;
  // Ranks per host (0: all on one host). With more than one host, hsdp and hsdp2 are choices too, and every
  // collective is charged its bytes on each link (within a host, between hosts).
  int ranks_per_host = 0;
  bool allow_hybrid = true;  // hsdp, hsdp2 among the choices (with several hosts)
  // Activation recomputation per GPT block: never, everywhere, or (auto) the search's choice per block.
  Recompute recompute = Recompute::auto_;
  int hosts() const { return ranks_per_host > 0 ? world / ranks_per_host : 1; }
  int per_host() const { return ranks_per_host > 0 ? ranks_per_host : world; }
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
  // The activations at every moment of a step at this micro-batch (interpolated between measured ones), with
  // the blocks recomputing that `choices` say (none by default).
  ActivationMoments activations(int64_t micro,
                                const std::map<std::string, OpChoice>* choices = nullptr) const;
  // Whether the search chooses recomputation per block (--recompute auto, a GPT, and activations measured
  // with recomputation).
  bool recompute_is_choice() const;
  // The same model with --recompute none (its caches kept: they do not depend on that).
  CostModel without_recompute() const {
    CostModel m = *this;
    m.o_.recompute = Recompute::none;
    return m;
  }
  // The same model with hybrid sharding not among the choices (--no-hybrid; caches kept).
  CostModel without_hybrid() const {
    CostModel m = *this;
    m.o_.allow_hybrid = false;
    return m;
  }
  // Takes the transient simulations `other` (the same model, another --recompute) has run.
  void adopt_caches(const CostModel& other) const {
    transients_.insert(other.transients_.begin(), other.transients_.end());
  }
  // What the search charges for the loss's moment (as ChoiceCost::load_bytes).
  int64_t loss_load(int64_t micro) const;
  // The block of op i (its index among the blocks), or -1.
  int block_index(size_t op) const { return block_[op]; }
  // What block `b` keeps through a step at this micro-batch, recomputing or not.
  int64_t block_kept_bytes(int b, bool recompute, int64_t micro) const {
    return block_kept(micro)[recompute ? 1 : 0].at(static_cast<size_t>(b));
  }
  double fixed_ms(int64_t micro) const;  // per step, independent of choices (loss, optimizer-free parts)
  PlanCost evaluate(const std::map<std::string, OpChoice>& choices, int64_t micro) const;
  std::string source() const { return source_; }

 private:
  CostOptions o_;
  ModelConfig model_;
  std::vector<OpProfile> ops_;
  std::vector<OpShape> shapes_;  // ops_ as shapes, for the memory simulation
  std::map<int64_t, double> loss_fwd_, loss_bwd_;
  std::map<int64_t, int64_t> loss_act_, bwd_extra_, loss_peak_;
  std::map<std::string, CollectiveFit> coll_;
  double overlap_ = 1, opt_ns_ = 0, coll_overhead_ = 0;
  // by strategy name, then micro-batch (profile.h: strategy_residual_ms)
  std::map<std::string, std::map<int64_t, double>> residual_;
  double param_numel_ = 1;  // all ops' params, for spreading the residuals
  std::string source_;
  // Op i's moments under a choice in its uniform neighbourhood, by (op, strategy, splits, accumulating,
  // recomputing).
  mutable std::map<std::tuple<size_t, int, int, bool, bool>, OpMoments> transients_;
  OpMoments op_transients(size_t op, OpChoice c, int64_t accum) const;
  OpMoments act_moments(const OpProfile& op, int64_t micro, bool recompute = false) const;
  // Recomputation: each op's block (-1 outside; blocks_ of them), whether activations were measured with it,
  // and per micro-batch the bytes each block keeps through the step without [0] and with [1] it.
  std::vector<int> block_, before_;  // before_: the blocks wholly before op i (its own block's index in one)
  std::vector<size_t> first_op_;     // each block's first op, then the first op after the last block
  int blocks_ = 0;
  bool live_measured_ = false, rc_measured_ = false;
  mutable std::map<int64_t, std::array<std::vector<int64_t>, 2>> kept_;
  void find_blocks();
  const std::array<std::vector<int64_t>, 2>& block_kept(int64_t micro) const;
  // Op i's activation moments with its block recomputing or not, less what the blocks before it keep (they
  // are added back per plan): the part that depends on op i's block alone.
  OpMoments local_moments(size_t op, bool recompute, int64_t micro) const;
  // What the blocks before op i keep when block j recomputes as rc(j).
  int64_t kept_before(size_t op, int64_t micro, const std::function<bool(int)>& rc) const;
  double interp(const std::map<int64_t, double>& m, int64_t b) const;
  int64_t interp_bytes(const std::map<int64_t, int64_t>& m, int64_t b) const;
};

}  // namespace slimshard
