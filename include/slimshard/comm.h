// comm.h — the Communicator: collectives over MPI run by exactly one background thread. Callers enqueue a
// collective on contiguous CPU tensors and get a Work handle (wait, done), as in PyTorch's c10d; every rank
// issues collectives in the same order, so there are no deadlocks. On one node the collectives go through an
// MPI-3 shared-memory window (ranks reduce and gather directly in shared memory); across nodes, plain MPI
// collectives. Bytes are counted per kind. A watchdog turns a collective that does not finish within the
// timeout into an error on every rank that can still report, naming the collective, the step and, when known,
// the rank waited on.
#pragma once
#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace slimshard {

enum class Collective { all_reduce = 0, all_gather, reduce_scatter, broadcast, barrier, count };
const char* collective_name(Collective c);
enum class ReduceOp { sum, avg };

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
  std::string backend = "auto";  // auto | shm | mpi
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
  // Staging memory the backend holds outside LibTorch (the shared-memory window), sized once at start.
  virtual int64_t staging_bytes() const { return 0; }

  // In place: t = reduce over ranks of t.
  virtual WorkPtr all_reduce(at::Tensor t, ReduceOp op = ReduceOp::sum) = 0;
  // out (world × in.numel()) = concatenation of every rank's `in`, in rank order. `in` may be this rank's
  // slot of `out` (in place).
  virtual WorkPtr all_gather(at::Tensor out, at::Tensor in) = 0;
  // out (in.numel() / world) = this rank's slice of the reduction of every rank's `in`. `then` runs on the
  // comm thread once the result is in `out`, before the Work completes (e.g. to accumulate it somewhere).
  virtual WorkPtr reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op = ReduceOp::sum,
                                 std::function<void()> then = {}) = 0;
  virtual WorkPtr broadcast(at::Tensor t, int root) = 0;
  virtual WorkPtr barrier() = 0;

  // Bytes this rank sends for each kind under the bandwidth-optimal (ring) algorithm: all-reduce 2(W-1)/W·n,
  // all-gather and reduce-scatter (W-1)/W·n of the full tensor, broadcast n at the root. Zero at world 1.
  int64_t bytes(Collective c) const { return bytes_[static_cast<int>(c)].load(); }
  int64_t total_bytes() const;
  int64_t calls(Collective c) const { return calls_[static_cast<int>(c)].load(); }
  // The training step, for watchdog messages.
  void set_step(int64_t step) { step_.store(step); }
  int64_t step() const { return step_.load(); }

  // Prints `msg` (prefixed with the rank) and ends the whole job with `code` (MPI_Abort under mpirun).
  [[noreturn]] virtual void abort(const std::string& msg, int code) = 0;

 protected:
  void count(Collective c, int64_t bytes) {
    bytes_[static_cast<int>(c)] += bytes;
    calls_[static_cast<int>(c)] += 1;
  }
  std::atomic<int64_t> bytes_[static_cast<int>(Collective::count)] = {};
  std::atomic<int64_t> calls_[static_cast<int>(Collective::count)] = {};
  std::atomic<int64_t> step_{-1};
};

// Every rank returns `root`'s string (a collective: every rank calls it).
std::string broadcast_string(Communicator& comm, const std::string& s, int root);
// Every rank passes its own error ("" if none) and gets the error of the lowest rank that had one, or "" —
// a collective, so that a check some ranks fail ends the job on all of them with the same message.
std::string agree_on_error(Communicator& comm, const std::string& error);

}  // namespace slimshard
