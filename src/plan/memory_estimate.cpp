// memory_estimate.cpp — bytes per rank for a plan: persistent params, grads and optimizer state by strategy,
// transient gathered weights and gradients, activations from a probe run of the real model, and the one peak
// formula (see memory_estimate.h).
#include "slimshard/memory_estimate.h"

#include <algorithm>
#include <cstdio>

#include "slimshard/common.h"
#include "slimshard/memory.h"

namespace slimshard {

ActivationProfile probe_activations(const ModelConfig& config, int64_t micro_batch, uint64_t seed) {
  ActivationProfile prof;
  prof.micro_batch = micro_batch;
  auto model = build_model(config, seed);
  const auto [x, y] = random_inputs(config, micro_batch, seed);
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

ChoiceMemory choice_memory(const std::vector<int64_t>& param_numels, OpChoice c, int world,
                           int optim_states) {
  constexpr int64_t kF = 4;  // fp32
  ChoiceMemory m;
  for (int64_t numel : param_numels) {
    const int64_t n = numel / c.splits;  // one block; splits divide the output features, so they divide numel
    const int64_t padded = padded_numel(n, world), owned = owned_numel(c.strategy, n, world);
    m.optimizer_scratch_bytes = std::max(m.optimizer_scratch_bytes, kF * owned);
    for (int b = 0; b < c.splits; ++b) {
      m.optim_bytes += kF * optim_states * owned;
      switch (c.strategy) {
        case Strategy::ddp:
          m.param_bytes += kF * n, m.grad_bytes += kF * n;
          break;
        case Strategy::zero1:
          m.param_bytes += kF * padded, m.grad_bytes += kF * (padded + owned);
          break;
        case Strategy::zero2:
          m.param_bytes += kF * padded, m.grad_bytes += kF * owned;
          m.grad_block_bytes = std::max(m.grad_block_bytes, kF * padded);
          break;
        case Strategy::zero3:
          m.param_bytes += kF * owned, m.grad_bytes += kF * owned;
          m.gathered_block_bytes = std::max(m.gathered_block_bytes, kF * padded);
          m.grad_block_bytes = std::max(m.grad_block_bytes, kF * padded);
          break;
        case Strategy::slim:
          // As ddp, plus what Slim-DP keeps: the anchor and the signal (fp32 each), the core and selection
          // masks (a byte each) and the packed round (4 bytes per selected element, ~1.3 at the defaults):
          // ~11 bytes.
          m.param_bytes += 3 * kF * n + 3 * n, m.grad_bytes += kF * n;
          break;
      }
    }
  }
  return m;
}

ChoiceMemory PeakMemory::add(const std::vector<int64_t>& param_numels, OpChoice c) {
  const ChoiceMemory m = choice_memory(param_numels, c, world_, optim_states_);
  persistent_ += m.persistent();
  transient_ = std::max(transient_, m.transient(prefetch_));
  optimizer_scratch_ = std::max(optimizer_scratch_, m.optimizer_scratch_bytes);
  return m;
}

int64_t PeakMemory::peak(int64_t activations) const {
  return std::max(persistent_ + activations + transient_, persistent_ + optimizer_scratch_);
}

MemoryEstimate estimate_memory(const std::vector<OpShape>& ops,
                               const std::map<std::string, OpChoice>& choices, int world, int prefetch,
                               int optim_states, const ActivationProfile& act) {
  MemoryEstimate est;
  PeakMemory peak(world, prefetch, optim_states);
  for (const OpShape& op : ops) {
    OpMemory m;
    m.op = op.name;
    m.choice = choices.at(op.name);
    auto it = act.op_bytes.find(op.name);
    m.activation_bytes = it == act.op_bytes.end() ? 0 : it->second;
    for (int64_t n : op.param_numels) m.params += n;
    const ChoiceMemory cm = peak.add(op.param_numels, m.choice);
    m.param_bytes = cm.param_bytes, m.grad_bytes = cm.grad_bytes, m.optim_bytes = cm.optim_bytes;
    m.transient_bytes = cm.transient(prefetch);
    est.ops.push_back(m);
  }
  est.persistent = peak.persistent();
  est.transient = peak.largest_transient();
  est.activations = act.total_bytes + act.backward_extra;
  est.peak = peak.peak(est.activations);
  return est;
}

void print_memory_estimate(const MemoryEstimate& est) {
  auto mib = [](int64_t b) { return format_mib(static_cast<double>(b)); };
  std::printf("%-22s %10s %-9s %6s %9s %9s %9s %11s %11s\n", "op", "params", "strategy", "splits",
              "param MiB", "grad MiB", "optim MiB", "transient", "activations");
  int64_t pb = 0, gb = 0, ob = 0;
  for (const OpMemory& m : est.ops) {
    std::printf("%-22s %10lld %-9s %6d %9s %9s %9s %11s %11s\n", m.op.c_str(), (long long)m.params,
                strategy_name(m.choice.strategy), m.choice.splits, mib(m.param_bytes).c_str(),
                mib(m.grad_bytes).c_str(), mib(m.optim_bytes).c_str(), mib(m.transient_bytes).c_str(),
                mib(m.activation_bytes).c_str());
    pb += m.param_bytes, gb += m.grad_bytes, ob += m.optim_bytes;
  }
  std::printf("%-22s %10s %-9s %6s %9s %9s %9s\n", "total", "", "", "", mib(pb).c_str(), mib(gb).c_str(),
              mib(ob).c_str());
  std::printf(
      "predicted peak per rank: %s MiB = persistent %s + activations %s + largest transient %s "
      "(LibTorch tensors; the shared-memory staging of the communicator is extra)\n",
      mib(est.peak).c_str(), mib(est.persistent).c_str(), mib(est.activations).c_str(),
      mib(est.transient).c_str());
}

nlohmann::json memory_estimate_json(const MemoryEstimate& est, int world) {
  nlohmann::json ops = nlohmann::json::array();
  for (const OpMemory& m : est.ops)
    ops.push_back({{"op", m.op},
                   {"params", m.params},
                   {"strategy", strategy_name(m.choice.strategy)},
                   {"splits", m.choice.splits},
                   {"param_bytes", m.param_bytes},
                   {"grad_bytes", m.grad_bytes},
                   {"optim_bytes", m.optim_bytes},
                   {"transient_bytes", m.transient_bytes},
                   {"activation_bytes", m.activation_bytes}});
  return {{"world", world},
          {"peak_bytes", est.peak},
          {"persistent_bytes", est.persistent},
          {"activation_bytes", est.activations},
          {"transient_bytes", est.transient},
          {"ops", ops}};
}

}  // namespace slimshard
