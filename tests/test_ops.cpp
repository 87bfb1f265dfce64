// test_ops.cpp — every sharding-aware op against LibTorch's own op: forward output, input gradient and weight
// gradients, in double precision on random shapes.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "slimshard/common.h"
#include "slimshard/memory.h"
#include "slimshard/nn.h"
#include "slimshard/sharded_param.h"

using namespace slimshard;

namespace {

at::Generator gen(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

// Moves every param of `op` to double and returns reference leaves holding the same values.
std::vector<at::Tensor> to_double(Op& op) {
  std::vector<at::Tensor> ref;
  for (ShardedParam* p : op.params()) {
    at::Tensor v = p->materialize().to(at::kDouble) + 0.1 * at::randn(p->shape(), at::kDouble);
    p->set_value(v);
    ref.push_back(v.clone().set_requires_grad(true));
  }
  return ref;
}

void expect_close(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double err = (a - b).abs().max().item<double>();
  const double scale = std::max(1.0, b.abs().max().item<double>());
  EXPECT_LT(err / scale, 1e-10) << what << ": max abs diff " << err;
}

// Runs op(x) and ref(x) with the same upstream gradient; compares output, dx and each weight gradient.
template <class OpFn, class RefFn>
void check(Op& op, const at::Tensor& x_in, OpFn op_fn, RefFn ref_fn, bool x_grad = true) {
  std::vector<at::Tensor> ref_w = to_double(op);
  at::Tensor x1 = x_in.clone(), x2 = x_in.clone();
  if (x_grad) x1.set_requires_grad(true), x2.set_requires_grad(true);
  at::Tensor y1 = op_fn(x1);
  at::Tensor y2 = ref_fn(x2, ref_w);
  expect_close(y1, y2, op.name() + " forward");
  at::Tensor dy = at::randn(y2.sizes(), at::kDouble);
  // Backward twice: weight gradients accumulate, as over micro-batches.
  for (int rep = 0; rep < 2; ++rep) {
    torch::autograd::backward({rep == 0 ? y1 : op_fn(x1)}, {dy});
    torch::autograd::backward({rep == 0 ? y2 : ref_fn(x2, ref_w)}, {dy});
  }
  if (x_grad) expect_close(x1.grad(), x2.grad(), op.name() + " input grad");
  for (size_t i = 0; i < ref_w.size(); ++i)
    expect_close(op.params()[i]->grad_buffer(), ref_w[i].grad(), op.params()[i]->name() + " grad");
}

}  // namespace

TEST(Ops, LinearMatchesLibTorch) {
  at::manual_seed(1);
  auto g = gen(1);
  for (auto [in, out, bias] :
       {std::tuple<int64_t, int64_t, bool>{7, 5, true}, {16, 33, false}, {3, 1, true}}) {
    ParamSet ps;
    Linear lin(ps, "lin", in, out, bias, g, Init{Init::normal, 0.5});
    at::Tensor x = at::randn({2, 3, in}, at::kDouble);
    check(
        lin, x, [&](const at::Tensor& t) { return lin(t); },
        [&](const at::Tensor& t, const std::vector<at::Tensor>& w) {
          return at::linear(t, w[0], bias ? w[1] : at::Tensor());
        });
  }
}

TEST(Ops, SplitLinearMatchesLibTorch) {
  at::manual_seed(11);
  auto g = gen(11);
  for (int k : {2, 3}) {
    ParamSet ps;
    Linear lin(ps, "lin", 5, 12, true, g, Init{Init::normal, 0.5});
    lin.set_splits(ps, k);
    ASSERT_EQ(lin.params().size(), size_t(2 * k));
    EXPECT_EQ(lin.params()[0]->name(), "lin.weight#0");
    at::Tensor x = at::randn({4, 5}, at::kDouble);
    check(
        lin, x, [&](const at::Tensor& t) { return lin(t); },
        [&](const at::Tensor& t, const std::vector<at::Tensor>& w) {
          std::vector<at::Tensor> ws(w.begin(), w.begin() + k), bs(w.begin() + k, w.end());
          return at::linear(t, at::cat(ws), at::cat(bs));
        });
  }
  ParamSet ps;
  Linear lin(ps, "lin", 5, 12, true, g, Init{Init::normal, 0.5});
  EXPECT_THROW(lin.set_splits(ps, 5), UsageError);
}

TEST(Ops, EmbeddingMatchesLibTorch) {
  at::manual_seed(2);
  auto g = gen(2);
  ParamSet ps;
  Embedding emb(ps, "emb", 11, 6, g, 1.0);
  // Repeated ids: their gradients must add up.
  at::Tensor ids = at::randint(0, 11, {4, 9}, at::kLong);
  ids[0][0] = 3, ids[1][1] = 3;
  check(
      emb, ids, [&](const at::Tensor& t) { return emb(t); },
      [&](const at::Tensor& t, const std::vector<at::Tensor>& w) { return at::embedding(w[0], t); },
      /*x_grad=*/false);
}

// A bf16 addend into an fp32 gradient: LibTorch's add_ bit for bit (odd sizes, across parallel_for's grain),
// and not one byte allocated for it, where add_ allocates an fp32 copy of the addend.
TEST(Ops, AddWideningEqualsAddWithoutATemporary) {
  at::manual_seed(7);
  for (int64_t n : {1, 1000, 70001, 300000}) {
    const at::Tensor dst = at::randn({n}), src = at::randn({n}).to(at::kBFloat16);
    at::Tensor expected = dst.clone(), got = dst.clone();
    expected.add_(src);
    memory::reset_peaks();
    const int64_t live = memory::live_bytes();
    add_widening(got, src);
    EXPECT_EQ(memory::peak_bytes(), live) << n;
    EXPECT_TRUE(at::equal(got, expected)) << n;
  }
  // Other dtypes and layouts fall back to add_.
  at::Tensor a = at::ones({4, 3}), b = at::ones({3, 4}).t();
  add_widening(a, b);
  EXPECT_TRUE(at::equal(a, at::full({4, 3}, 2.0)));
}

TEST(Ops, LayerNormMatchesLibTorch) {
  at::manual_seed(3);
  for (int64_t dim : {1, 8, 37}) {
    ParamSet ps;
    LayerNorm ln(ps, "ln", dim);
    at::Tensor x = at::randn({3, 5, dim}, at::kDouble) * 3 + 1;
    check(
        ln, x, [&](const at::Tensor& t) { return ln(t); },
        [&](const at::Tensor& t, const std::vector<at::Tensor>& w) {
          return at::layer_norm(t, {dim}, w[0], w[1], 1e-5);
        });
  }
}

TEST(Ops, Conv2dMatchesLibTorch) {
  at::manual_seed(4);
  auto g = gen(4);
  for (auto [cin, cout, k, stride, pad] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 4, 3, 1, 1},
        {3, 5, 3, 2, 0},
        {2, 2, 1, 1, 0}}) {
    ParamSet ps;
    Conv2d conv(ps, "conv", cin, cout, k, stride, pad, g);
    at::Tensor x = at::randn({2, cin, 9, 8}, at::kDouble);
    check(
        conv, x, [&](const at::Tensor& t) { return conv(t); },
        [&](const at::Tensor& t, const std::vector<at::Tensor>& w) {
          return at::conv2d(t, w[0], w[1], {stride, stride}, {pad, pad});
        });
  }
}

// The whole GPT in double against the same network written with LibTorch's own ops: forward and every
// gradient.
TEST(Ops, GptMatchesLibTorchReference) {
  ModelConfig c = ModelConfig::preset_config("gpt-tiny");
  c.n_layer = 2, c.n_embd = 16, c.n_head = 2, c.seq_len = 8, c.vocab = 13;
  auto model = build_model(c, 5);
  std::map<std::string, at::Tensor> w;
  for (ShardedParam* p : model->params().all()) {
    at::Tensor v = p->materialize().to(at::kDouble) + 0.05 * at::randn(p->shape(), at::kDouble);
    p->set_value(v);
    w[p->name()] = v.clone().set_requires_grad(true);
  }
  at::Tensor ids = at::randint(0, c.vocab, {3, c.seq_len}, at::kLong);
  at::Tensor tgt = at::randint(0, c.vocab, {3, c.seq_len}, at::kLong);
  at::Tensor loss = model->loss(ids, tgt);

  const int64_t B = 3, T = c.seq_len, C = c.n_embd, H = c.n_head, D = C / H;
  at::Tensor x = at::embedding(w["wte.weight"], ids) + at::embedding(w["wpe.weight"], at::arange(T));
  at::Tensor mask = at::ones({T, T}, at::kBool).tril();
  for (int i = 0; i < c.n_layer; ++i) {
    auto p = [&](const std::string& s) { return w["blocks." + std::to_string(i) + "." + s]; };
    at::Tensor h = at::layer_norm(x, {C}, p("ln1.weight"), p("ln1.bias"));
    auto qkv = at::linear(h, p("attn.qkv.weight"), p("attn.qkv.bias")).split(C, 2);
    auto heads = [&](const at::Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
    at::Tensor att = at::matmul(heads(qkv[0]), heads(qkv[1]).transpose(-2, -1)) / std::sqrt(double(D));
    att = att.masked_fill(mask.logical_not(), -INFINITY).softmax(-1);
    at::Tensor y = at::matmul(att, heads(qkv[2])).transpose(1, 2).reshape({B, T, C});
    x = x + at::linear(y, p("attn.proj.weight"), p("attn.proj.bias"));
    h = at::layer_norm(x, {C}, p("ln2.weight"), p("ln2.bias"));
    x = x + at::linear(at::gelu(at::linear(h, p("mlp.fc.weight"), p("mlp.fc.bias"))), p("mlp.proj.weight"),
                       p("mlp.proj.bias"));
  }
  at::Tensor logits =
      at::linear(at::layer_norm(x, {C}, w["ln_f.weight"], w["ln_f.bias"]), w["lm_head.weight"]);
  at::Tensor ref = at::cross_entropy_loss(logits.reshape({-1, c.vocab}), tgt.reshape({-1}));
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-12);
  loss.backward();
  ref.backward();
  for (ShardedParam* p : model->params().all())
    expect_close(p->grad_buffer(), w[p->name()].grad(), p->name() + " grad");
}
