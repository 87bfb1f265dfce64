// shm_backend.cpp — collectives through an MPI-3 shared-memory window on one node. Each rank owns a segment:
// a control line (barrier epoch, sleepers, current step) and two staging halves used alternately, so a rank
// may refill one half while the others still read the other. Synchronisation is a counter barrier: each rank
// bumps its epoch and waits for everyone's, spinning briefly and then sleeping on a futex (ranks may
// outnumber cores). A waiting rank knows which rank it waits on, which the watchdog reports.
//
// all-reduce of a chunk: copy in → barrier → rank r reduces slice r of every segment into its own → barrier →
// copy every reduced slice out. Data per rank ≈ 3n of memory traffic, no MPI message at all.
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <ctime>
#include <vector>

#include "backend.h"
#include "slimshard/common.h"

namespace slimshard::comm {
namespace {

struct alignas(64) Control {
  uint32_t epoch;     // barriers passed by this rank (futex word)
  uint32_t sleepers;  // ranks asleep on `epoch`
  int64_t step;       // this rank's training step
};
constexpr size_t kHeader = 256;

long futex(uint32_t* addr, int op, uint32_t val, const timespec* timeout) {
  return ::syscall(SYS_futex, addr, op, val, timeout, nullptr, 0);
}

inline void cpu_relax() { __builtin_ia32_pause(); }

constexpr size_t kAlign = 64;
char* aligned(void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<char*>((v + kAlign - 1) / kAlign * kAlign);
}

class ShmBackend final : public Backend {
 public:
  ShmBackend(MPI_Comm comm, int64_t bytes_per_rank, std::vector<std::string> labels)
      : comm_(comm), labels_(std::move(labels)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
    if (labels_.size() != static_cast<size_t>(world_)) {
      labels_.clear();
      for (int q = 0; q < world_; ++q) labels_.push_back("rank " + std::to_string(q));
    }
    half_ = static_cast<size_t>(std::max<int64_t>(bytes_per_rank / 2, 1 << 16)) / 64 * 64;
    // Each rank's segment starts on a cache line (MPI packs the segments without aligning them; the control
    // block is 64-byte aligned). The segments' offsets within a page are the same in every process's mapping,
    // so every process finds the same aligned start.
    const auto seg = static_cast<MPI_Aint>(kHeader + 2 * half_ + kAlign);
    void* mine = nullptr;
    if (MPI_Win_allocate_shared(seg, 1, MPI_INFO_NULL, comm_, &mine, &win_) != MPI_SUCCESS)
      throw RuntimeError("MPI_Win_allocate_shared failed");
    std::memset(aligned(mine), 0, kHeader);
    base_.resize(static_cast<size_t>(world_));
    for (int q = 0; q < world_; ++q) {
      MPI_Aint size;
      int disp;
      void* p = nullptr;
      MPI_Win_shared_query(win_, q, &size, &disp, &p);
      base_[static_cast<size_t>(q)] = aligned(p);
    }
    MPI_Barrier(comm_);  // every header is zeroed before anyone waits on it
  }
  ~ShmBackend() override { MPI_Win_free(&win_); }

  std::string name() const override { return "shm"; }
  int64_t buffer_bytes() const override { return static_cast<int64_t>(kHeader + 2 * half_); }

  void publish_step(int64_t step) override { __atomic_store_n(&ctrl(rank_)->step, step, __ATOMIC_RELAXED); }

  std::string waiting_on() const override {
    const int q = waiting_on_.load();
    if (q < 0) return {};
    return labels_[static_cast<size_t>(q)] + " (last seen at step " +
           std::to_string(__atomic_load_n(&ctrl(q)->step, __ATOMIC_RELAXED)) + ")";
  }

  void barrier() override {
    ++epoch_;
    Control* me = ctrl(rank_);
    __atomic_store_n(&me->epoch, epoch_, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&me->sleepers, __ATOMIC_SEQ_CST) != 0)
      futex(&me->epoch, FUTEX_WAKE, INT32_MAX, nullptr);
    for (int q = 0; q < world_; ++q)
      if (q != rank_) wait_for(q, epoch_);
  }

  void all_reduce(const at::Tensor& t, ReduceOp op) override {
    const size_t elem = t.element_size();
    const int64_t n = t.numel(), cap = static_cast<int64_t>(half_ / elem);
    char* data = static_cast<char*>(t.data_ptr());
    const double scale = op == ReduceOp::avg ? 1.0 / world_ : 1.0;
    std::vector<const void*> in(static_cast<size_t>(world_));
    for (int64_t off = 0; off < n; off += cap) {
      const int64_t c = std::min(cap, n - off), per = (c + world_ - 1) / world_;
      std::memcpy(stage(rank_), data + off * elem, static_cast<size_t>(c) * elem);
      barrier();
      const int64_t lo = std::min(c, rank_ * per), hi = std::min(c, lo + per);
      for (int q = 0; q < world_; ++q) in[static_cast<size_t>(q)] = stage(q) + lo * elem;
      if (hi > lo) reduce_into(stage(rank_) + lo * elem, in.data(), world_, hi - lo, t.scalar_type(), scale);
      barrier();
      for (int q = 0; q < world_; ++q) {
        const int64_t qlo = std::min(c, q * per), qhi = std::min(c, qlo + per);
        if (qhi > qlo)
          std::memcpy(data + (off + qlo) * elem, stage(q) + qlo * elem,
                      static_cast<size_t>(qhi - qlo) * elem);
      }
      flip();
    }
  }

  void all_gather(const at::Tensor& out, const at::Tensor& in) override {
    const auto n = static_cast<int64_t>(in.nbytes()), cap = static_cast<int64_t>(half_);
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    for (int64_t off = 0; off < n; off += cap) {
      const int64_t c = std::min(cap, n - off);
      std::memcpy(stage(rank_), src + off, static_cast<size_t>(c));
      barrier();
      for (int q = 0; q < world_; ++q) std::memcpy(dst + q * n + off, stage(q), static_cast<size_t>(c));
      flip();
    }
    if (n == 0) barrier();
  }

  void reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    const size_t elem = in.element_size();
    const int64_t n = out.numel(), cap = static_cast<int64_t>(half_ / elem) / world_;
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    const double scale = op == ReduceOp::avg ? 1.0 / world_ : 1.0;
    std::vector<const void*> parts(static_cast<size_t>(world_));
    for (int64_t off = 0; off < n; off += cap) {
      const int64_t c = std::min(cap, n - off);
      for (int q = 0; q < world_; ++q)
        std::memcpy(stage(rank_) + q * c * elem, src + (q * n + off) * elem, static_cast<size_t>(c) * elem);
      barrier();
      for (int q = 0; q < world_; ++q) parts[static_cast<size_t>(q)] = stage(q) + rank_ * c * elem;
      reduce_into(dst + off * elem, parts.data(), world_, c, in.scalar_type(), scale);
      flip();
    }
    if (n == 0) barrier();
  }

  void broadcast(const at::Tensor& t, int root) override {
    const auto n = static_cast<int64_t>(t.nbytes()), cap = static_cast<int64_t>(half_);
    char* data = static_cast<char*>(t.data_ptr());
    for (int64_t off = 0; off < n; off += cap) {
      const int64_t c = std::min(cap, n - off);
      if (rank_ == root) std::memcpy(stage(root), data + off, static_cast<size_t>(c));
      barrier();
      if (rank_ != root) std::memcpy(data + off, stage(root), static_cast<size_t>(c));
      flip();
    }
    if (n == 0) barrier();
  }

 private:
  Control* ctrl(int q) const { return reinterpret_cast<Control*>(base_[static_cast<size_t>(q)]); }
  char* stage(int q) const {
    return base_[static_cast<size_t>(q)] + kHeader + half_ * static_cast<size_t>(half_index_);
  }
  void flip() { half_index_ ^= 1; }

  // Waits until rank q has passed barrier `target`: spin ~10 µs, then sleep on q's epoch word.
  void wait_for(int q, uint32_t target) {
    Control* c = ctrl(q);
    for (int spins = 0;; ++spins) {
      const uint32_t v = __atomic_load_n(&c->epoch, __ATOMIC_ACQUIRE);
      if (static_cast<int32_t>(v - target) >= 0) break;
      if (spins < 1000) {
        cpu_relax();
        continue;
      }
      waiting_on_.store(q);
      __atomic_fetch_add(&c->sleepers, 1u, __ATOMIC_SEQ_CST);
      const timespec ts{0, 100 * 1000 * 1000};
      futex(&c->epoch, FUTEX_WAIT, v, &ts);
      __atomic_fetch_sub(&c->sleepers, 1u, __ATOMIC_SEQ_CST);
    }
    waiting_on_.store(-1);
  }

  MPI_Comm comm_;
  std::vector<std::string> labels_;
  MPI_Win win_ = MPI_WIN_NULL;
  int rank_ = 0, world_ = 1;
  size_t half_ = 0;
  int half_index_ = 0;
  uint32_t epoch_ = 0;
  std::vector<char*> base_;
  std::atomic<int> waiting_on_{-1};
};

}  // namespace

std::unique_ptr<Backend> make_shm_backend(MPI_Comm comm, int64_t bytes_per_rank,
                                          std::vector<std::string> labels) {
  return std::make_unique<ShmBackend>(comm, bytes_per_rank, std::move(labels));
}

}  // namespace slimshard::comm
