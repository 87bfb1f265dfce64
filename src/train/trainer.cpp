// trainer.cpp — a training run: options checked, the plan chosen (a file, one strategy, or osdp's search),
// the model built and laid out per op, then the step loop — each step a TrainStep (step.cpp), followed by
// what the StopPolicy asks for (evaluate, checkpoint, stop) — and at the end the summary, the saved model and
// a sample. Per-rank slices of a deterministic global batch, so the run is the same at any world size.
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "metrics.h"
#include "progress.h"
#include "slimshard/ckpt.h"
#include "slimshard/comm.h"
#include "slimshard/common.h"
#include "slimshard/data_parallel.h"
#include "slimshard/memory.h"
#include "slimshard/planner.h"
#include "slimshard/slim.h"
#include "slimshard/train.h"
#include "step.h"
#include "stop_policy.h"
#include "summary.h"

namespace slimshard {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// " across 2 hosts (a, b) x 2 ranks", or nothing on one host.
std::string hosts_description(const Topology& t) {
  if (t.hosts <= 1) return "";
  std::string names;
  for (const std::string& n : t.host_names) names += (names.empty() ? "" : ", ") + n;
  return " across " + std::to_string(t.hosts) + " hosts (" + names + ")" +
         (t.uniform ? " x " + std::to_string(t.local_size) + " ranks" : "");
}

struct EvalResult {
  double loss = 0, acc = -1;
};

class Trainer {
 public:
  Trainer(const TrainOptions& o, Communicator& comm);
  TrainSummary run();

 private:
  // Runs `f` on every rank; a usage error on any becomes the same AgreedUsageError on all (f: no
  // collectives).
  void agreed(const std::function<void()>& f);
  void check_options();
  void check_outputs();
  void claim_checkpoint_dir();
  Plan choose_plan();
  Plan measured_choice(const std::vector<PlanCandidate>& candidates, int64_t local);
  PlanCandidate osdp_choice_;  // osdp: the plan chosen (else empty)
  void build_model_layout(const Plan& plan);
  void build();
  void print_start() const;
  // Ranks per host for the planner (0: one host).
  int per_host() const { return comm_.topology().hosts > 1 ? comm_.topology().local_size : 0; }
  void print_buffers() const;
  Batch batch(int64_t step, int64_t micro) const;
  nlohmann::json step_record(int64_t step, const StepResult& r, double seconds, int64_t bytes) const;
  void evaluate_into(nlohmann::json& rec, int64_t step, Progress& progress, TrainSummary& s);
  EvalResult evaluate();
  // Checkpoints: this rank's pieces of every logical tensor; with `slim_state`, Slim-DP's agreed signal and
  // core too.
  std::vector<TensorPiece> pieces(bool slim_state);
  void save(int64_t steps, const StopPolicy& policy);
  void resume();
  void summarize(TrainSummary& s, const RunStats& stats, int64_t stop, double wall_s);
  void save_and_sample(TrainSummary& s);

  TrainOptions o_;
  Communicator& comm_;
  int rank_ = 0, world_ = 1;
  int64_t local_rows_ = 0, micro_ = 0, accum_ = 0;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optim_;
  LrSchedule schedule_;
  std::vector<ShardedParam*> params_;
  std::map<std::string, OpChoice> choices_;
  std::vector<Strategy> strategies_;  // per param, ParamSet order
  std::unique_ptr<DataParallel> dp_;  // after model_: destroyed before the params it hooks
  std::unique_ptr<SlimSync> slim_;    // Slim-DP for the params whose strategy is slim
  int64_t start_step_ = 0;            // > 0 when resumed
  std::string last_ckpt_;
  std::string run_id_;  // the run's checkpoints carry it: --keep-last removes only this run's
};

// Setup in phases that end in agreement, so that a bad flag, file or plan seen by one rank (or all) ends the
// job with one message and exit 2 on every rank, never with one rank waiting in a collective for the others.
Trainer::Trainer(const TrainOptions& o, Communicator& comm) : o_(o), comm_(comm) {
  rank_ = comm_.rank();
  world_ = comm_.world();
  memory::set_rank(rank_);
  agreed([&] {
    check_options();
    check_outputs();
    o_.data.seq_len = o_.model.seq_len;
    o_.data.vocab = o_.model.vocab;
    o_.data.seed = o_.seed;
    data_ = open_dataset(o_.data);
    if (data_->classification() != o_.model.is_classifier())
      throw UsageError("--data " + o_.data.spec + " does not suit --model " + o_.model.describe() +
                       (o_.model.is_classifier() ? " (classifiers train on fashion-mnist)"
                                                 : " (GPT trains on text or token files)"));
  });
  claim_checkpoint_dir();
  const Plan plan = choose_plan();
  memory::set_limit(o_.mem_limit);  // the run's budget; osdp's profile (its own models) ran outside it
  agreed([&] { build_model_layout(plan); });
  build();
  if (!o_.resume.empty()) resume();
}

void Trainer::agreed(const std::function<void()>& f) {
  std::string error;
  try {
    f();
  } catch (const UsageError& e) {
    error = e.what();
  }
  error = agree_on_error(comm_, error);
  if (!error.empty()) throw AgreedUsageError(error);
}

// Every output the run will write is checked before step 1: a run must not train for hours and then find it
// cannot save. Rank 0 writes the metrics and the model file; every rank writes into the checkpoint directory.
void Trainer::check_outputs() {
  if (rank_ == 0 && !o_.metrics_path.empty()) check_output_file(o_.metrics_path, "--metrics");
  if (rank_ == 0 && !o_.save_model.empty()) check_output_file(o_.save_model, "--save-model");
  if (!o_.ckpt_dir.empty()) check_output_dir(o_.ckpt_dir, "--ckpt-dir");
}

// A checkpoint directory belongs to one run: a fresh run into a directory that holds another run's
// checkpoints would mix them (and --keep-last would prune one with the other). Resuming from the directory
// continues its run; the run id travels in every checkpoint's index.
void Trainer::claim_checkpoint_dir() {
  std::string id, error;
  if (rank_ == 0) {
    try {
      const std::string resumed = o_.resume.empty() ? "" : latest_checkpoint(o_.resume);
      if (!resumed.empty()) id = checkpoint_meta(resumed).state.value("run", std::string());
      if (!o_.ckpt_dir.empty()) {
        const std::vector<std::string> held = run_checkpoints(o_.ckpt_dir, "");
        const bool continues = !resumed.empty() && !id.empty() && !run_checkpoints(o_.ckpt_dir, id).empty();
        const bool same_dir = !resumed.empty() && std::filesystem::path(resumed).parent_path() ==
                                                      std::filesystem::path(o_.ckpt_dir).lexically_normal();
        if (!held.empty() && !continues && !same_dir)
          throw UsageError(
              "--ckpt-dir " + o_.ckpt_dir + " holds checkpoints of another run (" + held.front() +
              (held.size() > 1 ? " and " + std::to_string(held.size() - 1) + " more" : "") +
              "); resume them with --resume " + o_.ckpt_dir + ", or write to an empty directory");
      }
      if (id.empty()) id = new_run_id();
    } catch (const UsageError& e) {
      error = e.what();
    }
  }
  error = agree_on_error(comm_, error);
  if (!error.empty()) throw AgreedUsageError(error);
  run_id_ = broadcast_string(comm_, id, 0);
}

void Trainer::check_options() {
  Fault::parse(o_.fault);
  o_.model.validate();
  if (o_.steps <= 0) throw UsageError("--steps: must be positive");
  if (o_.batch_size <= 0) throw UsageError("--batch-size: must be positive");
  if (o_.prefetch < 0) throw UsageError("--prefetch: must be >= 0");
  if (!(o_.lr > 0)) throw UsageError("--lr: must be positive");
  if (o_.clip < 0) throw UsageError("--clip: must be >= 0");
  if (!o_.profile.empty() && o_.strategy != "osdp") throw UsageError("--profile applies to --strategy osdp");
  if ((o_.save_every > 0 || o_.exit_after_steps > 0 || o_.exit_after_mins > 0) && o_.ckpt_dir.empty())
    throw UsageError("--save-every / --exit-after-*: give --ckpt-dir");
  if (o_.save_every < 0 || o_.exit_after_steps < 0 || o_.exit_after_mins < 0 || o_.keep_last < 0)
    throw UsageError("--save-every, --keep-last, --exit-after-*: must be >= 0");
  const SlimOptions& sl = o_.slim;
  if (sl.period < 1 || sl.refresh < 1 || !(sl.core > 0 && sl.core <= 1) ||
      !(sl.explore >= 0 && sl.explore <= 1) || sl.full_sync_every < 0)
    throw UsageError("--slim-*: period and refresh >= 1, core in (0, 1], explore in [0, 1], full-sync >= 0");
}

// The plan file, one strategy everywhere, or (osdp) the plan searched from a profile: taken now on every
// rank, or read from --profile.
Plan Trainer::choose_plan() {
  const RunSpec spec = run_spec(o_, world_, per_host());
  Plan plan;
  int64_t local = 0;
  const bool osdp = o_.strategy == "osdp" && o_.plan_file.empty();
  agreed([&] { osdp ? void(local = per_rank_batch(spec)) : void(plan = plan_of(spec)); });
  if (!osdp) return plan;
  if (!o_.profile.empty())
    return measured_choice(plan_for_run(spec, nullptr, o_.profile, comm_, o_.verbose), local);
  const std::vector<int64_t> micro = profile_micro_batches(local);
  if (rank_ == 0) {
    std::fprintf(stderr, "osdp: profiling %s at micro-batches", o_.model.describe().c_str());
    for (int64_t b : micro) std::fprintf(stderr, " %lld", (long long)b);
    std::fprintf(stderr, " ...\n");
  }
  ProfileOptions profile_opts;
  profile_opts.warmup = 1, profile_opts.repeats = 3, profile_opts.max_collective_bytes = 16 << 20;
  profile_opts.precision = o_.precision;
  const Profile p = profile_training(o_.model, micro, comm_, profile_opts, o_.seed);
  return measured_choice(plan_for_run(spec, &p, "", comm_, o_.verbose), local);
}

// osdp's choice among the searched plan and the uniform ones that fit, by timing them when there is a choice:
// on one host the cost model's error (5–15 %) can be larger than the differences between strategies
// (docs/osdp.md). So can this machine's noise: another plan replaces the searched one only if every step of
// it ran faster than every step of the searched plan (with 3 steps each, a chance of 1 in 20 when the two
// are equal), the fastest median of those.
Plan Trainer::measured_choice(const std::vector<PlanCandidate>& c, int64_t local) {
  osdp_choice_ = c.front();
  if (c.size() == 1 || o_.tune_steps == 0) return c.front().plan;
  if (rank_ == 0)
    std::fprintf(stderr, "osdp: timing %zu plans, %d steps each (--tune-steps) ...\n", c.size(),
                 o_.tune_steps);
  const std::vector<std::vector<double>> ms = time_plans(o_, c, local, comm_);
  const double searched_fastest = *std::min_element(ms[0].begin(), ms[0].end());
  size_t best = 0;
  for (size_t i = 1; i < c.size(); ++i)
    if (*std::max_element(ms[i].begin(), ms[i].end()) < searched_fastest && median(ms[i]) < median(ms[best]))
      best = i;
  if (rank_ == 0) {
    std::printf("osdp: measured step ms, median [range] (predicted):");
    for (size_t i = 0; i < c.size(); ++i)
      std::printf("%s %s %.1f [%.1f-%.1f] (%.1f)", i ? ";" : "", c[i].name.c_str(), median(ms[i]),
                  *std::min_element(ms[i].begin(), ms[i].end()),
                  *std::max_element(ms[i].begin(), ms[i].end()), c[i].predicted_ms);
    std::printf("\nosdp: trains the %s (%s): predicted peak %s MiB, step %.1f ms\n", c[best].name.c_str(),
                best == 0 ? "no other plan ran faster at every step" : "faster at every step",
                format_mib(static_cast<double>(c[best].predicted_peak)).c_str(), c[best].predicted_ms);
    std::fflush(stdout);
  }
  osdp_choice_ = c[best];
  return c[best].plan;
}

// The model and its per-op layout (this rank alone: what the plan asks must fit the model).
void Trainer::build_model_layout(const Plan& plan) {
  const RunSpec spec = run_spec(o_, world_, per_host());
  micro_ = micro_batch_of(spec, plan);
  local_rows_ = per_rank_batch(spec);
  accum_ = local_rows_ / micro_;
  memory::PhaseScope phase(memory::Phase::init);
  model_ = build_model(o_.model, o_.seed);
  choices_ = resolve_plan(plan, op_shapes(*model_));
  strategies_ = apply_plan(choices_, *model_);
  if (o_.slim.adam == "corrected" && o_.optim.name != "adamw")
    for (const auto& [op, c] : choices_)
      if (c.strategy == Strategy::slim) throw UsageError("--slim-adam corrected: needs --optimizer adamw");
}

// The data-parallel engine over the laid-out model (collectives: rank 0's weights to every rank), Slim-DP,
// the optimizer and the schedule.
void Trainer::build() {
  memory::PhaseScope phase(memory::Phase::init);
  params_ = model_->params().all();
  dp_ = std::make_unique<DataParallel>(
      comm_, params_, strategies_,
      DataParallel::Options{o_.bucket_bytes, o_.prefetch, o_.precision, o_.fuse_bytes, o_.defer_gathers});
  std::vector<ShardedParam*> slim_params;
  for (ShardedParam* p : params_)
    if (p->strategy() == Strategy::slim) slim_params.push_back(p);
  if (!slim_params.empty()) {
    o_.slim.seed = o_.seed;
    slim_ = std::make_unique<SlimSync>(comm_, slim_params, o_.slim);
    if (o_.slim.adam == "corrected") o_.optim.slim_ranks = world_;
  }
  optim_ = std::make_unique<Optimizer>(o_.optim);
  optim_->init_state(params_);
  schedule_.lr = o_.lr;
  schedule_.min_lr = o_.min_lr >= 0 ? o_.min_lr : o_.lr / 10;
  schedule_.warmup = o_.warmup >= 0 ? o_.warmup : std::min<int64_t>(100, o_.steps / 10);
  schedule_.total = o_.steps;
}

std::vector<TensorPiece> Trainer::pieces(bool slim_state) {
  const bool first_host = comm_.topology().host == 0;
  if (!slim_ || !slim_state) return param_pieces(params_, nullptr, first_host);
  return param_pieces(
      params_,
      [this](const ShardedParam* p) {
        return p->strategy() == Strategy::slim ? slim_->state_of(p) : NamedTensors{};
      },
      first_host);
}

void Trainer::save(int64_t steps, const StopPolicy& policy) {
  CheckpointMeta meta;
  meta.step = steps;
  meta.model = o_.model.to_json();
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [op, c] : choices_)
    ops[op] = {{"strategy", strategy_name(c.strategy)}, {"splits", c.splits}};
  meta.plan = {{"world", world_}, {"ops", ops}};
  // Batches and the learning rate are functions of (seed, step): the step is the data position.
  meta.state = {{"run", run_id_},  {"optimizer", o_.optim.name}, {"optimizer_steps", optim_->steps_taken()},
                {"seed", o_.seed}, {"data_position", steps},     {"global_batch", o_.batch_size}};
  if (slim_) meta.state["slim"] = slim_->state_json();
  const auto t0 = Clock::now();
  dp_->wait_gathers();  // the checkpoint reads the masters, slices of the params being gathered (fp32)
  last_ckpt_ =
      save_checkpoint(comm_, o_.ckpt_dir, meta, pieces(true), o_.keep_last, policy.inside_save(steps));
  if (rank_ == 0) std::fprintf(stderr, "checkpoint: %s (%.2f s)\n", last_ckpt_.c_str(), seconds_since(t0));
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
      slim_state = slim_->can_resume_from(meta.state.value("slim", nlohmann::json::object()));
      const std::set<std::string> held(meta.tensors.begin(), meta.tensors.end());
      for (const TensorPiece& p : pieces(true)) slim_state = slim_state && held.count(p.name);
    }
    meta = load_checkpoint(path, rank_, pieces(slim_state));
  } catch (const UsageError& e) {
    error = e.what();
  } catch (const nlohmann::json::exception& e) {  // a field of the index's trainer state of the wrong type
    error = path + "/index.json: bad trainer state (" + e.what() + ")";
  }
  // Every rank learns whether any rank failed, and why, so none goes on alone.
  error = agree_on_error(comm_, error);
  if (!error.empty()) throw AgreedUsageError("--resume: " + error);
  optim_->set_steps_taken(meta.state.value("optimizer_steps", meta.step));
  start_step_ = meta.step;
  dp_->after_optimizer_step();  // zero1/zero2: the full params from the loaded shards
  if (slim_) slim_->resume_from(meta.state.value("slim", nlohmann::json::object()), slim_state);
  if (rank_ == 0)
    std::fprintf(stderr, "resumed from %s at step %lld (saved at %d ranks; %.2f s)%s\n", path.c_str(),
                 (long long)start_step_, meta.plan.value("world", 0), seconds_since(t0),
                 !slim_       ? ""
                 : slim_state ? "; Slim-DP state restored"
                              : "; Slim-DP: no saved state for these settings, the core is chosen again");
}

void Trainer::print_start() const {
  std::fprintf(stderr, "model: %s, %lld parameters\n", o_.model.describe().c_str(),
               (long long)model_->params().numel());
  std::fprintf(stderr, "data: %s\n", data_->describe().c_str());
  std::fprintf(stderr,
               "training: %lld steps, global batch %lld (%lld ranks x %lld micro-batches of %lld), %s, "
               "%s lr %g, %s, %d thread(s) per rank, %s communication%s\n",
               (long long)o_.steps, (long long)o_.batch_size, (long long)world_, (long long)accum_,
               (long long)micro_,
               (o_.plan_file.empty() ? "strategy " + o_.strategy : "plan " + o_.plan_file).c_str(),
               o_.optim.name.c_str(), o_.lr, o_.precision.name().c_str(), o_.threads,
               comm_.backend_name().c_str(), hosts_description(comm_.topology()).c_str());
  if (o_.verbose) print_buffers();
}

void Trainer::print_buffers() const {
  int64_t p = 0, g = 0, st = 0;
  for (ShardedParam* sp : params_) {
    p += sp->master().nbytes(), g += sp->grad().nbytes();
    for (auto& kv : sp->optim_state()) st += kv.second.nbytes();
  }
  std::fprintf(
      stderr,
      "buffers (per rank, sized at start): params %s | grads %s in %d bucket(s) | optimizer state %s | "
      "comm staging %s (%s, outside LibTorch)\n",
      format_bytes(p).c_str(), format_bytes(g).c_str(), dp_->num_buckets(), format_bytes(st).c_str(),
      format_bytes(comm_.staging_bytes()).c_str(), comm_.backend_name().c_str());
  const DataParallel::PrefetchStats pf = dp_->prefetch_stats();
  if (pf.largest_buffer_bytes > 0)
    std::fprintf(stderr, "  zero3 gathers: up to %d buffer(s) of at most %s (prefetch %d)\n", pf.depth + 1,
                 format_bytes(static_cast<double>(pf.largest_buffer_bytes)).c_str(), pf.depth);
  if (slim_)
    std::fprintf(stderr, "  Slim-DP: %s (anchor, signal, masks, packed round)\n",
                 format_bytes(static_cast<double>(slim_->state_bytes())).c_str());
  for (ShardedParam* sp : params_)
    std::fprintf(stderr, "  %-28s %-16s %s\n", sp->name().c_str(),
                 c10::str(at::IntArrayRef(sp->shape())).c_str(), strategy_name(sp->strategy()));
}

Batch Trainer::batch(int64_t step, int64_t micro) const {
  const int64_t lo = rank_ * local_rows_ + micro * micro_;
  return data_->train_rows(step, o_.batch_size, lo, lo + micro_);
}

nlohmann::json Trainer::step_record(int64_t step, const StepResult& r, double seconds, int64_t bytes) const {
  const double units = static_cast<double>(o_.batch_size * data_->tokens_per_row());
  nlohmann::json rec{{"step", step + 1},
                     {"loss", r.loss},
                     {"lr", schedule_.at(step)},
                     {data_->classification() ? "samples_per_s" : "tokens_per_s", units / seconds},
                     {"step_ms", seconds * 1e3},
                     {"peak_bytes", memory::peak_bytes()},
                     {"comm_bytes", bytes},
                     {"grad_norm", r.grad_norm}};
  if (slim_) rec["slim_fraction"] = (step + 1) % o_.slim.period == 0 ? slim_->last_fraction() : 0.0;
  return rec;
}

// Evaluation after step `step`; Slim-DP first measures how far the replicas drifted, then makes one model.
void Trainer::evaluate_into(nlohmann::json& rec, int64_t step, Progress& progress, TrainSummary& s) {
  if (slim_) {
    const SlimSync::Divergence d = slim_->divergence();
    rec["divergence_max"] = d.max, rec["divergence_mean"] = d.mean;
    slim_->full_sync();
  }
  const EvalResult ev = evaluate();
  s.val_loss = ev.loss, s.val_acc = ev.acc;
  rec["val_loss"] = ev.loss;
  char line[160];
  if (data_->classification()) {
    rec["val_acc"] = ev.acc;
    std::snprintf(line, sizeof line, "step %lld: val loss %.4f, val acc %.2f%%", (long long)(step + 1),
                  ev.loss, 100 * ev.acc);
  } else {
    std::snprintf(line, sizeof line, "step %lld: val loss %.4f", (long long)(step + 1), ev.loss);
  }
  progress.message(line);
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

std::string progress_status(const nlohmann::json& rec, bool classify) {
  char status[160];
  std::snprintf(status, sizeof status, "loss %.4f | %.0f %s | %.0f ms | peak %s MiB",
                rec["loss"].get<double>(), rec[classify ? "samples_per_s" : "tokens_per_s"].get<double>(),
                classify ? "samples/s" : "tok/s", rec["step_ms"].get<double>(),
                format_mib(rec["peak_bytes"].get<double>()).c_str());
  return status;
}

TrainSummary Trainer::run() {
  const bool lead = rank_ == 0;
  if (lead) print_start();
  std::unique_ptr<MetricsWriter> metrics;
  if (!o_.metrics_path.empty() && lead) metrics = std::make_unique<MetricsWriter>(o_.metrics_path);
  Progress progress(o_.steps, o_.log_every, lead);
  StopPolicy policy(o_, comm_, start_step_);
  TrainStep stepper(comm_, *model_, *dp_, *optim_, slim_.get());
  RunStats stats;
  TrainSummary s;
  const auto t_start = Clock::now();
  int64_t stop = o_.steps;  // exit-after may end the run earlier, with a checkpoint
  for (int64_t step = start_step_; step < stop; ++step) {
    comm_.set_step(step);
    policy.before_step(step);
    memory::reset_peaks();
    const int64_t bytes0 = comm_.total_bytes(), inter0 = comm_.total_bytes(Link::inter);
    const auto t0 = Clock::now();
    const StepResult r = stepper.run(
        step, accum_, [&](int64_t m) { return batch(step, m); }, schedule_.at(step), o_.clip,
        [&] { return policy.local_flags(); });
    const double dt = seconds_since(t0);
    const int64_t inter = comm_.total_bytes(Link::inter) - inter0;
    stats.record(r, dt, comm_.total_bytes() - bytes0, inter);
    if (!std::isfinite(r.loss))
      throw RuntimeError("loss is " + std::to_string(r.loss) + " at step " + std::to_string(step) +
                         " (diverged; lower --lr?)");
    nlohmann::json rec = step_record(step, r, dt, comm_.total_bytes() - bytes0);
    rec["comm_bytes_inter"] = inter;
    const StepActions act = policy.after_step(step, r.stop);
    if (act.save && !act.eval && slim_) slim_->full_sync();  // a checkpoint holds one model
    if (act.eval) evaluate_into(rec, step, progress, s);
    if (act.save) save(step + 1, policy);
    if (act.exit) {
      stop = step + 1;
      s.stop_signal = act.signal;
      progress.message("stopping at step " + std::to_string(stop) + " (" + act.why + ")" +
                       (o_.ckpt_dir.empty() ? "" : "; resume with --resume " + o_.ckpt_dir));
    }
    if (metrics) metrics->write(rec);
    progress.step(step, progress_status(rec, data_->classification()), dt);
  }
  progress.finish();
  summarize(s, stats, stop, seconds_since(t_start));
  if (lead) {
    if (metrics)
      metrics->write(summary_json(s, stats, comm_bytes_by_kind(comm_), prefetch_json(*dp_, o_.prefetch)));
    print_summary(s, stats, comm_.backend_name());
  }
  if (!s.stop_signal)
    save_and_sample(s);  // a run stopped by a signal has no final model: its checkpoint is it
  return s;
}

// The figures of the run, and whether the ranks agree at the end (collectives: every rank calls it).
void Trainer::summarize(TrainSummary& s, const RunStats& stats, int64_t stop, double wall_s) {
  s.steps = stop;
  s.first_step = start_step_;
  s.checkpoint = last_ckpt_;
  s.world = world_;
  s.precision = o_.precision.name();
  s.osdp_choice = osdp_choice_.name, s.osdp_plan = osdp_choice_.plan_json;
  s.predicted_step_ms = osdp_choice_.predicted_ms, s.predicted_peak_bytes = osdp_choice_.predicted_peak;
  s.params = model_->params().numel();
  s.classifier = data_->classification();
  s.wall_s = wall_s;
  s.losses = stats.losses;
  s.final_loss = stats.final_loss();
  s.step_ms_median = 1e3 * stats.median_step_s();
  s.samples_per_s = static_cast<double>(o_.batch_size) / stats.median_step_s();
  if (!s.classifier) s.tokens_per_s = s.samples_per_s * static_cast<double>(data_->tokens_per_row());
  s.peak_bytes = stats.peak_bytes;
  s.comm_bytes = comm_.total_bytes();
  s.comm_bytes_per_step = median(stats.step_bytes);
  s.comm_bytes_inter = comm_.total_bytes(Link::inter);
  s.comm_bytes_inter_per_step = median(stats.step_inter_bytes);
  s.hosts = comm_.topology().hosts;
  // (Slim-DP's final full synchronisation happened at the last step's evaluation.)
  if (slim_) {
    at::Tensor digests = at::empty({world_}, at::kLong);
    comm_.all_gather(digests, at::full({1}, slim_->selection_digest(), at::kLong))->wait();
    s.slim_selection_identical = digests.eq(digests[0]).all().item<bool>();
    s.slim_rounds = slim_->rounds(), s.slim_digest = slim_->selection_digest();
  }
  at::Tensor sums = at::empty({world_}, at::kLong);
  comm_.all_gather(sums, at::full({1}, dp_->replicated_checksum(), at::kLong))->wait();
  s.weights_identical = sums.eq(sums[0]).all().item<bool>();
  s.weights_checksum = sums[0].item<int64_t>();
  if (!s.weights_identical && rank_ == 0)
    std::fprintf(stderr, "warning: ranks ended with different weights\n");
}

// Sharded weights are gathered on every rank (a collective); rank 0 saves and samples from one whole model.
void Trainer::save_and_sample(TrainSummary& s) {
  const bool want_sample = o_.sample_tokens > 0 && !data_->classification();
  if (o_.save_model.empty() && !want_sample) return;
  const NamedTensors full = dp_->full_values();
  if (rank_ != 0) return;
  if (!o_.save_model.empty()) {
    save_model_file(o_.save_model, o_.model, full);
    std::fprintf(stderr, "saved model weights to %s\n", o_.save_model.c_str());
  }
  if (!want_sample) return;
  if (o_.model.vocab != 256) {
    std::fprintf(stderr, "sample skipped: vocabulary %lld is not byte-level text\n",
                 (long long)o_.model.vocab);
    return;
  }
  GenerateOptions g;
  g.prompt = o_.sample_prompt, g.tokens = o_.sample_tokens, g.seed = o_.seed;
  s.sample = generate_text(*model_from_values(o_.model, full), g);
  std::printf("--- sample (%lld tokens, temperature %.1f, top-k %lld) ---\n%s\n---\n", (long long)g.tokens,
              g.temperature, (long long)g.top_k, s.sample.c_str());
  std::fflush(stdout);
}

}  // namespace

RunSpec run_spec(const TrainOptions& o, int world, int ranks_per_host) {
  RunSpec spec;
  spec.cost.ranks_per_host = ranks_per_host;
  spec.model = o.model;
  spec.cost.world = world;
  spec.cost.global_batch = o.batch_size;
  spec.cost.prefetch = o.prefetch;
  spec.cost.optim_states = static_cast<int>(Optimizer::state_names(o.optim).size());
  spec.cost.bucket_bytes = o.bucket_bytes;
  spec.cost.allow_slim = o.allow_slim;
  spec.cost.allow_hybrid = o.allow_hybrid;
  spec.cost.slim_fraction = o.slim.core + o.slim.explore * (1 - o.slim.core);
  spec.cost.slim_wire_bytes = o.slim.wire_bytes();
  spec.cost.slim_period = o.slim.period;
  spec.cost.slim_apply = parse_slim_apply(o.slim.apply);
  spec.cost.precision = o.precision;
  spec.cost.fuse_bytes = o.fuse_bytes;
  spec.cost.recompute = parse_recompute(o.recompute);
  spec.micro_batch = o.micro_batch;
  spec.mem_limit = o.mem_limit;
  spec.seed = o.seed;
  spec.strategy = o.strategy;
  spec.plan_file = o.plan_file;
  return spec;
}

TrainSummary train(const TrainOptions& opts, Communicator& comm) {
  at::set_num_threads(std::max(1, opts.threads));
  Trainer t(opts, comm);
  return t.run();
}

}  // namespace slimshard
