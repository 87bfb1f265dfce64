// nn.h — sharding-aware ops (Linear, Embedding, LayerNorm, Conv2d) and the models built only from them
// (GPT, MLP, CNN). Each op is a custom autograd Function: forward materializes its weights, computes,
// releases; backward materializes again, computes the input gradient, accumulates the weight gradients into
// the ShardedParams and tells them the gradient is ready, releases.
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "slimshard/sharded_param.h"

namespace torch::autograd {
struct AutogradContext;
}

namespace slimshard {

// Owns the ShardedParams of a model, in creation order.
class ParamSet {
 public:
  ShardedParam* add(std::string name, const at::Tensor& init, bool decay);
  // Replaces `old` by `with`, in its place (creation order is the DDP bucket order).
  std::vector<ShardedParam*> replace(ShardedParam* old, std::vector<std::unique_ptr<ShardedParam>> with);
  const std::vector<ShardedParam*>& all() const { return view_; }
  ShardedParam* find(const std::string& name) const;
  int64_t numel() const;

 private:
  std::vector<std::unique_ptr<ShardedParam>> owned_;
  std::vector<ShardedParam*> view_;
};

// Base of every sharding-aware op: a stable dotted name (the key of plans and checkpoints), its params, and
// an anchor — a leaf tensor that requires grad, passed to the autograd Function as an input so that its
// backward runs even where the activations need no gradient (an embedding of token ids).
class Op {
 public:
  explicit Op(std::string name);
  virtual ~Op() = default;
  const std::string& name() const { return name_; }
  const std::vector<ShardedParam*>& params() const { return params_; }
  const at::Tensor& anchor() const { return anchor_; }
  virtual std::string kind() const = 0;

  // Called by the autograd Function (see ops.cpp).
  virtual at::Tensor forward_impl(torch::autograd::AutogradContext* ctx, const at::Tensor& x) = 0;
  virtual at::Tensor backward_impl(torch::autograd::AutogradContext* ctx, const at::Tensor& dy) = 0;

 protected:
  std::string name_;
  std::vector<ShardedParam*> params_;
  at::Tensor anchor_;
};

// Parameter initialisation, from one generator shared by the whole model so that every rank draws the same.
struct Init {
  enum Kind { normal, uniform_fan_in, ones, zeros } kind;
  double std = 0.02;  // for normal
};

// y = x Wᵀ + b. With splits = k (OSDP's operator splitting) W and b are k row blocks along the output
// features, each its own ShardedParam ("<name>.weight#j"), gathered, used and released one at a time, so the
// transient gathered memory of a sharded Linear falls k-fold.
class Linear : public Op {
 public:
  Linear(ParamSet& ps, std::string name, int64_t in, int64_t out, bool bias, at::Generator& gen, Init w_init);
  at::Tensor operator()(const at::Tensor& x);
  std::string kind() const override { return "linear"; }
  at::Tensor forward_impl(torch::autograd::AutogradContext* ctx, const at::Tensor& x) override;
  at::Tensor backward_impl(torch::autograd::AutogradContext* ctx, const at::Tensor& dy) override;
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  int splits() const { return static_cast<int>(w_.size()); }
  // Re-lays the weights as k row blocks (same values). Before sharding; `k` must divide out_features().
  void set_splits(ParamSet& ps, int k);

 private:
  int64_t in_, out_;
  std::vector<ShardedParam*> w_, b_;  // row blocks (one when not split); b_ empty without bias
};

class Embedding : public Op {
 public:
  Embedding(ParamSet& ps, std::string name, int64_t num, int64_t dim, at::Generator& gen, double std);
  at::Tensor operator()(const at::Tensor& ids);
  std::string kind() const override { return "embedding"; }
  at::Tensor forward_impl(torch::autograd::AutogradContext* ctx, const at::Tensor& ids) override;
  at::Tensor backward_impl(torch::autograd::AutogradContext* ctx, const at::Tensor& dy) override;

 private:
  int64_t num_, dim_;
  ShardedParam* w_;
};

class LayerNorm : public Op {
 public:
  LayerNorm(ParamSet& ps, std::string name, int64_t dim, double eps = 1e-5);
  at::Tensor operator()(const at::Tensor& x);
  std::string kind() const override { return "layernorm"; }
  at::Tensor forward_impl(torch::autograd::AutogradContext* ctx, const at::Tensor& x) override;
  at::Tensor backward_impl(torch::autograd::AutogradContext* ctx, const at::Tensor& dy) override;

 private:
  int64_t dim_;
  double eps_;
  ShardedParam* w_;
  ShardedParam* b_;
};

class Conv2d : public Op {
 public:
  Conv2d(ParamSet& ps, std::string name, int64_t in_ch, int64_t out_ch, int64_t kernel, int64_t stride,
         int64_t padding, at::Generator& gen);
  at::Tensor operator()(const at::Tensor& x);
  std::string kind() const override { return "conv2d"; }
  at::Tensor forward_impl(torch::autograd::AutogradContext* ctx, const at::Tensor& x) override;
  at::Tensor backward_impl(torch::autograd::AutogradContext* ctx, const at::Tensor& dy) override;

 private:
  int64_t out_ch_, stride_, padding_;
  ShardedParam* w_;
  ShardedParam* b_;
};

// A unit of activation recomputation (activation checkpointing): a GPT block, "blocks.<i>". Run with
// recompute on, its forward keeps only its input; in backward it runs the forward again and then its backward
// (torch.utils.checkpoint's reentrant form). The recomputed forward runs the same kernels on the same input,
// so the gradients are bit for bit those without recomputation. Weights gathered on use (zero3, hsdp) are
// gathered once for the recomputed forward and kept for the backward that follows
// (ShardedParam::materialize).
class Block {
 public:
  explicit Block(std::string name);
  virtual ~Block() = default;
  const std::string& name() const { return name_; }
  bool recompute() const { return recompute_; }
  void set_recompute(bool on) { recompute_ = on; }
  // The block on `x`: directly, or through the recomputing autograd Function.
  at::Tensor operator()(const at::Tensor& x);
  // The block's math (ops and plain autograd code between them).
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  const at::Tensor& anchor() const { return anchor_; }

 private:
  std::string name_;
  bool recompute_ = false;
  at::Tensor anchor_;  // as Op's: backward runs even if the input needs no gradient
};
// True while a recomputed forward runs inside backward (observers tell it from the first forward).
bool recomputing();
// The block an op belongs to ("blocks.3" for "blocks.3.attn.qkv"), or "" for an op outside every block.
std::string block_of(const std::string& op_name);

// The shape of a model. arch: gpt | mlp | cnn.
struct ModelConfig {
  std::string arch = "gpt";
  std::string preset;  // the preset it came from, if any
  int64_t n_layer = 4, n_head = 4, n_embd = 256, seq_len = 128, vocab = 256;
  int64_t image = 28, classes = 10, hidden = 256;

  // Bounds every shape is checked against (flags and files alike): beyond any GPT planned here (175B: 96
  // layers, 12288 wide, T=2048), small enough that no size computed from them overflows.
  static constexpr int64_t kMaxLayers = 4096, kMaxWidth = 1 << 17, kMaxSeqLen = 1 << 20, kMaxVocab = 1 << 24;
  bool is_classifier() const { return arch != "gpt"; }
  // Throws UsageError naming the offending field.
  void validate() const;
  nlohmann::json to_json() const;
  static ModelConfig from_json(const nlohmann::json& j, const std::string& what);
  // gpt-tiny, gpt-small, gpt-25m, gpt2-124m, gpt, mlp, cnn. Throws UsageError for anything else.
  static ModelConfig preset_config(const std::string& name);
  std::string describe() const;
};

class Model {
 public:
  virtual ~Model() = default;
  // GPT: ids [B,T] int64 -> logits [B,T,V]. Classifiers: images [B,1,28,28] -> logits [B,classes].
  virtual at::Tensor logits(const at::Tensor& x) = 0;
  // Mean cross-entropy over all targets.
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y);

  const ModelConfig& config() const { return config_; }
  ParamSet& params() { return params_; }
  const std::vector<Op*>& ops() const { return op_view_; }
  Op* find_op(const std::string& name) const;
  // The units of recomputation, in model order (GPT: its blocks; none in the classifiers, whose layers are
  // one op each — recomputing an op would save nothing).
  const std::vector<Block*>& blocks() const { return block_view_; }

 protected:
  explicit Model(ModelConfig c) : config_(std::move(c)) {}
  template <class T, class... Args>
  T* add_op(Args&&... args) {
    auto op = std::make_unique<T>(params_, std::forward<Args>(args)...);
    T* raw = op.get();
    op_view_.push_back(raw);
    ops_.push_back(std::move(op));
    return raw;
  }
  template <class T, class... Args>
  T* add_block(Args&&... args) {
    auto b = std::make_unique<T>(std::forward<Args>(args)...);
    T* raw = b.get();
    block_view_.push_back(raw);
    blocks_.push_back(std::move(b));
    return raw;
  }
  ModelConfig config_;
  ParamSet params_;

 private:
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<Block*> block_view_;
  std::vector<std::unique_ptr<Op>> ops_;
  std::vector<Op*> op_view_;
};

// Called as every op's forward and backward begins and ends, on the thread running it: the activation probe
// and the profiler measure what lies between consecutive calls. nullptr = none.
enum class OpPhase { forward_begin, forward_end, backward_begin, backward_end };
void set_op_observer(std::function<void(const Op&, OpPhase)> observer);

// Builds the model with weights drawn from `seed` (the same on every rank).
std::unique_ptr<Model> build_model(const ModelConfig& config, uint64_t seed);

// An op as plans, the planner and file checks see it: its name and kind, its params' sizes at splits=1
// (weight, bias) and, for linear ops, the output features (which splits must divide).
struct OpShape {
  std::string name, kind;
  std::vector<int64_t> param_numels;
  int64_t out_features = 0;
  bool operator==(const OpShape& o) const {
    return name == o.name && kind == o.kind && param_numels == o.param_numels &&
           out_features == o.out_features;
  }
};
// The ops of a model from its config alone, without allocating it (a 175B-parameter GPT is planned, not
// built); and of a built model, whatever its current splits. Both in model order.
std::vector<OpShape> op_shapes(const ModelConfig& config);
std::vector<OpShape> op_shapes(const Model& model);

// Random inputs and targets of `rows` rows for `config` (token ids and next tokens, or images and labels),
// drawn from `seed`: what the activation probe and the profiler run the model on (their figures do not
// depend on the values).
std::pair<at::Tensor, at::Tensor> random_inputs(const ModelConfig& config, int64_t rows, uint64_t seed);

}  // namespace slimshard
