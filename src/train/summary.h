// summary.h — what a run measured step by step (RunStats) and its summary: the figures (TrainSummary), the
// metrics file's last line and the lines printed at the end. Private to src/train.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "slimshard/memory.h"
#include "step.h"

namespace slimshard {

class Communicator;
enum class Link;
class DataParallel;
struct TrainSummary;

struct RunStats {
  // Per training step (bytes: not counting evaluation; inter: those between hosts).
  std::vector<double> losses, step_s, step_bytes, step_inter_bytes;
  std::vector<StepTimes> times;
  int64_t peak_bytes = 0;
  int64_t phase_peak[static_cast<int>(memory::Phase::count)] = {};
  // After each step: its result, seconds, bytes sent, and the allocator's peaks since the step began.
  void record(const StepResult& r, double seconds, int64_t bytes, int64_t inter_bytes);
  // Medians over the steps after the first two (they pay for lazy allocations and warm caches).
  double median_step_s() const;
  double median_phase_ms(double StepTimes::*phase) const;
  double final_loss() const;  // mean of the last 10
};

// Bytes this rank sent per collective kind (on `link`, or both); zero3's gathers (the prefetch depth asked
// for, the most buffers live at once, gathers issued).
nlohmann::json comm_bytes_by_kind(const Communicator& comm);
nlohmann::json comm_bytes_by_kind(const Communicator& comm, Link link);
nlohmann::json prefetch_json(const DataParallel& dp, int depth);

// The summary line of the metrics file. `by_kind`: bytes sent per collective; `prefetch`: zero3's gathers.
nlohmann::json summary_json(const TrainSummary& s, const RunStats& stats, const nlohmann::json& by_kind,
                            const nlohmann::json& prefetch);
// The lines rank 0 prints at the end: losses, throughput, peak per phase, time per phase, communication.
void print_summary(const TrainSummary& s, const RunStats& stats, const std::string& backend);

}  // namespace slimshard
