// memory_estimate.h — the bytes one rank holds under a plan, per op and at its peak: persistent params,
// gradients and optimizer state by strategy, transient gathered weights and gradients, and activations from a
// probe run of the real model. The peak formula here is the only one: `slimshard memory`, the cost model and
// the search all use PeakMemory.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slimshard/plan.h"

namespace slimshard {

// Activations come from a probe: one forward and backward of the model at the micro-batch in this process,
// with the tracking allocator recording what each op leaves live (the same code and kernels the training
// runs, so no formula to drift from them).
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
  int64_t optimizer_scratch_bytes =
      0;  // the largest owned block, fp32: what the optimizer allocates per step
  int64_t transient(int prefetch) const {
    return (prefetch + 1) * gathered_block_bytes + 3 * grad_block_bytes;
  }
  int64_t persistent() const { return param_bytes + grad_bytes + optim_bytes; }
};
// `param_numels`: the op's params at splits=1 (weight, bias); with splits k each is cut into k blocks.
ChoiceMemory choice_memory(const std::vector<int64_t>& param_numels, OpChoice c, int world, int optim_states);

// The peak per rank over a step. While forward and backward run: every op's persistent bytes + the
// activations (with backward's scratch) + the largest transient of any op. While the optimizer steps (the
// activations freed): persistent + the optimizer's scratch for the largest owned block.
class PeakMemory {
 public:
  PeakMemory(int world, int prefetch, int optim_states)
      : world_(world), prefetch_(prefetch), optim_states_(optim_states) {}
  // Adds one op under `c`; returns what it holds.
  ChoiceMemory add(const std::vector<int64_t>& param_numels, OpChoice c);
  int64_t persistent() const { return persistent_; }
  int64_t largest_transient() const { return transient_; }
  int64_t peak(int64_t activations) const;

 private:
  int world_, prefetch_, optim_states_;
  int64_t persistent_ = 0, transient_ = 0, optimizer_scratch_ = 0;
};

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

// Estimate per rank for `choices` over `ops` at `world` ranks with prefetch depth K and `optim_states` fp32
// tensors of state per param element (AdamW 2, SGD with momentum 1).
MemoryEstimate estimate_memory(const std::vector<OpShape>& ops,
                               const std::map<std::string, OpChoice>& choices, int world, int prefetch,
                               int optim_states, const ActivationProfile& act);
// The per-op table and the totals, as `slimshard memory` prints them; and as JSON.
void print_memory_estimate(const MemoryEstimate& est);
nlohmann::json memory_estimate_json(const MemoryEstimate& est, int world);

}  // namespace slimshard
