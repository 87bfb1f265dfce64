// prefetcher.cpp — zero3's gathers, K ahead of use in the recorded order (see prefetcher.h).
#include "prefetcher.h"

#include <algorithm>
#include <cstdio>

#include "slimshard/comm.h"

namespace slimshard {

Prefetcher::Prefetcher(Communicator& comm, int depth) : comm_(comm), depth_(std::max(0, depth)) {}

void Prefetcher::issue(size_t key, ShardedParam& p) {
  Gathered g;
  g.buf = at::empty({p.padded_numel()}, p.gather_source().options());
  g.work = comm_.all_gather(g.buf, p.gather_source(), {}, group_of(p));
  live_[key] = std::move(g);
  max_live_ = std::max(max_live_, static_cast<int>(live_.size()));
  ++gathers_;
}

// Issues the next recorded params, up to trace index `limit` (exclusive), while fewer than K+1 are live.
void Prefetcher::fill(size_t limit) {
  limit = std::min(limit, trace_.size());
  while (issued_ < limit && static_cast<int>(live_.size()) < depth_ + 1) {
    issue(issued_, *trace_[issued_]);
    ++issued_;
  }
}

void Prefetcher::fuse(const std::vector<ShardedParam*>& members) {
  for (ShardedParam* p : members) group_of_[p] = groups_.size();
  groups_.push_back(members);
}

void Prefetcher::gather_group(ShardedParam& p) {
  std::vector<at::Tensor> outs, ins;
  std::vector<ShardedParam*> now;
  for (ShardedParam* m : groups_[group_of_.at(&p)])
    if (!fused_live_.count(m)) {
      now.push_back(m);
      outs.push_back(at::empty({m->padded_numel()}, m->gather_source().options()));
      ins.push_back(m->gather_source());
    }
  WorkPtr work = comm_.all_gather_coalesced(outs, ins, group_of(p));
  for (size_t i = 0; i < now.size(); ++i) fused_live_[now[i]] = Gathered{outs[i], work};
  ++gathers_;
}

at::Tensor Prefetcher::acquire(ShardedParam& p) {
  if (group_of_.count(&p)) {
    if (!fused_live_.count(&p)) gather_group(p);
    Gathered& g = fused_live_.at(&p);
    g.work->wait();
    return g.buf;
  }
  bool follow = enabled_ && !recording_ && !broken_ && depth_ > 0;
  if (follow && (pos_ >= trace_.size() || trace_[pos_] != &p)) {
    // The order changed (it should not: same graph every pass). Stop prefetching rather than gather wrongly.
    broken_ = true, follow = false;
    std::fprintf(stderr, "[rank %d] warning: zero3 materialization order changed at %s; prefetch disabled\n",
                 comm_.rank(), p.name().c_str());
  }
  size_t key;
  if (follow) {
    key = pos_;
    if (issued_ <= pos_) issue(pos_, p), issued_ = pos_ + 1;
    fill(pos_ + static_cast<size_t>(depth_) + 1);
    ++pos_;
  } else {
    if (enabled_ && recording_) trace_.push_back(&p);
    key = next_adhoc_++;
    issue(key, p);
  }
  in_use_[&p].push_back(key);
  Gathered& g = live_.at(key);
  g.work->wait();
  return g.buf;
}

void Prefetcher::release(ShardedParam& p) {
  if (group_of_.count(&p)) {
    fused_live_.erase(&p);
    return;
  }
  auto& keys = in_use_[&p];
  if (keys.empty()) throw std::logic_error("release of " + p.name() + " without acquire");
  live_.erase(keys.front());
  keys.pop_front();
  if (enabled_ && !recording_ && !broken_ && depth_ > 0) fill(pos_ + static_cast<size_t>(depth_));
}

void Prefetcher::end_pass() {
  for (auto& [p, g] : fused_live_) g.work->wait();  // gathered for a use the pass did not make
  fused_live_.clear();
  if (!enabled_) return;
  recording_ = false;
  pos_ = issued_ = 0;
  // Gathers issued for positions the pass never reached (none when the order held) are dropped.
  for (auto it = live_.begin(); it != live_.end();) {
    it->second.work->wait();
    it = it->first < trace_.size() ? live_.erase(it) : std::next(it);
  }
}

}  // namespace slimshard
