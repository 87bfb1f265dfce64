// comm.h — the Communicator: collectives over MPI run by exactly one background thread. Callers enqueue a
// collective on contiguous CPU tensors and get a Work handle (wait, done), as in PyTorch's c10d; every rank
// issues collectives in the same order, so there are no deadlocks. On one host the collectives go through an
// MPI-3 shared-memory window (ranks reduce and gather directly in shared memory); across hosts they run
// hierarchically (within each host through the window, between hosts only among the ranks of the same local
// index, so every host link carries 1/R of the data), or as plain MPI collectives. Bytes are counted per kind
// and per link (within a host, between hosts). A watchdog turns a collective that does not finish within the
// timeout into an error on every rank that can still report, naming the collective, the step and, when known,
// the rank and host waited on.
#pragma once
#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace slimshard {

enum class Collective { all_reduce = 0, all_gather, reduce_scatter, broadcast, barrier, count };
const char* collective_name(Collective c);
enum class ReduceOp { sum, avg };
// Which ranks a collective spans: all of them; those on this rank's host (R); or this rank's peers, one per
// host (the ranks with the same local index: H). Hybrid sharding gathers within the host and all-reduces
// among peers.
enum class Group { world = 0, host, peers, count };
// Where bytes travel: between ranks of one host (shared memory), or between hosts (the network).
enum class Link { intra = 0, inter, count };
const char* link_name(Link l);

// Where the ranks run: hosts as MPI sees them (ranks that can share memory: MPI_Comm_split_type SHARED),
// numbered by their lowest rank; this rank's host and its index among the host's ranks.
struct Topology {
  int hosts = 1, host = 0;
  int local_rank = 0, local_size = 1;
  bool uniform = true;                  // every host runs the same number of ranks
  std::vector<int> host_of;             // per rank
  std::vector<std::string> host_names;  // per host (MPI_Get_processor_name)
  // The rank with local index `r` on host `h` (uniform topologies).
  int rank_at(int h, int r) const;
};

// Handle of one enqueued collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective has finished; rethrows its error.
  virtual void wait() = 0;
  virtual bool done() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

constexpr double kMaxTimeoutS = 1e6;

struct CommOptions {
  double timeout_s = 300;        // watchdog, at most kMaxTimeoutS
  int64_t shm_bytes = 16 << 20;  // shared-memory staging per rank (two halves, used alternately)
  // auto: shm on one host, hier across hosts (plain mpi where hosts run different numbers of ranks)
  std::string backend = "auto";  // auto | shm | mpi | hier
};

class Communicator {
 public:
  // Under mpirun: initialises MPI on the comm thread. Otherwise: a world of one, no MPI, no thread.
  static std::unique_ptr<Communicator> create(const CommOptions& opts);
  // True when this process was started by mpirun (so create() will initialise MPI).
  static bool launched_by_mpi();
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual std::string backend_name() const = 0;
  const Topology& topology() const { return topo_; }
  // Staging memory the backend holds outside LibTorch (the shared-memory window), sized once at start.
  virtual int64_t staging_bytes() const { return 0; }

  // Every collective spans `group` (world by default; its size group_size(g), ranks ordered by rank) and runs
  // `then` on the comm thread once its result is in place, before the Work completes (e.g. to accumulate it).
  // In place: t = reduce over the group's ranks of t.
  virtual WorkPtr all_reduce(at::Tensor t, ReduceOp op = ReduceOp::sum, std::function<void()> then = {},
                             Group g = Group::world) = 0;
  // out (size × in.numel()) = concatenation of every rank's `in`, in rank order. `in` may be this rank's
  // slot of `out` (in place).
  virtual WorkPtr all_gather(at::Tensor out, at::Tensor in, std::function<void()> then = {},
                             Group g = Group::world) = 0;
  // out (in.numel() / size) = this rank's slice of the reduction of every rank's `in`.
  virtual WorkPtr reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op = ReduceOp::sum,
                                 std::function<void()> then = {}, Group g = Group::world) = 0;
  int group_size(Group g) const {
    return g == Group::world ? world() : g == Group::host ? topo_.local_size : topo_.hosts;
  }
  // Several tensors of one dtype in one collective (Horovod's tensor fusion; c10d's *_coalesced): packed
  // into one buffer, one collective, unpacked on the comm thread — so that small tensors cross the network
  // once, not one message each. outs[i] and ins[i] as in all_gather / reduce_scatter.
  WorkPtr all_gather_coalesced(std::vector<at::Tensor> outs, std::vector<at::Tensor> ins,
                               Group g = Group::world);
  WorkPtr reduce_scatter_coalesced(std::vector<at::Tensor> outs, std::vector<at::Tensor> ins,
                                   ReduceOp op = ReduceOp::sum, std::function<void()> then = {},
                                   Group g = Group::world);
  virtual WorkPtr broadcast(at::Tensor t, int root) = 0;
  virtual WorkPtr barrier() = 0;

  // Bytes this rank sends for each kind under the bandwidth-optimal (ring) algorithm: all-reduce 2(W-1)/W·n,
  // all-gather and reduce-scatter (W-1)/W·n of the full tensor, broadcast n. Zero at world 1. Per link: a
  // flat ring's bytes are inter-host when this rank's successor in the ring is on another host; the
  // hierarchical algorithm's are the rings over the R ranks of the host (twice for all-reduce) and over the H
  // hosts on 1/R of the tensor.
  int64_t bytes(Collective c) const { return bytes(c, Link::intra) + bytes(c, Link::inter); }
  int64_t bytes(Collective c, Link l) const {
    return bytes_[static_cast<int>(l)][static_cast<int>(c)].load();
  }
  int64_t total_bytes() const { return total_bytes(Link::intra) + total_bytes(Link::inter); }
  int64_t total_bytes(Link l) const;
  int64_t calls(Collective c) const { return calls_[static_cast<int>(c)].load(); }
  // The training step, for watchdog messages.
  void set_step(int64_t step) { step_.store(step); }
  int64_t step() const { return step_.load(); }

  // Prints `msg` (prefixed with the rank) and ends the whole job with `code` (MPI_Abort under mpirun).
  [[noreturn]] virtual void abort(const std::string& msg, int code) = 0;

 protected:
  void count(Collective c, int64_t intra, int64_t inter) {
    bytes_[0][static_cast<int>(c)] += intra;
    bytes_[1][static_cast<int>(c)] += inter;
    calls_[static_cast<int>(c)] += 1;
  }
  Topology topo_;
  std::atomic<int64_t> bytes_[2][static_cast<int>(Collective::count)] = {};
  std::atomic<int64_t> calls_[static_cast<int>(Collective::count)] = {};
  std::atomic<int64_t> step_{-1};
};

// Every rank returns `root`'s string (a collective: every rank calls it).
std::string broadcast_string(Communicator& comm, const std::string& s, int root);
// Every rank passes its own error ("" if none) and gets the error of the lowest rank that had one, or "" —
// a collective, so that a check some ranks fail ends the job on all of them with the same message.
std::string agree_on_error(Communicator& comm, const std::string& error);

}  // namespace slimshard
