// ops.cpp — the sharding-aware ops. One autograd Function serves them all: it carries the op's address and
// calls back into forward_impl/backward_impl, so an op is written once, as plain forward/backward math over
// the weights it materializes.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "slimshard/common.h"
#include "slimshard/memory.h"
#include "slimshard/nn.h"

namespace slimshard {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

std::function<void(const Op&, OpPhase)> g_observer;

// The anchor is an input only so that autograd runs backward; its own gradient is never produced (the weight
// gradients go straight to the ShardedParams). The op pointer travels as an int64 because saved_data holds
// IValues.
struct OpFunction : torch::autograd::Function<OpFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                            int64_t op_addr) {
    (void)anchor;
    Op* op = reinterpret_cast<Op*>(op_addr);
    ctx->saved_data["op"] = op_addr;
    memory::OpScope scope(op->name());
    if (g_observer) g_observer(*op, OpPhase::forward_begin);
    at::Tensor y = op->forward_impl(ctx, x);
    if (g_observer) g_observer(*op, OpPhase::forward_end);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Op* op = reinterpret_cast<Op*>(ctx->saved_data["op"].toInt());
    memory::OpScope scope(op->name());
    if (g_observer) g_observer(*op, OpPhase::backward_begin);
    at::Tensor dx = op->backward_impl(ctx, grads[0]);
    if (g_observer) g_observer(*op, OpPhase::backward_end);
    return {dx, at::Tensor(), at::Tensor()};
  }
};

at::Tensor apply_op(Op& op, const at::Tensor& x) {
  return OpFunction::apply(x, op.anchor(), reinterpret_cast<int64_t>(&op));
}

// Forward with grad mode off (custom Functions run so): the ops inside build no graph, so what they save is
// dropped as each returns. Backward: the forward again with grad mode on, from a detached copy of the input,
// then backward through it (nested in the running backward); the input's gradient is what it accumulated.
struct RecomputeFunction : torch::autograd::Function<RecomputeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                            int64_t block_addr) {
    (void)anchor;
    ctx->saved_data["block"] = block_addr;
    ctx->save_for_backward({x});
    return reinterpret_cast<Block*>(block_addr)->forward(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Block* block = reinterpret_cast<Block*>(ctx->saved_data["block"].toInt());
    at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor y;
    KeptGathers kept;  // gathered once for the forward here, used again by the backward below
    {
      at::AutoGradMode grad_on(true);
      y = block->forward(x);
    }
    kept.stop_keeping();
    torch::autograd::backward({y}, {grads[0]});
    return {x.grad(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor draw(std::vector<int64_t> shape, Init init, int64_t fan_in, at::Generator& gen) {
  at::Tensor t = at::empty(shape, at::kFloat);
  switch (init.kind) {
    case Init::normal:
      return t.normal_(0.0, init.std, gen);
    case Init::uniform_fan_in: {
      double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
      return t.uniform_(-bound, bound, gen);
    }
    case Init::ones:
      return t.fill_(1.0);
    case Init::zeros:
      return t.zero_();
  }
  return t;
}

void accumulate(ShardedParam* p, const at::Tensor& g) {
  add_widening(p->grad_buffer(), g);  // a bf16 gradient is added into the fp32 one
  p->grad_ready();
}

// The weight gradient a·b of a matmul added into p's gradient: in place when the dtypes agree; in mixed
// precision computed in the compute dtype and then added (LibTorch has no bf16 × bf16 → fp32 GEMM).
void add_mm_grad(ShardedParam* p, const at::Tensor& a, const at::Tensor& b) {
  at::Tensor g = p->grad_buffer();
  if (g.scalar_type() == a.scalar_type())
    g.addmm_(a, b);
  else
    add_widening(g, at::mm(a, b));
}

// A convolution's bias gradient: the sum over rows, in fp32 even when the rows are bf16.
at::Tensor sum_rows(const at::Tensor& dy, at::IntArrayRef dims) {
  return dy.scalar_type() == at::kBFloat16 ? at::sum(dy, dims, false, at::kFloat) : dy.sum(dims);
}

at::Tensor as_type(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
ShardedParam* ParamSet::add(std::string name, const at::Tensor& init, bool decay) {
  if (find(name)) throw std::logic_error("duplicate parameter name " + name);
  owned_.push_back(std::make_unique<ShardedParam>(std::move(name), init, decay));
  view_.push_back(owned_.back().get());
  return view_.back();
}

void set_op_observer(std::function<void(const Op&, OpPhase)> observer) { g_observer = std::move(observer); }

// Exactly while a recomputed forward runs, its KeptGathers keeps.
bool recomputing() { return KeptGathers::keeping(); }

std::string block_of(const std::string& op_name) {
  if (op_name.rfind("blocks.", 0) != 0) return "";
  const size_t dot = op_name.find('.', 7);
  return dot == std::string::npos ? "" : op_name.substr(0, dot);
}

Block::Block(std::string name) : name_(std::move(name)) {
  anchor_ = at::empty({0}, at::kFloat);
  anchor_.set_requires_grad(true);
}

at::Tensor Block::operator()(const at::Tensor& x) {
  if (!recompute_ || !at::GradMode::is_enabled()) return forward(x);
  return RecomputeFunction::apply(x, anchor_, reinterpret_cast<int64_t>(this));
}

std::vector<ShardedParam*> ParamSet::replace(ShardedParam* old,
                                             std::vector<std::unique_ptr<ShardedParam>> with) {
  auto it = std::find(view_.begin(), view_.end(), old);
  if (it == view_.end()) throw std::logic_error("replace: unknown parameter");
  const auto at = it - view_.begin();
  std::vector<ShardedParam*> added;
  for (auto& p : with) added.push_back(p.get());
  view_.erase(it);
  view_.insert(view_.begin() + at, added.begin(), added.end());
  owned_.erase(owned_.begin() + at);
  for (size_t i = 0; i < with.size(); ++i)
    owned_.insert(owned_.begin() + at + static_cast<std::ptrdiff_t>(i), std::move(with[i]));
  return added;
}

ShardedParam* ParamSet::find(const std::string& name) const {
  for (auto* p : view_)
    if (p->name() == name) return p;
  return nullptr;
}

int64_t ParamSet::numel() const {
  int64_t n = 0;
  for (auto* p : view_) n += p->numel();
  return n;
}

Op::Op(std::string name) : name_(std::move(name)) {
  anchor_ = at::empty({0}, at::kFloat);
  anchor_.set_requires_grad(true);
}

// ---------------------------------------------------------------------------------------------------------------
Linear::Linear(ParamSet& ps, std::string name, int64_t in, int64_t out, bool bias, at::Generator& gen,
               Init w_init)
    : Op(std::move(name)), in_(in), out_(out) {
  w_.push_back(ps.add(name_ + ".weight", draw({out, in}, w_init, in, gen), /*decay=*/true));
  if (bias) {
    Init b_init = w_init.kind == Init::uniform_fan_in ? w_init : Init{Init::zeros};
    b_.push_back(ps.add(name_ + ".bias", draw({out}, b_init, in, gen), /*decay=*/false));
  }
  params_ = w_;
  params_.insert(params_.end(), b_.begin(), b_.end());
}

void Linear::set_splits(ParamSet& ps, int k) {
  if (k < 1 || out_ % k != 0)
    throw UsageError("op " + name_ + ": splits=" + std::to_string(k) + " does not divide its " +
                     std::to_string(out_) + " output features");
  if (k == splits()) return;
  auto resplit = [&](std::vector<ShardedParam*>& blocks, const std::string& kind, bool decay) {
    if (blocks.empty()) return;
    std::vector<at::Tensor> parts;
    for (ShardedParam* p : blocks) parts.push_back(p->full_value());
    at::Tensor full = at::cat(parts, 0);
    std::vector<std::unique_ptr<ShardedParam>> fresh;
    const int64_t rows = out_ / k;
    for (int j = 0; j < k; ++j)
      fresh.push_back(std::make_unique<ShardedParam>(
          k == 1 ? name_ + "." + kind : name_ + "." + kind + "#" + std::to_string(j),
          full.slice(0, j * rows, (j + 1) * rows), decay));
    // The first old block's place takes all new blocks; the others are dropped.
    for (size_t i = 1; i < blocks.size(); ++i) ps.replace(blocks[i], {});
    blocks = ps.replace(blocks[0], std::move(fresh));
  };
  resplit(w_, "weight", true);
  resplit(b_, "bias", false);
  params_ = w_;
  params_.insert(params_.end(), b_.begin(), b_.end());
}

at::Tensor Linear::operator()(const at::Tensor& x) { return apply_op(*this, x); }

at::Tensor Linear::forward_impl(AutogradContext* ctx, const at::Tensor& input) {
  // In mixed precision the input is cast to the weights' compute dtype and kept so (half the bytes saved).
  const at::Tensor x = as_type(input, w_[0]->compute_dtype());
  ctx->save_for_backward({x});
  at::Tensor x2 = x.reshape({-1, in_});
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out_;
  if (splits() == 1) {
    at::Tensor w = w_[0]->materialize();
    at::Tensor y = b_.empty() ? at::mm(x2, w.t()) : at::addmm(b_[0]->materialize(), x2, w.t());
    w_[0]->release();
    if (!b_.empty()) b_[0]->release();
    return y.view(shape);
  }
  const int64_t rows = out_ / splits();
  at::Tensor y = at::empty({x2.size(0), out_}, x2.options());
  for (int j = 0; j < splits(); ++j) {
    at::Tensor w = w_[static_cast<size_t>(j)]->materialize();
    at::Tensor part = y.narrow(1, j * rows, rows);
    if (b_.empty()) {
      part.copy_(at::mm(x2, w.t()));
    } else {
      part.copy_(at::addmm(b_[static_cast<size_t>(j)]->materialize(), x2, w.t()));
      b_[static_cast<size_t>(j)]->release();
    }
    w_[static_cast<size_t>(j)]->release();
  }
  return y.view(shape);
}

at::Tensor Linear::backward_impl(AutogradContext* ctx, const at::Tensor& dy) {
  at::Tensor x = ctx->get_saved_variables()[0];
  at::Tensor x2 = x.reshape({-1, in_});
  at::Tensor dy2 = as_type(dy, x.scalar_type()).reshape({-1, out_});
  const bool need_dx = ctx->needs_input_grad(0);
  const int64_t rows = out_ / splits();
  at::Tensor dx;
  for (int j = 0; j < splits(); ++j) {
    ShardedParam* wp = w_[static_cast<size_t>(j)];
    at::Tensor dyj = splits() == 1 ? dy2 : dy2.narrow(1, j * rows, rows);
    {
      const at::Tensor w = wp->materialize();
      if (need_dx) dx = j == 0 ? at::mm(dyj, w) : dx.addmm_(dyj, w);
    }
    add_mm_grad(wp, dyj.t(), x2);
    wp->release();  // the gathered weight goes now, not after the bias's reduction below
    wp->grad_ready();
    // In bf16 the bias gradient is LibTorch's bf16 sum (fp32 inside, the result rounded to bf16, as under
    // torch.autocast) and accumulated in fp32: 3x faster than summing in fp32, which widened every row first
    // (gpt-25m: 31 of a 513 ms step).
    if (!b_.empty()) accumulate(b_[static_cast<size_t>(j)], dyj.sum(0));
  }
  return need_dx ? dx.view(x.sizes()) : dx;
}

// ---------------------------------------------------------------------------------------------------------------
Embedding::Embedding(ParamSet& ps, std::string name, int64_t num, int64_t dim, at::Generator& gen, double std)
    : Op(std::move(name)), num_(num), dim_(dim) {
  w_ = ps.add(name_ + ".weight", draw({num, dim}, Init{Init::normal, std}, dim, gen), /*decay=*/true);
  params_.push_back(w_);
}

at::Tensor Embedding::operator()(const at::Tensor& ids) { return apply_op(*this, ids); }

at::Tensor Embedding::forward_impl(AutogradContext* ctx, const at::Tensor& ids) {
  ctx->save_for_backward({ids});
  at::Tensor y = at::embedding(w_->materialize(), ids);
  w_->release();
  // The rows start the residual stream, which stays in the master dtype (fp32) in mixed precision.
  return as_type(y, w_->master().scalar_type());
}

at::Tensor Embedding::backward_impl(AutogradContext* ctx, const at::Tensor& dy) {
  at::Tensor ids = ctx->get_saved_variables()[0];
  at::Tensor g = w_->grad_buffer();
  g.index_add_(0, ids.reshape({-1}), as_type(dy, g.scalar_type()).reshape({-1, dim_}));
  w_->grad_ready();
  return at::Tensor();
}

// ---------------------------------------------------------------------------------------------------------------
LayerNorm::LayerNorm(ParamSet& ps, std::string name, int64_t dim, double eps)
    : Op(std::move(name)), dim_(dim), eps_(eps) {
  w_ = ps.add(name_ + ".weight", at::ones({dim}), /*decay=*/false);
  b_ = ps.add(name_ + ".bias", at::zeros({dim}), /*decay=*/false);
  params_ = {w_, b_};
}

at::Tensor LayerNorm::operator()(const at::Tensor& x) { return apply_op(*this, x); }

// Statistics in the master dtype (fp32) whatever the compute dtype; the output in the compute dtype, which is
// what the Linear after it takes.
at::Tensor LayerNorm::forward_impl(AutogradContext* ctx, const at::Tensor& input) {
  const at::ScalarType st = w_->master().scalar_type();
  const at::Tensor x = as_type(input, st);
  auto out =
      at::native_layer_norm(x, {dim_}, as_type(w_->materialize(), st), as_type(b_->materialize(), st), eps_);
  w_->release();
  b_->release();
  ctx->save_for_backward({x, std::get<1>(out), std::get<2>(out)});
  return as_type(std::get<0>(out), w_->compute_dtype());
}

at::Tensor LayerNorm::backward_impl(AutogradContext* ctx, const at::Tensor& dy) {
  auto saved = ctx->get_saved_variables();
  const at::ScalarType st = saved[0].scalar_type();
  auto grads = at::native_layer_norm_backward(as_type(dy, st), saved[0], {dim_}, saved[1], saved[2],
                                              as_type(w_->materialize(), st), as_type(b_->materialize(), st),
                                              {ctx->needs_input_grad(0), true, true});
  w_->release();
  b_->release();
  accumulate(w_, std::get<1>(grads));
  accumulate(b_, std::get<2>(grads));
  return std::get<0>(grads);
}

// ---------------------------------------------------------------------------------------------------------------
Conv2d::Conv2d(ParamSet& ps, std::string name, int64_t in_ch, int64_t out_ch, int64_t kernel, int64_t stride,
               int64_t padding, at::Generator& gen)
    : Op(std::move(name)), out_ch_(out_ch), stride_(stride), padding_(padding) {
  const int64_t fan_in = in_ch * kernel * kernel;
  w_ = ps.add(name_ + ".weight",
              draw({out_ch, in_ch, kernel, kernel}, Init{Init::uniform_fan_in}, fan_in, gen),
              /*decay=*/true);
  b_ = ps.add(name_ + ".bias", draw({out_ch}, Init{Init::uniform_fan_in}, fan_in, gen), /*decay=*/false);
  params_ = {w_, b_};
}

at::Tensor Conv2d::operator()(const at::Tensor& x) { return apply_op(*this, x); }

at::Tensor Conv2d::forward_impl(AutogradContext* ctx, const at::Tensor& input) {
  const at::Tensor x = as_type(input, w_->compute_dtype());
  ctx->save_for_backward({x});
  at::Tensor y =
      at::conv2d(x, w_->materialize(), b_->materialize(), {stride_, stride_}, {padding_, padding_});
  w_->release();
  b_->release();
  return y;
}

at::Tensor Conv2d::backward_impl(AutogradContext* ctx, const at::Tensor& dy) {
  at::Tensor x = ctx->get_saved_variables()[0];
  const at::Tensor g = as_type(dy, x.scalar_type());
  const bool mixed = w_->mixed();  // the bias gradient summed in fp32 (below), not by the bf16 kernel
  std::vector<int64_t> bias_sizes{out_ch_};
  auto grads = at::convolution_backward(
      g, x, w_->materialize(), at::OptionalIntArrayRef(bias_sizes), {stride_, stride_}, {padding_, padding_},
      {1, 1}, /*transposed=*/false, {0, 0}, /*groups=*/1, {ctx->needs_input_grad(0), true, !mixed});
  w_->release();
  accumulate(w_, std::get<1>(grads));
  accumulate(b_, mixed ? sum_rows(g, {0, 2, 3}) : std::get<2>(grads));
  return std::get<0>(grads);
}

}  // namespace slimshard
