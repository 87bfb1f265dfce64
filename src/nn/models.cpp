// models.cpp — ModelConfig (presets, validation, JSON) and the models: GPT (pre-LayerNorm transformer with
// causal self-attention and a GELU MLP, untied LM head), an MLP and a small CNN for 28×28 images. Models use
// only the sharding-aware ops for learnable tensors; the rest (attention, activations, pooling) is plain
// LibTorch autograd.
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>

#include "slimshard/common.h"
#include "slimshard/json.h"
#include "slimshard/nn.h"

namespace slimshard {

// ---------------------------------------------------------------------------------------------------------------
ModelConfig ModelConfig::preset_config(const std::string& name) {
  ModelConfig c;
  c.preset = name;
  if (name == "gpt" || name == "gpt-small") {
    c.arch = "gpt", c.n_layer = 4, c.n_head = 4, c.n_embd = 256, c.seq_len = 128;
  } else if (name == "gpt-tiny") {
    c.arch = "gpt", c.n_layer = 2, c.n_head = 2, c.n_embd = 64, c.seq_len = 64;
  } else if (name == "gpt-25m") {
    c.arch = "gpt", c.n_layer = 8, c.n_head = 8, c.n_embd = 512, c.seq_len = 256;
  } else if (name == "gpt2-124m") {
    c.arch = "gpt", c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.seq_len = 1024, c.vocab = 50257;
  } else if (name == "mlp") {
    c.arch = "mlp", c.hidden = 256;
  } else if (name == "cnn") {
    c.arch = "cnn", c.hidden = 128;
  } else {
    throw UsageError("--model: unknown model '" + name +
                     "' (expected gpt, gpt-tiny, gpt-small, gpt-25m, gpt2-124m, mlp or cnn)");
  }
  return c;
}

void ModelConfig::validate() const {
  auto in = [](int64_t v, const char* flag, int64_t hi) {
    if (v <= 0 || v > hi)
      throw UsageError(std::string(flag) + ": must be an integer from 1 to " + std::to_string(hi) + ", got " +
                       std::to_string(v));
  };
  if (arch == "gpt") {
    in(n_layer, "--n-layer", kMaxLayers);
    in(n_head, "--n-head", kMaxWidth);
    in(n_embd, "--n-embd", kMaxWidth);
    in(seq_len, "--seq-len", kMaxSeqLen);
    in(vocab, "--vocab", kMaxVocab);
    if (n_embd % n_head != 0)
      throw UsageError("--n-embd: " + std::to_string(n_embd) + " is not divisible by --n-head " +
                       std::to_string(n_head));
  } else if (arch == "mlp" || arch == "cnn") {
    in(hidden, "hidden", kMaxWidth);
    in(classes, "classes", kMaxVocab);
    if (image != 28) throw UsageError("image: only 28x28 images are supported");
  } else {
    throw UsageError("model arch '" + arch + "' is unknown (expected gpt, mlp or cnn)");
  }
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json j{{"arch", arch}};
  if (!preset.empty()) j["preset"] = preset;
  if (arch == "gpt") {
    j.update({{"n_layer", n_layer},
              {"n_head", n_head},
              {"n_embd", n_embd},
              {"seq_len", seq_len},
              {"vocab", vocab}});
  } else {
    j.update({{"image", image}, {"classes", classes}, {"hidden", hidden}});
  }
  return j;
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& what) {
  ModelConfig c;
  try {
    if (!j.is_object()) throw UsageError(what + ": the model config is not a JSON object");
    c.arch = j.at("arch").get<std::string>();
    c.preset = j.value("preset", std::string());
    auto field = [&](const char* key, int64_t hi) {
      return json_integer(j.at(key), what + ": model " + key, 1, hi);
    };
    if (c.arch == "gpt") {
      c.n_layer = field("n_layer", kMaxLayers);
      c.n_head = field("n_head", kMaxWidth);
      c.n_embd = field("n_embd", kMaxWidth);
      c.seq_len = field("seq_len", kMaxSeqLen);
      c.vocab = field("vocab", kMaxVocab);
    } else {
      c.image = field("image", 1 << 10);
      c.classes = field("classes", kMaxVocab);
      c.hidden = field("hidden", kMaxWidth);
    }
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(what + ": bad model config: " + e.what());
  }
  try {
    c.validate();
  } catch (const UsageError& e) {
    throw UsageError(what + ": model config: " + e.what());
  }
  return c;
}

std::string ModelConfig::describe() const {
  std::string name = preset.empty() ? arch : preset;
  if (arch == "gpt")
    return name + " (" + std::to_string(n_layer) + " layers, " + std::to_string(n_head) + " heads, " +
           std::to_string(n_embd) + " wide, T=" + std::to_string(seq_len) + ", vocab " +
           std::to_string(vocab) + ")";
  return name + " (" + std::to_string(image) + "x" + std::to_string(image) + " images, hidden " +
         std::to_string(hidden) + ", " + std::to_string(classes) + " classes)";
}

// ---------------------------------------------------------------------------------------------------------------
at::Tensor Model::loss(const at::Tensor& x, const at::Tensor& y) {
  at::Tensor lg = logits(x);
  if (lg.scalar_type() == at::kBFloat16) lg = lg.to(at::kFloat);  // the loss in fp32 (mixed precision)
  return at::cross_entropy_loss(lg.reshape({-1, lg.size(-1)}), y.reshape({-1}));
}

Op* Model::find_op(const std::string& name) const {
  for (Op* op : op_view_)
    if (op->name() == name) return op;
  return nullptr;
}

namespace {

// One transformer block: x + attn(ln1(x)), then + mlp(ln2(·)). The unit of recomputation.
class GptBlock final : public Block {
 public:
  GptBlock(std::string name, const ModelConfig& c, LayerNorm* ln1, Linear* qkv, Linear* attn_proj,
           LayerNorm* ln2, Linear* fc, Linear* mlp_proj, at::Tensor causal_mask)
      : Block(std::move(name)),
        H_(c.n_head),
        C_(c.n_embd),
        ln1_(ln1),
        qkv_(qkv),
        attn_proj_(attn_proj),
        ln2_(ln2),
        fc_(fc),
        mlp_proj_(mlp_proj),
        causal_mask_(std::move(causal_mask)) {}

  at::Tensor forward(const at::Tensor& x_in) override {
    const int64_t B = x_in.size(0), T = x_in.size(1), D = C_ / H_;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    auto qkv = (*qkv_)((*ln1_)(x_in)).split(C_, 2);
    at::Tensor q = qkv[0].view({B, T, H_, D}).transpose(1, 2);
    at::Tensor k = qkv[1].view({B, T, H_, D}).transpose(1, 2);
    at::Tensor v = qkv[2].view({B, T, H_, D}).transpose(1, 2);
    // scale · q kᵀ + (0 or −inf above the diagonal) in one batched GEMM: no pass over the scores to scale or
    // mask them, and none in backward (softmax's gradient is 0 where its output is). In bf16 the scores and
    // the softmax's output are bf16; LibTorch's softmax computes in fp32 inside (its output equals the fp32
    // softmax's rounded to bf16, bit for bit: docs/precision.md).
    const at::Tensor mask = at::zeros({T, T}, q.options().requires_grad(false))
                                .masked_fill_(causal_mask_.slice(0, 0, T).slice(1, 0, T),
                                              -std::numeric_limits<float>::infinity());
    at::Tensor att = at::baddbmm(mask, q.reshape({B * H_, T, D}), k.reshape({B * H_, T, D}).transpose(1, 2),
                                 /*beta=*/1.0, /*alpha=*/scale)
                         .softmax(-1)
                         .view({B, H_, T, T});
    at::Tensor y = at::matmul(att, v).transpose(1, 2).reshape({B, T, C_});
    at::Tensor x = x_in + (*attn_proj_)(y);
    return x + (*mlp_proj_)(at::gelu((*fc_)((*ln2_)(x))));
  }

 private:
  int64_t H_, C_;
  LayerNorm* ln1_;
  Linear *qkv_, *attn_proj_;
  LayerNorm* ln2_;
  Linear *fc_, *mlp_proj_;
  at::Tensor causal_mask_;  // shared by all blocks
};

class GPT final : public Model {
 public:
  GPT(const ModelConfig& c, at::Generator& gen) : Model(c) {
    const int64_t C = c.n_embd;
    const Init w{Init::normal, 0.02};
    // GPT-2: residual projections scaled by 1/sqrt(2L) so the residual stream's variance does not grow with
    // depth.
    const Init proj{Init::normal, 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer))};
    const at::Tensor causal_mask = at::ones({c.seq_len, c.seq_len}, at::kBool).triu(1);
    wte_ = add_op<Embedding>("wte", c.vocab, C, gen, 0.02);
    wpe_ = add_op<Embedding>("wpe", c.seq_len, C, gen, 0.02);
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string name = "blocks." + std::to_string(i), p = name + ".";
      auto* ln1 = add_op<LayerNorm>(p + "ln1", C);
      auto* qkv = add_op<Linear>(p + "attn.qkv", C, 3 * C, true, gen, w);
      auto* attn_proj = add_op<Linear>(p + "attn.proj", C, C, true, gen, proj);
      auto* ln2 = add_op<LayerNorm>(p + "ln2", C);
      auto* fc = add_op<Linear>(p + "mlp.fc", C, 4 * C, true, gen, w);
      auto* mlp_proj = add_op<Linear>(p + "mlp.proj", 4 * C, C, true, gen, proj);
      add_block<GptBlock>(name, c, ln1, qkv, attn_proj, ln2, fc, mlp_proj, causal_mask);
    }
    ln_f_ = add_op<LayerNorm>("ln_f", C);
    lm_head_ = add_op<Linear>("lm_head", C, c.vocab, false, gen, w);
  }

  at::Tensor logits(const at::Tensor& ids) override {
    const int64_t T = ids.size(1);
    if (T > config_.seq_len)
      throw UsageError("sequence of " + std::to_string(T) + " tokens exceeds --seq-len");
    at::Tensor x = (*wte_)(ids) + (*wpe_)(at::arange(T, at::kLong));
    for (Block* b : blocks()) x = (*b)(x);
    return (*lm_head_)((*ln_f_)(x));
  }

 private:
  Embedding *wte_, *wpe_;
  LayerNorm* ln_f_;
  Linear* lm_head_;
};

class MLP final : public Model {
 public:
  MLP(const ModelConfig& c, at::Generator& gen) : Model(c) {
    const Init u{Init::uniform_fan_in};
    fc1_ = add_op<Linear>("fc1", c.image * c.image, c.hidden, true, gen, u);
    fc2_ = add_op<Linear>("fc2", c.hidden, c.hidden, true, gen, u);
    fc3_ = add_op<Linear>("fc3", c.hidden, c.classes, true, gen, u);
  }
  at::Tensor logits(const at::Tensor& images) override {
    at::Tensor x = images.reshape({images.size(0), -1});
    x = at::relu((*fc1_)(x));
    x = at::relu((*fc2_)(x));
    return (*fc3_)(x);
  }

 private:
  Linear *fc1_, *fc2_, *fc3_;
};

class CNN final : public Model {
 public:
  CNN(const ModelConfig& c, at::Generator& gen) : Model(c) {
    const Init u{Init::uniform_fan_in};
    conv1_ = add_op<Conv2d>("conv1", 1, 16, 3, 1, 1, gen);
    conv2_ = add_op<Conv2d>("conv2", 16, 32, 3, 1, 1, gen);
    const int64_t side = c.image / 4;
    fc1_ = add_op<Linear>("fc1", 32 * side * side, c.hidden, true, gen, u);
    fc2_ = add_op<Linear>("fc2", c.hidden, c.classes, true, gen, u);
  }
  at::Tensor logits(const at::Tensor& images) override {
    at::Tensor x = at::max_pool2d(at::relu((*conv1_)(images)), {2, 2});
    x = at::max_pool2d(at::relu((*conv2_)(x)), {2, 2});
    x = at::relu((*fc1_)(x.reshape({x.size(0), -1})));
    return (*fc2_)(x);
  }

 private:
  Conv2d *conv1_, *conv2_;
  Linear *fc1_, *fc2_;
};

}  // namespace

std::unique_ptr<Model> build_model(const ModelConfig& config, uint64_t seed) {
  config.validate();
  at::Generator gen = at::detail::createCPUGenerator(seed);
  if (config.arch == "gpt") return std::make_unique<GPT>(config, gen);
  if (config.arch == "mlp") return std::make_unique<MLP>(config, gen);
  return std::make_unique<CNN>(config, gen);
}

std::vector<OpShape> op_shapes(const ModelConfig& c) {
  c.validate();
  std::vector<OpShape> ops;
  auto add = [&](std::string name, std::string kind, std::vector<int64_t> numels, int64_t out) {
    ops.push_back(OpShape{std::move(name), std::move(kind), std::move(numels), out});
  };
  auto linear = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
    add(name, "linear", bias ? std::vector<int64_t>{in * out, out} : std::vector<int64_t>{in * out}, out);
  };
  if (c.arch == "gpt") {
    const int64_t C = c.n_embd;
    add("wte", "embedding", {c.vocab * C}, 0);
    add("wpe", "embedding", {c.seq_len * C}, 0);
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string p = "blocks." + std::to_string(i) + ".";
      add(p + "ln1", "layernorm", {C, C}, 0);
      linear(p + "attn.qkv", C, 3 * C, true);
      linear(p + "attn.proj", C, C, true);
      add(p + "ln2", "layernorm", {C, C}, 0);
      linear(p + "mlp.fc", C, 4 * C, true);
      linear(p + "mlp.proj", 4 * C, C, true);
    }
    add("ln_f", "layernorm", {C, C}, 0);
    linear("lm_head", C, c.vocab, false);
  } else if (c.arch == "mlp") {
    linear("fc1", c.image * c.image, c.hidden, true);
    linear("fc2", c.hidden, c.hidden, true);
    linear("fc3", c.hidden, c.classes, true);
  } else {
    add("conv1", "conv2d", {16 * 9, 16}, 0);
    add("conv2", "conv2d", {32 * 16 * 9, 32}, 0);
    linear("fc1", 32 * (c.image / 4) * (c.image / 4), c.hidden, true);
    linear("fc2", c.hidden, c.classes, true);
  }
  return ops;
}

std::vector<OpShape> op_shapes(const Model& model) {
  std::vector<OpShape> out;
  for (const Op* op : model.ops()) {
    OpShape s{op->name(), op->kind(), {}, 0};
    if (const auto* lin = dynamic_cast<const Linear*>(op)) {  // a split Linear holds row blocks: count whole
      s.param_numels.push_back(lin->in_features() * lin->out_features());
      if (static_cast<int>(op->params().size()) == 2 * lin->splits())
        s.param_numels.push_back(lin->out_features());
      s.out_features = lin->out_features();
    } else {
      for (const ShardedParam* p : op->params()) s.param_numels.push_back(p->numel());
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::pair<at::Tensor, at::Tensor> random_inputs(const ModelConfig& c, int64_t rows, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  if (c.is_classifier())
    return {at::randn({rows, 1, c.image, c.image}, gen), at::randint(0, c.classes, {rows}, gen, at::kLong)};
  return {at::randint(0, c.vocab, {rows, c.seq_len}, gen, at::kLong),
          at::randint(0, c.vocab, {rows, c.seq_len}, gen, at::kLong)};
}

}  // namespace slimshard
