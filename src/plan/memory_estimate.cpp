// memory_estimate.cpp — bytes per rank for a plan: persistent params, grads and optimizer state by strategy,
// activations from a probe run of the real model, transients simulated as the engine holds them, and the one
// peak over all moments of a step (see memory_estimate.h).
#include "slimshard/memory_estimate.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <set>
#include <tuple>

#include "slimshard/common.h"
#include "slimshard/memory.h"

namespace slimshard {

std::set<std::string> recomputed_blocks(const std::map<std::string, OpChoice>& choices) {
  std::set<std::string> out;
  for (const auto& [op, c] : choices)
    if (c.recompute && !block_of(op).empty()) out.insert(block_of(op));
  return out;
}

ActivationProfile probe_activations(const ModelConfig& config, int64_t micro_batch, uint64_t seed,
                                    at::ScalarType compute, const std::set<std::string>& recompute) {
  ActivationProfile prof;
  prof.micro_batch = micro_batch;
  prof.recompute = recompute;
  auto model = build_model(config, seed);
  for (Block* b : model->blocks()) b->set_recompute(recompute.count(b->name()) > 0);
  // Laid out as training lays it out, so that the gradients exist before backward: they are persistent
  // memory, counted by strategy (in a model never sharded, backward would allocate them as it goes).
  // (In mixed precision the working copies are persistent too: choice_memory counts them.)
  for (ShardedParam* p : model->params().all()) p->shard(Strategy::ddp, 0, 1, compute);
  const int64_t base = memory::live_bytes();
  const auto [x, y] = random_inputs(config, micro_batch, seed);  // the batch is live through the step too
  int64_t prev = base;
  memory::reset_peaks();
  // An op's backward splits at the hand-over of a weight gradient: the peak before it is kept aside, and the
  // span restarts, so at the op's end the peak since the last one is the backward's tail (OpMoments).
  int64_t head = -1;  // the backward's peak before its last weight hand-over; -1: none yet
  for (ShardedParam* p : model->params().all())
    if (p->name().size() > 7 && p->name().compare(p->name().size() - 7, 7, ".weight") == 0)
      p->set_grad_ready_hook([&](ShardedParam&) {
        head = std::max(head, memory::peak_bytes() - base);
        memory::reset_peaks();
      });
  // Each call closes a span: the peak since the last call belongs to the moment that ends here.
  set_op_observer([&](const Op& op, OpPhase phase) {
    // A recomputed forward inside backward: its peak stays for the backward moment that follows.
    if (recomputing() && (phase == OpPhase::forward_begin || phase == OpPhase::forward_end)) return;
    const int64_t peak = memory::peak_bytes() - base;
    if (phase == OpPhase::forward_begin) prof.live_before.emplace(op.name(), memory::live_bytes() - base);
    OpMoments& m = prof.moments[op.name()];
    if (phase == OpPhase::backward_end) {
      m.bwd = std::max({m.bwd, head, peak});
      m.bwd_tail = std::max(m.bwd_tail, head >= 0 ? peak : m.bwd);
    }
    int64_t& into = phase == OpPhase::forward_begin    ? m.before_fwd
                    : phase == OpPhase::forward_end    ? m.fwd
                    : phase == OpPhase::backward_begin ? m.before_bwd
                                                       : m.bwd;
    into = std::max(into, peak);
    head = -1;
    if (phase == OpPhase::forward_end) {
      const int64_t now = memory::live_bytes();
      prof.op_bytes[op.name()] += now - prev;
      prev = now;
    }
    memory::reset_peaks();
  });
  at::Tensor loss;
  try {
    loss = model->loss(x, y);
    const int64_t end_forward = memory::live_bytes();
    prof.op_bytes["(loss)"] += end_forward - prev;
    prof.loss_peak = memory::peak_bytes() - base;
    prof.total_bytes = end_forward - base;
    memory::reset_peaks();
    loss.backward();
  } catch (...) {
    set_op_observer(nullptr);
    throw;
  }
  set_op_observer(nullptr);
  int64_t highest = memory::peak_bytes() - base;  // the tail after the last op's backward
  for (const auto& [op, m] : prof.moments) highest = std::max({highest, m.before_bwd, m.bwd});
  prof.backward_extra = std::max<int64_t>(0, highest - prof.total_bytes);
  return prof;
}

int64_t ActivationMoments::highest() const {
  int64_t h = loss;
  for (const OpMoments& m : ops) h = std::max(h, m.most());
  return h;
}

ActivationMoments activation_moments(const ActivationProfile& act, const std::vector<OpShape>& ops) {
  ActivationMoments m;
  for (const OpShape& op : ops) {
    auto it = act.moments.find(op.name);
    m.ops.push_back(it == act.moments.end() ? OpMoments{} : it->second);
  }
  m.loss = act.loss_peak;
  return m;
}

ChoiceMemory choice_memory(const std::vector<int64_t>& param_numels, OpChoice c, int world, int optim_states,
                           const Precision& prec, int per_host) {
  constexpr int64_t kF = 4;  // fp32: masters, gradients, optimizer state
  // Mixed precision: the working copy in the compute dtype beside the master (ddp/slim full, zero1/zero2 the
  // full param instead of an fp32 one, zero3 its shard); a bf16 reduce gives DDP buckets a bf16 twin.
  const bool mixed = prec.compute != at::kFloat;
  const int64_t kC = prec.compute_bytes();
  const int64_t wire = prec.reduce == at::kBFloat16 && world > 1 ? prec.reduce_bytes() : 0;
  ChoiceMemory m;
  for (int64_t numel : param_numels) {
    const int64_t n = numel / c.splits;  // one block; splits divide the output features, so they divide numel
    const int ranks = shard_ranks(c.strategy, world, per_host);
    const int64_t padded = padded_numel(n, ranks), owned = owned_numel(c.strategy, n, ranks);
    // AdamW steps each tensor in one fused pass with no temporaries (optim/adamw_kernel.cpp); SGD and
    // Slim-DP's corrected AdamW run LibTorch ops that allocate one owned-sized temporary.
    const bool fused = optim_states == 2 && c.strategy != Strategy::slim;
    if (!fused) m.optimizer_scratch_bytes = std::max(m.optimizer_scratch_bytes, kF * owned);
    for (int b = 0; b < c.splits; ++b) {
      m.optim_bytes += kF * optim_states * owned;
      switch (c.strategy) {
        case Strategy::ddp:
          m.param_bytes += kF * n + (mixed ? kC * n : 0), m.grad_bytes += kF * n + wire * n;
          break;
        case Strategy::zero1:
          m.param_bytes += mixed ? kF * owned + kC * padded : kF * padded;
          m.grad_bytes += kF * (padded + owned);
          break;
        case Strategy::zero2:
        case Strategy::hsdp2:
          m.param_bytes += mixed ? kF * owned + kC * padded : kF * padded;
          m.grad_bytes += kF * owned;
          break;
        case Strategy::zero3:
        case Strategy::hsdp:
          m.param_bytes += kF * owned + (mixed ? kC * owned : 0), m.grad_bytes += kF * owned;
          break;
        case Strategy::slim:
          // As ddp, plus what Slim-DP keeps: the anchor and the signal (fp32 each), the core and selection
          // masks (a byte each) and the packed round (4 bytes per selected element, ~1.3 at the defaults):
          // ~11 bytes.
          m.param_bytes += 3 * kF * n + 3 * n + (mixed ? kC * n : 0), m.grad_bytes += kF * n;
          break;
      }
    }
  }
  return m;
}

// ---------------------------------------------------------------------------------------------------------------
namespace {

// What an op does with its params, in order: a block of a param acquired (gathered, zero3) or released, its
// full gradient allocated or handed over to be reduced; and the moments to sample. Mirrors nn/ops.cpp.
enum class Ev : uint8_t { acquire, release, grad, ready, sample };
struct Event {
  Ev ev;
  int param, block;  // param: 0 weight, 1 bias
};

std::vector<Event> op_events(const OpShape& op, int splits, bool backward) {
  const bool bias = op.param_numels.size() > 1;
  std::vector<Event> e;
  auto add = [&](Ev ev, int param, int block = 0) { e.push_back({ev, param, block}); };
  if (op.kind == "embedding") {
    if (backward)
      add(Ev::grad, 0), add(Ev::sample, 0), add(Ev::ready, 0);
    else
      add(Ev::acquire, 0), add(Ev::sample, 0), add(Ev::release, 0);
    return e;
  }
  if (op.kind == "linear") {
    for (int j = 0; j < splits; ++j) {
      if (backward) {
        add(Ev::acquire, 0, j), add(Ev::grad, 0, j), add(Ev::sample, 0), add(Ev::release, 0, j);
        add(Ev::ready, 0, j);
        if (bias) add(Ev::grad, 1, j), add(Ev::sample, 0), add(Ev::ready, 1, j);
      } else {
        add(Ev::acquire, 0, j);
        if (bias) add(Ev::acquire, 1, j);
        add(Ev::sample, 0);
        if (splits == 1) add(Ev::release, 0, j);
        if (bias) add(Ev::release, 1, j);
        if (splits > 1) add(Ev::release, 0, j);
      }
    }
    return e;
  }
  // layernorm, conv2d: weight and bias together in forward; conv2d's backward gathers the weight alone.
  const bool both = op.kind == "layernorm";
  if (!backward) {
    add(Ev::acquire, 0), add(Ev::acquire, 1), add(Ev::sample, 0), add(Ev::release, 0), add(Ev::release, 1);
    return e;
  }
  add(Ev::acquire, 0);
  if (both) add(Ev::acquire, 1);
  add(Ev::sample, 0), add(Ev::release, 0);
  if (both) add(Ev::release, 1);
  add(Ev::grad, 0), add(Ev::sample, 0), add(Ev::ready, 0), add(Ev::grad, 1), add(Ev::sample, 0),
      add(Ev::ready, 1);
  return e;
}

// op_events, kept per kind of op (the search simulates thousands of plans of the same few kinds).
const std::vector<Event>& events_of(const OpShape& op, int splits, bool backward) {
  thread_local std::map<std::tuple<std::string, size_t, int, bool>, std::vector<Event>> cache;
  const auto key = std::make_tuple(op.kind, op.param_numels.size(), splits, backward);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, op_events(op, splits, backward)).first;
  return it->second;
}

// One step of the engine's memory behaviour over a plan: the prefetcher's window over the recorded order of
// zero3 gathers (prefetcher.cpp), and the queue of gradients being reduce-scattered (data_parallel.cpp).
class TransientSim {
 public:
  TransientSim(const std::vector<OpShape>& ops, const std::vector<OpChoice>& choices, int world, int prefetch,
               int64_t accum, const Precision& prec, int64_t fuse_bytes, int per_host)
      : ops_(ops),
        choices_(choices),
        world_(world),
        per_host_(per_host),
        depth_(std::max(0, prefetch)),
        accum_(accum),
        gather_bytes_(prec.compute_bytes()),
        narrow_wire_(prec.reduce == at::kBFloat16) {
    for (size_t i = 0; i < ops.size(); ++i) base_.push_back(static_cast<int>(ids_)), ids_ += 2 * 64;
    for (size_t i = 0; i < ops.size(); ++i)
      events_.push_back(
          {&events_of(ops[i], choices[i].splits, false), &events_of(ops[i], choices[i].splits, true)});
    find_blocks();
    find_groups(fuse_bytes);
    record_trace();
  }

  // One micro-batch's forward and backward in the steady state (the order recorded): every micro-batch is
  // alike, since the engine waits for its reductions before the next one. Before an op runs, what is live is
  // what the ops before it left gathered or in flight.
  // A recomputed block (nn.h: Block) runs its forward again before its backward, keeping what it gathers
  // until the backward releases it, and whatever that leaves (biases) when the block's backward ends: that
  // forward's moments belong to the moment before the block's backward.
  TransientMoments run() {
    TransientMoments t;
    t.ops.assign(ops_.size(), OpMoments{});
    for (size_t i = 0; i < ops_.size(); ++i) t.ops[i].before_fwd = live(), play(i, false, &t.ops[i].fwd);
    t.after_forward = live();
    for (size_t i = ops_.size(); i-- > 0;) {
      t.ops[i].before_bwd = live();
      if (recomputes_last(i)) {
        keeping_ = true;
        for (size_t k = block_first_[i]; k <= i; ++k) play(k, false, &t.ops[i].before_bwd);
        keeping_ = false;
      }
      play(i, true, &t.ops[i].bwd, &t.ops[i].bwd_tail);
      if (choices_[i].recompute && block_first_[i] == i) drop_kept();
    }
    return t;
  }

 private:
  // The padded elements of the member with key `id` (op, block, param).
  int64_t member_numel(int id) const {
    const size_t op =
        static_cast<size_t>(std::upper_bound(base_.begin(), base_.end(), id) - base_.begin() - 1);
    return block_numel(op, (id - base_[op]) % 2);
  }
  // The padded elements of one block of op's param.
  int64_t block_numel(size_t op, int param) const {
    const int64_t n = ops_[op].param_numels.at(static_cast<size_t>(param)) / choices_[op].splits;
    return padded_numel(n, ranks(op));
  }
  // The ranks op's params are sharded over (hybrid: the host's).
  int ranks(size_t op) const { return shard_ranks(choices_[op].strategy, world_, per_host_); }
  int64_t block_bytes(size_t op, int param) const { return 4 * block_numel(op, param); }  // fp32 gradient
  int key(size_t op, const Event& e) const { return base_[op] + 2 * e.block + e.param; }
  int64_t live() const { return gathered_bytes_ + own_bytes_ + flight_bytes_; }
  // The first op of op i's block (i itself outside blocks), and whether i ends a recomputed block.
  void find_blocks() {
    for (size_t i = 0; i < ops_.size(); ++i) {
      const std::string b = block_of(ops_[i].name);
      block_first_.push_back(!b.empty() && i > 0 && block_of(ops_[i - 1].name) == b ? block_first_[i - 1]
                                                                                    : i);
    }
  }
  bool recomputes_last(size_t i) const {
    return choices_[i].recompute && (i + 1 == ops_.size() || block_first_[i + 1] != block_first_[i]);
  }

  // The engine's fusion (DataParallel): sharded params of at most fuse_bytes (fp32) go together per block and
  // strategy, in groups of two or more.
  void find_groups(int64_t fuse_bytes) {
    if (fuse_bytes <= 0 || world_ == 1) return;
    std::map<std::pair<std::string, int>, std::vector<int>> members;
    for (size_t i = 0; i < ops_.size(); ++i) {
      const Strategy s = choices_[i].strategy;
      if (!is_sharded(s)) continue;
      const std::string block = fusion_block(ops_[i].name);
      for (int param = 0; param < static_cast<int>(ops_[i].param_numels.size()); ++param)
        if (fits_fused_group(ops_[i].param_numels[static_cast<size_t>(param)] / choices_[i].splits,
                             fuse_bytes))
          for (int b = 0; b < choices_[i].splits; ++b)
            members[{block, static_cast<int>(s)}].push_back(key(i, Event{Ev::sample, param, b}));
    }
    for (auto& [k, ids] : members) {
      if (ids.size() < 2) continue;
      for (int id : ids) group_of_[id] = groups_.size();
      groups_.push_back(ids);
    }
    pending_.assign(groups_.size(), {});
  }
  const std::vector<int>* group(int id) const {
    auto it = group_of_.find(id);
    return it == group_of_.end() ? nullptr : &groups_[it->second];
  }
  void push_flight(int64_t held) {
    flight_.push_back(held), flight_bytes_ += held;
    while (flight_.size() > 2) flight_bytes_ -= flight_.front(), flight_.pop_front();
  }

  void record_trace() {
    auto record = [&](size_t i, bool backward, std::set<int>* kept) {
      if (!gathers_on_use(choices_[i].strategy)) return;
      for (const Event& e : *events_[i][backward]) {
        if (e.ev != Ev::acquire || group(key(i, e))) continue;
        if (kept && !backward && !kept->insert(key(i, e)).second) continue;  // already gathered and kept
        if (kept && backward && kept->count(key(i, e))) continue;
        trace_.push_back(gather_bytes_ * block_numel(i, e.param));
      }
    };
    for (size_t i = 0; i < ops_.size(); ++i) record(i, false, nullptr);
    std::set<int> kept;
    for (size_t i = ops_.size(); i-- > 0;) {
      if (recomputes_last(i)) {
        kept.clear();
        for (size_t k = block_first_[i]; k <= i; ++k) record(k, false, &kept);
      }
      record(i, true, choices_[i].recompute ? &kept : nullptr);
    }
  }
  // The end of a recomputed block's backward: what it kept and did not use again is released.
  void drop_kept() {
    for (int id : kept_) release(id);
    kept_.clear();
  }
  void release(int id) {
    if (group(id)) {
      gathered_bytes_ -= fused_.at(id);
      fused_.erase(id);
      return;
    }
    const size_t at = in_use_[id].front();
    in_use_[id].pop_front();
    gathered_bytes_ -= gathered_.at(at);
    gathered_.erase(at);
    if (depth_ > 0) fill(pos_ + static_cast<size_t>(depth_));
  }
  void issue(size_t at) {
    gathered_[at] = trace_[at];
    gathered_bytes_ += trace_[at];
  }
  void fill(size_t limit) {
    limit = std::min(limit, trace_.size());
    while (issued_ < limit && static_cast<int>(gathered_.size()) < depth_ + 1) issue(issued_++);
  }
  // Plays op i's events, sampling into *most; in backward, from the hand-over of its last weight block on,
  // into *tail (OpMoments::bwd_tail).
  void play(size_t i, bool backward, int64_t* most, int64_t* tail = nullptr) {
    const Strategy s = choices_[i].strategy;
    for (const Event& e : *events_[i][backward]) {
      const int id = key(i, e);
      if (tail && e.ev == Ev::ready && e.param == 0 && e.block == choices_[i].splits - 1) most = tail;
      switch (e.ev) {
        case Ev::acquire: {
          if (!gathers_on_use(s)) break;
          if (kept_.count(id)) break;  // gathered by the recomputed forward: taken again, not gathered
          if (keeping_) kept_.insert(id);
          if (const std::vector<int>* g = group(id)) {  // the members not gathered yet, together
            if (!fused_.count(id))
              for (int m : *g)
                if (!fused_.count(m))
                  fused_[m] = gather_bytes_ * member_numel(m), gathered_bytes_ += fused_[m];
            break;
          }
          size_t at = pos_;
          if (depth_ > 0) {
            if (issued_ <= pos_) issue(pos_), issued_ = pos_ + 1;
            fill(pos_ + static_cast<size_t>(depth_) + 1);
          } else {
            at = trace_.size() + static_cast<size_t>(id), gathered_[at] = trace_[pos_],
            gathered_bytes_ += trace_[pos_];
          }
          ++pos_;
          in_use_[id].push_back(at);
          break;
        }
        case Ev::release: {
          if (!gathers_on_use(s) || keeping_) break;  // kept for the backward after the recomputed forward
          kept_.erase(id);
          release(id);
          break;
        }
        case Ev::grad:
          if (frees_full_grad(s)) own_bytes_ += block_bytes(i, e.param);
          break;
        case Ev::ready: {
          const int64_t numel = block_numel(i, e.param);
          const int64_t wire = narrow_wire_ ? 2 : 4;  // bytes per element reduced
          if (const std::vector<int>* g = group(id); g && (frees_full_grad(s) || s == Strategy::zero1)) {
            // Held until the group's last gradient; then one packed reduce-scatter of all of them.
            auto& pending = pending_[group_of_.at(id)];
            pending.push_back(numel);
            if (pending.size() < g->size()) break;
            int64_t n = 0;
            for (int64_t k : pending) n += k;
            pending.clear();
            const int64_t packed = wire * (n + 2 * n / ranks(i));  // packed in, packed out, slices
            // The moment of packing (DataParallel::flush_group): the gradients handed in are alive beside
            // the packed buffers: the fp32 ones themselves, or on a bf16 wire their copies (the fp32 ones
            // of zero2/zero3 freed just before).
            const int64_t freed = frees_full_grad(s) ? 4 * n : 0;
            *most = std::max(*most, live() + packed + (narrow_wire_ ? 2 * n - freed : 0));
            if (narrow_wire_) *most = std::max(*most, live() + 2 * n + 2 * n / ranks(i));  // before the free
            own_bytes_ -= freed;
            push_flight(packed);
            break;
          }
          int64_t held = 0;  // what travels: the gradient (or its bf16 copy) and the slice it lands in
          if (frees_full_grad(s)) {
            // On a bf16 wire the copy is made while the fp32 gradient is alive.
            if (narrow_wire_ && !(world_ == 1 && accum_ == 1)) *most = std::max(*most, live() + 2 * numel);
            own_bytes_ -= 4 * numel;
            if (world_ == 1 && accum_ == 1) break;  // copied into the owned slice at once
            // A slice to land in when accumulating, on a bf16 wire, or for the hybrid step across hosts.
            const bool slice = accum_ > 1 || narrow_wire_ || (shards_within_host(s) && ranks(i) < world_);
            held = wire * (numel + (slice ? numel / ranks(i) : 0));
          } else if (s == Strategy::zero1 && narrow_wire_ && world_ > 1) {
            held = 2 * (numel + numel / world_);  // the bf16 copy of the persistent full gradient
          } else {
            break;
          }
          push_flight(held);
          break;
        }
        case Ev::sample:
          *most = std::max(*most, live());
          break;
      }
    }
  }

  const std::vector<OpShape>& ops_;
  const std::vector<OpChoice>& choices_;
  int world_, per_host_, depth_;
  int64_t accum_;
  int64_t gather_bytes_;  // per element gathered: the compute dtype's
  bool narrow_wire_;      // gradients reduced in bf16
  std::vector<int> base_;
  std::map<int, size_t> group_of_;             // fused member (key) -> group
  std::vector<std::vector<int>> groups_;       // members, by key
  std::vector<std::vector<int64_t>> pending_;  // per group: gradients held (elements)
  std::map<int, int64_t> fused_;               // fused members gathered now: bytes
  size_t ids_ = 0;
  std::vector<int64_t> trace_;  // bytes of each recorded gather, forward then backward
  size_t pos_ = 0, issued_ = 0;
  std::map<size_t, int64_t> gathered_;  // by trace position (or above the trace: on demand)
  std::map<int, std::deque<size_t>> in_use_;
  std::deque<int64_t> flight_;  // gradients being reduce-scattered, oldest first
  std::vector<size_t> block_first_;
  std::vector<std::array<const std::vector<Event>*, 2>> events_;  // per op: forward, backward
  bool keeping_ = false;                                          // playing a recomputed forward
  std::set<int> kept_;  // gathered by it and not yet released by the backward
  int64_t gathered_bytes_ = 0, own_bytes_ = 0, flight_bytes_ = 0;
};

}  // namespace

TransientMoments simulate_transients(const std::vector<OpShape>& ops, const std::vector<OpChoice>& choices,
                                     int world, int prefetch, int64_t accum, const Precision& prec,
                                     int64_t fuse_bytes, int per_host) {
  return TransientSim(ops, choices, world, prefetch, accum, prec, fuse_bytes, per_host).run();
}

OpMoments transients_in_uniform_neighbourhood(const std::vector<OpShape>& ops, size_t i, OpChoice c,
                                              int world, int prefetch, int64_t accum, const Precision& prec,
                                              int64_t fuse_bytes, int per_host) {
  // Only neighbours reach op i: the prefetcher's window of K+1 gathers and the two reductions in flight, a
  // few ops either side (the window is wider than that reach).
  const size_t reach = static_cast<size_t>(std::max(0, prefetch)) + 4;
  const size_t lo = i > reach ? i - reach : 0, hi = std::min(ops.size(), i + reach + 1);
  const std::vector<OpShape> window(ops.begin() + static_cast<std::ptrdiff_t>(lo),
                                    ops.begin() + static_cast<std::ptrdiff_t>(hi));
  std::vector<OpChoice> plan;
  const std::string block = block_of(ops[i].name);
  for (const OpShape& op : window) {
    const bool split = op.kind == "linear" && op.out_features % c.splits == 0;
    const bool same_block = !block.empty() && block_of(op.name) == block;  // recomputes as a whole
    plan.push_back(OpChoice{c.strategy, split ? c.splits : 1, c.recompute && same_block});
  }
  plan[i - lo] = c;
  return simulate_transients(window, plan, world, prefetch, accum, prec, fuse_bytes, per_host).ops[i - lo];
}

PeakBreakdown peak_of(int64_t persistent, int64_t optimizer_scratch, const ActivationMoments& a,
                      const TransientMoments& t, const std::vector<OpShape>& ops) {
  PeakBreakdown best;
  auto consider = [&](int64_t act, int64_t tr, const std::string& moment) {
    if (persistent + act + tr > best.peak || best.moment.empty())
      best = PeakBreakdown{persistent + act + tr, persistent, act, tr, moment};
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    consider(a.ops[i].before_fwd, t.ops[i].before_fwd, "forward before " + ops[i].name);
    consider(a.ops[i].fwd, t.ops[i].fwd, "forward of " + ops[i].name);
  }
  consider(a.loss, t.after_forward, "loss");
  for (size_t i = ops.size(); i-- > 0;) {
    consider(a.ops[i].before_bwd, t.ops[i].before_bwd, "backward before " + ops[i].name);
    consider(a.ops[i].bwd, t.ops[i].bwd, "backward of " + ops[i].name);
    consider(a.ops[i].bwd_tail, t.ops[i].bwd_tail,
             "backward of " + ops[i].name + ", its gradient handed over");
  }
  consider(0, optimizer_scratch, "optimizer");
  return best;
}

MemoryEstimate estimate_memory(const std::vector<OpShape>& ops,
                               const std::map<std::string, OpChoice>& choices, int world, int prefetch,
                               int optim_states, int64_t accum, const ActivationProfile& act,
                               const Precision& prec, int64_t fuse_bytes, int per_host) {
  MemoryEstimate est;
  std::vector<OpChoice> plan;
  int64_t scratch = 0;
  for (const OpShape& op : ops) {
    OpMemory m;
    m.op = op.name;
    m.choice = choices.at(op.name);
    auto it = act.op_bytes.find(op.name);
    m.activation_bytes = it == act.op_bytes.end() ? 0 : it->second;
    for (int64_t n : op.param_numels) m.params += n;
    const ChoiceMemory cm = choice_memory(op.param_numels, m.choice, world, optim_states, prec, per_host);
    m.param_bytes = cm.param_bytes, m.grad_bytes = cm.grad_bytes, m.optim_bytes = cm.optim_bytes;
    est.persistent += m.persistent();
    scratch = std::max(scratch, cm.optimizer_scratch_bytes);
    plan.push_back(m.choice);
    est.ops.push_back(m);
  }
  const TransientMoments t =
      simulate_transients(ops, plan, world, prefetch, accum, prec, fuse_bytes, per_host);
  for (size_t i = 0; i < ops.size(); ++i) est.ops[i].transient_bytes = t.ops[i].most();
  est.peak = peak_of(est.persistent, scratch, activation_moments(act, ops), t, ops);
  return est;
}

void print_memory_estimate(const MemoryEstimate& est) {
  auto mib = [](int64_t b) { return format_mib(static_cast<double>(b)); };
  std::printf("%-22s %10s %-9s %6s %9s %9s %9s %11s %11s\n", "op", "params", "strategy", "splits",
              "param MiB", "grad MiB", "optim MiB", "transient", "activations");
  int64_t pb = 0, gb = 0, ob = 0;
  for (const OpMemory& m : est.ops) {
    const std::string choice =
        std::string(strategy_name(m.choice.strategy)) + (m.choice.recompute ? " rc" : "");
    std::printf("%-22s %10lld %-9s %6d %9s %9s %9s %11s %11s\n", m.op.c_str(), (long long)m.params,
                choice.c_str(), m.choice.splits, mib(m.param_bytes).c_str(), mib(m.grad_bytes).c_str(),
                mib(m.optim_bytes).c_str(), mib(m.transient_bytes).c_str(), mib(m.activation_bytes).c_str());
    pb += m.param_bytes, gb += m.grad_bytes, ob += m.optim_bytes;
  }
  std::printf("%-22s %10s %-9s %6s %9s %9s %9s\n", "total", "", "", "", mib(pb).c_str(), mib(gb).c_str(),
              mib(ob).c_str());
  const PeakBreakdown& p = est.peak;
  std::printf(
      "predicted peak per rank: %s MiB at the %s = persistent %s + activations %s + transient %s (LibTorch "
      "tensors; the shared-memory staging of the communicator is extra)\n",
      mib(p.peak).c_str(), p.moment.c_str(), mib(p.persistent).c_str(), mib(p.activations).c_str(),
      mib(p.transient).c_str());
}

nlohmann::json memory_estimate_json(const MemoryEstimate& est, int world) {
  nlohmann::json ops = nlohmann::json::array();
  for (const OpMemory& m : est.ops)
    ops.push_back({{"op", m.op},
                   {"params", m.params},
                   {"strategy", strategy_name(m.choice.strategy)},
                   {"splits", m.choice.splits},
                   {"recompute", m.choice.recompute},
                   {"param_bytes", m.param_bytes},
                   {"grad_bytes", m.grad_bytes},
                   {"optim_bytes", m.optim_bytes},
                   {"transient_bytes", m.transient_bytes},
                   {"activation_bytes", m.activation_bytes}});
  return {{"world", world},
          {"peak_bytes", est.peak.peak},
          {"peak_at", est.peak.moment},
          {"persistent_bytes", est.persistent},
          {"activation_bytes", est.peak.activations},
          {"transient_bytes", est.peak.transient},
          {"ops", ops}};
}

}  // namespace slimshard
