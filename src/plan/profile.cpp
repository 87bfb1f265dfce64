// profile.cpp — measures what the cost model needs on the real hardware: per-op forward and backward time and
// activation bytes at each micro-batch, a latency + bandwidth fit per collective at this world size, how much
// compute slows while communication runs, and the optimizer's time per element; calibrates them against
// measured steps; reads and checks profile files (see profile.h).
#include "slimshard/profile.h"

#include <ATen/Parallel.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <thread>

#include "slimshard/comm.h"
#include "slimshard/common.h"
#include "slimshard/cost_model.h"
#include "slimshard/json.h"
#include "slimshard/memory_estimate.h"
#include "slimshard/optim.h"

namespace slimshard {
namespace {

// 2: activation peaks around and in each op (act_moments: before and in forward, before and in backward, and
// the backward's tail after its weight gradient's hand-over — absent in older version 2 files;
// loss.peak_bytes), measured with the gradients laid out (version 1 counted them as backward activations).
// 3: overlap_slowdown is the compute rate while a collective is in flight, and the calibration (compute
// scale, latency, residuals) is fitted with the cost model's overlap that charges it only while the
// collective lasts; a version 2 profile's fits rest on the older overlap and would mislead it.
constexpr int kProfileVersion = 3;

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// t = α + β·bytes minimising the squared relative error, each size weighted by the time it takes: a step's
// time is mostly its large transfers, and on a shaped link the small ones ride the token bucket's burst (a 64
// KiB all-reduce at 12 MB/s, 16 MiB at 4.4), so weighting sizes alike fitted 7 MB/s and predicted hybrid
// steps 35 % short. α, β ≥ 0. Residual: RMS of the relative error.
CollectiveFit fit(const std::vector<std::pair<double, double>>& pts) {
  CollectiveFit f;
  f.points = pts;
  double S = 0, Sx = 0, Sy = 0, Sxx = 0, Sxy = 0;
  for (auto [x, y] : pts) {
    const double w = 1.0 / std::max(1e-9, y);
    S += w, Sx += w * x, Sy += w * y, Sxx += w * x * x, Sxy += w * x * y;
  }
  const double det = S * Sxx - Sx * Sx;
  f.beta_ms_per_byte = det > 0 ? (S * Sxy - Sx * Sy) / det : 0;
  f.alpha_ms = (Sy - f.beta_ms_per_byte * Sx) / S;
  if (f.alpha_ms < 0) f.alpha_ms = 0, f.beta_ms_per_byte = Sxx > 0 ? Sxy / Sxx : 0;
  if (f.beta_ms_per_byte < 0) f.beta_ms_per_byte = 0, f.alpha_ms = Sy / S;
  double r = 0;
  for (auto [x, y] : pts) r += std::pow((f.ms(x) - y) / y, 2);
  f.residual = std::sqrt(r / static_cast<double>(pts.size()));
  return f;
}

// Per-op forward/backward time (the span since the previous op ended) and activation bytes at micro-batch b.
void profile_compute(const ModelConfig& cfg, int64_t b, const ProfileOptions& o, uint64_t seed, Profile& p) {
  auto model = build_model(cfg, seed);
  for (ShardedParam* q : model->params().all()) q->shard(Strategy::ddp, 0, 1, o.precision.compute);
  const auto [x, y] = random_inputs(cfg, b, seed);
  std::map<std::string, std::vector<double>> fwd, bwd;
  std::vector<double> loss_fwd, loss_bwd;
  std::map<std::string, double> f_now, b_now;
  auto mark = Clock::now();
  set_op_observer([&](const Op& op, OpPhase phase) {
    if (phase != OpPhase::forward_end && phase != OpPhase::backward_end) return;
    const bool backward = phase == OpPhase::backward_end;
    const auto now = Clock::now();
    (backward ? b_now : f_now)[op.name()] += std::chrono::duration<double, std::milli>(now - mark).count();
    mark = now;
  });
  try {
    for (int it = 0; it < o.warmup + o.repeats; ++it) {
      for (ShardedParam* q : model->params().all()) q->zero_grad();
      f_now.clear(), b_now.clear();
      mark = Clock::now();
      at::Tensor loss = model->loss(x, y);
      const double lf = ms_since(mark);
      mark = Clock::now();
      loss.backward();
      const double lb = ms_since(mark);
      if (it < o.warmup) continue;
      for (auto& [k, v] : f_now) fwd[k].push_back(v);
      for (auto& [k, v] : b_now) bwd[k].push_back(v);
      loss_fwd.push_back(lf), loss_bwd.push_back(lb);
    }
  } catch (...) {
    set_op_observer(nullptr);
    throw;
  }
  set_op_observer(nullptr);
  const ActivationProfile act = probe_activations(cfg, b, seed, o.precision.compute);
  std::set<std::string> blocks;  // a second probe with every block recomputing
  for (const OpProfile& op : p.ops)
    if (!block_of(op.name).empty()) blocks.insert(block_of(op.name));
  const ActivationProfile rc =
      blocks.empty() ? ActivationProfile{} : probe_activations(cfg, b, seed, o.precision.compute, blocks);
  for (OpProfile& op : p.ops) {
    op.fwd_ms[b] = median(fwd[op.name]);
    op.bwd_ms[b] = median(bwd[op.name]);
    auto it = act.op_bytes.find(op.name);
    op.act_bytes[b] = it == act.op_bytes.end() ? 0 : it->second;
    op.act_moments[b] = act.moments.count(op.name) ? act.moments.at(op.name) : OpMoments{};
    op.live_before[b] = act.live_before.count(op.name) ? act.live_before.at(op.name) : 0;
    if (blocks.empty()) continue;
    op.live_before_rc[b] = rc.live_before.count(op.name) ? rc.live_before.at(op.name) : 0;
    if (block_of(op.name).empty()) continue;
    op.act_moments_rc[b] = rc.moments.count(op.name) ? rc.moments.at(op.name) : OpMoments{};
  }
  p.loss_peak_bytes[b] = act.loss_peak;
  p.loss_fwd_ms[b] = median(loss_fwd);  // the span after the last op: the loss
  p.loss_bwd_ms[b] =
      median(loss_bwd);  // the backward's tail after the last op (the loss's own falls to lm_head)
  auto lit = act.op_bytes.find("(loss)");
  p.loss_act_bytes[b] = lit == act.op_bytes.end() ? 0 : lit->second;
  p.backward_extra_bytes[b] = act.backward_extra;
}

// The probe compute of measure_overlap_slowdown: one 384 x 384 GEMM of the same operands into the same
// output each step (a chained product, a = a·c / 384, shrank ~20x a step: through denormals to zero within
// ~35 of its 60 steps).
struct ProbeGemm {
  at::Tensor a = at::randn({384, 384}), c = at::randn({384, 384}), out = at::empty({384, 384});
  void step() { at::mm_out(out, a, c); }
};

// Collectives at this world size, over a range of sizes: a fit of t = α + β·bytes each.
void profile_collectives(Communicator& comm, const ProfileOptions& o, Profile& p) {
  // World collectives (hierarchical across hosts); with several hosts also hybrid sharding's own: gathers and
  // reduce-scatters among the host's ranks, all-reduces among the peers across hosts — the inter-host link
  // measured, not assumed.
  struct Measured {
    const char* name;
    Collective kind;
    Group group;
  };
  std::vector<Measured> todo = {{"all_gather", Collective::all_gather, Group::world},
                                {"reduce_scatter", Collective::reduce_scatter, Group::world},
                                {"all_reduce", Collective::all_reduce, Group::world}};
  if (comm.topology().hosts > 1)
    todo.insert(todo.end(), {{"host_all_gather", Collective::all_gather, Group::host},
                             {"host_reduce_scatter", Collective::reduce_scatter, Group::host},
                             {"peers_all_reduce", Collective::all_reduce, Group::peers}});
  for (const Measured& m : todo) {
    const int size = comm.group_size(m.group);
    std::vector<std::pair<double, double>> pts;
    for (int64_t bytes = 16 << 10; bytes <= o.max_collective_bytes; bytes *= 4) {
      const int64_t n = bytes / 4 / size * size;
      at::Tensor full = at::ones({n}), part = at::ones({n / size});
      std::vector<double> times;
      for (int it = 0; it < o.warmup + o.repeats; ++it) {
        comm.barrier()->wait();
        const auto t = Clock::now();
        if (m.kind == Collective::all_gather) comm.all_gather(full, part, {}, m.group)->wait();
        if (m.kind == Collective::reduce_scatter)
          comm.reduce_scatter(part, full, ReduceOp::avg, {}, m.group)->wait();
        if (m.kind == Collective::all_reduce) comm.all_reduce(full, ReduceOp::avg, {}, m.group)->wait();
        if (it >= o.warmup) times.push_back(ms_since(t));
      }
      pts.emplace_back(static_cast<double>(n * 4), median(times));
    }
    p.collectives[m.name] = fit(pts);
  }
}

// How much slower compute runs while a collective is in flight (the cost model's f: compute proceeds at
// 1/f of its speed for as long as the collective lasts). Per GEMM, alone and while all-gathers keep the
// comm thread busy — timed only while they last: a train of gathers that ended before the GEMMs did diluted
// the rate with GEMMs that ran alone (one host's fast gathers). The train is sized from one gather alone to
// outlast the GEMMs; rank 0's count is every rank's, since all must issue as many.
double measure_overlap_slowdown(Communicator& comm) {
  if (comm.world() == 1) return 1.0;
  constexpr int gemms = 60;
  at::Tensor full = at::ones({(8 << 20) / 4 / comm.world() * comm.world()});
  at::Tensor part = at::ones({full.numel() / comm.world()});
  ProbeGemm gemm;
  auto per_gemm_alone = [&] {
    const auto t = Clock::now();
    for (int i = 0; i < gemms; ++i) gemm.step();
    return ms_since(t) / gemms;
  };
  comm.barrier()->wait();
  const double gemm_ms = per_gemm_alone();
  comm.barrier()->wait();
  auto t = Clock::now();
  comm.all_gather(full, part)->wait();
  const double gather_ms = std::max(1e-3, ms_since(t));
  at::Tensor train =
      at::full({1}, std::clamp(std::ceil(2 * gemms * gemm_ms / gather_ms), 2.0, 256.0), at::kDouble);
  comm.broadcast(train, 0)->wait();
  const int gathers = static_cast<int>(train.item<double>());
  std::vector<double> alone, together;
  for (int it = 0; it < 3; ++it) {
    comm.barrier()->wait();
    alone.push_back(per_gemm_alone());
    comm.barrier()->wait();
    std::vector<WorkPtr> works;
    for (int i = 0; i < gathers; ++i) works.push_back(comm.all_gather(full, part));
    int done = 0;
    t = Clock::now();
    while (done < gemms && !works.back()->done()) gemm.step(), ++done;
    if (done >= 4) together.push_back(ms_since(t) / done);
    for (auto& w : works) w->wait();
  }
  if (together.empty()) return 1.0;  // every train ended within a few GEMMs: nothing to slow
  return std::max(1.0, median(together) / median(alone));
}

// Per element of the owned parameters, the work after backward: zeroing the gradient (before the next step),
// its norm and scaling (clipping), and AdamW. Every rank at once after a barrier, as in training (where all
// step their optimizers together after the last reduction): timed alone while other ranks still polled in
// a collective, a step of a few milliseconds sometimes waited out a whole scheduling slice (12.9 ns per
// element in one profile across hosts, 1.1 in the one before). 4 Mi elements (5-15 ms a pass here), 9 passes.
double measure_optimizer_ns_per_element(Communicator& comm) {
  constexpr int64_t n = int64_t{1} << 22;
  ShardedParam q("probe", at::randn({n}), true);
  q.shard(Strategy::ddp, 0, 1);
  Optimizer opt(OptimConfig{});
  opt.init_state({&q});
  comm.barrier()->wait();
  std::vector<double> times;
  for (int it = 0; it < 9; ++it) {
    q.grad().normal_();
    const auto t = Clock::now();
    const double norm = std::sqrt(q.grad().dot(q.grad()).item<double>());
    q.grad().mul_(1.0 / (norm + 1e-6));
    opt.step({&q}, 1e-3);
    q.zero_grad();
    times.push_back(ms_since(t));
  }
  return median(times) * 1e6 / static_cast<double>(n);
}

// The model's step time with one strategy everywhere, at micro-batch b (one micro-batch per rank).
double uniform_step_ms(const Profile& p, Strategy s, int64_t b) {
  CostOptions cost_opts;
  cost_opts.precision = p.precision;
  cost_opts.world = p.world;
  cost_opts.global_batch = b * p.world;
  std::map<std::string, OpChoice> choices;
  for (const OpProfile& op : p.ops) choices[op.name] = OpChoice{s, 1};
  return CostModel::from_profile(p, cost_opts).evaluate(choices, b).step_ms;
}

}  // namespace

std::vector<OpProfile> unmeasured(const std::vector<OpShape>& shapes) {
  std::vector<OpProfile> out;
  for (const OpShape& s : shapes) out.push_back(OpProfile{s, {}, {}, {}, {}, {}, {}, {}});
  return out;
}

std::vector<Strategy> residual_strategies(bool across_hosts) {
  if (!across_hosts) return {Strategy::zero1, Strategy::zero2, Strategy::zero3};
  return {Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3, Strategy::hsdp, Strategy::hsdp2};
}

std::vector<int64_t> profile_micro_batches(int64_t local) {
  std::vector<int64_t> micro;
  for (int64_t b = local; b >= 1 && micro.size() < 4; b /= 2)
    if (local % b == 0) micro.insert(micro.begin(), b);
  return micro;
}

Profile measure_profile(const ModelConfig& model, const std::vector<int64_t>& micro_batches,
                        Communicator& comm, const ProfileOptions& o, uint64_t seed) {
  if (micro_batches.empty()) throw UsageError("--micro-batch: give at least one size");
  Profile p;
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  p.machine = {{"host", host}, {"cpus", std::thread::hardware_concurrency()}, {"cpu", cpu_model()}};
  p.world = comm.world();
  p.hosts = comm.topology().hosts;
  p.ranks_per_host = p.hosts > 1 ? comm.topology().local_size : 0;
  p.threads = at::get_num_threads();
  p.libtorch = TORCH_VERSION;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  p.date = date;
  p.model = model;
  p.precision = o.precision;
  p.micro_batches = micro_batches;
  p.ops = unmeasured(op_shapes(model));
  // Compute: every rank runs it at the same time, so the figures include the contention training will see.
  for (int64_t b : micro_batches) {
    comm.barrier()->wait();
    profile_compute(model, b, o, seed, p);
  }
  profile_collectives(comm, o, p);
  p.overlap_slowdown = measure_overlap_slowdown(comm);
  p.optimizer_ns_per_element = measure_optimizer_ns_per_element(comm);
  return p;
}

void calibrate_profile(Profile& p, const MeasuredSteps& steps) {
  nlohmann::json record = nlohmann::json::object();
  p.strategy_residual_ms.clear();
  for (const auto& [b, ddp_ms] : steps.ddp_ms) {
    // The optimizer and exposed communication are not scaled, so rounds bring the step onto the measured one
    // (each leaves about their share of the gap before it).
    double scale = 1;
    for (int round = 0; round < 30; ++round) {
      const double r = ddp_ms / uniform_step_ms(p, Strategy::ddp, b);
      if (!(r > 0) || !std::isfinite(r) || std::abs(r - 1) < 1e-12) break;
      for (OpProfile& op : p.ops) op.fwd_ms[b] *= r, op.bwd_ms[b] *= r;
      p.loss_fwd_ms[b] *= r, p.loss_bwd_ms[b] *= r;
      scale *= r;
    }
    record[std::to_string(b)] = {{"ddp_ms", ddp_ms}, {"compute_scale", scale}};
  }
  const int64_t top = p.micro_batches.back();
  const auto zero3 = steps.uniform_ms.find("zero3");
  if (p.world > 1 && zero3 != steps.uniform_ms.end() && zero3->second.count(top)) {
    int64_t gathers = 0;
    for (const OpProfile& op : p.ops) gathers += 2 * static_cast<int64_t>(op.param_numels.size());
    const double measured = zero3->second.at(top);
    const double predicted = uniform_step_ms(p, Strategy::zero3, top);
    p.collective_overhead_ms = std::max(0.0, (measured - predicted) / static_cast<double>(gathers));
  }
  // What the model misses of each real step is that strategy's residual at that micro-batch (for zero3 what
  // the latency leaves: charged per gather, it mostly hides under the op's compute in the model's overlap —
  // w4-deep: 659 predicted vs 717 ms measured). Taken against the model without residuals: the cost model
  // lends a micro-batch without one the nearest one's.
  std::map<std::string, std::map<int64_t, double>> residual;
  for (const auto& [name, by_b] : steps.uniform_ms)
    for (const auto& [b, ms] : by_b) {
      residual[name][b] = ms - uniform_step_ms(p, parse_strategy(name, "calibration"), b);
      record[std::to_string(b)][name + "_ms"] = ms;
    }
  p.strategy_residual_ms = residual;
  p.measured_steps = record;
}

// ---------------------------------------------------------------------------------------------------------------
namespace {
nlohmann::json moments_json(const std::map<int64_t, OpMoments>& by_b) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [b, m] : by_b)
    j[std::to_string(b)] = {m.before_fwd, m.fwd, m.before_bwd, m.bwd, m.bwd_tail};
  return j;
}
}  // namespace

nlohmann::json profile_to_json(const Profile& p) {
  auto by_b = [](const auto& m) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [b, v] : m) j[std::to_string(b)] = v;
    return j;
  };
  nlohmann::json ops = nlohmann::json::array();
  for (const OpProfile& o : p.ops) {
    ops.push_back({{"name", o.name},
                   {"kind", o.kind},
                   {"param_numels", o.param_numels},
                   {"out_features", o.out_features},
                   {"fwd_ms", by_b(o.fwd_ms)},
                   {"bwd_ms", by_b(o.bwd_ms)},
                   {"act_bytes", by_b(o.act_bytes)},
                   {"act_moments", moments_json(o.act_moments)},
                   {"live_before", by_b(o.live_before)}});
    if (!o.live_before_rc.empty()) ops.back()["recompute"] = {{"live_before", by_b(o.live_before_rc)}};
    if (!o.act_moments_rc.empty())
      ops.back()["recompute"].update({{"act_moments", moments_json(o.act_moments_rc)}});
  }
  nlohmann::json residual = nlohmann::json::object();
  for (const auto& [name, by_b_ms] : p.strategy_residual_ms) residual[name] = by_b(by_b_ms);
  nlohmann::json coll = nlohmann::json::object();
  for (const auto& [k, f] : p.collectives)
    coll[k] = {{"alpha_ms", f.alpha_ms},
               {"beta_ms_per_byte", f.beta_ms_per_byte},
               {"residual", f.residual},
               {"points", f.points}};
  return {
      {"format", "slimshard.profile"},
      {"version", kProfileVersion},
      {"machine", p.machine},
      {"world", p.world},
      {"hosts", p.hosts},
      {"ranks_per_host", p.ranks_per_host},
      {"threads", p.threads},
      {"libtorch", p.libtorch},
      {"date", p.date},
      {"model", p.model.to_json()},
      {"precision",
       {{"compute", float_type_name(p.precision.compute)}, {"reduce", float_type_name(p.precision.reduce)}}},
      {"micro_batches", p.micro_batches},
      {"ops", ops},
      {"loss",
       {{"fwd_ms", by_b(p.loss_fwd_ms)},
        {"bwd_ms", by_b(p.loss_bwd_ms)},
        {"act_bytes", by_b(p.loss_act_bytes)},
        {"peak_bytes", by_b(p.loss_peak_bytes)}}},
      {"backward_extra_bytes", by_b(p.backward_extra_bytes)},
      {"collectives", coll},
      {"overlap_slowdown", p.overlap_slowdown},
      {"collective_overhead_ms", p.collective_overhead_ms},
      {"strategy_residual_ms", residual},
      {"measured_steps", p.measured_steps},
      {"optimizer_ns_per_element", p.optimizer_ns_per_element}};
}

Profile profile_from_json(const nlohmann::json& j, const std::string& what) {
  Profile p;
  auto bad = [&](const std::string& field, const std::string& why) -> UsageError {
    return UsageError(what + ": " + field + ": " + why);
  };
  try {
    if (!j.is_object() || j.value("format", "") != "slimshard.profile")
      throw bad("format", "not a slimshard profile (expected \"format\": \"slimshard.profile\")");
    if (!j.at("version").is_number_integer() || j.at("version").get<int64_t>() != kProfileVersion)
      throw bad("version", "format version " + j.at("version").dump() + ", this slimshard reads version " +
                               std::to_string(kProfileVersion) + " (profile again with `slimshard profile`)");
    p.machine = j.at("machine");
    p.world = static_cast<int>(json_integer(j.at("world"), what + ": world", 1, 1 << 20));
    if (j.contains("hosts")) {  // absent in profiles taken before hosts were told apart: one host
      p.hosts = static_cast<int>(json_integer(j.at("hosts"), what + ": hosts", 1, p.world));
      p.ranks_per_host =
          static_cast<int>(json_integer(j.at("ranks_per_host"), what + ": ranks_per_host", 0, p.world));
      if (p.hosts > 1 && p.ranks_per_host * p.hosts != p.world)
        throw bad("ranks_per_host", "hosts x ranks_per_host is not the world");
    }
    p.threads = static_cast<int>(json_integer(j.at("threads"), what + ": threads", 1, 4096));
    p.libtorch = j.at("libtorch").get<std::string>();
    p.date = j.value("date", "");
    p.model = ModelConfig::from_json(j.at("model"), what + ": model");
    if (j.contains("precision")) {  // absent in profiles taken before mixed precision: fp32
      const auto& prec = j.at("precision");
      if (!prec.is_object()) throw bad("precision", "expected {\"compute\": ..., \"reduce\": ...}");
      p.precision.compute =
          parse_float_type(prec.at("compute").get<std::string>(), what + ": precision.compute");
      p.precision.reduce =
          parse_float_type(prec.at("reduce").get<std::string>(), what + ": precision.reduce");
    }
    const auto& sizes = j.at("micro_batches");
    if (!sizes.is_array() || sizes.empty() || sizes.size() > 64)
      throw bad("micro_batches", "expected 1 to 64 sizes");
    for (const auto& b : sizes)
      p.micro_batches.push_back(json_integer(b, what + ": micro_batches", 1, 1 << 30));
    // Times are non-negative numbers; bytes integers, an op's activation bytes possibly negative (what frees
    // after the previous op ended).
    constexpr int64_t kMaxBytes = int64_t{1} << 50;
    auto read_b = [&](const nlohmann::json& obj, const std::string& field, auto& out,
                      bool signed_ok = false) {
      if (!obj.is_object()) throw bad(field, "expected an object by micro-batch");
      for (int64_t b : p.micro_batches) {
        const std::string key = std::to_string(b);
        if (!obj.contains(key)) throw bad(field, "no value for micro-batch " + key);
        using V = typename std::decay_t<decltype(out)>::mapped_type;
        const auto& v = obj.at(key);
        if constexpr (std::is_same_v<V, double>) {
          const double x = v.is_number() ? v.get<double>() : NAN;
          if (!(x >= 0) || !std::isfinite(x) || x > 1e12)
            throw bad(field, "negative, not finite or not a number");
          out[b] = x;
        } else {
          out[b] = json_integer(v, what + ": " + field, signed_ok ? -kMaxBytes : 0, kMaxBytes);
        }
      }
    };
    const std::vector<OpProfile> shapes = unmeasured(op_shapes(p.model));
    const auto& ops = j.at("ops");
    if (!ops.is_array() || ops.size() != shapes.size())
      throw bad("ops", "expected " + std::to_string(shapes.size()) + " ops for this model");
    for (size_t i = 0; i < ops.size(); ++i) {
      OpProfile o = shapes[i];
      if (ops[i].at("name").get<std::string>() != o.name)
        throw bad("ops[" + std::to_string(i) + "]",
                  "'" + ops[i].at("name").get<std::string>() + "', the model has '" + o.name + "'");
      std::vector<int64_t> numels;
      for (const auto& n : ops[i].at("param_numels"))
        numels.push_back(json_integer(n, what + ": ops." + o.name + ".param_numels", 0, kMaxBytes));
      if (numels != o.param_numels) throw bad("ops." + o.name, "parameter sizes do not match the model");
      read_b(ops[i].at("fwd_ms"), "ops." + o.name + ".fwd_ms", o.fwd_ms);
      read_b(ops[i].at("bwd_ms"), "ops." + o.name + ".bwd_ms", o.bwd_ms);
      auto read_moments = [&](const nlohmann::json& by_b, const std::string& field,
                              std::map<int64_t, OpMoments>& out) {
        for (int64_t b : p.micro_batches) {
          const auto& v = by_b.at(std::to_string(b));
          // Profiles before the backward's tail was measured have 4: the tail is then taken as the
          // whole backward's peak (the estimate as it was).
          if (!v.is_array() || (v.size() != 4 && v.size() != 5))
            throw UsageError(field + ": expected 5 byte counts per micro-batch");
          int64_t m[5];
          for (size_t k = 0; k < v.size(); ++k) m[k] = json_integer(v[k], field, 0, kMaxBytes);
          out[b] = OpMoments{m[0], m[1], m[2], m[3], v.size() == 5 ? m[4] : m[3]};
        }
      };
      read_b(ops[i].at("act_bytes"), "ops." + o.name + ".act_bytes", o.act_bytes, true);
      read_moments(ops[i].at("act_moments"), what + ": ops." + o.name + ".act_moments", o.act_moments);
      // Optional: profiles taken before recomputation have none of these.
      if (ops[i].contains("live_before"))
        read_b(ops[i].at("live_before"), "ops." + o.name + ".live_before", o.live_before);
      if (ops[i].contains("recompute")) {
        const auto& rc = ops[i].at("recompute");
        if (rc.contains("live_before"))
          read_b(rc.at("live_before"), "ops." + o.name + ".recompute.live_before", o.live_before_rc);
        if (rc.contains("act_moments")) {
          if (block_of(o.name).empty())
            throw bad("ops." + o.name + ".recompute", "activations with recomputation for an op in no block");
          read_moments(rc.at("act_moments"), what + ": ops." + o.name + ".recompute.act_moments",
                       o.act_moments_rc);
        }
      }
      p.ops.push_back(o);
    }
    read_b(j.at("loss").at("fwd_ms"), "loss.fwd_ms", p.loss_fwd_ms);
    read_b(j.at("loss").at("bwd_ms"), "loss.bwd_ms", p.loss_bwd_ms);
    read_b(j.at("loss").at("act_bytes"), "loss.act_bytes", p.loss_act_bytes, true);
    read_b(j.at("loss").at("peak_bytes"), "loss.peak_bytes", p.loss_peak_bytes);
    read_b(j.at("backward_extra_bytes"), "backward_extra_bytes", p.backward_extra_bytes);
    for (const char* k : {"all_gather", "reduce_scatter", "all_reduce", "host_all_gather",
                          "host_reduce_scatter", "peers_all_reduce"}) {
      const bool world_kind = std::string(k).find("host_") != 0 && std::string(k).find("peers_") != 0;
      if (!world_kind && !j.at("collectives").contains(k)) continue;  // only with several hosts
      const auto& c = j.at("collectives").at(k);
      CollectiveFit f;
      const std::string field = what + ": collectives." + k;
      f.alpha_ms = json_number(c.at("alpha_ms"), field + ".alpha_ms", 0, 1e9);
      f.beta_ms_per_byte = json_number(c.at("beta_ms_per_byte"), field + ".beta_ms_per_byte", 0, 1e3);
      f.residual = json_number(c.at("residual"), field + ".residual", 0, 1e9);
      if (c.contains("points")) f.points = c.at("points").get<std::vector<std::pair<double, double>>>();
      p.collectives[k] = f;
    }
    p.overlap_slowdown = json_number(j.at("overlap_slowdown"), what + ": overlap_slowdown", 1, 100);
    p.collective_overhead_ms =
        json_number(j.at("collective_overhead_ms"), what + ": collective_overhead_ms", 0, 1e9);
    p.optimizer_ns_per_element =
        json_number(j.at("optimizer_ns_per_element"), what + ": optimizer_ns_per_element", 0, 1e9);
    const auto& residual = j.at("strategy_residual_ms");
    if (!residual.is_object()) throw bad("strategy_residual_ms", "expected an object by strategy");
    const std::vector<Strategy> calibrated = residual_strategies(true);
    for (const auto& item : residual.items()) {
      const std::string name = item.key();  // a named copy: lambdas may not capture a structured binding
      const auto& v = item.value();
      const std::string field = what + ": strategy_residual_ms." + name;
      if (std::none_of(calibrated.begin(), calibrated.end(),
                       [&](Strategy s) { return name == strategy_name(s); }))
        throw bad("strategy_residual_ms", "unknown strategy '" + name + "'");
      // One number (profiles taken before residuals were kept by micro-batch): the largest's.
      if (v.is_number()) {
        p.strategy_residual_ms[name][p.micro_batches.back()] = json_number(v, field, -1e9, 1e9);
        continue;
      }
      if (!v.is_object() || v.empty())
        throw bad("strategy_residual_ms." + name, "expected ms by micro-batch");
      for (const auto& entry : v.items()) {
        const std::string key = entry.key();  // a named copy, as above
        const auto b = std::find_if(p.micro_batches.begin(), p.micro_batches.end(),
                                    [&](int64_t m) { return std::to_string(m) == key; });
        if (b == p.micro_batches.end())
          throw bad("strategy_residual_ms." + name,
                    "'" + key + "' is not one of the profile's micro-batches");
        p.strategy_residual_ms[name][*b] = json_number(entry.value(), field + "." + key, -1e9, 1e9);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(what + ": missing or mistyped field (" + std::string(e.what()) + ")");
  }
  return p;
}

Profile load_profile(const std::string& path) {
  return profile_from_json(parse_json(read_file(path, "--profile"), "--profile " + path),
                           "--profile " + path);
}

Profile scale_profile(const Profile& p, int world) {
  Profile q = p;
  if (world == p.world) return q;
  // (The hosts of the profile are not those of the other world: it is re-derived as one host.)
  for (const char* k : {"host_all_gather", "host_reduce_scatter", "peers_all_reduce"}) q.collectives.erase(k);
  q.hosts = 1, q.ranks_per_host = 0;
  // Ring model: a collective moves (W-1)/W of the bytes (all-reduce twice) in W-1 steps of latency. Fit the
  // measured α, β to per-step latency and bandwidth, then re-derive them at the new W.
  auto share = [](int w, bool twice) { return (twice ? 2.0 : 1.0) * (w - 1) / static_cast<double>(w); };
  for (auto& [k, f] : q.collectives) {
    const bool ar = k == "all_reduce";
    const double steps_old = (ar ? 2.0 : 1.0) * std::max(1, p.world - 1);
    const double steps_new = (ar ? 2.0 : 1.0) * std::max(1, world - 1);
    const double s_old = std::max(share(p.world, ar), 1e-9), s_new = share(world, ar);
    f.alpha_ms = f.alpha_ms / steps_old * steps_new;
    f.beta_ms_per_byte = f.beta_ms_per_byte / s_old * s_new;
    f.points.clear();
  }
  q.world = world;
  return q;
}

void print_profile(const Profile& p) {
  for (int64_t b : p.micro_batches) {
    double fwd = 0, bwd = 0;
    for (const auto& op : p.ops) fwd += op.fwd_ms.at(b), bwd += op.bwd_ms.at(b);
    std::printf("  micro-batch %lld: forward %.1f ms, backward %.1f ms\n", (long long)b,
                fwd + p.loss_fwd_ms.at(b), bwd + p.loss_bwd_ms.at(b));
  }
  for (const auto& [k, fit] : p.collectives)
    std::printf("  %-14s t = %.3f ms + bytes / %.2f GB/s   (fit residual %.1f%%)\n", k.c_str(), fit.alpha_ms,
                fit.beta_ms_per_byte > 0 ? 1e-6 / fit.beta_ms_per_byte : 0.0, 100 * fit.residual);
  std::printf(
      "  compute runs %.2fx slower while communication runs; %.3f ms per collective in a step; "
      "AdamW and clipping %.2f ns per element\n",
      p.overlap_slowdown, p.collective_overhead_ms, p.optimizer_ns_per_element);
  for (const auto& [name, by_b] : p.strategy_residual_ms)
    for (const auto& [b, ms] : by_b)
      std::printf("  a real %s step at micro-batch %lld: %+.1f ms against the model\n", name.c_str(),
                  static_cast<long long>(b), ms);
}

}  // namespace slimshard
