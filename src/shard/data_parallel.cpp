// data_parallel.cpp — gradient synchronisation and parameter gathering for every strategy (see
// data_parallel.h): DDP buckets all-reduced from the backward hooks, ZeRO reduce-scatters, in-place
// all-gathers after the step; zero3's gathers go through the prefetcher (prefetcher.cpp).
#include "slimshard/data_parallel.h"

#include <algorithm>

#include "prefetcher.h"
#include "slimshard/comm.h"
#include "slimshard/common.h"
#include "slimshard/hash.h"

namespace slimshard {
DataParallel::DataParallel(Communicator& comm, std::vector<ShardedParam*> params,
                           const std::vector<Strategy>& strategies, const Options& o)
    : comm_(comm), reduce_(o.precision.reduce), defer_gathers_(o.defer_gathers), params_(std::move(params)) {
  if (strategies.size() != params_.size()) throw std::logic_error("DataParallel: one strategy per param");
  // Rank 0's initial weights, everywhere; then each rank keeps what its strategy says.
  std::vector<WorkPtr> works;
  for (ShardedParam* p : params_) works.push_back(comm_.broadcast(p->master(), 0));
  for (auto& w : works) w->wait();
  const Topology& t = comm_.topology();
  for (size_t i = 0; i < params_.size(); ++i) {
    // Hybrid strategies shard among the host's ranks (the same slice on every host).
    const bool hybrid = shards_within_host(strategies[i]);
    params_[i]->shard(strategies[i], hybrid ? t.local_rank : comm_.rank(),
                      shard_ranks(strategies[i], comm_.world(), t.local_size), o.precision.compute);
    if (is_sharded(strategies[i])) any_sharded_ = true;
    if (hybrid && !t.uniform)
      throw UsageError("strategy " + std::string(strategy_name(strategies[i])) + " (" + params_[i]->name() +
                       "): the hosts run different numbers of ranks; hybrid sharding needs the same on each");
    if (gathers_on_use(strategies[i])) {
      if (!prefetcher_) prefetcher_ = std::make_unique<Prefetcher>(comm_, o.prefetch);
      params_[i]->set_gatherer(prefetcher_.get());
    }
  }
  // DDP buckets: reverse creation order, the last layers' gradients come first in backward.
  std::vector<std::vector<ShardedParam*>> groups;
  int64_t bytes = 0;
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    ShardedParam* p = *it;
    if (p->strategy() != Strategy::ddp) continue;
    const int64_t b = p->numel() * static_cast<int64_t>(p->master().element_size());
    // A new bucket when this param would overflow the current one (a param larger than a bucket gets its
    // own).
    if (groups.empty() || (bytes + b > o.bucket_bytes && bytes > 0)) groups.emplace_back(), bytes = 0;
    groups.back().push_back(p);
    bytes += b;
  }
  for (auto& g : groups) {
    int64_t n = 0;
    for (ShardedParam* p : g) n += p->numel();
    Bucket bucket;
    bucket.flat = at::zeros({n}, g.front()->master().options());
    if (narrow_wire(bucket.flat) && comm_.world() > 1)
      bucket.wire = at::empty({n}, bucket.flat.options().dtype(reduce_));
    int64_t off = 0;
    for (ShardedParam* p : g) {
      p->set_grad_storage(bucket.flat.slice(0, off, off + p->numel()));
      off += p->numel();
      bucket_of_[p] = static_cast<int>(buckets_.size());
    }
    bucket.params = std::move(g);
    buckets_.push_back(std::move(bucket));
  }
  for (ShardedParam* p : params_) p->set_grad_ready_hook([this](ShardedParam& q) { on_grad_ready(q); });
  // Fusion: small sharded params by (block, strategy), groups of two or more.
  std::vector<std::pair<std::pair<std::string, int>, std::vector<ShardedParam*>>> keyed;
  for (ShardedParam* p : params_) {
    const Strategy s = p->strategy();
    if (!is_sharded(s) || comm_.world() == 1 || !fits_fused_group(p->numel(), o.fuse_bytes)) continue;
    const auto key = std::make_pair(fusion_block(p->name()), static_cast<int>(s));
    auto it = std::find_if(keyed.begin(), keyed.end(), [&](const auto& k) { return k.first == key; });
    if (it == keyed.end()) it = keyed.insert(keyed.end(), {key, {}});
    it->second.push_back(p);
  }
  for (auto& [key, members] : keyed) {
    if (members.size() < 2) continue;
    for (ShardedParam* p : members) group_of_[p] = groups_.size();
    if (gathers_on_use(members.front()->strategy())) prefetcher_->fuse(members);
    groups_.push_back(std::move(members));
  }
  pending_.resize(groups_.size());
}

void DataParallel::flush_group(size_t g) {
  auto& pending = pending_[g];
  if (pending.empty()) return;
  const Strategy s = pending.front().first->strategy();
  const bool zero1 = s == Strategy::zero1;
  std::vector<at::Tensor> ins, parts, owned;
  int64_t total = 0;
  for (auto& [p, full] : pending) {
    ins.push_back(narrow_wire(full) ? full.to(reduce_) : full);
    owned.push_back(p->grad());
    total += p->shard_numel();
  }
  // The slices land side by side in one buffer: one more collective carries them all across hosts (hybrid).
  at::Tensor landed = at::empty({total}, ins.front().options());
  int64_t off = 0;
  for (const auto& entry : pending) {
    parts.push_back(landed.narrow(0, off, entry.first->shard_numel()));
    off += entry.first->shard_numel();
  }
  pending.clear();  // the full gradients (zero2/zero3) go once packed
  // zero1 reduces its accumulated gradient once per step (copy); the others each micro-batch's (add).
  std::function<void()> apply = [owned, parts, zero1]() mutable {
    for (size_t i = 0; i < owned.size(); ++i)
      zero1 ? void(owned[i].copy_(parts[i])) : add_widening(owned[i], parts[i]);
  };
  if (across_hosts(s) && micro_index_ == micro_count_ - 1) {
    // The last micro-batch: the host's slices plus what earlier micro-batches accumulated cross hosts once.
    std::function<void()> fold = [owned, parts]() mutable {
      for (size_t i = 0; i < owned.size(); ++i) parts[i].add_(owned[i]);
    };
    std::function<void()> land = [owned, parts]() mutable {
      for (size_t i = 0; i < owned.size(); ++i) owned[i].copy_(parts[i]);
    };
    queue_reduction(comm_.reduce_scatter_coalesced(parts, ins, ReduceOp::avg, fold, Group::host), true);
    queue_reduction(comm_.all_reduce(landed, ReduceOp::avg, land, Group::peers), false);
  } else {
    queue_reduction(comm_.reduce_scatter_coalesced(parts, ins, ReduceOp::avg, apply, shard_group(s)), true);
  }
  bound_full_grads_in_flight();
}

void DataParallel::queue_reduction(std::shared_ptr<Work> w, bool holds_full) {
  scatters_.emplace_back(std::move(w), holds_full);
}

// At most two full gradients wait in the queue (what the memory estimate counts). A hybrid op's all-reduce
// among the peers holds only its slice: it does not count, so backward runs on while the slow link drains
// it (counting it cost the mixed plans of docs/cluster.md their overlap).
void DataParallel::bound_full_grads_in_flight() {
  auto full = [this] {
    return std::count_if(scatters_.begin(), scatters_.end(), [](auto& e) { return e.second; });
  };
  while (full() > 2) scatters_.front().first->wait(), scatters_.pop_front();
}

void DataParallel::drain_reductions() {
  for (auto& entry : scatters_) entry.first->wait();
  scatters_.clear();
}

DataParallel::~DataParallel() {
  for (ShardedParam* p : params_) p->set_grad_ready_hook(nullptr), p->set_gatherer(nullptr);
}

void DataParallel::begin_backward(int64_t index, int64_t count) {
  micro_index_ = index;
  micro_count_ = count;
  if (index != count - 1) return;
  next_launch_ = 0;
  for (auto& b : buckets_) b.pending = static_cast<int>(b.params.size()), b.work.reset();
  for (ShardedParam* p : params_) produced_[p] = false;
}

void DataParallel::on_grad_ready(ShardedParam& p) {
  const bool last = micro_index_ == micro_count_ - 1;
  const Strategy s = p.strategy();
  if (s == Strategy::slim) return;  // local gradients; Slim-DP synchronises the weights after the step
  if (frees_full_grad(s)) {
    // Every micro-batch: reduce-scatter now, free the full gradient once done. With accumulation the slice is
    // added to the owned gradient on the comm thread.
    at::Tensor full = p.take_full_grad_flat();
    if (comm_.world() == 1 && micro_count_ == 1) {
      p.grad().copy_(full);
      return;
    }
    if (auto g = group_of_.find(&p); g != group_of_.end()) {
      pending_[g->second].emplace_back(&p, std::move(full));
      if (pending_[g->second].size() == groups_[g->second].size()) flush_group(g->second);
      return;
    }
    const Group g = shard_group(s);
    if (micro_count_ == 1 && !narrow_wire(full) && !across_hosts(s)) {
      queue_reduction(comm_.reduce_scatter(p.grad(), full, ReduceOp::avg, {}, g), true);
    } else {
      // Into a slice added to the owned gradient (accumulation; a bf16 wire, rounded once for the trip, the
      // fp32 gradient freed now; hybrid: the host's slice then averaged with the peers on the other hosts).
      at::Tensor wire = narrow_wire(full) ? full.to(reduce_) : full;
      full.reset();
      at::Tensor part = at::empty({p.shard_numel()}, wire.options()), owned = p.grad();
      std::function<void()> add = [owned, part]() mutable { add_widening(owned, part); };
      if (across_hosts(s) && last) {
        // Hybrid, last micro-batch: this one's host slice plus the accumulated ones, averaged across hosts
        // once per step (the callbacks run on the comm thread in order, between the two collectives).
        std::function<void()> fold = [owned, part]() mutable { part.add_(owned); };
        std::function<void()> land = [owned, part]() mutable { owned.copy_(part); };
        queue_reduction(comm_.reduce_scatter(part, wire, ReduceOp::avg, fold, g), true);
        queue_reduction(comm_.all_reduce(part, ReduceOp::avg, land, Group::peers), false);
      } else {
        queue_reduction(comm_.reduce_scatter(part, wire, ReduceOp::avg, add, g), true);
      }
    }
    bound_full_grads_in_flight();
    return;
  }
  if (!last || comm_.world() == 1) {
    if (s == Strategy::zero1 && last) p.grad().copy_(p.full_grad_flat());
    return;
  }
  bool& done = produced_[&p];
  if (done)
    throw std::logic_error("parameter " + p.name() +
                           " produced its gradient twice in one backward; shared weights are not supported");
  done = true;
  if (s == Strategy::zero1) {
    if (auto g = group_of_.find(&p); g != group_of_.end()) {
      pending_[g->second].emplace_back(&p, p.full_grad_flat());
      if (pending_[g->second].size() == groups_[g->second].size()) flush_group(g->second);
      return;
    }
    if (narrow_wire(p.full_grad_flat())) {
      at::Tensor wire = p.full_grad_flat().to(reduce_);
      at::Tensor part = at::empty({p.shard_numel()}, wire.options()), owned = p.grad();
      queue_reduction(
          comm_.reduce_scatter(part, wire, ReduceOp::avg, [owned, part]() mutable { owned.copy_(part); }),
          false);
    } else {
      queue_reduction(comm_.reduce_scatter(p.grad(), p.full_grad_flat(), ReduceOp::avg), false);
    }
    return;
  }
  Bucket& b = buckets_[static_cast<size_t>(bucket_of_.at(&p))];
  if (--b.pending == 0) launch_ready_buckets();
}

// Buckets go out strictly in index order, so every rank issues the same sequence of collectives.
void DataParallel::launch_ready_buckets() {
  while (next_launch_ < num_buckets() && buckets_[static_cast<size_t>(next_launch_)].pending == 0) {
    Bucket& b = buckets_[static_cast<size_t>(next_launch_++)];
    if (b.wire.defined()) b.wire.copy_(b.flat);
    b.work = comm_.all_reduce(b.wire.defined() ? b.wire : b.flat, ReduceOp::avg);
  }
}

void DataParallel::end_backward(bool last) {
  // A param the forward did not use (or that ran no forward) still has its gather from the last step in
  // flight: the optimizer must not write its slice under it.
  if (last) wait_gathers();
  if (prefetcher_) prefetcher_->end_pass();
  // Groups some of whose params produced no gradient (unused) go now, in order, the same on every rank.
  for (size_t g = 0; g < groups_.size(); ++g) flush_group(g);
  // Every micro-batch's reduce-scatters finish before the next forward: their full gradients are never alive
  // beside another micro-batch's activations (what the memory estimate counts on).
  drain_reductions();
  if (!last) return;
  if (comm_.world() > 1) {
    // Gradients a step did not produce (unused params) are zero; their buckets still go, in order.
    for (auto& b : buckets_) b.pending = 0;
    launch_ready_buckets();
    for (auto& b : buckets_) {
      if (b.work) b.work->wait();
      if (b.work && b.wire.defined()) b.flat.copy_(b.wire);
    }
  }
  drain_reductions();
}

double DataParallel::grad_sq_sum() {
  double replicated = 0;
  for (const auto& b : buckets_) replicated += b.flat.dot(b.flat).item<double>();
  for (ShardedParam* p : params_)  // slim gradients are this rank's own: so is their norm
    if (p->strategy() == Strategy::slim) replicated += p->grad().dot(p->grad()).item<double>();
  if (!any_sharded_) return replicated;
  at::Tensor sharded = at::zeros({1}, at::kDouble);
  // A hybrid slice is held alike on every host: counted once over the world's sum.
  const double copies = comm_.topology().hosts;
  for (ShardedParam* p : params_)
    if (is_sharded(p->strategy()))
      sharded +=
          p->grad().dot(p->grad()).to(at::kDouble) / (shards_within_host(p->strategy()) ? copies : 1.0);
  comm_.all_reduce(sharded)->wait();
  return replicated + sharded.item<double>();
}

void DataParallel::after_optimizer_step() {
  // In the params' order, which is the forward's, a fused group at its first member's place: the next forward
  // waits for each in the order they go out. Each working copy is refreshed just before its gather.
  std::vector<bool> issued(groups_.size(), false);
  for (ShardedParam* p : params_) {
    if (p->gather_pending()) continue;  // a Slim-DP round in flight (--slim-apply forward) refreshes it
    const auto g = gathers_after_step(p->strategy()) ? group_of_.find(p) : group_of_.end();
    if (g == group_of_.end()) {
      p->refresh_working();
      if (gathers_after_step(p->strategy()))
        p->set_pending_gather(
            comm_.all_gather(p->flat_param(), p->owned_working(), {}, shard_group(p->strategy())));
      continue;
    }
    if (issued[g->second]) continue;
    issued[g->second] = true;
    const std::vector<ShardedParam*>& members = groups_[g->second];
    std::vector<at::Tensor> outs, ins;
    for (ShardedParam* q : members) {
      q->refresh_working();
      outs.push_back(q->flat_param()), ins.push_back(q->owned_working());
    }
    const WorkPtr w = comm_.all_gather_coalesced(outs, ins, shard_group(p->strategy()));
    for (ShardedParam* q : members) q->set_pending_gather(w);
  }
  if (!defer_gathers_) wait_gathers();
}

void DataParallel::wait_gathers() {
  for (ShardedParam* p : params_) p->wait_gather();
}

DataParallel::PrefetchStats DataParallel::prefetch_stats() const {
  PrefetchStats s;
  if (!prefetcher_) return s;
  s.depth = prefetcher_->depth();
  s.max_live = prefetcher_->max_live();
  s.gathers = prefetcher_->gathers();
  for (const ShardedParam* p : params_)
    if (gathers_on_use(p->strategy()))
      s.largest_buffer_bytes =
          std::max<int64_t>(s.largest_buffer_bytes,
                            p->padded_numel() * static_cast<int64_t>(p->gather_source().element_size()));
  return s;
}

void DataParallel::set_prefetch_enabled(bool on) {
  if (prefetcher_) prefetcher_->set_enabled(on);
}

std::vector<std::pair<std::string, at::Tensor>> DataParallel::full_values() {
  wait_gathers();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (ShardedParam* p : params_) {
    if (p->has_full_master()) {
      out.emplace_back(p->name(), p->full_value());
      continue;
    }
    at::Tensor buf = at::empty({p->padded_numel()}, p->master().options());
    comm_.all_gather(buf, p->master(), {}, shard_group(p->strategy()))->wait();
    out.emplace_back(p->name(), buf.slice(0, 0, p->numel()).view(p->shape()).clone());
  }
  return out;
}

int64_t DataParallel::replicated_checksum() {
  wait_gathers();
  uint64_t h = kFnvOffset;
  for (ShardedParam* p : params_) {
    const at::Tensor v = p->replicated_value();
    if (!v.defined()) continue;  // zero3: shards differ by construction
    const at::Tensor t = v.contiguous();
    h = fnv1a_bytes(h, t.data_ptr(), t.nbytes());
  }
  return static_cast<int64_t>(h);
}

}  // namespace slimshard
