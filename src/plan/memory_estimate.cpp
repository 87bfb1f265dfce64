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
  set_forward_observer([&](const Op& op) {
    const int64_t now = memory::live_bytes();
    prof.op_bytes[op.name()] += now - prev;
    prev = now;
  });
  at::Tensor loss;
  try {
    loss = model->loss(x, y);
  } catch (...) {
    set_forward_observer(nullptr);
    throw;
  }
  set_forward_observer(nullptr);
  const int64_t end_forward = memory::live_bytes();
  prof.op_bytes["(loss)"] += end_forward - prev;
  prof.total_bytes = end_forward - base;
  memory::reset_peaks();
  loss.backward();
  prof.backward_extra = std::max<int64_t>(0, memory::peak_bytes() - end_forward);
  return prof;
}

MemoryEstimate estimate_memory(const Model& model, const std::map<std::string, OpChoice>& choices, int world,
                               int prefetch, int optim_states, const ActivationProfile& act) {
  constexpr int64_t kF = 4;  // fp32
  MemoryEstimate est;
  std::vector<int64_t> gathered_blocks;  // zero3 blocks in use order
  int64_t largest_full_grad = 0, largest_shard = 0;
  for (const Op* op : model.ops()) {
    OpMemory m;
    m.op = op->name();
    m.choice = choices.at(op->name());
    const int k = m.choice.splits;
    auto it = act.op_bytes.find(op->name());
    m.activation_bytes = it == act.op_bytes.end() ? 0 : it->second;
    for (const ShardedParam* p : op->params()) {
      // With splits, each of the k blocks is a param of its own.
      const int64_t blocks =
          (dynamic_cast<const Linear*>(op) && k > 1 && static_cast<const Linear*>(op)->splits() == 1) ? k : 1;
      const int64_t n = p->numel() / blocks;
      m.params += p->numel();
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t padded = (n + world - 1) / world * world, shard = padded / world;
        largest_shard = std::max(largest_shard, m.choice.strategy == Strategy::ddp ? n : shard);
        switch (m.choice.strategy) {
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
            m.grad_transient_bytes = std::max(m.grad_transient_bytes, kF * padded);
            break;
          case Strategy::zero3:
            m.param_bytes += kF * shard, m.grad_bytes += kF * shard,
                m.optim_bytes += kF * optim_states * shard;
            m.gathered_bytes = std::max(m.gathered_bytes, kF * padded);
            m.grad_transient_bytes = std::max(m.grad_transient_bytes, kF * padded);
            gathered_blocks.push_back(kF * padded);
            break;
        }
      }
    }
    largest_full_grad = std::max(largest_full_grad, m.grad_transient_bytes);
    est.persistent += m.persistent();
    est.ops.push_back(m);
  }
  est.activations = act.total_bytes;
  // Transient: K+1 consecutive gathered zero3 blocks at most (the largest such window), plus full gradients
  // waiting to be reduce-scattered (the engine keeps at most 2 queued besides the one being produced).
  int64_t window = 0;
  for (size_t i = 0; i < gathered_blocks.size(); ++i) {
    int64_t w = 0;
    for (size_t j = i; j < std::min(gathered_blocks.size(), i + static_cast<size_t>(prefetch) + 1); ++j)
      w += gathered_blocks[j];
    window = std::max(window, w);
  }
  est.transient = window + 3 * largest_full_grad + act.backward_extra;
  // The optimizer runs when activations are gone: its own temporaries are one owned slice at a time.
  est.peak = std::max(est.persistent + est.activations + est.transient, est.persistent + kF * largest_shard);
  return est;
}

}  // namespace slimshard
