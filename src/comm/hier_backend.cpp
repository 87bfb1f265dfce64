// hier_backend.cpp — collectives across hosts, hierarchically (as NCCL's and Horovod's hierarchical
// all-reduce): within a host through the shared-memory window (shm_backend.cpp), between hosts plain MPI
// among the ranks with the same local index, so that each host link carries 1/R of the data (R ranks per
// host) and the R ranks of a host use their links in parallel.
//   all-reduce      reduce-scatter in the host → all-reduce of the 1/R chunk across hosts → all-gather in the
//   host reduce-scatter  reduce-scatter in the host (each rank the slices of its local index on every host)
//                   → reduce-scatter across hosts
//   all-gather      all-gather across hosts (the slices of this local index) → all-gather in the host
// Ranks need not be numbered host by host: slices are permuted into and out of (local index, host) order.
// Sums run in the host first, then across hosts; an average divides once, at the end.
#include <atomic>

#include "backend.h"
#include "slimshard/common.h"

namespace slimshard::comm {

std::vector<std::string> rank_labels(const Topology& t, int rank) {
  std::vector<std::string> out;
  const int host = t.host_of.empty() ? 0 : t.host_of[static_cast<size_t>(rank)];
  for (size_t g = 0; g < t.host_of.size(); ++g)
    if (t.host_of[g] == host)
      out.push_back("rank " + std::to_string(g) +
                    (t.hosts > 1 ? " on host " + t.host_names[static_cast<size_t>(host)] : ""));
  return out;
}

namespace {

class HierBackend final : public Backend {
 public:
  HierBackend(MPI_Comm comm, const Topology& t, Backend* intra, Backend* across)
      : comm_(comm), t_(t), intra_(intra), across_(across) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
    H_ = t_.hosts, R_ = t_.local_size;
    for (int r = 0; r < R_; ++r)
      for (int h = 0; h < H_; ++h) order_.push_back(t_.rank_at(h, r));
    for (size_t i = 0; i < order_.size(); ++i) identity_ = identity_ && order_[i] == static_cast<int>(i);
    std::string peers;
    for (int h = 0; h < H_; ++h)
      peers += (h ? ", " : "") + std::string("rank ") + std::to_string(t_.rank_at(h, t_.local_rank)) +
               " on host " + t_.host_names[static_cast<size_t>(h)];
    across_peers_ = "the step between hosts (" + peers + ")";
  }
  std::string name() const override { return "hier"; }
  void publish_step(int64_t step) override { intra_->publish_step(step); }
  std::string waiting_on() const override {
    return across_busy_.load() ? across_peers_ + " or the network" : intra_->waiting_on();
  }

  void all_reduce(const at::Tensor& t, ReduceOp op) override {
    const int64_t n = t.numel(), c = (n + R_ - 1) / R_;
    at::Tensor flat = t.view({-1});
    at::Tensor padded = flat;
    if (c * R_ != n) {
      padded = at::zeros({c * R_}, t.options());
      padded.narrow(0, 0, n).copy_(flat);
    }
    at::Tensor chunk = at::empty({c}, t.options());
    intra_->reduce_scatter(chunk, padded, ReduceOp::sum);
    across([&] { across_->all_reduce(chunk, ReduceOp::sum); });
    if (op == ReduceOp::avg) chunk.div_(world_);
    intra_->all_gather(padded, chunk);
    if (!padded.is_same(flat)) flat.copy_(padded.narrow(0, 0, n));
  }

  void reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    const int64_t m = out.numel();
    // Slot (r, h) holds the slice of the rank with local index r on host h.
    at::Tensor ordered = in;
    if (!identity_) {
      ordered = at::empty({in.numel()}, in.options());
      for (size_t i = 0; i < order_.size(); ++i)
        ordered.narrow(0, static_cast<int64_t>(i) * m, m).copy_(in.narrow(0, order_[i] * m, m));
    }
    // This rank's local index: H slices, summed over the host; then this host's slice of them.
    at::Tensor mine = H_ > 1 ? at::empty({H_ * m}, in.options()) : out;
    intra_->reduce_scatter(mine, ordered, ReduceOp::sum);
    if (H_ > 1) across([&] { across_->reduce_scatter(out, mine, ReduceOp::sum); });
    if (op == ReduceOp::avg) out.div_(world_);
  }

  void all_gather(const at::Tensor& out, const at::Tensor& in) override {
    const int64_t m = in.numel();
    // The slices of this local index on every host, then every local index's: slot (r, h).
    at::Tensor mine = in;
    if (H_ > 1) {
      mine = at::empty({H_ * m}, in.options());
      across([&] { across_->all_gather(mine, in.contiguous()); });
    }
    at::Tensor ordered = identity_ ? out : at::empty({out.numel()}, out.options());
    intra_->all_gather(ordered, mine);
    if (!identity_)
      for (size_t i = 0; i < order_.size(); ++i)
        out.narrow(0, order_[i] * m, m).copy_(ordered.narrow(0, static_cast<int64_t>(i) * m, m));
  }

  void broadcast(const at::Tensor& t, int root) override {
    across_busy_.store(true);
    MPI_Bcast(t.data_ptr(), static_cast<int>(t.nbytes()), MPI_BYTE, root, comm_);
    across_busy_.store(false);
  }
  void barrier() override {
    intra_->barrier();
    across([&] { across_->barrier(); });
    intra_->barrier();
  }

 private:
  // The step between hosts (skipped on one host); the watchdog names its peers while it runs.
  template <class F>
  void across(F&& f) {
    if (H_ == 1) return;
    across_busy_.store(true);
    f();
    across_busy_.store(false);
  }

  MPI_Comm comm_;
  Topology t_;
  Backend* intra_;   // the host's ranks (shared memory); not owned
  Backend* across_;  // this rank's peers on the other hosts (MPI); not owned
  int rank_ = 0, world_ = 1, H_ = 1, R_ = 1;
  std::vector<int> order_;  // slot r·H + h → the rank with local index r on host h
  bool identity_ = true;
  std::string across_peers_;
  std::atomic<bool> across_busy_{false};
};

}  // namespace

std::unique_ptr<Backend> make_hier_backend(MPI_Comm comm, const Topology& topology, Backend* intra,
                                           Backend* across) {
  if (!topology.uniform) throw std::logic_error("hier backend: hosts with different numbers of ranks");
  return std::make_unique<HierBackend>(comm, topology, intra, across);
}

}  // namespace slimshard::comm
