// tracking_allocator.cpp — LibTorch CPU allocator that counts live/peak bytes per phase and enforces a
// budget. Each block carries a 64-byte header holding its size, so a free knows what it returns without a
// lookup table; 64 also keeps the alignment LibTorch's vectorised kernels expect.
#include "slimshard/memory.h"

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

#include "slimshard/common.h"

namespace slimshard::memory {
namespace {

constexpr size_t kHeader = 64;
constexpr int kPhases = static_cast<int>(Phase::count);
constexpr size_t kCacheMin = 256 << 10;  // smaller blocks: glibc's own bins are fast enough
constexpr size_t kCacheGrain = 64 << 10;

// A block's header: bytes the tensor asked for (counted as live) and bytes the block holds (its cache size).
struct BlockHeader {
  int64_t asked;
  int64_t capacity;
};

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_phase_peak[kPhases];
std::atomic<int64_t> g_limit{0};
std::atomic<int64_t> g_count{0};
std::atomic<int> g_phase{0};
std::atomic<int> g_rank{0};
std::atomic<bool> g_installed{false};
thread_local const char* t_op = nullptr;
thread_local std::string t_last_op;  // the op that ran last on this thread, for allocations between ops

std::mutex g_msg_mutex;
std::string g_limit_msg;

// Free large blocks by capacity. A request takes the smallest cached block of at least its size, if that
// block is at most 1/8 larger.
std::mutex g_cache_mutex;
std::multimap<size_t, void*> g_cache;
std::atomic<int64_t> g_cached{0};
std::atomic<int64_t> g_cache_cap{int64_t(4) << 30};

void* take_cached(size_t capacity) {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  auto it = g_cache.lower_bound(capacity);
  if (it == g_cache.end() || it->first > capacity + capacity / 8) return nullptr;
  void* base = it->second;
  g_cached.fetch_sub(static_cast<int64_t>(it->first), std::memory_order_relaxed);
  g_cache.erase(it);
  return base;
}

bool put_cached(void* base, size_t capacity) {
  if (g_cached.load(std::memory_order_relaxed) + static_cast<int64_t>(capacity) > g_cache_cap.load())
    return false;
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  g_cache.emplace(capacity, base);
  g_cached.fetch_add(static_cast<int64_t>(capacity), std::memory_order_relaxed);
  return true;
}

void raise_to(std::atomic<int64_t>& peak, int64_t v) {
  int64_t p = peak.load(std::memory_order_relaxed);
  while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
  }
}

// `data` is what the caller got; its size sits in the header just before it. Data and context are the same
// pointer because LibTorch's raw_allocate()/raw_deallocate() (used for kernel scratch space) require it.
void free_tracked(void* data) {
  if (data == nullptr) return;
  void* base = static_cast<char*>(data) - kHeader;
  const BlockHeader h = *static_cast<BlockHeader*>(base);
  g_live.fetch_sub(h.asked, std::memory_order_relaxed);
  if (static_cast<size_t>(h.capacity) >= kCacheMin && put_cached(base, static_cast<size_t>(h.capacity)))
    return;
  std::free(base);
}

void free_nothing(void*) {}

[[noreturn]] void throw_limit(int64_t asked, int64_t live) {
  const std::string where = t_op                ? std::string("in op '") + t_op + "'"
                            : t_last_op.empty() ? std::string("outside any op")
                                                : "after op '" + t_last_op + "'";
  std::string msg = "[rank " + std::to_string(g_rank.load()) + "] memory limit exceeded " + where +
                    " (phase " + phase_name(static_cast<Phase>(g_phase.load())) + "): asked " +
                    format_bytes(static_cast<double>(asked)) + " with " +
                    format_bytes(static_cast<double>(live)) + " live, limit " +
                    format_bytes(static_cast<double>(g_limit.load())) + " (--mem-limit)";
  {
    std::lock_guard<std::mutex> lock(g_msg_mutex);
    if (g_limit_msg.empty()) g_limit_msg = msg;
  }
  throw MemoryLimitError(msg);
}

// LibTorch 2.3 made allocate() non-const and added copy_data(); 1.13 has neither.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define SLIMSHARD_ALLOC_CONST
#define SLIMSHARD_ALLOC_COPY_DATA 1
#else
#define SLIMSHARD_ALLOC_CONST const
#define SLIMSHARD_ALLOC_COPY_DATA 0
#endif

struct TrackingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) SLIMSHARD_ALLOC_CONST override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &free_nothing, cpu};
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t live = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    const int64_t lim = g_limit.load(std::memory_order_relaxed);
    if (lim > 0 && live > lim) {
      g_live.fetch_sub(bytes, std::memory_order_relaxed);
      throw_limit(bytes, live - bytes);
    }
    const size_t capacity = n >= kCacheMin ? (n + kCacheGrain - 1) / kCacheGrain * kCacheGrain : n;
    void* base = capacity >= kCacheMin ? take_cached(capacity) : nullptr;
    if (!base && posix_memalign(&base, kHeader, capacity + kHeader) != 0) {
      release_cache();
      if (posix_memalign(&base, kHeader, capacity + kHeader) != 0) {
        g_live.fetch_sub(bytes, std::memory_order_relaxed);
        throw RuntimeError("[rank " + std::to_string(g_rank.load()) + "] host out of memory allocating " +
                           format_bytes(static_cast<double>(n)));
      }
    }
    const int64_t cap = static_cast<int64_t>(capacity);
    *static_cast<BlockHeader*>(base) = BlockHeader{bytes, cap};
    g_count.fetch_add(1, std::memory_order_relaxed);
    raise_to(g_peak, live);
    raise_to(g_phase_peak[g_phase.load(std::memory_order_relaxed)], live);
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &free_tracked, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_tracked; }
#if SLIMSHARD_ALLOC_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
};

TrackingAllocator g_allocator;

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::init:
      return "init";
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::optimizer:
      return "optimizer";
    case Phase::comm:
      return "comm";
    case Phase::eval:
      return "eval";
    default:
      return "?";
  }
}

void install() {
  if (g_installed.exchange(true)) return;
  c10::SetCPUAllocator(&g_allocator, /*priority=*/100);
}

bool installed() { return g_installed.load(); }
int64_t live_bytes() { return g_live.load(); }
int64_t peak_bytes() { return g_peak.load(); }
int64_t phase_peak_bytes(Phase p) { return g_phase_peak[static_cast<int>(p)].load(); }
int64_t allocation_count() { return g_count.load(); }
int64_t cached_bytes() { return g_cached.load(); }

void release_cache() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  for (auto& kv : g_cache) std::free(kv.second);
  g_cache.clear();
  g_cached.store(0);
}

void reset_peaks() {
  int64_t live = g_live.load();
  g_peak.store(live);
  for (auto& p : g_phase_peak) p.store(0);
  g_phase_peak[g_phase.load()].store(live);
}

void set_limit(int64_t bytes) { g_limit.store(bytes); }
int64_t limit() { return g_limit.load(); }
void set_rank(int rank) { g_rank.store(rank); }

std::string limit_error_message() {
  std::lock_guard<std::mutex> lock(g_msg_mutex);
  return g_limit_msg;
}

PhaseScope::PhaseScope(Phase p) : prev_(static_cast<Phase>(g_phase.exchange(static_cast<int>(p)))) {
  raise_to(g_phase_peak[static_cast<int>(p)], g_live.load());
}
PhaseScope::~PhaseScope() { g_phase.store(static_cast<int>(prev_)); }

OpScope::OpScope(const std::string& name) : prev_(t_op) { t_op = name.c_str(); }
OpScope::~OpScope() {
  if (t_op) t_last_op = t_op;
  t_op = prev_;
}

}  // namespace slimshard::memory
