// trainer.cpp — the step loop: per-rank slices of a deterministic global batch, micro-batches with gradient
// accumulation, global-norm clipping, the optimizer over owned shards, evaluation, metrics and progress.
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "progress.h"
#include "slimshard/ckpt.h"
#include "slimshard/common.h"
#include "slimshard/memory.h"
#include "slimshard/train.h"

namespace slimshard {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct EvalResult {
  double loss = 0, acc = -1;
};

class Trainer {
 public:
  explicit Trainer(const TrainOptions& o) : o_(o) { setup(); }
  TrainSummary run();

 private:
  void setup();
  double train_step(int64_t step);
  EvalResult evaluate();
  void print_buffers();

  TrainOptions o_;
  int rank_ = 0, world_ = 1;
  int64_t local_rows_ = 0, micro_ = 0, accum_ = 0;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optim_;
  LrSchedule schedule_;
  std::vector<ShardedParam*> params_;
  int64_t phase_peak_[static_cast<int>(memory::Phase::count)] = {};
};

void Trainer::setup() {
  o_.model.validate();
  if (o_.steps <= 0) throw UsageError("--steps: must be positive");
  if (o_.batch_size <= 0) throw UsageError("--batch-size: must be positive");
  if (o_.batch_size % world_ != 0)
    throw UsageError("--batch-size " + std::to_string(o_.batch_size) + " is not divisible by the " +
                     std::to_string(world_) + " ranks");
  local_rows_ = o_.batch_size / world_;
  micro_ = o_.micro_batch > 0 ? o_.micro_batch : local_rows_;
  if (local_rows_ % micro_ != 0)
    throw UsageError("--micro-batch " + std::to_string(micro_) + " does not divide the per-rank batch of " +
                     std::to_string(local_rows_) + " rows");
  accum_ = local_rows_ / micro_;
  if (!(o_.lr > 0)) throw UsageError("--lr: must be positive");
  if (o_.clip < 0) throw UsageError("--clip: must be >= 0");
  parse_strategy(o_.strategy, "--strategy");

  memory::set_rank(rank_);
  memory::set_limit(o_.mem_limit);

  o_.data.seq_len = o_.model.seq_len;
  o_.data.vocab = o_.model.vocab;
  o_.data.seed = o_.seed;
  data_ = open_dataset(o_.data);
  if (data_->classification() != o_.model.is_classifier())
    throw UsageError("--data " + o_.data.spec + " does not suit --model " + o_.model.describe() +
                     (o_.model.is_classifier() ? " (classifiers train on fashion-mnist)"
                                               : " (GPT trains on text or token files)"));

  memory::PhaseScope phase(memory::Phase::init);
  model_ = build_model(o_.model, o_.seed);
  params_ = model_->params().all();
  optim_ = std::make_unique<Optimizer>(o_.optim);
  schedule_.lr = o_.lr;
  schedule_.min_lr = o_.min_lr >= 0 ? o_.min_lr : o_.lr / 10;
  schedule_.warmup = o_.warmup >= 0 ? o_.warmup : std::min<int64_t>(100, o_.steps / 10);
  schedule_.total = o_.steps;
}

void Trainer::print_buffers() {
  int64_t p = 0, g = 0;
  for (ShardedParam* sp : params_) p += sp->master().nbytes(), g += sp->grad().nbytes();
  std::fprintf(stderr,
               "buffers (per rank, sized at start): params %s | grads %s | optimizer state: %zu x params\n",
               format_bytes(p).c_str(), format_bytes(g).c_str(), optim_->state_names().size());
  for (ShardedParam* sp : params_)
    std::fprintf(stderr, "  %-28s %-16s %s\n", sp->name().c_str(),
                 c10::str(at::IntArrayRef(sp->shape())).c_str(), strategy_name(sp->strategy()));
}

double Trainer::train_step(int64_t step) {
  for (ShardedParam* p : params_) p->zero_grad();
  double loss_sum = 0;
  for (int64_t m = 0; m < accum_; ++m) {
    const int64_t lo = rank_ * local_rows_ + m * micro_;
    Batch b = data_->train_rows(step, o_.batch_size, lo, lo + micro_);
    at::Tensor loss;
    {
      memory::PhaseScope phase(memory::Phase::forward);
      loss = model_->loss(b.x, b.y);
    }
    {
      memory::PhaseScope phase(memory::Phase::backward);
      // Each micro-batch's mean is scaled by 1/accum so that the sum is the mean over the rank's slice.
      (accum_ > 1 ? loss / static_cast<double>(accum_) : loss).backward();
    }
    loss_sum += loss.item<double>();
  }
  memory::PhaseScope phase(memory::Phase::optimizer);
  if (o_.clip > 0) {
    const double norm = std::sqrt(grad_sq_sum(params_));
    if (norm > o_.clip) scale_grads(params_, o_.clip / (norm + 1e-6));
  }
  optim_->step(params_, schedule_.at(step));
  return loss_sum / static_cast<double>(accum_);
}

EvalResult Trainer::evaluate() {
  memory::PhaseScope phase(memory::Phase::eval);
  at::NoGradGuard no_grad;
  const int64_t n = data_->val_size();
  const int64_t lo = n * rank_ / world_, hi = n * (rank_ + 1) / world_;
  double loss_sum = 0, correct = 0;
  for (int64_t r = lo; r < hi; r += micro_) {
    Batch b = data_->val_rows(r, std::min(hi, r + micro_));
    at::Tensor logits = model_->logits(b.x);
    at::Tensor flat = logits.reshape({-1, logits.size(-1)});
    loss_sum +=
        at::cross_entropy_loss(flat, b.y.reshape({-1})).item<double>() * static_cast<double>(b.rows());
    if (data_->classification()) correct += flat.argmax(-1).eq(b.y.reshape({-1})).sum().item<double>();
  }
  EvalResult r;
  r.loss = loss_sum / static_cast<double>(std::max<int64_t>(1, n));
  if (data_->classification()) r.acc = correct / static_cast<double>(std::max<int64_t>(1, n));
  return r;
}

TrainSummary Trainer::run() {
  const bool lead = rank_ == 0;
  const bool classify = data_->classification();
  TrainSummary s;
  s.params = model_->params().numel();
  if (lead) {
    std::fprintf(stderr, "model: %s, %lld parameters\n", o_.model.describe().c_str(), (long long)s.params);
    std::fprintf(stderr, "data: %s\n", data_->describe().c_str());
    std::fprintf(
        stderr,
        "training: %lld steps, global batch %lld (%lld ranks x %lld micro-batches of %lld), strategy %s, "
        "%s lr %g, %d thread(s)\n",
        (long long)o_.steps, (long long)o_.batch_size, (long long)world_, (long long)accum_,
        (long long)micro_, o_.strategy.c_str(), o_.optim.name.c_str(), o_.lr, o_.threads);
    if (o_.verbose) print_buffers();
  }
  std::unique_ptr<MetricsWriter> metrics_file;
  if (!o_.metrics_path.empty() && lead) metrics_file = std::make_unique<MetricsWriter>(o_.metrics_path);
  Progress progress(o_.steps, o_.log_every, lead);

  const double rows_per_step = static_cast<double>(o_.batch_size);
  const double units_per_step = rows_per_step * static_cast<double>(data_->tokens_per_row());
  const char* rate_key = classify ? "samples_per_s" : "tokens_per_s";
  std::vector<double> step_s;
  const auto t_start = Clock::now();
  for (int64_t step = 0; step < o_.steps; ++step) {
    memory::reset_peaks();
    const auto t0 = Clock::now();
    const double loss = train_step(step);
    const double dt = seconds_since(t0);
    step_s.push_back(dt);
    s.losses.push_back(loss);
    const int64_t peak = memory::peak_bytes();
    s.peak_bytes = std::max(s.peak_bytes, peak);
    for (int p = 0; p < static_cast<int>(memory::Phase::count); ++p)
      phase_peak_[p] = std::max(phase_peak_[p], memory::phase_peak_bytes(static_cast<memory::Phase>(p)));
    if (!std::isfinite(loss))
      throw RuntimeError("loss is " + std::to_string(loss) + " at step " + std::to_string(step) +
                         " (diverged; lower --lr?)");

    nlohmann::json rec{{"step", step + 1},         {"loss", loss},
                       {"lr", schedule_.at(step)}, {rate_key, units_per_step / dt},
                       {"step_ms", dt * 1e3},      {"peak_bytes", peak},
                       {"comm_bytes", 0}};
    const bool eval_now = (o_.eval_every > 0 && (step + 1) % o_.eval_every == 0) || step + 1 == o_.steps;
    if (eval_now) {
      EvalResult ev = evaluate();
      s.val_loss = ev.loss, s.val_acc = ev.acc;
      rec["val_loss"] = ev.loss;
      char line[160];
      if (classify) {
        rec["val_acc"] = ev.acc;
        std::snprintf(line, sizeof line, "step %lld: val loss %.4f, val acc %.2f%%", (long long)(step + 1),
                      ev.loss, 100 * ev.acc);
      } else {
        std::snprintf(line, sizeof line, "step %lld: val loss %.4f", (long long)(step + 1), ev.loss);
      }
      progress.message(line);
    }
    if (metrics_file) metrics_file->write(rec);
    char status[160];
    std::snprintf(status, sizeof status, "loss %.4f | %.0f %s | %.0f ms | peak %s MiB", loss,
                  units_per_step / dt, classify ? "samples/s" : "tok/s", dt * 1e3,
                  format_mib(static_cast<double>(peak)).c_str());
    progress.step(step, status, dt);
  }
  progress.finish();
  s.steps = o_.steps;
  s.wall_s = seconds_since(t_start);
  const size_t tail = std::min<size_t>(10, s.losses.size());
  for (size_t i = s.losses.size() - tail; i < s.losses.size(); ++i)
    s.final_loss += s.losses[i] / static_cast<double>(tail);
  // The first steps pay for lazy allocations and warm caches; the median ignores them.
  s.step_ms_median =
      1e3 * median(std::vector<double>(
                step_s.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(2, step_s.size() - 1)),
                step_s.end()));
  s.tokens_per_s = units_per_step / (s.step_ms_median / 1e3);

  if (lead) {
    nlohmann::json phases;
    for (int p = 0; p < static_cast<int>(memory::Phase::count); ++p)
      if (phase_peak_[p] > 0) phases[memory::phase_name(static_cast<memory::Phase>(p))] = phase_peak_[p];
    nlohmann::json sum{{"summary", true},
                       {"steps", s.steps},
                       {"loss", s.final_loss},
                       {rate_key, s.tokens_per_s},
                       {"step_ms", s.step_ms_median},
                       {"peak_bytes", s.peak_bytes},
                       {"comm_bytes", 0},
                       {"val_loss", s.val_loss},
                       {"wall_s", s.wall_s},
                       {"params", s.params},
                       {"world", world_},
                       {"phase_peak_bytes", phases}};
    if (classify) sum["val_acc"] = s.val_acc;
    if (metrics_file) metrics_file->write(sum);
    std::printf("summary: %lld steps in %.1f s | train loss %.4f | val loss %.4f", (long long)s.steps,
                s.wall_s, s.final_loss, s.val_loss);
    if (classify) std::printf(" | val acc %.2f%%", 100 * s.val_acc);
    std::printf(
        " | %.0f %s (median step %.1f ms) | peak %s MiB (forward %s, backward %s, optimizer %s)\n",
        s.tokens_per_s, classify ? "samples/s" : "tokens/s", s.step_ms_median,
        format_mib(static_cast<double>(s.peak_bytes)).c_str(),
        format_mib(static_cast<double>(phase_peak_[static_cast<int>(memory::Phase::forward)])).c_str(),
        format_mib(static_cast<double>(phase_peak_[static_cast<int>(memory::Phase::backward)])).c_str(),
        format_mib(static_cast<double>(phase_peak_[static_cast<int>(memory::Phase::optimizer)])).c_str());
  }
  if (!o_.save_model.empty() && lead) {
    save_model_file(o_.save_model, *model_);
    std::fprintf(stderr, "saved model weights to %s\n", o_.save_model.c_str());
  }
  if (o_.sample_tokens > 0 && !classify && lead) {
    if (o_.model.vocab == 256) {
      GenerateOptions g;
      g.prompt = o_.sample_prompt, g.tokens = o_.sample_tokens, g.seed = o_.seed;
      s.sample = generate_text(*model_, g);
      std::printf("--- sample (%lld tokens, temperature %.1f, top-k %lld) ---\n%s\n---\n",
                  (long long)g.tokens, g.temperature, (long long)g.top_k, s.sample.c_str());
    } else {
      std::fprintf(stderr, "sample skipped: vocabulary %lld is not byte-level text\n",
                   (long long)o_.model.vocab);
    }
  }
  std::fflush(stdout);
  return s;
}

}  // namespace

TrainSummary train(const TrainOptions& opts) {
  at::set_num_threads(std::max(1, opts.threads));
  Trainer t(opts);
  return t.run();
}

std::string generate_text(Model& model, const GenerateOptions& g) {
  if (model.config().arch != "gpt" || model.config().vocab < 256)
    throw UsageError("generate: needs a byte-level GPT (vocab >= 256)");
  at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(g.seed);
  std::vector<int64_t> ids;
  for (unsigned char c : g.prompt) ids.push_back(c);
  if (ids.empty()) ids.push_back('\n');
  const int64_t T = model.config().seq_len;
  std::string out = g.prompt;
  for (int64_t i = 0; i < g.tokens; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - T);
    at::Tensor ctx = at::tensor(std::vector<int64_t>(ids.begin() + start, ids.end()), at::kLong).unsqueeze(0);
    at::Tensor logits = model.logits(ctx).select(1, ctx.size(1) - 1).squeeze(0);
    if (g.temperature <= 0) {
      ids.push_back(logits.argmax().item<int64_t>());
    } else {
      logits = logits / g.temperature;
      if (g.top_k > 0 && g.top_k < logits.size(0)) {
        at::Tensor kth = std::get<0>(logits.topk(g.top_k)).select(0, g.top_k - 1);
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      ids.push_back(at::multinomial(logits.softmax(-1), 1, false, gen).item<int64_t>());
    }
    const int64_t tok = ids.back();
    out.push_back(tok < 256 ? static_cast<char>(tok) : '?');
  }
  return out;
}

}  // namespace slimshard
