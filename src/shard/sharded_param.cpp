// sharded_param.cpp — storage layout and lifecycle of one learnable tensor under each strategy (see
// sharded_param.h).
#include "slimshard/sharded_param.h"

#include <ATen/Parallel.h>

#include "slimshard/comm.h"
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
    case Strategy::slim:
      return "slim";
    case Strategy::hsdp:
      return "hsdp";
    case Strategy::hsdp2:
      return "hsdp2";
  }
  return "?";
}

Strategy parse_strategy(const std::string& s, const std::string& what) {
  if (s == "ddp") return Strategy::ddp;
  if (s == "zero1") return Strategy::zero1;
  if (s == "zero2") return Strategy::zero2;
  if (s == "zero3") return Strategy::zero3;
  if (s == "slim") return Strategy::slim;
  if (s == "hsdp") return Strategy::hsdp;
  if (s == "hsdp2") return Strategy::hsdp2;
  throw UsageError(what + ": unknown strategy '" + s +
                   "' (expected ddp, zero1, zero2, zero3, slim, hsdp or hsdp2)");
}

std::string fusion_block(const std::string& name) {
  const size_t first = name.find('.');
  if (name.compare(0, first, "blocks") == 0) return name.substr(0, name.find('.', first + 1));
  return name.substr(0, first);
}

std::string Precision::name() const {
  std::string s = float_type_name(compute);
  if (reduce != at::kFloat) s += std::string(", ") + float_type_name(reduce) + " reduce";
  return s;
}

at::ScalarType parse_float_type(const std::string& s, const std::string& what) {
  if (s == "fp32") return at::kFloat;
  if (s == "bf16") return at::kBFloat16;
  throw UsageError(what + ": unknown precision '" + s + "' (expected fp32 or bf16)");
}

const char* float_type_name(at::ScalarType t) {
  return t == at::kBFloat16 ? "bf16" : t == at::kFloat ? "fp32" : t == at::kDouble ? "fp64" : "?";
}

ShardedParam::ShardedParam(std::string name, const at::Tensor& init, bool decay)
    : name_(std::move(name)), shape_(init.sizes().vec()), numel_(init.numel()), decay_(decay) {
  set_value(init);
}

void ShardedParam::set_value(const at::Tensor& full) {
  if (full.sizes().vec() != shape_)
    throw UsageError("param " + name_ + ": value of shape " + c10::str(full.sizes()) + ", expected " +
                     c10::str(at::IntArrayRef(shape_)));
  if (!is_replicated(strategy_)) throw std::logic_error("set_value on sharded param " + name_);
  at::NoGradGuard no_grad;
  const at::ScalarType dtype = at::isFloatingType(full.scalar_type()) ? full.scalar_type() : at::kFloat;
  if (full_.defined() && full_.scalar_type() == dtype) {
    full_.copy_(full);
    return;
  }
  flat_ = full.to(dtype).contiguous().clone().view({-1});
  full_ = flat_.view(shape_);
  master_ = flat_;
  compute_ = dtype;
  work_full_ = work_shard_ = at::Tensor();
  // The gradient is allocated by shard() (or on first use): a model being sharded never holds full gradients.
  grad_flat_ = grad_full_ = grad_ = at::Tensor();
  padded_ = shard_numel_ = numel_;
  shard_offset_ = 0;
}

void ShardedParam::shard(Strategy s, int rank, int world, at::ScalarType compute) {
  at::NoGradGuard no_grad;
  strategy_ = s;
  working_written_ = grad_zeroed_ = false;  // of the layout before, if any
  // Tests run ops in fp64: a param whose master is not fp32 computes in its own dtype.
  compute_ = master_.scalar_type() == at::kFloat ? compute : master_.scalar_type();
  const bool mixed = compute_ != master_.scalar_type();
  if (is_replicated(s)) {
    if (!grad_.defined()) grad_flat_ = grad_ = at::zeros_like(flat_), grad_full_ = grad_flat_.view(shape_);
    if (mixed) work_full_ = full_.to(compute_);
    return;
  }
  padded_ = slimshard::padded_numel(numel_, world);
  shard_numel_ = padded_ / world;
  shard_offset_ = shard_numel_ * rank;
  at::Tensor padded = at::zeros({padded_}, flat_.options());
  padded.slice(0, 0, numel_).copy_(flat_);
  grad_ = at::zeros({shard_numel_}, flat_.options());
  grad_flat_ = grad_full_ = at::Tensor();
  if (gathers_on_use(s)) {
    master_ = padded.slice(0, shard_offset_, shard_offset_ + shard_numel_).clone();
    if (mixed) work_shard_ = master_.to(compute_);
    flat_ = full_ = at::Tensor();
    return;
  }
  if (mixed) {  // the fp32 master is the shard alone; the full param is the working copy
    master_ = padded.slice(0, shard_offset_, shard_offset_ + shard_numel_).clone();
    flat_ = padded.to(compute_);
  } else {
    flat_ = padded;
    master_ = flat_.slice(0, shard_offset_, shard_offset_ + shard_numel_);
  }
  full_ = flat_.slice(0, 0, numel_).view(shape_);
  if (s == Strategy::zero1) {
    grad_flat_ = at::zeros({padded_}, master_.options());
    grad_full_ = grad_flat_.slice(0, 0, numel_).view(shape_);
  }
}

void ShardedParam::refresh_working() {
  if (working_written_) {
    working_written_ = false;
    return;
  }
  at::NoGradGuard no_grad;
  if (work_full_.defined()) work_full_.copy_(full_);
  if (work_shard_.defined()) work_shard_.copy_(master_);
  if (gathers_after_step(strategy_) && mixed()) owned_working().copy_(master_);
}

void ShardedParam::wait_gather() const {
  if (!pending_gather_) return;
  const std::shared_ptr<Work> w = std::move(pending_gather_);
  pending_gather_.reset();
  w->wait();
}

at::Tensor ShardedParam::replicated_value() const {
  wait_gather();
  if (is_replicated(strategy_) || gathers_after_step(strategy_)) return full_;
  return at::Tensor();
}

namespace {
thread_local KeptGathers* t_keeping = nullptr;  // the recomputed forward running on this thread, if any
}

KeptGathers::KeptGathers() : outer_(t_keeping) { t_keeping = this; }

bool KeptGathers::keeping() { return t_keeping != nullptr; }

void KeptGathers::stop_keeping() {
  if (t_keeping == this) t_keeping = outer_;
}

KeptGathers::~KeptGathers() {
  stop_keeping();
  for (ShardedParam* p : kept_)
    if (p->kept_.defined()) p->kept_.reset(), p->gatherer_->release(*p);
}

at::Tensor ShardedParam::materialize() {
  wait_gather();
  if (!gathers_on_use(strategy_)) return work_full_.defined() ? work_full_ : full_;
  if (!gatherer_) throw std::logic_error("zero3 param " + name_ + " has no gatherer");
  if (kept_.defined()) return kept_.slice(0, 0, numel_).view(shape_);
  at::Tensor buf = gatherer_->acquire(*this);
  if (t_keeping) kept_ = buf, t_keeping->kept_.push_back(this);
  return buf.slice(0, 0, numel_).view(shape_);
}

void ShardedParam::release() {
  if (!gathers_on_use(strategy_)) return;
  if (kept_.defined()) {
    if (t_keeping) return;  // the backward after the recomputed forward uses it again
    kept_.reset();
  }
  gatherer_->release(*this);
}

at::Tensor ShardedParam::grad_buffer() {
  if (!grad_full_.defined()) {  // zero2/zero3: the first gradient of this micro-batch (or an unsharded param)
    grad_flat_ = at::zeros({padded_}, master_.options());
    grad_full_ = grad_flat_.slice(0, 0, numel_).view(shape_);
    if (is_replicated(strategy_)) grad_ = grad_flat_;
  }
  return grad_full_;
}

void ShardedParam::grad_ready() {
  if (on_grad_ready_) on_grad_ready_(*this);
}

at::Tensor ShardedParam::full_grad_flat() { return grad_flat_; }

at::Tensor ShardedParam::take_full_grad_flat() {
  at::Tensor g = std::move(grad_flat_);
  grad_flat_ = grad_full_ = at::Tensor();
  return g;
}

at::Tensor ShardedParam::working_of_master() {
  if (!mixed() || strategy_ == Strategy::slim) return at::Tensor();
  if (work_full_.defined()) return work_full_.view({-1});  // ddp: master_ is all of flat_
  if (work_shard_.defined()) return work_shard_;
  if (gathers_after_step(strategy_)) return owned_working();
  return at::Tensor();
}

void ShardedParam::zero_grad() {
  if (grad_.defined() && !grad_zeroed_) grad_.zero_();
  grad_zeroed_ = false;
  if (strategy_ == Strategy::zero1) grad_flat_.zero_();
}

at::Tensor ShardedParam::full_value() {
  if (!has_full_master())
    throw std::logic_error("full_value of sharded param " + name_ + " needs a gather of the masters");
  wait_gather();
  return full_.clone();
}

void ShardedParam::set_grad_storage(const at::Tensor& flat) {
  if (strategy_ != Strategy::ddp || flat.numel() != numel_ || flat.scalar_type() != flat_.scalar_type())
    throw std::logic_error("set_grad_storage: " + name_ + ": not ddp, or wrong size or dtype");
  grad_ = grad_flat_ = flat;
  grad_.zero_();
  grad_full_ = flat.view(shape_);
}

void ShardedParam::set_value_storage(const at::Tensor& flat) {
  if (!is_replicated(strategy_) || flat.numel() != numel_ || flat.scalar_type() != flat_.scalar_type())
    throw std::logic_error("set_value_storage: " + name_ + ": not replicated, or wrong size or dtype");
  flat.copy_(flat_);
  master_ = flat_ = flat;
  full_ = flat.view(shape_);
  refresh_working();
}

int64_t ShardedParam::resident_bytes() const {
  int64_t bytes = master_.nbytes() + grad_.nbytes();
  if (gathers_after_step(strategy_)) bytes += flat_.nbytes() - (mixed() ? 0 : master_.nbytes());
  if (work_full_.defined()) bytes += work_full_.nbytes();
  if (work_shard_.defined()) bytes += work_shard_.nbytes();
  if (strategy_ == Strategy::zero1) bytes += grad_flat_.nbytes();
  for (const auto& kv : optim_state_) bytes += kv.second.nbytes();
  return bytes;
}

void add_widening(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.scalar_type() != at::kFloat || src.scalar_type() != at::kBFloat16 || !dst.is_contiguous() ||
      !src.is_contiguous() || dst.numel() != src.numel()) {
    dst.add_(src);
    return;
  }
  float* o = dst.data_ptr<float>();
  const c10::BFloat16* q = src.data_ptr<c10::BFloat16>();
  at::parallel_for(0, dst.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) o[i] += static_cast<float>(q[i]);
  });
}

}  // namespace slimshard
