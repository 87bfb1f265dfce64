// memory.h — the tracking allocator: LibTorch's CPU allocator replaced by one that counts live and peak
// bytes, per phase of the step, and enforces a per-process budget (--mem-limit). On CPU this stands in for a
// device's memory: every plan must fit under it and every estimate is checked against it.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

namespace slimshard::memory {

enum class Phase : int { init = 0, forward, backward, optimizer, comm, eval, count };
const char* phase_name(Phase p);

// Installs the tracking allocator as LibTorch's CPU allocator (idempotent). Tensors allocated before stay
// uncounted; install first thing in main().
void install();
bool installed();

int64_t live_bytes();
int64_t peak_bytes();
int64_t phase_peak_bytes(Phase p);
int64_t allocation_count();
// Free blocks of 256 KiB and more are kept for reuse (not counted as live); release_cache() returns them.
int64_t cached_bytes();
void release_cache();
// Restarts peak tracking at the current live bytes (all phases).
void reset_peaks();

// 0 = no limit. The rank appears in the error message.
void set_limit(int64_t bytes);
int64_t limit();
void set_rank(int rank);

// Thrown by an allocation that would exceed the limit; the message names rank, op, phase, bytes asked,
// live bytes and the limit.
struct MemoryLimitError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The message of the first limit error in this process ("" if none): it survives any wrapping of the
// exception by LibTorch on its way up.
std::string limit_error_message();

// Marks the phase of the step for the duration of a scope.
class PhaseScope {
 public:
  explicit PhaseScope(Phase p);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase prev_;
};

// Names the op running on this thread (for the limit error). `name` must outlive the scope.
class OpScope {
 public:
  explicit OpScope(const std::string& name);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  const char* prev_;
};

}  // namespace slimshard::memory
