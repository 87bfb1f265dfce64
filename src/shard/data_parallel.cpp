// data_parallel.cpp — DDP gradient synchronisation: flat buckets, all-reduce issued from the gradient hooks
// while backward runs, in bucket order on every rank (see shard.h).
#include "slimshard/comm.h"
#include "slimshard/common.h"
#include "slimshard/shard.h"

namespace slimshard {

DataParallel::DataParallel(Communicator& comm, std::vector<ShardedParam*> params, int64_t bucket_bytes)
    : comm_(comm), params_(std::move(params)) {
  // Reverse creation order: the last layers' gradients come first in backward.
  std::vector<ShardedParam*> order(params_.rbegin(), params_.rend());
  std::vector<std::vector<ShardedParam*>> groups;
  int64_t bytes = 0;
  for (ShardedParam* p : order) {
    const int64_t b = p->numel() * static_cast<int64_t>(p->master().element_size());
    if (groups.empty() || (bytes + b > bucket_bytes && bytes > 0)) groups.emplace_back(), bytes = 0;
    groups.back().push_back(p);
    bytes += b;
  }
  for (auto& g : groups) {
    int64_t n = 0;
    for (ShardedParam* p : g) n += p->numel();
    Bucket bucket;
    bucket.flat = at::zeros({n}, g.front()->master().options());
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
}

DataParallel::~DataParallel() {
  for (ShardedParam* p : params_) p->set_grad_ready_hook(nullptr);
}

int64_t DataParallel::bucket_buffer_bytes() const {
  int64_t b = 0;
  for (const auto& k : buckets_) b += static_cast<int64_t>(k.flat.nbytes());
  return b;
}

void DataParallel::broadcast_from_rank0() {
  std::vector<WorkPtr> works;
  for (ShardedParam* p : params_) works.push_back(comm_.broadcast(p->master(), 0));
  for (auto& w : works) w->wait();
}

void DataParallel::begin_backward(bool sync) {
  sync_ = sync;
  if (!sync) return;
  next_launch_ = 0;
  for (auto& b : buckets_) b.pending = static_cast<int>(b.params.size()), b.work.reset();
  for (ShardedParam* p : params_) produced_[p] = false;
}

void DataParallel::on_grad_ready(ShardedParam& p) {
  if (!sync_ || comm_.world() == 1) return;
  bool& done = produced_[&p];
  if (done)
    throw std::logic_error(
        "parameter " + p.name() +
        " produced its gradient twice in one backward; shared weights are not supported by DDP "
        "buckets");
  done = true;
  Bucket& b = buckets_[static_cast<size_t>(bucket_of_.at(&p))];
  if (--b.pending == 0) launch_ready_buckets();
}

// Buckets go out strictly in index order, so every rank issues the same sequence of collectives.
void DataParallel::launch_ready_buckets() {
  while (next_launch_ < num_buckets() && buckets_[static_cast<size_t>(next_launch_)].pending == 0) {
    Bucket& b = buckets_[static_cast<size_t>(next_launch_++)];
    b.work = comm_.all_reduce(b.flat, ReduceOp::avg);
  }
}

void DataParallel::finish_backward() {
  if (comm_.world() == 1) return;
  // Gradients a step did not produce (unused params) are zero; their buckets still go, in order.
  for (auto& b : buckets_) b.pending = 0;
  launch_ready_buckets();
  for (auto& b : buckets_)
    if (b.work) b.work->wait();
  sync_ = false;
}

double DataParallel::grad_sq_sum() {
  double s = 0;
  for (const auto& b : buckets_) s += b.flat.dot(b.flat).item<double>();
  return s;
}

}  // namespace slimshard
