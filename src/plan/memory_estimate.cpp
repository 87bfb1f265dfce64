// memory_estimate.cpp — bytes per rank for a plan: persistent params, grads and optimizer state by strategy,
// transient gathered weights and gradients, and activations from a probe run of the real model.
#include <algorithm>

#include "slimshard/memory.h"
#include "slimshard/plan.h"

namespace slimshard {

ActivationProfile probe_activations(const ModelConfig& config, int64_t micro_batch, uint64_t seed) {
  ActivationProfile prof;
  prof.micro_batch = micro_batch;
  auto model = build_model(config, seed);
  at::manual_seed(static_cast<int64_t>(seed));
  at::Tensor x, y;
  if (config.is_classifier()) {
    x = at::randn({micro_batch, 1, config.image, config.image});
    y = at::randint(0, config.classes, {micro_batch}, at::kLong);
  } else {
    x = at::randint(0, config.vocab, {micro_batch, config.seq_len}, at::kLong);
    y = at::randint(0, config.vocab, {micro_batch, config.seq_len}, at::kLong);
  }
  const int64_t base = memory::live_bytes();
  int64_t prev = base;
  set_op_observer([&](const Op& op, bool backward) {
    if (backward) return;
    const int64_t now = memory::live_bytes();
    prof.op_bytes[op.name()] += now - prev;
    prev = now;
  });
  at::Tensor loss;
  try {
    loss = model->loss(x, y);
  } catch (...) {
    set_op_observer(nullptr);
    throw;
  }
  set_op_observer(nullptr);
  const int64_t end_forward = memory::live_bytes();
  prof.op_bytes["(loss)"] += end_forward - prev;
  prof.total_bytes = end_forward - base;
  memory::reset_peaks();
  loss.backward();
  prof.backward_extra = std::max<int64_t>(0, memory::peak_bytes() - end_forward);
  return prof;
}

std::vector<int64_t> op_param_numels(const Op& op) {
  const auto* lin = dynamic_cast<const Linear*>(&op);
  if (!lin) {
    std::vector<int64_t> out;
    for (const ShardedParam* p : op.params()) out.push_back(p->numel());
    return out;
  }
  std::vector<int64_t> out{lin->in_features() * lin->out_features()};
  if (static_cast<int>(op.params().size()) == 2 * lin->splits()) out.push_back(lin->out_features());
  return out;
}

ChoiceMemory choice_memory(const std::vector<int64_t>& param_numels, OpChoice c, int world,
                           int optim_states) {
  constexpr int64_t kF = 4;  // fp32
  ChoiceMemory m;
  for (int64_t numel : param_numels) {
    const int64_t n = numel / c.splits;  // one block; splits divide the output features, so they divide numel
    for (int b = 0; b < c.splits; ++b) {
      const int64_t padded = (n + world - 1) / world * world, shard = padded / world;
      switch (c.strategy) {
        case Strategy::ddp:
          m.param_bytes += kF * n, m.grad_bytes += kF * n, m.optim_bytes += kF * optim_states * n;
          break;
        case Strategy::zero1:
          m.param_bytes += kF * padded, m.grad_bytes += kF * (padded + shard);
          m.optim_bytes += kF * optim_states * shard;
          break;
        case Strategy::zero2:
          m.param_bytes += kF * padded, m.grad_bytes += kF * shard,
              m.optim_bytes += kF * optim_states * shard;
          m.grad_block_bytes = std::max(m.grad_block_bytes, kF * padded);
          break;
        case Strategy::zero3:
          m.param_bytes += kF * shard, m.grad_bytes += kF * shard, m.optim_bytes += kF * optim_states * shard;
          m.gathered_block_bytes = std::max(m.gathered_block_bytes, kF * padded);
          m.grad_block_bytes = std::max(m.grad_block_bytes, kF * padded);
          break;
        case Strategy::slim:
          // As ddp, plus what Slim-DP keeps: the anchor and the signal (fp32 each), the core and selection
          // masks (a byte each) and the packed round (4 bytes per selected element, ~1.3 at the defaults):
          // ~11 bytes.
          m.param_bytes += 3 * kF * n + 3 * n, m.grad_bytes += kF * n, m.optim_bytes += kF * optim_states * n;
          break;
      }
    }
  }
  return m;
}

MemoryEstimate estimate_memory(const Model& model, const std::map<std::string, OpChoice>& choices, int world,
                               int prefetch, int optim_states, const ActivationProfile& act) {
  MemoryEstimate est;
  int64_t largest_shard = 0;
  for (const Op* op : model.ops()) {
    OpMemory m;
    m.op = op->name();
    m.choice = choices.at(op->name());
    auto it = act.op_bytes.find(op->name());
    m.activation_bytes = it == act.op_bytes.end() ? 0 : it->second;
    const std::vector<int64_t> numels = op_param_numels(*op);
    for (int64_t n : numels) {
      m.params += n;
      const int64_t block = n / m.choice.splits;
      largest_shard =
          std::max(largest_shard, m.choice.strategy == Strategy::ddp ? block : (block + world - 1) / world);
    }
    const ChoiceMemory cm = choice_memory(numels, m.choice, world, optim_states);
    m.param_bytes = cm.param_bytes, m.grad_bytes = cm.grad_bytes, m.optim_bytes = cm.optim_bytes;
    m.transient_bytes = cm.transient(prefetch);
    est.persistent += m.persistent();
    est.transient = std::max(est.transient, m.transient_bytes);
    est.ops.push_back(m);
  }
  est.activations = act.total_bytes + act.backward_extra;
  // The optimizer runs once activations are gone; its own scratch is one owned slice at a time.
  est.peak = std::max(est.persistent + est.activations + est.transient, est.persistent + 4 * largest_shard);
  return est;
}

}  // namespace slimshard
