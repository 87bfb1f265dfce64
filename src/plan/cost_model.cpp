// cost_model.cpp — time and memory of each op under each choice, from a measured profile or an analytic
// device spec; additive over ops so that the search is exact. Per op and micro-batch:
//   forward   compute, overlapped with zero3's gather (prefetch ≥ 1) or followed by it (prefetch 0)
//   backward  compute overlapped with the op's reductions: zero3 gather + reduce-scatter, zero2
//             reduce-scatter, and on the last micro-batch only zero1's reduce-scatter or DDP's share of its
//             bucket's all-reduce
//   overlap   max(M, C + M·(1 - 1/f)): compute runs at 1/f of its speed (measured) while the
//             collective lasts, so an overlapped collective never costs more than a serial one
//   splits    each collective a split adds pays the busy-thread latency (unless its pieces are fused)
//   after     zero1/zero2 all-gather the updated slices, charged whole: the engine lets them run into
//             the next forward, but they queue on one link, and charged as hidden under each op's own
//             forward the model over-credited it (docs/cluster.md); the optimizer over the owned elements
#include "slimshard/cost_model.h"

#include <algorithm>
#include <cmath>

#include "slimshard/common.h"
#include "slimshard/json.h"

namespace slimshard {

namespace {

// Compute C overlapped with a collective of M: while the collective lasts the compute does M/f of its work,
// the rest runs alone after it. (Charging the slowdown over the whole overlapped span instead,
// C + (f-1)·min(C, M), made overlap dearer than running serially above f = 2, which a cluster's profile
// measures: Slim-DP's round hidden under the next step predicted 31 % long; docs/slim-dp.md.)
double overlap(double compute, double comm, double f) {
  if (comm <= 0) return compute;
  return std::max(comm, compute + comm * (1 - 1 / f));
}

// A residual at micro-batch b: the one measured there, else the nearest measured one's (the larger on a tie).
double nearest(const std::map<int64_t, double>& by_b, int64_t b) {
  auto hi = by_b.lower_bound(b);
  if (hi == by_b.end()) return std::prev(hi)->second;
  if (hi->first == b || hi == by_b.begin()) return hi->second;
  const auto lo = std::prev(hi);
  return b - lo->first < hi->first - b ? lo->second : hi->second;
}

}  // namespace

SlimApply parse_slim_apply(const std::string& s) {
  if (s == "now") return SlimApply::now;
  if (s == "forward") return SlimApply::forward;
  if (s == "next") return SlimApply::next;
  throw UsageError("--slim-apply: expected now, forward or next, got '" + s + "'");
}

double CostModel::interp(const std::map<int64_t, double>& m, int64_t b) const {
  if (m.empty()) return 0;
  auto it = m.find(b);
  if (it != m.end()) return it->second;
  // Linear in the micro-batch between (or beyond) the nearest measured sizes; time grows with the rows.
  auto hi = m.lower_bound(b);
  if (hi == m.begin()) return hi->second * static_cast<double>(b) / static_cast<double>(hi->first);
  auto lo = std::prev(hi);
  if (hi == m.end()) return lo->second * static_cast<double>(b) / static_cast<double>(lo->first);
  const double w = static_cast<double>(b - lo->first) / static_cast<double>(hi->first - lo->first);
  return lo->second + w * (hi->second - lo->second);
}

int64_t CostModel::interp_bytes(const std::map<int64_t, int64_t>& m, int64_t b) const {
  std::map<int64_t, double> d;
  for (auto [k, v] : m) d[k] = static_cast<double>(v);
  return static_cast<int64_t>(std::llround(interp(d, b)));
}

CostModel CostModel::from_profile(const Profile& p, const CostOptions& o) {
  if (p.world != o.world)
    throw UsageError("--profile: taken at world size " + std::to_string(p.world) + ", planning for " +
                     std::to_string(o.world) + " (profile again under mpirun -n " + std::to_string(o.world) +
                     ", or pass --scale-profile to re-derive its collectives by the ring model)");
  if (p.precision != o.precision)
    throw UsageError("--profile: taken in " + p.precision.name() + ", this run is " + o.precision.name() +
                     " (op times and activations differ: profile again with --precision " +
                     float_type_name(o.precision.compute) + " --reduce-dtype " +
                     float_type_name(o.precision.reduce) + ")");
  CostModel m;
  m.o_ = o;
  if (m.o_.ranks_per_host == 0) m.o_.ranks_per_host = p.ranks_per_host;  // planned where it was measured
  m.model_ = p.model;
  m.ops_ = p.ops;
  m.shapes_.assign(m.ops_.begin(), m.ops_.end());
  m.loss_fwd_ = p.loss_fwd_ms, m.loss_bwd_ = p.loss_bwd_ms;
  m.loss_act_ = p.loss_act_bytes, m.bwd_extra_ = p.backward_extra_bytes, m.loss_peak_ = p.loss_peak_bytes;
  m.coll_ = p.collectives;
  m.overlap_ = p.overlap_slowdown;
  m.opt_ns_ = p.optimizer_ns_per_element;
  m.coll_overhead_ = p.collective_overhead_ms;
  m.residual_ = p.strategy_residual_ms;
  m.param_numel_ = 0;
  for (const OpProfile& op : m.ops_)
    for (int64_t n : op.param_numels) m.param_numel_ += static_cast<double>(n);
  m.param_numel_ = std::max(1.0, m.param_numel_);
  m.find_blocks();
  m.source_ = "profile (" + p.date + ", " + std::to_string(p.world) + " ranks, " +
              (p.machine.is_object() ? p.machine.value("cpu", "?") : std::string("?")) + ")";
  return m;
}

CostModel CostModel::from_cluster(const ClusterSpec& c, const ModelConfig& cfg, const CostOptions& o,
                                  const std::vector<int64_t>& micro_batches) {
  CostModel m;
  m.o_ = o;
  m.model_ = cfg;
  m.ops_ = unmeasured(op_shapes(cfg));
  m.shapes_.assign(m.ops_.begin(), m.ops_.end());
  m.source_ = "cluster spec " + c.name;
  const double flops = c.peak_flops * c.achievable_fraction;
  const double e = c.activation_bytes_per_element;
  // Collectives as the engine runs them: within a node a ring over its R devices on the intra link; across
  // nodes hierarchically — that ring, then a ring over the H nodes on 1/R of the bytes on the inter link.
  const double R = std::min(o.world, c.devices_per_node), H = std::max(1.0, o.world / R);
  m.o_.ranks_per_host = o.world > c.devices_per_node ? c.devices_per_node : 0;
  auto ring = [&](double steps_factor, double n, double bw, double lat, double bytes_share) {
    CollectiveFit f;  // bytes_share: the part of the tensor this ring carries (1/R across nodes)
    if (n <= 1) return f;
    f.alpha_ms = steps_factor * (n - 1) * lat * 1e3;
    f.beta_ms_per_byte = steps_factor * (n - 1) / n * bytes_share / bw * 1e3;
    return f;
  };
  auto both = [&](double steps_factor) {
    CollectiveFit in = ring(steps_factor, R, c.intra_bandwidth, c.intra_latency, 1),
                  out = ring(steps_factor, H, c.inter_bandwidth, c.inter_latency, 1 / R);
    in.alpha_ms += out.alpha_ms, in.beta_ms_per_byte += out.beta_ms_per_byte;
    return in;
  };
  m.coll_["all_gather"] = both(1), m.coll_["reduce_scatter"] = both(1), m.coll_["all_reduce"] = both(2);
  if (H > 1) {  // hybrid sharding's own: within the node, and among the peers across nodes
    m.coll_["host_all_gather"] = m.coll_["host_reduce_scatter"] =
        ring(1, R, c.intra_bandwidth, c.intra_latency, 1);
    m.coll_["peers_all_reduce"] = ring(2, H, c.inter_bandwidth, c.inter_latency, 1);
  }
  m.overlap_ = c.overlap_slowdown;
  m.opt_ns_ = 28.0 / c.memory_bandwidth * 1e9;  // AdamW reads param, grad, two states and writes three
  for (int64_t b : micro_batches) {
    if (cfg.arch != "gpt") throw UsageError("--cluster: analytic costs are for GPT models");
    const double T = static_cast<double>(cfg.seq_len), C = static_cast<double>(cfg.n_embd);
    const double H = static_cast<double>(cfg.n_head), V = static_cast<double>(cfg.vocab);
    const double rows = static_cast<double>(b) * T;
    double kept = 0;  // the activations so far
    for (OpProfile& op : m.ops_) {
      double fwd = 0, act = 0;  // seconds, elements kept for backward
      if (op.kind == "linear") {
        fwd = 2 * rows * static_cast<double>(op.param_numels[0]) / flops;
        act = rows * static_cast<double>(op.out_features);
        if (op.name.find("attn.proj") !=
            std::string::npos) {  // the attention before it: QKᵀ and AV, softmax kept
          fwd += 4 * static_cast<double>(b) * T * T * C / flops;
          act += static_cast<double>(b) * H * T * T + 2 * rows * C;
        }
        if (op.name.find("mlp.proj") != std::string::npos) act += rows * 4 * C;  // GELU output
      } else {  // embedding and layernorm: memory-bound passes over the activations
        fwd = 4 * rows * C * e / c.memory_bandwidth;
        act = rows * C + (op.kind == "layernorm" ? 2 * rows : 0);
      }
      op.fwd_ms[b] = fwd * 1e3;
      op.bwd_ms[b] = 2 * fwd * 1e3;
      op.live_before[b] = static_cast<int64_t>(kept);
      op.act_bytes[b] = static_cast<int64_t>(act * e);
      kept += act * e;
      op.act_moments[b].before_fwd = op.act_moments[b].fwd = static_cast<int64_t>(kept);
    }
    m.loss_fwd_[b] = 3 * rows * V * e / c.memory_bandwidth * 1e3;
    m.loss_bwd_[b] = m.loss_fwd_[b];
    m.loss_act_[b] = static_cast<int64_t>(2 * rows * V * e);
    m.bwd_extra_[b] = static_cast<int64_t>((4 * rows * C + 2 * static_cast<double>(b) * H * T * T) * e);
    m.loss_peak_[b] = static_cast<int64_t>(kept) + m.loss_act_[b];
    // Backward at an op: what the ops up to it keep, the backward's own scratch, and (first) the loss's.
    for (OpProfile& op : m.ops_) {
      OpMoments& om = op.act_moments[b];
      om.before_bwd = om.bwd = om.bwd_tail =
          om.fwd + m.bwd_extra_[b] + (&op == &m.ops_.back() ? m.loss_act_[b] : 0);
    }
    // Recomputing every block: a block keeps its input alone (its first op's share); in its backward the
    // recomputed forward holds all it kept without recomputation again, on top of the blocks before it.
    double kept_rc = 0, block_start_none = 0, block_start_rc = 0;
    std::string block;
    for (OpProfile& op : m.ops_) {
      const std::string b_name = block_of(op.name);
      if (b_name.empty()) continue;
      const OpMoments& none = op.act_moments[b];
      if (b_name != block) {
        block = b_name;
        block_start_none = static_cast<double>(none.before_fwd - op.act_bytes[b]);
        block_start_rc = kept_rc;
        kept_rc += rows * C * e;
      }
      const double shift = block_start_rc - block_start_none;  // the blocks before keep less
      op.act_moments_rc[b].before_fwd = op.act_moments_rc[b].fwd = static_cast<int64_t>(kept_rc);
      op.act_moments_rc[b].before_bwd = static_cast<int64_t>(static_cast<double>(none.before_bwd) + shift);
      op.act_moments_rc[b].bwd = static_cast<int64_t>(static_cast<double>(none.bwd) + shift);
      op.act_moments_rc[b].bwd_tail = static_cast<int64_t>(static_cast<double>(none.bwd_tail) + shift);
    }
    // Live before each op with every block recomputing: less, by what the blocks before no longer keep.
    double less = 0, block_none = 0;
    block.clear();
    for (OpProfile& op : m.ops_) {
      const std::string b_name = block_of(op.name);
      if (b_name != block && !block.empty()) less += block_none - rows * C * e, block_none = 0;
      block = b_name;
      op.live_before_rc[b] = static_cast<int64_t>(static_cast<double>(op.live_before[b]) - less);
      if (!b_name.empty()) block_none += static_cast<double>(op.act_bytes[b]);
    }
  }
  m.find_blocks();
  return m;
}

void CostModel::find_blocks() {
  block_.clear(), before_.clear(), first_op_.clear(), blocks_ = 0;
  std::string prev;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const std::string b = block_of(ops_[i].name);
    if (!b.empty() && b != prev) ++blocks_, first_op_.push_back(i);
    if (b.empty() && !prev.empty()) first_op_.push_back(i);  // the first op after a block
    prev = b;
    block_.push_back(b.empty() ? -1 : blocks_ - 1);
    before_.push_back(b.empty() ? blocks_ : blocks_ - 1);
  }
  // Kept bytes per block from the live bytes at block boundaries, where measured.
  live_measured_ = blocks_ > 0 && first_op_.size() > static_cast<size_t>(blocks_);
  rc_measured_ = live_measured_;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const size_t n = ops_[i].act_moments.size();
    if (ops_[i].live_before.size() != n) live_measured_ = rc_measured_ = false;
    if (ops_[i].live_before_rc.size() != n) rc_measured_ = false;
    if (block_[i] >= 0 && ops_[i].act_moments_rc.size() != n) rc_measured_ = false;
  }
  if (o_.recompute == Recompute::all && blocks_ > 0 && !rc_measured_)
    throw UsageError(
        "--recompute all: the profile has no activations measured with recomputation (it was "
        "taken before slimshard had it): profile again");
}

bool CostModel::recompute_is_choice() const { return o_.recompute == Recompute::auto_ && rc_measured_; }

const std::array<std::vector<int64_t>, 2>& CostModel::block_kept(int64_t micro) const {
  auto it = kept_.find(micro);
  if (it != kept_.end()) return it->second;
  std::array<std::vector<int64_t>, 2> k{std::vector<int64_t>(static_cast<size_t>(blocks_), 0),
                                        std::vector<int64_t>(static_cast<size_t>(blocks_), 0)};
  if (live_measured_) {
    // Live as the next block's first op (or the op after the blocks) begins, less as this block's began: a
    // block's temporaries are gone there (at an op's end they are not, and the split would be off by them).
    for (size_t j = 0; j < static_cast<size_t>(blocks_); ++j) {
      const OpProfile &from = ops_[first_op_[j]], &to = ops_[first_op_[j + 1]];
      k[0][j] = interp_bytes(to.live_before, micro) - interp_bytes(from.live_before, micro);
      if (rc_measured_)
        k[1][j] = interp_bytes(to.live_before_rc, micro) - interp_bytes(from.live_before_rc, micro);
    }
  } else {  // profiles before these were measured: the ops' own shares
    for (size_t i = 0; i < ops_.size(); ++i)
      if (block_[i] >= 0) k[0][static_cast<size_t>(block_[i])] += interp_bytes(ops_[i].act_bytes, micro);
  }
  return kept_[micro] = k;
}

int64_t CostModel::kept_before(size_t op, int64_t micro, const std::function<bool(int)>& rc) const {
  const auto& k = block_kept(micro);
  int64_t sum = 0;
  for (int j = 0; j < before_[op]; ++j) sum += k[rc(j) ? 1 : 0][static_cast<size_t>(j)];
  return sum;
}

OpMoments CostModel::local_moments(size_t op, bool recompute, int64_t micro) const {
  const bool rc = recompute && block_[op] >= 0 && rc_measured_;
  OpMoments m = act_moments(ops_[op], micro, rc);
  const int64_t before = kept_before(op, micro, [&](int) { return rc; });
  m.shift(-before);
  return m;
}

int64_t CostModel::loss_load(int64_t micro) const {
  const int64_t peak = interp_bytes(loss_peak_, micro);
  if (blocks_ == 0 || !rc_measured_) return peak;
  const size_t last = ops_.size() - 1;
  const int64_t none = kept_before(last, micro, [](int) { return false; });
  if (recompute_is_choice()) return peak - none;
  return peak - none + kept_before(last, micro, [&](int) { return o_.recompute == Recompute::all; });
}

std::vector<int64_t> CostModel::micro_batches() const {
  std::vector<int64_t> out;
  if (o_.global_batch % o_.world != 0) return out;
  const int64_t local = o_.global_batch / o_.world;
  if (ops_.empty()) return out;
  for (const auto& [b, t] : ops_.front().fwd_ms)
    if (b <= local && local % b == 0) out.push_back(b);
  return out;
}

std::vector<OpChoice> CostModel::candidates(size_t op) const {
  std::vector<OpChoice> out;
  const OpProfile& p = ops_.at(op);
  std::vector<bool> recompute{false};
  if (block_[op] >= 0 && recompute_is_choice()) recompute = {false, true};
  if (block_[op] >= 0 && o_.recompute == Recompute::all) recompute = {true};
  std::vector<Strategy> strategies{Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3};
  if (o_.allow_slim) strategies.push_back(Strategy::slim);
  if (o_.hosts() > 1 && o_.allow_hybrid)
    strategies.push_back(Strategy::hsdp), strategies.push_back(Strategy::hsdp2);
  for (Strategy s : strategies)
    for (int k : {1, 2, 4, 8}) {
      if (k > 1 && (!o_.allow_splits || p.kind != "linear" || p.out_features % k != 0 || s == Strategy::slim))
        continue;
      for (bool r : recompute) out.push_back(OpChoice{s, k, r});
    }
  return out;
}

ChoiceCost CostModel::cost(size_t op, OpChoice c, int64_t micro) const {
  const OpProfile& p = ops_.at(op);
  const int64_t local = o_.global_batch / o_.world;
  const double accum = static_cast<double>(local / micro);
  // A recomputed op runs its forward again in backward, under the backward's communication (zero3's gather
  // for it is the backward's own: nn.h, Block).
  const double fwd = interp(p.fwd_ms, micro), bwd = interp(p.bwd_ms, micro) + (c.recompute ? fwd : 0);
  // Hybrid: gathers and reduce-scatters among the host's ranks (their own fits), then the owned slice
  // all-reduced among the peers on the other hosts.
  const bool hybrid = shards_within_host(c.strategy) && o_.hosts() > 1;
  auto fit = [&](const char* group_name, const char* world_name) -> const CollectiveFit& {
    auto it = coll_.find(group_name);
    return hybrid && it != coll_.end() ? it->second : coll_.at(world_name);
  };
  const CollectiveFit &ag = fit("host_all_gather", "all_gather"),
                      &rs = fit("host_reduce_scatter", "reduce_scatter"), &ar = coll_.at("all_reduce");
  const CollectiveFit* peers = coll_.count("peers_all_reduce") ? &coll_.at("peers_all_reduce") : nullptr;
  const int ranks = shard_ranks(c.strategy, o_.world, o_.per_host());
  double t_ag = 0, t_gather = 0, t_rs = 0, t_ar = 0, t_peers = 0, owned = 0;
  const bool multi = o_.world > 1;
  // Bytes per link (comm.h): a world collective runs hierarchically across hosts — rings over the R ranks of
  // the host and over the H hosts on 1/R; a host one stays in the host; a peers one crosses.
  const int R = o_.per_host(), H = o_.hosts();
  double intra = 0, inter = 0;
  auto ring = [](double bytes, int n, double times) { return n > 1 ? times * (n - 1) * bytes / n : 0.0; };
  auto world_bytes = [&](double bytes, double times) {  // times = 2 for an all-reduce
    intra += ring(bytes, R, times), inter += ring(bytes / R, H, times);
  };
  // zero3's gathers are waited for one at a time while compute runs: each pays the measured latency of a
  // collective issued among busy threads instead of the fit's α (from back-to-back collectives, threads
  // awake). Reductions and the after-step gathers go back to back and keep α.
  // That latency is calibrated on a real zero3 step, whose gathers span the world (across hosts, the slow
  // link's); hybrid sharding's gathers stay in the host and keep their own fit's α.
  const double lat = hybrid ? 0.0 : coll_overhead_;
  // Weights travel in the compute dtype, gradients in the reduce dtype.
  const double wb = o_.precision.compute_bytes(), gb = o_.precision.reduce_bytes();
  // A split param runs k collectives where one would do. The first is in the uniform step the strategy's
  // residual was calibrated on; each one more pays the busy-thread latency as zero3's gathers do (the fits'
  // α, from back-to-back collectives, is ~0 across hosts: a plan with 12 ops split ran 1.15x slower than
  // the same plan unsplit at 100 Mbit/s while the model, charging α, gave both the same step;
  // docs/cluster.md). Pieces small enough to be fused (DataParallel) travel with their block's group.
  for (int64_t numel : p.param_numels) {
    const int64_t n = numel / c.splits;
    const double padded = static_cast<double>(padded_numel(n, ranks));
    const bool fused = fits_fused_group(n, o_.fuse_bytes);
    auto pieces = [&](const CollectiveFit& fit, double bytes, double latency) {
      const double extra = fused ? 0.0 : std::max(0.0, latency - fit.alpha_ms);
      return c.splits * fit.ms(bytes) + (c.splits - 1) * extra;
    };
    if (multi) {
      t_ag += pieces(ag, wb * padded, lat);
      t_gather += c.splits * (std::max(ag.alpha_ms, lat) + ag.beta_ms_per_byte * wb * padded);
      t_rs += pieces(rs, gb * padded, lat);
      // Hybrid: the accumulated slice crosses hosts once per step, after the last micro-batch's
      // reduce-scatter (its pieces pay the latency calibrated on collectives that cross hosts).
      if (hybrid && peers) t_peers += pieces(*peers, gb * padded / ranks, coll_overhead_);
      // DDP fuses gradients into buckets: bandwidth for these bytes, latency for their share of a bucket.
      const double bytes = gb * static_cast<double>(n);
      t_ar += c.splits * (ar.beta_ms_per_byte * bytes +
                          ar.alpha_ms * std::min(1.0, bytes / static_cast<double>(o_.bucket_bytes)));
    }
    // Replicated ops (ddp, slim) step every element on every rank; sharded ones their shard.
    owned += c.splits * static_cast<double>(owned_numel(c.strategy, n, ranks));
    // What goes on each link per step (the slim round is counted below).
    const double k = c.splits, w = wb * padded, g = gb * padded;
    const double micro_batches = accum;
    switch (c.strategy) {
      case Strategy::ddp:
        world_bytes(k * gb * static_cast<double>(n), 2);
        break;
      case Strategy::zero1:
        world_bytes(k * g, 1), world_bytes(k * w, 1);
        break;
      case Strategy::zero2:
        world_bytes(k * g * micro_batches, 1), world_bytes(k * w, 1);
        break;
      case Strategy::zero3:
        world_bytes(k * (2 * w + g) * micro_batches, 1);
        break;
      case Strategy::hsdp:
      case Strategy::hsdp2: {
        const double gathers = c.strategy == Strategy::hsdp ? 2 * micro_batches : 1;
        intra += ring(k * (gathers * w + micro_batches * g), R, 1);
        inter += ring(k * g / R, H, 2);
        break;
      }
      case Strategy::slim:
        break;
    }
  }
  const double f = overlap_;
  double forward = fwd, backward_mid = bwd, backward_last = bwd, after = 0;
  switch (c.strategy) {
    case Strategy::ddp:
      backward_last = overlap(bwd, t_ar, f);
      break;
    case Strategy::zero1:
      backward_last = overlap(bwd, t_rs, f);
      after = t_ag;
      break;
    case Strategy::zero2:
    case Strategy::hsdp2:
      backward_mid = overlap(bwd, t_rs, f);
      backward_last = overlap(bwd, t_rs + t_peers, f);
      after = t_ag;
      break;
    case Strategy::zero3:
    case Strategy::hsdp:
      if (o_.prefetch > 0) {
        forward = overlap(fwd, t_gather, f);
        backward_mid = overlap(bwd, t_gather + t_rs, f);
        backward_last = overlap(bwd, t_gather + t_rs + t_peers, f);
      } else {  // gathered on demand: the gather waits in front of the compute
        forward = fwd + t_gather;
        backward_mid = overlap(bwd, t_rs, f) + t_gather;
        backward_last = overlap(bwd, t_rs + t_peers, f) + t_gather;
      }
      break;
    case Strategy::slim: {
      // Every `period` steps, an all-reduce of the selected fraction of the op's elements, after the step.
      double n = 0;
      for (int64_t numel : p.param_numels) n += static_cast<double>(numel);
      if (multi) after = ar.ms(o_.slim_wire_bytes * n * o_.slim_fraction) / std::max(1, o_.slim_period);
      world_bytes(o_.slim_wire_bytes * n * o_.slim_fraction / std::max(1, o_.slim_period), 2);
      // forward: each block's round travels while the forward runs the ops before it and is waited for at the
      // block's first use; charged here as hidden under the op's own first forward (the same sum over the
      // blocks, shifted by one op). next: under the whole next step's compute of this op, which it slows.
      const double hiding = o_.slim_apply == SlimApply::forward ? fwd
                            : o_.slim_apply == SlimApply::next  ? accum * fwd + bwd
                                                                : 0;
      if (hiding > 0) after = overlap(hiding, after, f) - hiding;
      break;
    }
  }
  ChoiceCost cc;
  cc.choice = c;
  cc.intra_bytes = multi ? intra : 0, cc.inter_bytes = multi ? inter : 0;
  cc.time_ms = accum * forward + (accum - 1) * backward_mid + backward_last + after + opt_ns_ * owned * 1e-6;
  if (auto it = residual_.find(strategy_name(c.strategy)); it != residual_.end() && !it->second.empty()) {
    double n = 0;
    for (int64_t numel : p.param_numels) n += static_cast<double>(numel);
    cc.time_ms = std::max(0.0, cc.time_ms + nearest(it->second, micro) * n / param_numel_);
  }
  cc.mem = choice_memory(p.param_numels, c, o_.world, o_.optim_states, o_.precision, o_.ranks_per_host);
  const OpMoments t = op_transients(op, c, static_cast<int64_t>(accum));
  OpMoments a = local_moments(op, c.recompute, micro);
  if (recompute_is_choice()) {  // the blocks' kept activations are charged as weight (search.cpp)
    if (block_[op] >= 0 && (op == 0 || block_[op - 1] != block_[op]))
      cc.kept_bytes = block_kept(micro)[c.recompute ? 1 : 0][static_cast<size_t>(block_[op])];
  } else {
    const int64_t before = kept_before(op, micro, [&](int) { return o_.recompute == Recompute::all; });
    a.shift(before);
  }
  cc.transient_bytes = t.most();
  cc.load_bytes = paired_peak(a, t);
  return cc;
}

OpMoments CostModel::act_moments(const OpProfile& op, int64_t micro, bool recompute) const {
  std::map<int64_t, int64_t> parts[5];
  for (const auto& [b, m] : recompute ? op.act_moments_rc : op.act_moments)
    parts[0][b] = m.before_fwd, parts[1][b] = m.fwd, parts[2][b] = m.before_bwd, parts[3][b] = m.bwd,
    parts[4][b] = m.bwd_tail;
  return OpMoments{interp_bytes(parts[0], micro), interp_bytes(parts[1], micro),
                   interp_bytes(parts[2], micro), interp_bytes(parts[3], micro),
                   interp_bytes(parts[4], micro)};
}

OpMoments CostModel::op_transients(size_t op, OpChoice c, int64_t accum) const {
  const auto key = std::make_tuple(op, static_cast<int>(c.strategy), c.splits, accum > 1, c.recompute);
  auto it = transients_.find(key);
  if (it != transients_.end()) return it->second;
  return transients_[key] = transients_in_uniform_neighbourhood(
             shapes_, op, c, o_.world, o_.prefetch, accum, o_.precision, o_.fuse_bytes, o_.ranks_per_host);
}

ActivationMoments CostModel::activations(int64_t micro,
                                         const std::map<std::string, OpChoice>* choices) const {
  ActivationMoments a;
  std::vector<bool> rc(static_cast<size_t>(blocks_), false);
  if (choices && rc_measured_)
    for (size_t i = 0; i < ops_.size(); ++i)
      if (auto it = choices->find(ops_[i].name);
          block_[i] >= 0 && it != choices->end() && it->second.recompute)
        rc[static_cast<size_t>(block_[i])] = true;
  const auto of_block = [&](int j) { return static_cast<bool>(rc[static_cast<size_t>(j)]); };
  for (size_t i = 0; i < ops_.size(); ++i) {
    OpMoments m = local_moments(i, block_[i] >= 0 && rc[static_cast<size_t>(block_[i])], micro);
    const int64_t before = kept_before(i, micro, of_block);
    m.shift(before);
    a.ops.push_back(m);
  }
  a.loss = interp_bytes(loss_peak_, micro);
  if (!ops_.empty() && blocks_ > 0)
    a.loss += kept_before(ops_.size() - 1, micro, of_block) -
              kept_before(ops_.size() - 1, micro, [](int) { return false; });
  return a;
}

double CostModel::fixed_ms(int64_t micro) const {
  const double accum = static_cast<double>(o_.global_batch / o_.world / micro);
  // Loss forward/backward every micro-batch; per step, the loss average and the gradient norm (two scalars).
  double small = 0;
  if (o_.world > 1) small = 2 * coll_.at("all_reduce").ms(8.0);
  return accum * (interp(loss_fwd_, micro) + interp(loss_bwd_, micro)) + small;
}

PlanCost CostModel::evaluate(const std::map<std::string, OpChoice>& choices, int64_t micro) const {
  PlanCost pc;
  pc.micro_batch = micro;
  pc.accum = o_.global_batch / o_.world / micro;
  pc.step_ms = fixed_ms(micro);
  std::vector<OpChoice> plan;
  int64_t persistent = 0, scratch = 0;
  for (size_t i = 0; i < ops_.size(); ++i) {
    auto it = choices.find(ops_[i].name);
    const OpChoice c = it == choices.end() ? OpChoice{} : it->second;
    ChoiceCost cc = cost(i, c, micro);
    pc.step_ms += cc.time_ms;
    persistent += cc.mem.persistent(), scratch = std::max(scratch, cc.mem.optimizer_scratch_bytes);
    plan.push_back(c);
    pc.per_op.push_back(cc);
  }
  const PeakBreakdown peak = peak_of(persistent, scratch, activations(micro, &choices),
                                     simulate_transients(shapes_, plan, o_.world, o_.prefetch, pc.accum,
                                                         o_.precision, o_.fuse_bytes, o_.ranks_per_host),
                                     shapes_);
  pc.peak_bytes = peak.peak, pc.persistent_bytes = peak.persistent;
  pc.activation_bytes = peak.activations, pc.transient_bytes = peak.transient, pc.peak_at = peak.moment;
  pc.samples_per_s = static_cast<double>(o_.global_batch) / (pc.step_ms / 1e3);
  pc.tokens_per_s = pc.samples_per_s * (model_.is_classifier() ? 1.0 : static_cast<double>(model_.seq_len));
  return pc;
}

ClusterSpec load_cluster(const std::string& path) {
  const std::string what = "--cluster " + path;
  return cluster_from_json(parse_json(read_file(path, "--cluster"), what), what);
}

ClusterSpec cluster_from_json(const nlohmann::json& j, const std::string& what) {
  const std::string path = what;
  ClusterSpec c;
  try {
    if (!j.is_object()) throw UsageError(what + ": not a JSON object");
    auto opt = [&](const char* key, double fallback) {
      return j.contains(key) ? j.at(key) : nlohmann::json(fallback);
    };
    c.name = j.value("name", path);
    c.devices = static_cast<int>(json_integer(j.at("devices"), what + ": devices", 1, 1 << 24));
    c.devices_per_node = static_cast<int>(
        json_integer(j.contains("devices_per_node") ? j.at("devices_per_node") : j.at("devices"),
                     what + ": devices_per_node", 1, 1 << 24));
    const auto& mem = j.at("memory_per_device");
    c.memory_bytes = mem.is_string() ? parse_bytes(mem.get<std::string>(), what + ": memory_per_device")
                                     : json_integer(mem, what + ": memory_per_device", 1, int64_t{1} << 60);
    c.peak_flops = json_number(j.at("peak_flops"), what + ": peak_flops", 0, 1e21, true);
    c.achievable_fraction =
        json_number(opt("achievable_fraction", 0.5), what + ": achievable_fraction", 0, 1, true);
    c.memory_bandwidth =
        json_number(opt("memory_bandwidth_GBps", 1000.0), what + ": memory_bandwidth_GBps", 0, 1e9, true) *
        1e9;
    const auto& intra = j.at("intra_node");
    c.intra_bandwidth =
        json_number(intra.at("bandwidth_GBps"), what + ": intra_node.bandwidth_GBps", 0, 1e9, true) * 1e9;
    c.intra_latency = json_number(intra.at("latency_us"), what + ": intra_node.latency_us", 0, 1e9) * 1e-6;
    const auto& inter = j.contains("inter_node") ? j.at("inter_node") : intra;
    c.inter_bandwidth =
        json_number(inter.at("bandwidth_GBps"), what + ": inter_node.bandwidth_GBps", 0, 1e9, true) * 1e9;
    c.inter_latency = json_number(inter.at("latency_us"), what + ": inter_node.latency_us", 0, 1e9) * 1e-6;
    c.overlap_slowdown = json_number(opt("overlap_slowdown", 1.1), what + ": overlap_slowdown", 1, 100);
    c.activation_bytes_per_element = static_cast<int>(json_integer(
        j.contains("activation_bytes_per_element") ? j.at("activation_bytes_per_element") : nlohmann::json(2),
        what + ": activation_bytes_per_element", 1, 8));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(what + ": missing or mistyped field (" + std::string(e.what()) + ")");
  }
  return c;
}

}  // namespace slimshard
