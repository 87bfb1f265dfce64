// trainer.cpp — the step loop: per-rank slices of a deterministic global batch, micro-batches with gradient
// accumulation, global-norm clipping, the optimizer over owned shards, evaluation, metrics and progress.
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <set>
#include <thread>

#include "progress.h"
#include "slimshard/ckpt.h"
#include "slimshard/comm.h"
#include "slimshard/common.h"
#include "slimshard/memory.h"
#include "slimshard/plan.h"
#include "slimshard/slim.h"
#include "slimshard/train.h"

namespace slimshard {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct EvalResult {
  double loss = 0, acc = -1;
};

// Where a step's time goes on this rank (ms): building the batch, forward, backward (with the gradient
// reductions it overlaps), waiting for the reductions still running after backward, clipping + optimizer.
struct StepTimes {
  double data = 0, forward = 0, backward = 0, comm_wait = 0, optimizer = 0;
};

struct Fault {
  std::string kind;
  int rank = -1;
  int64_t step = -1;
};

Fault parse_fault(const std::string& spec) {
  Fault f;
  if (spec.empty()) return f;
  const size_t a = spec.find(':'), b = spec.find(':', a + 1);
  try {
    if (a == std::string::npos || b == std::string::npos) throw std::invalid_argument("format");
    f.kind = spec.substr(0, a);
    f.rank = std::stoi(spec.substr(a + 1, b - a - 1));
    f.step = std::stoll(spec.substr(b + 1));
  } catch (const std::exception&) {
    throw UsageError("--fault: '" + spec + "' is not KIND:RANK:STEP");
  }
  if (f.kind != "sleep" && f.kind != "exit" && f.kind != "kill" && f.kind != "killsave")
    throw UsageError("--fault: unknown kind '" + f.kind + "' (expected sleep, exit, kill or killsave)");
  return f;
}

class Trainer {
 public:
  Trainer(const TrainOptions& o, Communicator& comm) : o_(o), comm_(comm) { setup(); }
  TrainSummary run();

 private:
  void setup();
  double train_step(int64_t step);
  EvalResult evaluate();
  void print_buffers();
  void inject_fault(int64_t step);
  // Checkpoints: this rank's pieces of every logical tensor (params and optimizer state), saving after
  // `steps` steps, and resuming.
  // What a checkpoint holds of this rank; with `slim_state`, also Slim-DP's agreed signal and core.
  std::vector<TensorPiece> pieces(bool slim_state = true);
  nlohmann::json plan_json() const;
  // Slim-DP's settings and round count, saved with a checkpoint: its state is restored only under the same
  // settings.
  nlohmann::json slim_state_json() const;
  void save(int64_t steps);
  void resume();
  // --exit-after-mins: whether any rank's clock says time is up (a small collective, so all ranks agree).
  bool agreed_time_up(Clock::time_point start);

  TrainOptions o_;
  Communicator& comm_;
  int rank_ = 0, world_ = 1;
  Fault fault_;
  int64_t local_rows_ = 0, micro_ = 0, accum_ = 0;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optim_;
  LrSchedule schedule_;
  std::vector<ShardedParam*> params_;
  Plan plan_;
  std::map<std::string, OpChoice> choices_;
  std::unique_ptr<DataParallel> dp_;  // after model_: destroyed before the params it hooks
  std::unique_ptr<SlimSync> slim_;    // Slim-DP for the params whose strategy is slim
  int64_t start_step_ = 0;            // > 0 when resumed
  double grad_norm_ = 0;  // of the last step, before clipping (slim params: this rank's own gradient)
  std::string last_ckpt_;
  std::vector<StepTimes> step_times_;
  std::vector<double> step_bytes_;  // communicated per training step (not counting evaluation)
  int64_t phase_peak_[static_cast<int>(memory::Phase::count)] = {};
};

void Trainer::setup() {
  rank_ = comm_.rank();
  world_ = comm_.world();
  fault_ = parse_fault(o_.fault);
  o_.model.validate();
  if (o_.steps <= 0) throw UsageError("--steps: must be positive");
  if (o_.batch_size <= 0) throw UsageError("--batch-size: must be positive");
  if (o_.batch_size % world_ != 0)
    throw UsageError("--batch-size " + std::to_string(o_.batch_size) + " is not divisible by the " +
                     std::to_string(world_) + " ranks");
  plan_ = !o_.plan_text.empty()  ? parse_plan(o_.plan_text, "osdp plan")
          : o_.plan_file.empty() ? uniform_plan(parse_strategy(o_.strategy, "--strategy"))
                                 : load_plan(o_.plan_file);
  if (plan_.world != 0 && plan_.world != world_)
    throw UsageError("--plan " + o_.plan_file + ": made for " + std::to_string(plan_.world) +
                     " ranks, this job has " + std::to_string(world_));
  if (o_.micro_batch == 0 && plan_.micro_batch > 0) o_.micro_batch = plan_.micro_batch;
  if (o_.prefetch < 0) throw UsageError("--prefetch: must be >= 0");
  local_rows_ = o_.batch_size / world_;
  micro_ = o_.micro_batch > 0 ? o_.micro_batch : local_rows_;
  if (local_rows_ % micro_ != 0)
    throw UsageError("--micro-batch " + std::to_string(micro_) + " does not divide the per-rank batch of " +
                     std::to_string(local_rows_) + " rows");
  accum_ = local_rows_ / micro_;
  if (!(o_.lr > 0)) throw UsageError("--lr: must be positive");
  if (o_.clip < 0) throw UsageError("--clip: must be >= 0");

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
  choices_ = resolve_plan(plan_, *model_);
  const std::vector<Strategy> strategies = apply_plan(choices_, *model_);
  params_ = model_->params().all();
  dp_ = std::make_unique<DataParallel>(comm_, params_, strategies,
                                       DataParallel::Options{o_.bucket_bytes, o_.prefetch});
  std::vector<ShardedParam*> slim_params;
  for (ShardedParam* p : params_)
    if (p->strategy() == Strategy::slim) slim_params.push_back(p);
  if (!slim_params.empty()) {
    if (o_.slim.period < 1 || o_.slim.refresh < 1 || !(o_.slim.core > 0 && o_.slim.core <= 1) ||
        !(o_.slim.explore >= 0 && o_.slim.explore <= 1) || o_.slim.full_sync_every < 0)
      throw UsageError(
          "--slim-*: period and refresh >= 1, core in (0, 1], explore in [0, 1], full-sync >= 0");
    o_.slim.seed = o_.seed;
    slim_ = std::make_unique<SlimSync>(comm_, slim_params, o_.slim);
  }
  if (slim_ && o_.slim.adam == "corrected") {
    if (o_.optim.name != "adamw") throw UsageError("--slim-adam corrected: needs --optimizer adamw");
    o_.optim.slim_ranks = world_;
  }
  optim_ = std::make_unique<Optimizer>(o_.optim);
  optim_->init_state(params_);
  schedule_.lr = o_.lr;
  schedule_.min_lr = o_.min_lr >= 0 ? o_.min_lr : o_.lr / 10;
  schedule_.warmup = o_.warmup >= 0 ? o_.warmup : std::min<int64_t>(100, o_.steps / 10);
  schedule_.total = o_.steps;
  if ((o_.save_every > 0 || o_.exit_after_steps > 0 || o_.exit_after_mins > 0) && o_.ckpt_dir.empty())
    throw UsageError("--save-every / --exit-after-*: give --ckpt-dir");
  if (o_.save_every < 0 || o_.exit_after_steps < 0 || o_.exit_after_mins < 0 || o_.keep_last < 0)
    throw UsageError("--save-every, --keep-last, --exit-after-*: must be >= 0");
  if (!o_.resume.empty()) resume();
}

std::vector<TensorPiece> Trainer::pieces(bool slim_state) {
  // Split ops keep row blocks "w#0", "w#1", ...: consecutive ranges of the flattened logical tensor "w".
  std::map<std::string, std::pair<int64_t, std::vector<int64_t>>> logical;  // name -> (numel so far, shape)
  std::vector<std::pair<std::string, int64_t>> where;                       // per param: logical name, offset
  for (ShardedParam* p : params_) {
    const std::string base = p->name().substr(0, p->name().find('#'));
    auto& [numel, shape] = logical[base];
    if (shape.empty()) {
      shape = p->shape();
    } else {
      shape[0] += p->shape()[0];
    }
    where.emplace_back(base, numel);
    numel += p->numel();
  }
  std::vector<TensorPiece> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    ShardedParam* p = params_[i];
    const Strategy st = p->strategy();
    const bool full = st == Strategy::ddp || st == Strategy::slim;
    const int64_t lo = full ? 0 : p->shard_offset();
    const int64_t len = full ? p->numel() : std::min(p->numel(), lo + p->shard_numel()) - lo;
    if (len <= 0) continue;  // this rank's shard is all padding
    auto add = [&](const std::string& name, const at::Tensor& t, bool per_rank) {
      TensorPiece piece;
      piece.name = name;
      piece.shape = logical[where[i].first].second;
      piece.start = where[i].second + lo;
      piece.data = t.reshape({-1}).slice(0, 0, len);
      piece.replicated = full && !per_rank;
      piece.per_rank = per_rank;
      out.push_back(piece);
    };
    add(where[i].first, p->master(), false);
    // Slim-DP's optimizer state is each rank's own; ddp's is identical everywhere; zero's is the owned slice.
    for (auto& [key, t] : p->optim_state()) add(where[i].first + "." + key, t, st == Strategy::slim);
    if (st == Strategy::slim && slim_state)
      for (auto& [key, t] : slim_->state_of(p)) add(where[i].first + "." + key, t, false);
  }
  return out;
}

nlohmann::json Trainer::plan_json() const {
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [op, c] : choices_)
    ops[op] = {{"strategy", strategy_name(c.strategy)}, {"splits", c.splits}};
  return {{"world", world_}, {"ops", ops}};
}

nlohmann::json Trainer::slim_state_json() const {
  const SlimOptions& o = slim_->options();
  return {{"period", o.period},
          {"core", o.core},
          {"explore", o.explore},
          {"refresh", o.refresh},
          {"full_sync_every", o.full_sync_every},
          {"wire", o.wire},
          {"seed", o.seed},
          {"rounds", slim_->rounds()},
          {"digest", slim_->selection_digest()}};
}

void Trainer::save(int64_t steps) {
  CheckpointMeta meta;
  meta.step = steps;
  meta.model = o_.model.to_json();
  meta.plan = plan_json();
  // Batches and the learning rate are functions of (seed, step): the step is the data position.
  meta.state = {{"optimizer", o_.optim.name},
                {"optimizer_steps", optim_->steps_taken()},
                {"seed", o_.seed},
                {"data_position", steps},
                {"global_batch", o_.batch_size}};
  if (slim_) meta.state["slim"] = slim_state_json();
  const bool kill = fault_.kind == "killsave" && fault_.rank == rank_ && fault_.step == steps;
  const auto t0 = Clock::now();
  last_ckpt_ = save_checkpoint(comm_, o_.ckpt_dir, meta, pieces(), o_.keep_last, [&] {
    if (!kill) return;
    std::fprintf(stderr, "[rank %d] --fault: killsave at step %lld\n", rank_, (long long)steps);
    std::fflush(stderr);
    std::raise(SIGKILL);
  });
  if (rank_ == 0) std::fprintf(stderr, "checkpoint: %s (%.2f s)\n", last_ckpt_.c_str(), seconds_since(t0));
}

bool Trainer::agreed_time_up(Clock::time_point start) {
  at::Tensor up = at::full({1}, seconds_since(start) >= 60 * o_.exit_after_mins ? 1.0 : 0.0, at::kDouble);
  comm_.all_reduce(up, ReduceOp::sum)->wait();
  return up.item<double>() > 0;
}

void Trainer::resume() {
  const std::string path = latest_checkpoint(o_.resume);
  if (path.empty()) throw UsageError("--resume " + o_.resume + ": no complete checkpoint there");
  const auto t0 = Clock::now();
  CheckpointMeta meta;
  std::string error;
  bool slim_state = false;
  try {
    meta = checkpoint_meta(path);
    if (meta.model != o_.model.to_json())
      throw UsageError(path + ": checkpoint of model " + meta.model.dump() + ", this run is " +
                       o_.model.to_json().dump());
    if (meta.state.value("optimizer", o_.optim.name) != o_.optim.name)
      throw UsageError(path + ": saved with optimizer " + meta.state.value("optimizer", std::string()) +
                       ", this run uses " + o_.optim.name);
    if (meta.step >= o_.steps)
      throw UsageError(path + ": already at step " + std::to_string(meta.step) + " of --steps " +
                       std::to_string(o_.steps));
    // Slim-DP's state is taken when the checkpoint has it for every slim op, saved with the same settings;
    // otherwise the loaded weights become the anchor and the core is chosen again (not bit-exact).
    if (slim_) {
      const nlohmann::json saved = meta.state.value("slim", nlohmann::json::object());
      nlohmann::json now = slim_state_json();
      now["rounds"] = saved.value("rounds", nlohmann::json()),
      now["digest"] = saved.value("digest", nlohmann::json());
      slim_state = saved == now && now["rounds"].is_number_integer() && now["digest"].is_number_integer();
      const std::set<std::string> held(meta.tensors.begin(), meta.tensors.end());
      for (const TensorPiece& p : pieces(true)) slim_state = slim_state && held.count(p.name);
    }
    meta = load_checkpoint(path, rank_, pieces(slim_state));
  } catch (const UsageError& e) {
    error = e.what();
  }
  // Every rank learns whether any rank failed, so none goes on alone.
  at::Tensor failed = at::full({1}, error.empty() ? 0.0 : 1.0, at::kDouble);
  comm_.all_reduce(failed, ReduceOp::sum)->wait();
  if (!error.empty()) throw UsageError("--resume: " + error);
  if (failed.item<double>() > 0) throw UsageError("--resume " + path + ": another rank could not load it");
  optim_->set_steps_taken(meta.state.value("optimizer_steps", meta.step));
  start_step_ = meta.step;
  dp_->after_optimizer_step();  // zero1/zero2: the full params from the loaded shards
  if (slim_ && slim_state)
    slim_->resumed(meta.state["slim"]["rounds"].get<int64_t>(), meta.state["slim"]["digest"].get<int64_t>());
  else if (slim_)
    slim_->restart();  // the loaded weights are the new anchor
  if (rank_ == 0)
    std::fprintf(stderr, "resumed from %s at step %lld (saved at %d ranks; %.2f s)%s\n", path.c_str(),
                 (long long)start_step_, meta.plan.value("world", 0), seconds_since(t0),
                 !slim_       ? ""
                 : slim_state ? "; Slim-DP state restored"
                              : "; Slim-DP: no saved state for these settings, the core is chosen again");
}

void Trainer::print_buffers() {
  int64_t p = 0, g = 0;
  for (ShardedParam* sp : params_) p += sp->master().nbytes(), g += sp->grad().nbytes();
  int64_t st = 0;
  for (ShardedParam* sp : params_)
    for (auto& kv : sp->optim_state()) st += kv.second.nbytes();
  std::fprintf(
      stderr,
      "buffers (per rank, sized at start): params %s | grads %s in %d bucket(s) | optimizer state %s | "
      "comm staging %s (%s, outside LibTorch)\n",
      format_bytes(p).c_str(), format_bytes(g).c_str(), dp_->num_buckets(), format_bytes(st).c_str(),
      format_bytes(comm_.staging_bytes()).c_str(), comm_.backend_name().c_str());
  for (ShardedParam* sp : params_)
    std::fprintf(stderr, "  %-28s %-16s %s\n", sp->name().c_str(),
                 c10::str(at::IntArrayRef(sp->shape())).c_str(), strategy_name(sp->strategy()));
}

void Trainer::inject_fault(int64_t step) {
  if (fault_.rank != rank_ || fault_.step != step || fault_.kind == "killsave") return;
  std::fprintf(stderr, "[rank %d] --fault: %s at step %lld\n", rank_, fault_.kind.c_str(), (long long)step);
  std::fflush(stderr);
  if (fault_.kind == "sleep") std::this_thread::sleep_for(std::chrono::hours(1));
  if (fault_.kind == "exit") std::_Exit(3);
  if (fault_.kind == "kill") std::raise(SIGKILL);  // (killsave fires inside save())
}

double Trainer::train_step(int64_t step) {
  comm_.set_step(step);
  inject_fault(step);
  StepTimes times;
  auto lap = Clock::now();
  auto split = [&lap](double& into) {
    const auto now = Clock::now();
    into += std::chrono::duration<double, std::milli>(now - lap).count();
    lap = now;
  };
  for (ShardedParam* p : params_) p->zero_grad();
  double loss_sum = 0;
  for (int64_t m = 0; m < accum_; ++m) {
    const int64_t lo = rank_ * local_rows_ + m * micro_;
    Batch b = data_->train_rows(step, o_.batch_size, lo, lo + micro_);
    split(times.data);
    at::Tensor loss;
    {
      memory::PhaseScope phase(memory::Phase::forward);
      loss = model_->loss(b.x, b.y);
    }
    split(times.forward);
    {
      memory::PhaseScope phase(memory::Phase::backward);
      dp_->begin_backward(m, accum_);
      // Each micro-batch's mean is scaled by 1/accum so that the sum is the mean over the rank's slice.
      (accum_ > 1 ? loss / static_cast<double>(accum_) : loss).backward();
    }
    loss_sum += loss.item<double>();
    split(times.backward);
    if (m < accum_ - 1) dp_->end_backward(/*last=*/false);
  }
  {
    memory::PhaseScope phase(memory::Phase::comm);
    dp_->end_backward(/*last=*/true);
  }
  split(times.comm_wait);
  // The loss reported is the mean over the global batch: every rank's mean, averaged.
  at::Tensor mean_loss = at::full({1}, loss_sum / static_cast<double>(accum_), at::kDouble);
  WorkPtr loss_work = comm_.all_reduce(mean_loss, ReduceOp::avg);
  {
    memory::PhaseScope phase(memory::Phase::optimizer);
    grad_norm_ = std::sqrt(dp_->grad_sq_sum());
    if (o_.clip > 0 && grad_norm_ > o_.clip) scale_grads(params_, o_.clip / (grad_norm_ + 1e-6));
    optim_->step(params_, schedule_.at(step));
  }
  {
    memory::PhaseScope phase(memory::Phase::comm);
    dp_->after_optimizer_step();
    if (slim_) slim_->after_step(step);
  }
  loss_work->wait();
  split(times.optimizer);
  step_times_.push_back(times);
  return mean_loss.item<double>();
}

EvalResult Trainer::evaluate() {
  memory::PhaseScope phase(memory::Phase::eval);
  at::NoGradGuard no_grad;
  dp_->set_prefetch_enabled(false);
  const int64_t n = data_->val_size();
  // Every rank runs the same number of forwards (zero3 gathers are collectives), some possibly empty.
  const int64_t per = (n + world_ - 1) / world_;
  const int64_t lo = std::min(n, per * rank_), hi = std::min(n, lo + per);
  double loss_sum = 0, correct = 0;
  for (int64_t r = 0; r < per; r += micro_) {
    Batch b = data_->val_rows(std::min(hi, lo + r), std::min(hi, lo + r + micro_));
    at::Tensor logits = model_->logits(b.x);
    if (b.rows() == 0) continue;
    at::Tensor flat = logits.reshape({-1, logits.size(-1)});
    loss_sum +=
        at::cross_entropy_loss(flat, b.y.reshape({-1})).item<double>() * static_cast<double>(b.rows());
    if (data_->classification()) correct += flat.argmax(-1).eq(b.y.reshape({-1})).sum().item<double>();
  }
  dp_->set_prefetch_enabled(true);
  at::Tensor sums = at::tensor({loss_sum, correct}, at::kDouble);
  comm_.all_reduce(sums)->wait();
  EvalResult r;
  r.loss = sums[0].item<double>() / static_cast<double>(std::max<int64_t>(1, n));
  if (data_->classification()) r.acc = sums[1].item<double>() / static_cast<double>(std::max<int64_t>(1, n));
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
        "%s lr %g, %d thread(s) per rank, %s communication\n",
        (long long)o_.steps, (long long)o_.batch_size, (long long)world_, (long long)accum_,
        (long long)micro_, o_.strategy.c_str(), o_.optim.name.c_str(), o_.lr, o_.threads,
        comm_.backend_name().c_str());
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
  int64_t stop = o_.steps;  // exit-after may end the run earlier, with a checkpoint
  for (int64_t step = start_step_; step < stop; ++step) {
    memory::reset_peaks();
    const int64_t bytes0 = comm_.total_bytes();
    const auto t0 = Clock::now();
    const double loss = train_step(step);
    const double dt = seconds_since(t0);
    const int64_t step_bytes = comm_.total_bytes() - bytes0;
    step_bytes_.push_back(static_cast<double>(step_bytes));
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
                       {"comm_bytes", step_bytes}};
    rec["grad_norm"] = grad_norm_;
    if (slim_) rec["slim_fraction"] = (step + 1) % o_.slim.period == 0 ? slim_->last_fraction() : 0.0;
    const bool eval_now = (o_.eval_every > 0 && (step + 1) % o_.eval_every == 0) || step + 1 == o_.steps;
    const bool time_up = o_.exit_after_mins > 0 && agreed_time_up(t_start);
    const bool exit_now =
        step + 1 < o_.steps &&
        ((o_.exit_after_steps > 0 && step + 1 - start_step_ >= o_.exit_after_steps) || time_up);
    const bool save_now = !o_.ckpt_dir.empty() && ((o_.save_every > 0 && (step + 1) % o_.save_every == 0) ||
                                                   step + 1 == o_.steps || exit_now);
    if (save_now && !eval_now && slim_) slim_->full_sync();  // a checkpoint holds one model
    if (eval_now && slim_) {
      // How far the replicas drifted apart, then one model again for evaluation.
      const SlimSync::Divergence d = slim_->divergence();
      rec["divergence_max"] = d.max, rec["divergence_mean"] = d.mean;
      slim_->full_sync();
    }
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
    if (save_now) save(step + 1);
    if (exit_now) {
      stop = step + 1;
      progress.message("stopping at step " + std::to_string(stop) + " (--exit-after-" +
                       (time_up ? "mins" : "steps") + "); resume with --resume " + o_.ckpt_dir);
    }
    if (metrics_file) metrics_file->write(rec);
    char status[160];
    std::snprintf(status, sizeof status, "loss %.4f | %.0f %s | %.0f ms | peak %s MiB", loss,
                  units_per_step / dt, classify ? "samples/s" : "tok/s", dt * 1e3,
                  format_mib(static_cast<double>(peak)).c_str());
    progress.step(step, status, dt);
  }
  progress.finish();
  s.steps = stop;
  s.first_step = start_step_;
  s.checkpoint = last_ckpt_;
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
  s.comm_bytes = comm_.total_bytes();
  // (Slim-DP's final full synchronisation happened at the last step's evaluation.)
  bool same_selection = true;
  if (slim_) {
    at::Tensor digests = at::empty({world_}, at::kLong);
    comm_.all_gather(digests, at::full({1}, slim_->selection_digest(), at::kLong))->wait();
    same_selection = digests.eq(digests[0]).all().item<bool>();
  }
  // Every rank must end with the same weights: compare checksums.
  at::Tensor sums = at::empty({world_}, at::kLong);
  comm_.all_gather(sums, at::full({1}, dp_->replicated_checksum(), at::kLong))->wait();
  s.weights_identical = sums.eq(sums[0]).all().item<bool>();
  if (!s.weights_identical && lead) std::fprintf(stderr, "warning: ranks ended with different weights\n");

  if (lead) {
    nlohmann::json by_kind;
    for (int c = 0; c < static_cast<int>(Collective::count); ++c)
      by_kind[collective_name(static_cast<Collective>(c))] = comm_.bytes(static_cast<Collective>(c));
    auto med = [&](double StepTimes::*f) {
      std::vector<double> v;
      for (size_t i = std::min<size_t>(2, step_times_.size() - 1); i < step_times_.size(); ++i)
        v.push_back(step_times_[i].*f);
      return median(v);
    };
    const nlohmann::json phase_ms{{"data", med(&StepTimes::data)},
                                  {"forward", med(&StepTimes::forward)},
                                  {"backward", med(&StepTimes::backward)},
                                  {"comm_wait", med(&StepTimes::comm_wait)},
                                  {"optimizer", med(&StepTimes::optimizer)}};
    nlohmann::json phases;
    for (int p = 0; p < static_cast<int>(memory::Phase::count); ++p)
      if (phase_peak_[p] > 0) phases[memory::phase_name(static_cast<memory::Phase>(p))] = phase_peak_[p];
    nlohmann::json sum{{"summary", true},
                       {"steps", s.steps},
                       {"first_step", s.first_step},
                       {"checkpoint", s.checkpoint},
                       {"loss", s.final_loss},
                       {rate_key, s.tokens_per_s},
                       {"step_ms", s.step_ms_median},
                       {"peak_bytes", s.peak_bytes},
                       {"comm_bytes", s.comm_bytes},
                       {"comm_bytes_per_step", median(step_bytes_)},
                       {"comm_bytes_by_kind", by_kind},
                       {"weights_identical", s.weights_identical},
                       {"slim_rounds", slim_ ? slim_->rounds() : 0},
                       {"slim_selection_digest", slim_ ? slim_->selection_digest() : 0},
                       {"slim_selection_identical", same_selection},
                       {"weights_checksum", sums[0].item<int64_t>()},
                       {"val_loss", s.val_loss},
                       {"wall_s", s.wall_s},
                       {"params", s.params},
                       {"world", world_},
                       {"phase_peak_bytes", phases},
                       {"prefetch",
                        {{"depth", o_.prefetch},
                         {"max_live", dp_->prefetcher() ? dp_->prefetcher()->max_live() : 0},
                         {"gathers", dp_->prefetcher() ? dp_->prefetcher()->gathers() : 0}}},
                       {"phase_ms", phase_ms}};
    if (classify) sum["val_acc"] = s.val_acc;
    if (metrics_file) metrics_file->write(sum);
    if (s.first_step > 0)
      std::printf("summary: steps %lld-%lld in %.1f s | train loss %.4f", (long long)s.first_step + 1,
                  (long long)s.steps, s.wall_s, s.final_loss);
    else
      std::printf("summary: %lld steps in %.1f s | train loss %.4f", (long long)s.steps, s.wall_s,
                  s.final_loss);
    if (s.val_loss >= 0) std::printf(" | val loss %.4f", s.val_loss);
    if (classify && s.val_loss >= 0) std::printf(" | val acc %.2f%%", 100 * s.val_acc);
    std::printf(
        " | %.0f %s (median step %.1f ms) | peak %s MiB (forward %s, backward %s, optimizer %s)\n",
        s.tokens_per_s, classify ? "samples/s" : "tokens/s", s.step_ms_median,
        format_mib(static_cast<double>(s.peak_bytes)).c_str(),
        format_mib(static_cast<double>(phase_peak_[static_cast<int>(memory::Phase::forward)])).c_str(),
        format_mib(static_cast<double>(phase_peak_[static_cast<int>(memory::Phase::backward)])).c_str(),
        format_mib(static_cast<double>(phase_peak_[static_cast<int>(memory::Phase::optimizer)])).c_str());
    std::printf(
        "time per step on rank 0 (median ms): data %.1f, forward %.1f, backward %.1f, waiting for "
        "gradient reductions %.1f, optimizer %.1f\n",
        phase_ms["data"].get<double>(), phase_ms["forward"].get<double>(), phase_ms["backward"].get<double>(),
        phase_ms["comm_wait"].get<double>(), phase_ms["optimizer"].get<double>());
    if (world_ > 1)
      std::printf("communication: %s per step per rank (%s backend); weights identical on all %d ranks: %s\n",
                  format_bytes(median(step_bytes_)).c_str(), comm_.backend_name().c_str(), world_,
                  s.weights_identical ? "yes" : "NO");
  }
  // Sharded weights are gathered on every rank (a collective); rank 0 saves and samples from one whole model.
  const bool want_sample = o_.sample_tokens > 0 && !classify;
  NamedTensors full;
  if (!o_.save_model.empty() || want_sample) full = dp_->full_values();
  if (!o_.save_model.empty() && lead) {
    save_model_file(o_.save_model, o_.model, full);
    std::fprintf(stderr, "saved model weights to %s\n", o_.save_model.c_str());
  }
  if (want_sample && lead) {
    if (o_.model.vocab == 256) {
      GenerateOptions g;
      g.prompt = o_.sample_prompt, g.tokens = o_.sample_tokens, g.seed = o_.seed;
      auto whole = model_from_values(o_.model, full);
      s.sample = generate_text(*whole, g);
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

TrainSummary train(const TrainOptions& opts, Communicator& comm) {
  at::set_num_threads(std::max(1, opts.threads));
  Trainer t(opts, comm);
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
