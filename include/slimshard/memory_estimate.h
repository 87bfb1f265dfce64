// memory_estimate.h — the bytes one rank holds under a plan, per op and at its peak. Persistent: params,
// gradients and optimizer state by strategy. Activations: from a probe run of the real model, the peak within
// every op's span of forward and of backward. Transient: zero3's gathered weights and zero2/zero3's full
// gradients, simulated op by op as the engine holds them. The peak is the largest sum of the three at any
// moment, or persistent + the optimizer's scratch while it steps. `slimshard memory`, the cost model and the
// search all use these functions: there is no second formula.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "slimshard/plan.h"

namespace slimshard {

// Bytes at the moments around one op where the peak is sampled: in the code before it (forward: since the
// previous op's end — attention, GELU, residuals; backward: their backward), in the op itself, and in its
// backward's tail, from the hand-over of its (last) weight gradient on: there the backward's temporaries
// (the weight-gradient GEMM's output) are gone and the hand-over's (a bf16 copy of the gradient, a fused
// group's packed buffers) are made, so the two are paired there and not added up at `bwd`.
struct OpMoments {
  int64_t before_fwd = 0, fwd = 0, before_bwd = 0, bwd = 0, bwd_tail = 0;
  int64_t most() const { return std::max({before_fwd, fwd, before_bwd, bwd, bwd_tail}); }
  void shift(int64_t by) { before_fwd += by, fwd += by, before_bwd += by, bwd += by, bwd_tail += by; }
};
// The highest of activations + transients over the moments they share.
inline int64_t paired_peak(const OpMoments& a, const OpMoments& t) {
  return std::max({a.before_fwd + t.before_fwd, a.fwd + t.fwd, a.before_bwd + t.before_bwd, a.bwd + t.bwd,
                   a.bwd_tail + t.bwd_tail});
}

// Activations come from a probe: one forward and backward of the model at the micro-batch in this process,
// laid out as training lays it out (gradients allocated), with the tracking allocator recording the peak in
// every span between op boundaries — the same code and kernels the training runs, so no formula to drift
// from them. Bytes beyond params and gradients.
struct ActivationProfile {
  int64_t micro_batch = 0;
  std::set<std::string> recompute;           // the blocks that recomputed in the probe
  std::map<std::string, int64_t> op_bytes;   // kept for backward, attributed to the op that ends the span
  std::map<std::string, OpMoments> moments;  // the peak around and in each op
  // Live as each op's forward begins: between blocks, what the blocks before keep (nothing of a block's
  // temporaries is left there, unlike at an op's end)
  std::map<std::string, int64_t> live_before;
  int64_t loss_peak = 0;       // after the last op's forward: the loss
  int64_t total_bytes = 0;     // live at the end of forward
  int64_t backward_extra = 0;  // the highest in backward, beyond `total_bytes`
};
// In mixed precision (`compute` bf16) the probe runs the model as training runs it, with bf16 working copies.
// The blocks named in `recompute` recompute (nn.h: Block); what their recomputed forward holds is measured as
// part of the moment before the block's backward.
ActivationProfile probe_activations(const ModelConfig& config, int64_t micro_batch, uint64_t seed,
                                    at::ScalarType compute = at::kFloat,
                                    const std::set<std::string>& recompute = {});
// The blocks `choices` recompute.
std::set<std::string> recomputed_blocks(const std::map<std::string, OpChoice>& choices);

// The activation bytes at each moment the peak is sampled, in model order.
struct ActivationMoments {
  std::vector<OpMoments> ops;
  int64_t loss = 0;
  int64_t highest() const;
};
ActivationMoments activation_moments(const ActivationProfile& act, const std::vector<OpShape>& ops);

// Persistent bytes one rank holds for one op under a choice, from its params' sizes: fp32 masters, gradients
// and optimizer state; in mixed precision also the working copies (and DDP's bf16 bucket to reduce in).
struct ChoiceMemory {
  int64_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;
  // What the optimizer allocates while it steps: the largest owned block, fp32 (SGD, Slim-DP); none for
  // AdamW's fused pass.
  int64_t optimizer_scratch_bytes = 0;
  int64_t persistent() const { return param_bytes + grad_bytes + optim_bytes; }
};
// `param_numels`: the op's params at splits=1 (weight, bias); with splits k each is cut into k blocks.
// Hybrid strategies shard over the `per_host` ranks of a host (0: one host, the whole world).
ChoiceMemory choice_memory(const std::vector<int64_t>& param_numels, OpChoice c, int world, int optim_states,
                           const Precision& prec = {}, int per_host = 0);

// Transient bytes at each moment, simulated as the engine runs a step (nn/ops.cpp, shard/data_parallel.cpp,
// shard/prefetcher.cpp): zero3's gathered blocks — the op's own and what the prefetcher has issued ahead in
// the recorded order, at most K+1 (more while one op holds several) — and zero2/zero3's full gradients from
// allocation until reduce-scattered, the engine keeping at most two in flight besides the one being produced
// (with slow links they are all alive: the bound is what the estimate takes) and waiting for all of them at
// the end of each micro-batch's backward. `accum` micro-batches per step. Gathers travel in the compute
// dtype; gradients are produced in fp32 and travel in the reduce dtype.
struct TransientMoments {
  std::vector<OpMoments> ops;  // per op, model order
  int64_t after_forward = 0;   // while the loss runs
};
TransientMoments simulate_transients(const std::vector<OpShape>& ops, const std::vector<OpChoice>& choices,
                                     int world, int prefetch, int64_t accum, const Precision& prec = {},
                                     int64_t fuse_bytes = 0, int per_host = 0);
// What the search charges op `i` under `c`: its moments when every other op takes c's strategy (and its
// splits where it is a linear op they divide) — exact for such uniform plans, the neighbours' own moments
// covering most of what differs in others (the search checks its result with simulate_transients).
OpMoments transients_in_uniform_neighbourhood(const std::vector<OpShape>& ops, size_t i, OpChoice c,
                                              int world, int prefetch, int64_t accum,
                                              const Precision& prec = {}, int64_t fuse_bytes = 0,
                                              int per_host = 0);

// The peak of a plan and the moment it falls at.
struct PeakBreakdown {
  int64_t peak = 0, persistent = 0, activations = 0, transient = 0;
  std::string moment;  // "forward of <op>", "backward of <op>", "loss", "optimizer"
};
PeakBreakdown peak_of(int64_t persistent, int64_t optimizer_scratch, const ActivationMoments& a,
                      const TransientMoments& t, const std::vector<OpShape>& ops);

struct OpMemory {
  std::string op;
  int64_t params = 0;  // elements
  OpChoice choice;
  int64_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;  // persistent, this rank
  int64_t transient_bytes = 0;   // the most gathered weights and full gradients live while it runs
  int64_t activation_bytes = 0;  // what it keeps for backward
  int64_t persistent() const { return param_bytes + grad_bytes + optim_bytes; }
};

struct MemoryEstimate {
  std::vector<OpMemory> ops;
  int64_t persistent = 0;
  PeakBreakdown peak;
};

// Estimate per rank for `choices` over `ops` at `world` ranks with prefetch depth K, `optim_states` fp32
// tensors of state per param element (AdamW 2, SGD with momentum 1) and `accum` micro-batches per step.
MemoryEstimate estimate_memory(const std::vector<OpShape>& ops,
                               const std::map<std::string, OpChoice>& choices, int world, int prefetch,
                               int optim_states, int64_t accum, const ActivationProfile& act,
                               const Precision& prec = {}, int64_t fuse_bytes = 0, int per_host = 0);
// The per-op table and the totals, as `slimshard memory` prints them; and as JSON.
void print_memory_estimate(const MemoryEstimate& est);
nlohmann::json memory_estimate_json(const MemoryEstimate& est, int world);

}  // namespace slimshard
