// communicator.cpp — the comm thread, Work handles, byte counting and the watchdog (see comm.h).
// Under mpirun the comm thread initialises MPI, owns every MPI call of the process and runs queued
// collectives in order; a watchdog thread aborts the job when one runs past the timeout. Without mpirun, a
// world of one.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include "backend.h"
#include "slimshard/common.h"

namespace slimshard {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::all_gather:
      return "all_gather";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::broadcast:
      return "broadcast";
    case Collective::barrier:
      return "barrier";
    default:
      return "?";
  }
}

const char* link_name(Link l) { return l == Link::intra ? "intra" : "inter"; }

int Topology::rank_at(int h, int r) const {
  for (size_t g = 0, seen = 0; g < host_of.size(); ++g)
    if (host_of[g] == h && static_cast<int>(seen++) == r) return static_cast<int>(g);
  throw std::logic_error("Topology::rank_at: no rank " + std::to_string(r) + " on host " + std::to_string(h));
}

int64_t Communicator::total_bytes(Link l) const {
  int64_t s = 0;
  for (const auto& b : bytes_[static_cast<int>(l)]) s += b.load();
  return s;
}

bool Communicator::launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
}

namespace {

class WorkImpl final : public Work {
 public:
  void wait() override {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(m_);
    return done_;
  }
  void finish(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(m_);
    done_ = true;
    error_ = std::move(e);
    cv_.notify_all();
  }

 private:
  mutable std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

void check_tensor(const at::Tensor& t, const char* what) {
  if (!t.defined() || !t.is_contiguous() || !t.device().is_cpu())
    throw std::logic_error(std::string(what) + ": needs a defined, contiguous CPU tensor");
}

// Bytes one rank sends in the bandwidth-optimal (ring) algorithm over `world` ranks (see comm.h).
int64_t ring_bytes(Collective c, int64_t bytes, int world) {
  if (world <= 1) return 0;
  switch (c) {
    case Collective::all_reduce:
      return 2 * (world - 1) * bytes / world;
    case Collective::all_gather:
    case Collective::reduce_scatter:
      return (world - 1) * bytes / world;
    case Collective::broadcast:
      return bytes;
    default:
      return 0;
  }
}

// {intra, inter} bytes this rank sends for a collective of `bytes` (the full tensor; see comm.h).
std::pair<int64_t, int64_t> link_bytes(Collective c, int64_t bytes, const Topology& t, int rank, int world,
                                       bool hierarchical) {
  if (hierarchical && c != Collective::broadcast) {
    const int R = t.local_size, H = t.hosts;
    return {ring_bytes(c, bytes, R), ring_bytes(c, bytes / R, H)};
  }
  const int64_t b = ring_bytes(c, bytes, world);
  const bool crosses = t.host_of.size() > 1 && t.host_of[static_cast<size_t>((rank + 1) % world)] != t.host;
  return crosses ? std::make_pair(int64_t{0}, b) : std::make_pair(b, int64_t{0});
}

// Where this rank runs: hosts from MPI_Comm_split_type(SHARED), numbered by their lowest rank, and named.
Topology learn_topology(MPI_Comm comm) {
  Topology t;
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &t.local_rank);
  MPI_Comm_size(node, &t.local_size);
  int leader = rank;
  MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  std::vector<int> leaders(static_cast<size_t>(world));
  MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm);
  std::vector<int> firsts = leaders;
  std::sort(firsts.begin(), firsts.end());
  firsts.erase(std::unique(firsts.begin(), firsts.end()), firsts.end());
  t.hosts = static_cast<int>(firsts.size());
  for (int l : leaders)
    t.host_of.push_back(static_cast<int>(std::lower_bound(firsts.begin(), firsts.end(), l) - firsts.begin()));
  t.host = t.host_of[static_cast<size_t>(rank)];
  for (int h = 0; h < t.hosts; ++h)
    t.uniform = t.uniform && std::count(t.host_of.begin(), t.host_of.end(), h) == t.local_size;
  int uniform = t.uniform ? 1 : 0;  // every rank must agree (hosts of other sizes see it differently)
  MPI_Allreduce(MPI_IN_PLACE, &uniform, 1, MPI_INT, MPI_MIN, comm);
  t.uniform = uniform == 1;
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> names(static_cast<size_t>(world) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm);
  t.host_names.assign(static_cast<size_t>(t.hosts), "");
  for (int h = 0; h < t.hosts; ++h)
    t.host_names[static_cast<size_t>(h)] =
        std::string(&names[static_cast<size_t>(firsts[h]) * MPI_MAX_PROCESSOR_NAME]);
  return t;
}

// ---------------------------------------------------------------------------------------------------------------
// A world of one: collectives are no-ops or copies, done at once.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::string backend_name() const override { return "local"; }
  WorkPtr all_reduce(at::Tensor t, ReduceOp, std::function<void()> then, Group) override {
    if (then) then();
    return done(Collective::all_reduce, t);
  }
  WorkPtr all_gather(at::Tensor out, at::Tensor in, std::function<void()> then, Group) override {
    if (out.numel() != in.numel()) throw std::logic_error("all_gather: output must be world × input");
    if (out.data_ptr() != in.data_ptr()) out.copy_(in);
    if (then) then();
    return done(Collective::all_gather, out);
  }
  WorkPtr reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp, std::function<void()> then,
                         Group) override {
    if (out.numel() != in.numel()) throw std::logic_error("reduce_scatter: input must be world × output");
    out.copy_(in);
    if (then) then();
    return done(Collective::reduce_scatter, in);
  }
  WorkPtr broadcast(at::Tensor t, int) override { return done(Collective::broadcast, t); }
  WorkPtr barrier() override { return done(Collective::barrier, at::Tensor()); }
  [[noreturn]] void abort(const std::string& msg, int code) override {
    std::fprintf(stderr, "%s\n", msg.c_str());
    std::fflush(stderr);
    std::_Exit(code);
  }

 private:
  WorkPtr done(Collective c, const at::Tensor&) {
    count(c, 0, 0);
    auto w = std::make_shared<WorkImpl>();
    w->finish(nullptr);
    return w;
  }
};

// ---------------------------------------------------------------------------------------------------------------
class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const CommOptions& o) : opts_(o) {
    // The promise is shared: the comm thread may still be inside set_value() when this constructor returns.
    auto ready = std::make_shared<std::promise<void>>();
    auto started = ready->get_future();
    comm_thread_ = std::thread([this, ready] { comm_main(*ready); });
    try {
      started.get();
    } catch (...) {
      comm_thread_.join();
      throw;
    }
    watchdog_ = std::thread([this] { watchdog_main(); });
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    cv_watchdog_.notify_all();
    if (comm_thread_.joinable()) comm_thread_.join();
    if (watchdog_.joinable()) watchdog_.join();
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string backend_name() const override { return backend_name_; }
  int64_t staging_bytes() const override { return buffer_bytes_; }

  WorkPtr all_reduce(at::Tensor t, ReduceOp op, std::function<void()> then, Group g) override {
    check_tensor(t, "all_reduce");
    return enqueue(Collective::all_reduce, t.nbytes(), g, [t, op, then](comm::Backend& b) {
      b.all_reduce(t, op);
      if (then) then();
    });
  }
  WorkPtr all_gather(at::Tensor out, at::Tensor in, std::function<void()> then, Group g) override {
    check_tensor(out, "all_gather");
    check_tensor(in, "all_gather");
    if (out.numel() != in.numel() * group_size(g) || out.scalar_type() != in.scalar_type())
      throw std::logic_error("all_gather: output must be group size × input, same dtype");
    return enqueue(Collective::all_gather, out.nbytes(), g, [out, in, then](comm::Backend& b) {
      b.all_gather(out, in);
      if (then) then();
    });
  }
  WorkPtr reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op, std::function<void()> then,
                         Group g) override {
    check_tensor(out, "reduce_scatter");
    check_tensor(in, "reduce_scatter");
    if (in.numel() != out.numel() * group_size(g) || out.scalar_type() != in.scalar_type())
      throw std::logic_error("reduce_scatter: input must be group size × output, same dtype");
    return enqueue(Collective::reduce_scatter, in.nbytes(), g, [out, in, op, then](comm::Backend& b) {
      b.reduce_scatter(out, in, op);
      if (then) then();
    });
  }
  WorkPtr broadcast(at::Tensor t, int root) override {
    check_tensor(t, "broadcast");
    return enqueue(Collective::broadcast, t.nbytes(), Group::world,
                   [t, root](comm::Backend& b) { b.broadcast(t, root); });
  }
  WorkPtr barrier() override {
    return enqueue(Collective::barrier, 0, Group::world, [](comm::Backend& b) { b.barrier(); });
  }

  [[noreturn]] void abort(const std::string& msg, int code) override {
    // Messages that already name their rank (the allocator's) are not prefixed twice.
    if (msg.find("[rank ") == std::string::npos)
      std::fprintf(stderr, "[rank %d] %s\n", rank_, msg.c_str());
    else
      std::fprintf(stderr, "%s\n", msg.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  struct Task {
    Collective kind;
    int64_t bytes;
    Group group;
    std::function<void(comm::Backend&)> run;
    std::shared_ptr<WorkImpl> work;
  };

  WorkPtr enqueue(Collective kind, int64_t bytes, Group g, std::function<void(comm::Backend&)> run) {
    const auto [intra, inter] =
        g == Group::world  ? link_bytes(kind, bytes, topo_, rank_, world_, hierarchical_)
        : g == Group::host ? std::make_pair(ring_bytes(kind, bytes, topo_.local_size), int64_t{0})
                           : std::make_pair(int64_t{0}, ring_bytes(kind, bytes, topo_.hosts));
    count(kind, intra, inter);
    auto work = std::make_shared<WorkImpl>();
    {
      std::lock_guard<std::mutex> lock(m_);
      queue_.push_back(Task{kind, bytes, g, std::move(run), work});
    }
    cv_.notify_one();
    return work;
  }

  void comm_main(std::promise<void>& ready) {
    // The world's backend and those of the two sub-groups (host, peers); host may be the world's own (one
    // host, shared memory), and the hierarchical backend runs on the two others.
    std::unique_ptr<comm::Backend> backend, host_backend, peers_backend;
    comm::Backend* groups[static_cast<int>(Group::count)] = {};
    MPI_Comm comm = MPI_COMM_NULL, node = MPI_COMM_NULL, cross = MPI_COMM_NULL;
    try {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      // This thread makes every MPI call but MPI_Abort, which the watchdog may call while it is blocked.
      if (provided < MPI_THREAD_MULTIPLE)
        throw RuntimeError("MPI provides thread level " + std::to_string(provided) +
                           ", slimshard needs MPI_THREAD_MULTIPLE (the watchdog aborts from its own thread)");
      MPI_Comm_dup(MPI_COMM_WORLD, &comm);
      MPI_Comm_rank(comm, &rank_);
      MPI_Comm_size(comm, &world_);
      topo_ = learn_topology(comm);
      const bool one_host = topo_.hosts == 1;
      if (opts_.backend == "shm" && !one_host)
        throw UsageError("--comm-backend shm: the ranks span " + std::to_string(topo_.hosts) +
                         " hosts; use hier, mpi or auto");
      if (opts_.backend == "hier" && !topo_.uniform)
        throw UsageError("--comm-backend hier: the hosts run different numbers of ranks; use mpi or auto");
      MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
      MPI_Comm_split(comm, topo_.local_rank, topo_.host, &cross);  // a peer's rank = its host's index
      peers_backend = comm::make_mpi_backend(cross);
      if (opts_.backend == "shm" || (opts_.backend == "auto" && one_host)) {
        backend = comm::make_shm_backend(comm, opts_.shm_bytes, comm::rank_labels(topo_, rank_));
      } else if (opts_.backend == "hier" || (opts_.backend == "auto" && topo_.uniform)) {
        host_backend = comm::make_shm_backend(node, opts_.shm_bytes, comm::rank_labels(topo_, rank_));
        backend = comm::make_hier_backend(comm, topo_, host_backend.get(), peers_backend.get());
        hierarchical_ = true;
      } else {
        backend = comm::make_mpi_backend(comm);
        host_backend = comm::make_mpi_backend(node);
      }
      groups[static_cast<int>(Group::world)] = backend.get();
      groups[static_cast<int>(Group::host)] = host_backend ? host_backend.get() : backend.get();
      groups[static_cast<int>(Group::peers)] = peers_backend.get();
      backend_name_ = backend->name();
      buffer_bytes_ = backend->buffer_bytes() + (host_backend ? host_backend->buffer_bytes() : 0);
    } catch (...) {
      ready.set_exception(std::current_exception());
      backend.reset(), host_backend.reset(), peers_backend.reset();
      for (MPI_Comm* c : {&node, &cross})
        if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
      if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
      int init = 0;
      MPI_Initialized(&init);
      if (init) MPI_Finalize();
      return;
    }
    ready.set_value();

    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) break;  // stop requested and nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      comm::Backend* b = groups[static_cast<int>(task.group)];
      for (comm::Backend* g : groups) g->publish_step(step_.load());
      backend_ = b;
      inflight_kind_.store(static_cast<int>(task.kind));
      inflight_bytes_.store(task.bytes);
      inflight_seq_.store(seq_);
      inflight_start_ns_.store(now_ns());
      std::exception_ptr err;
      try {
        task.run(*b);
      } catch (...) {
        err = std::current_exception();
      }
      inflight_start_ns_.store(0);
      ++seq_;
      // The tensors the collective captured are let go before its Work completes: a caller that waits and
      // then allocates must not find them still alive (the memory estimate counts on their release).
      task.run = nullptr;
      task.work->finish(err);
    }
    backend_ = nullptr;
    backend.reset();  // frees the shared window (collective); the hierarchical one uses the two below
    host_backend.reset();
    peers_backend.reset();
    MPI_Comm_free(&node);
    MPI_Comm_free(&cross);
    MPI_Comm_free(&comm);
    MPI_Finalize();
  }

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  void watchdog_main() {
    const auto limit_ns = static_cast<int64_t>(opts_.timeout_s * 1e9);
    std::unique_lock<std::mutex> lock(m_);
    while (!stop_) {
      cv_watchdog_.wait_for(lock, std::chrono::milliseconds(100));
      const int64_t start = inflight_start_ns_.load();
      if (start == 0 || now_ns() - start < limit_ns) continue;
      std::string msg = std::string("watchdog: ") +
                        collective_name(static_cast<Collective>(inflight_kind_.load())) + " #" +
                        std::to_string(inflight_seq_.load()) + " (" +
                        format_bytes(static_cast<double>(inflight_bytes_.load())) + ", step " +
                        std::to_string(step_.load()) + ") did not finish within " +
                        std::to_string(static_cast<int64_t>(opts_.timeout_s)) + " s (--comm-timeout)";
      comm::Backend* b = backend_;
      const std::string who = b ? b->waiting_on() : std::string();
      msg += who.empty() ? "; a rank stopped participating or died" : "; waiting on " + who;
      lock.unlock();
      abort(msg, 1);
    }
  }

  CommOptions opts_;
  int rank_ = 0, world_ = 1;
  bool hierarchical_ = false;
  std::string backend_name_;
  int64_t buffer_bytes_ = 0;
  std::atomic<comm::Backend*> backend_{nullptr};
  std::thread comm_thread_, watchdog_;
  std::mutex m_;
  std::condition_variable cv_, cv_watchdog_;
  std::deque<Task> queue_;
  bool stop_ = false;
  int64_t seq_ = 0;
  std::atomic<int> inflight_kind_{0};
  std::atomic<int64_t> inflight_bytes_{0}, inflight_seq_{0}, inflight_start_ns_{0};
};

}  // namespace

namespace {

// Offsets of each tensor's elements in a packed buffer, and the total; all of one dtype.
std::vector<int64_t> packed_offsets(const std::vector<at::Tensor>& ts, int64_t* total, const char* what) {
  std::vector<int64_t> off;
  *total = 0;
  for (const at::Tensor& t : ts) {
    if (!t.is_contiguous() || t.scalar_type() != ts.front().scalar_type())
      throw std::logic_error(std::string(what) + ": tensors must be contiguous and of one dtype");
    off.push_back(*total);
    *total += t.numel();
  }
  return off;
}

}  // namespace

// One all-gather of every ins[i] packed: rank r's block of the result holds its ins in order; outs[i]'s slot
// r is the i-th piece of block r.
WorkPtr Communicator::all_gather_coalesced(std::vector<at::Tensor> outs, std::vector<at::Tensor> ins,
                                           Group g) {
  if (outs.size() != ins.size() || ins.empty())
    throw std::logic_error("all_gather_coalesced: one out per in");
  int64_t m = 0;
  const std::vector<int64_t> off = packed_offsets(ins, &m, "all_gather_coalesced");
  const int W = group_size(g);
  at::Tensor packed_in = at::empty({m}, ins.front().options());
  for (size_t i = 0; i < ins.size(); ++i)
    packed_in.narrow(0, off[i], ins[i].numel()).copy_(ins[i].view({-1}));
  at::Tensor packed_out = at::empty({W * m}, ins.front().options());
  return all_gather(
      packed_out, packed_in,
      [packed_out, outs, ins, off, W, m] {
        const at::Tensor blocks = packed_out.view({W, m});
        for (size_t i = 0; i < outs.size(); ++i)
          outs[i].view({W, ins[i].numel()}).copy_(blocks.narrow(1, off[i], ins[i].numel()));
      },
      g);
}

// One reduce-scatter of every ins[i] packed so that rank r's block holds each input's slice r in order.
WorkPtr Communicator::reduce_scatter_coalesced(std::vector<at::Tensor> outs, std::vector<at::Tensor> ins,
                                               ReduceOp op, std::function<void()> then, Group g) {
  if (outs.size() != ins.size() || ins.empty())
    throw std::logic_error("reduce_scatter_coalesced: one out per in");
  int64_t m = 0;
  const std::vector<int64_t> off = packed_offsets(outs, &m, "reduce_scatter_coalesced");
  const int W = group_size(g);
  at::Tensor packed_in = at::empty({W * m}, ins.front().options());
  const at::Tensor blocks = packed_in.view({W, m});
  for (size_t i = 0; i < ins.size(); ++i)
    blocks.narrow(1, off[i], outs[i].numel()).copy_(ins[i].view({W, outs[i].numel()}));
  at::Tensor packed_out = at::empty({m}, outs.front().options());
  return reduce_scatter(
      packed_out, packed_in, op,
      [packed_out, outs, off, then] {
        for (size_t i = 0; i < outs.size(); ++i)
          outs[i].view({-1}).copy_(packed_out.narrow(0, off[i], outs[i].numel()));
        if (then) then();
      },
      g);
}

std::string agree_on_error(Communicator& comm, const std::string& error) {
  // The lowest rank that failed, or world when none did; then its message, from it, to everyone.
  at::Tensor first =
      at::full({1}, static_cast<double>(error.empty() ? comm.world() : comm.rank()), at::kDouble);
  if (comm.world() == 1) return error;
  at::Tensor ranks = at::empty({comm.world()}, at::kDouble);
  comm.all_gather(ranks, first)->wait();
  const int from = static_cast<int>(ranks.min().item<double>());
  if (from >= comm.world()) return "";
  return broadcast_string(comm, error, from);
}

std::string broadcast_string(Communicator& comm, const std::string& s, int root) {
  at::Tensor len = at::full({1}, static_cast<int64_t>(s.size()), at::kLong);
  comm.broadcast(len, root)->wait();
  at::Tensor bytes = at::empty({len.item<int64_t>()}, at::kByte);
  if (comm.rank() == root && !s.empty()) std::memcpy(bytes.data_ptr(), s.data(), s.size());
  comm.broadcast(bytes, root)->wait();
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
}

std::unique_ptr<Communicator> Communicator::create(const CommOptions& opts) {
  if (opts.backend != "auto" && opts.backend != "shm" && opts.backend != "mpi" && opts.backend != "hier")
    throw UsageError("--comm-backend: unknown backend '" + opts.backend +
                     "' (expected auto, shm, mpi or hier)");
  // A bound the watchdog's nanosecond clock holds without overflow (about 11.5 days).
  if (!(opts.timeout_s > 0 && opts.timeout_s <= kMaxTimeoutS))
    throw UsageError("--comm-timeout: must be a number in (0, " +
                     std::to_string(static_cast<int64_t>(kMaxTimeoutS)) + "] seconds");
  if (!launched_by_mpi()) return std::make_unique<LocalCommunicator>();
  return std::make_unique<MpiCommunicator>(opts);
}

}  // namespace slimshard
