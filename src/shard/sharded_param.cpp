// sharded_param.cpp — storage layout and lifecycle of one learnable tensor (see shard.h).
#include "slimshard/shard.h"

#include "slimshard/common.h"

namespace slimshard {

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::ddp:
      return "ddp";
    case Strategy::zero1:
      return "zero1";
    case Strategy::zero2:
      return "zero2";
    case Strategy::zero3:
      return "zero3";
  }
  return "?";
}

Strategy parse_strategy(const std::string& s, const std::string& what) {
  if (s == "ddp") return Strategy::ddp;
  if (s == "zero1") return Strategy::zero1;
  if (s == "zero2") return Strategy::zero2;
  if (s == "zero3") return Strategy::zero3;
  throw UsageError(what + ": unknown strategy '" + s + "' (expected ddp, zero1, zero2 or zero3)");
}

ShardedParam::ShardedParam(std::string name, const at::Tensor& init, bool decay)
    : name_(std::move(name)), shape_(init.sizes().vec()), numel_(init.numel()), decay_(decay) {
  set_value(init);
}

at::Tensor ShardedParam::materialize() { return full_; }

void ShardedParam::release() {}

at::Tensor ShardedParam::grad_buffer() { return grad_full_; }

void ShardedParam::grad_ready() {
  if (on_grad_ready_) on_grad_ready_(*this);
}

void ShardedParam::zero_grad() { grad_full_.zero_(); }

at::Tensor ShardedParam::full_value() { return full_.clone(); }

void ShardedParam::set_value(const at::Tensor& full) {
  if (full.sizes().vec() != shape_)
    throw UsageError("param " + name_ + ": value of shape " + c10::str(full.sizes()) + ", expected " +
                     c10::str(at::IntArrayRef(shape_)));
  at::NoGradGuard no_grad;
  const at::ScalarType dtype = at::isFloatingType(full.scalar_type()) ? full.scalar_type() : at::kFloat;
  if (full_.defined() && full_.scalar_type() == dtype) {
    full_.copy_(full);
    return;
  }
  full_ = full.to(dtype).contiguous().clone();
  master_ = full_.view({-1});
  grad_full_ = at::zeros_like(full_);
  grad_ = grad_full_.view({-1});
}

void ShardedParam::set_grad_storage(const at::Tensor& flat) {
  if (flat.numel() != numel_ || flat.scalar_type() != full_.scalar_type())
    throw std::logic_error("set_grad_storage: " + name_ + ": wrong size or dtype");
  grad_ = flat;
  grad_.zero_();
  grad_full_ = flat.view(shape_);
}

int64_t ShardedParam::resident_bytes() const {
  int64_t bytes = full_.nbytes() + grad_full_.nbytes();
  for (const auto& kv : optim_state_) bytes += kv.second.nbytes();
  return bytes;
}

}  // namespace slimshard
