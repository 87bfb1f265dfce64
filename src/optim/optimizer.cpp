// optimizer.cpp — AdamW, SGD with momentum, LR schedule and gradient-norm helpers (see optim.h).
#include <cmath>

#include "adamw_kernel.h"
#include "slimshard/common.h"
#include "slimshard/optim.h"
#include "slimshard/sharded_param.h"

namespace slimshard {
namespace {

bool fusable(const at::Tensor& t) { return t.scalar_type() == at::kFloat && t.is_contiguous(); }

}  // namespace

Optimizer::Optimizer(OptimConfig c) : c_(std::move(c)) {
  if (c_.name != "adamw" && c_.name != "sgd")
    throw UsageError("--optimizer: unknown optimizer '" + c_.name + "' (expected adamw or sgd)");
}

std::vector<std::string> Optimizer::state_names(const OptimConfig& c) {
  if (c.name == "adamw") return {"exp_avg", "exp_avg_sq"};
  return c.momentum != 0 ? std::vector<std::string>{"momentum"} : std::vector<std::string>{};
}

void Optimizer::init_state(const std::vector<ShardedParam*>& params) {
  for (ShardedParam* p : params)
    for (const std::string& name : state_names()) {
      at::Tensor& t = p->optim_state()[name];
      if (!t.defined()) t = at::zeros_like(p->master());
    }
}

void Optimizer::step(const std::vector<ShardedParam*>& params, double lr, double grad_scale) {
  at::NoGradGuard no_grad;
  ++t_;
  if (c_.name == "adamw") {
    const double bc1 = 1.0 - std::pow(c_.beta1, static_cast<double>(t_));
    const double bc2 = 1.0 - std::pow(c_.beta2, static_cast<double>(t_));
    for (ShardedParam* p : params) {
      at::Tensor w = p->master(), g = p->grad();
      auto& st = p->optim_state();
      auto& m = st["exp_avg"];
      auto& v = st["exp_avg_sq"];
      if (!m.defined()) m = at::zeros_like(w), v = at::zeros_like(w);
      const bool corrected = c_.slim_ranks > 1 && p->strategy() == Strategy::slim;
      if (!corrected && fusable(w) && fusable(g) && fusable(m) && fusable(v)) {
        const bool decays = p->decay() && c_.weight_decay != 0;
        const AdamWScalars k{static_cast<float>(c_.beta1),
                             static_cast<float>(c_.beta2),
                             static_cast<float>(1.0 - c_.beta1),
                             static_cast<float>(1.0 - c_.beta2),
                             decays ? static_cast<float>(1.0 - lr * c_.weight_decay) : 1.0f,
                             static_cast<float>(-lr / bc1),
                             static_cast<float>(std::sqrt(bc2)),
                             static_cast<float>(c_.eps),
                             static_cast<float>(grad_scale)};
        // The bf16 working copy and the zeroed gradient in the same pass (adamw_kernel.h).
        const at::Tensor work = p->working_of_master();
        TORCH_INTERNAL_ASSERT(!work.defined() || (work.scalar_type() == at::kBFloat16 &&
                                                  work.is_contiguous() && work.numel() == w.numel()),
                              "the working copy of ", p->name(), " does not mirror its master");
        adamw_update(w.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                     w.numel(), k, work.defined() ? static_cast<uint16_t*>(work.data_ptr()) : nullptr);
        if (work.defined()) p->working_written();
        p->grad_zeroed();
        continue;
      }
      if (grad_scale != 1.0) g.mul_(grad_scale);
      m.mul_(c_.beta1).add_(g, 1.0 - c_.beta1);
      v.mul_(c_.beta2).addcmul_(g, g, 1.0 - c_.beta2);
      if (p->decay() && c_.weight_decay != 0) w.mul_(1.0 - lr * c_.weight_decay);
      at::Tensor denom;
      if (corrected) {
        // A rank's v̂ measures its own 1/N-batch gradient; v̂ − m̂² is that gradient's variance, which the
        // average over N ranks divides by N: denom = √(m̂² + max(v̂ − m̂², 0)/N) + ε.
        at::Tensor m_hat_sq = m.square().div_(bc1 * bc1);
        denom = (v / bc2).sub_(m_hat_sq).clamp_min_(0).div_(c_.slim_ranks);
        denom.add_(m_hat_sq).sqrt_().add_(c_.eps);
      } else {
        denom = v.sqrt().div_(std::sqrt(bc2)).add_(c_.eps);
      }
      w.addcdiv_(m, denom, -lr / bc1);
    }
    return;
  }
  for (ShardedParam* p : params) {
    at::Tensor w = p->master(), g = p->grad();
    if (grad_scale != 1.0) g.mul_(grad_scale);
    if (p->decay() && c_.weight_decay != 0) g = g.add(w, c_.weight_decay);
    if (c_.momentum != 0) {
      auto& buf = p->optim_state()["momentum"];
      if (!buf.defined())
        buf = g.clone();
      else
        buf.mul_(c_.momentum).add_(g);
      g = buf;
    }
    w.add_(g, -lr);
  }
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (total <= warmup) return lr;
  double progress =
      static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  progress = std::min(1.0, std::max(0.0, progress));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

double grad_sq_sum(const std::vector<ShardedParam*>& params) {
  double s = 0;
  for (ShardedParam* p : params) {
    at::Tensor g = p->grad();
    s += g.dot(g).item<double>();
  }
  return s;
}

}  // namespace slimshard
