// summary.cpp — step statistics and the end-of-run summary, as JSON and as printed lines (see summary.h).
#include "summary.h"

#include <algorithm>
#include <cstdio>

#include "slimshard/comm.h"
#include "slimshard/common.h"
#include "slimshard/data_parallel.h"
#include "slimshard/train.h"

namespace slimshard {
namespace {

template <class T>
std::vector<T> after_warmup(const std::vector<T>& v) {
  const size_t skip = std::min<size_t>(2, v.empty() ? 0 : v.size() - 1);
  return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(skip), v.end());
}

std::string mib(int64_t b) { return format_mib(static_cast<double>(b)); }

}  // namespace

void RunStats::record(const StepResult& r, double seconds, int64_t bytes, int64_t inter_bytes) {
  losses.push_back(r.loss);
  step_s.push_back(seconds);
  step_bytes.push_back(static_cast<double>(bytes));
  step_inter_bytes.push_back(static_cast<double>(inter_bytes));
  times.push_back(r.times);
  peak_bytes = std::max(peak_bytes, memory::peak_bytes());
  for (int p = 0; p < static_cast<int>(memory::Phase::count); ++p)
    phase_peak[p] = std::max(phase_peak[p], memory::phase_peak_bytes(static_cast<memory::Phase>(p)));
}

double RunStats::median_step_s() const { return median(after_warmup(step_s)); }

double RunStats::median_phase_ms(double StepTimes::*phase) const {
  std::vector<double> v;
  for (const StepTimes& t : after_warmup(times)) v.push_back(t.*phase);
  return median(v);
}

double RunStats::final_loss() const {
  const size_t tail = std::min<size_t>(10, losses.size());
  double sum = 0;
  for (size_t i = losses.size() - tail; i < losses.size(); ++i) sum += losses[i];
  return tail ? sum / static_cast<double>(tail) : 0;
}

nlohmann::json comm_bytes_by_kind(const Communicator& comm) {
  nlohmann::json by_kind;
  for (int c = 0; c < static_cast<int>(Collective::count); ++c)
    by_kind[collective_name(static_cast<Collective>(c))] = comm.bytes(static_cast<Collective>(c));
  return by_kind;
}

nlohmann::json comm_bytes_by_kind(const Communicator& comm, Link link) {
  nlohmann::json by_kind;
  for (int c = 0; c < static_cast<int>(Collective::count); ++c)
    by_kind[collective_name(static_cast<Collective>(c))] = comm.bytes(static_cast<Collective>(c), link);
  return by_kind;
}

nlohmann::json prefetch_json(const DataParallel& dp, int depth) {
  const DataParallel::PrefetchStats p = dp.prefetch_stats();
  return {{"depth", depth}, {"max_live", p.max_live}, {"gathers", p.gathers}};
}

nlohmann::json summary_json(const TrainSummary& s, const RunStats& stats, const nlohmann::json& by_kind,
                            const nlohmann::json& prefetch) {
  nlohmann::json phases;
  for (int p = 0; p < static_cast<int>(memory::Phase::count); ++p)
    if (stats.phase_peak[p] > 0)
      phases[memory::phase_name(static_cast<memory::Phase>(p))] = stats.phase_peak[p];
  const nlohmann::json phase_ms{{"data", stats.median_phase_ms(&StepTimes::data)},
                                {"forward", stats.median_phase_ms(&StepTimes::forward)},
                                {"backward", stats.median_phase_ms(&StepTimes::backward)},
                                {"comm_wait", stats.median_phase_ms(&StepTimes::comm_wait)},
                                {"optimizer", stats.median_phase_ms(&StepTimes::optimizer)},
                                {"after_step", stats.median_phase_ms(&StepTimes::after_step)}};
  nlohmann::json j{{"summary", true},
                   {"steps", s.steps},
                   {"first_step", s.first_step},
                   {"checkpoint", s.checkpoint},
                   {"loss", s.final_loss},
                   {"step_ms", s.step_ms_median},
                   {"peak_bytes", s.peak_bytes},
                   {"comm_bytes", s.comm_bytes},
                   {"comm_bytes_per_step", s.comm_bytes_per_step},
                   {"comm_bytes_by_kind", by_kind},
                   {"comm_bytes_inter", s.comm_bytes_inter},
                   {"comm_bytes_inter_per_step", s.comm_bytes_inter_per_step},
                   {"hosts", s.hosts},
                   {"weights_identical", s.weights_identical},
                   {"slim_rounds", s.slim_rounds},
                   {"slim_selection_digest", s.slim_digest},
                   {"slim_selection_identical", s.slim_selection_identical},
                   {"weights_checksum", s.weights_checksum},
                   {"val_loss", s.val_loss},
                   {"wall_s", s.wall_s},
                   {"params", s.params},
                   {"world", s.world},
                   {"precision", s.precision},
                   {"phase_peak_bytes", phases},
                   {"prefetch", prefetch},
                   {"phase_ms", phase_ms}};
  if (!s.osdp_choice.empty())
    j["osdp"] = {{"choice", s.osdp_choice},
                 {"plan", nlohmann::json::parse(s.osdp_plan)},
                 {"predicted_step_ms", s.predicted_step_ms},
                 {"predicted_peak_bytes", s.predicted_peak_bytes}};
  // The throughput in the unit of the per-step records: tokens for GPT, samples (images) for classifiers.
  if (s.classifier)
    j["samples_per_s"] = s.samples_per_s, j["val_acc"] = s.val_acc;
  else
    j["tokens_per_s"] = s.tokens_per_s;
  return j;
}

void print_summary(const TrainSummary& s, const RunStats& stats, const std::string& backend) {
  if (s.first_step > 0)
    std::printf("summary: steps %lld-%lld in %.1f s | train loss %.4f", (long long)s.first_step + 1,
                (long long)s.steps, s.wall_s, s.final_loss);
  else
    std::printf("summary: %lld steps in %.1f s | train loss %.4f", (long long)s.steps, s.wall_s,
                s.final_loss);
  if (s.val_loss >= 0) std::printf(" | val loss %.4f", s.val_loss);
  if (s.classifier && s.val_loss >= 0) std::printf(" | val acc %.2f%%", 100 * s.val_acc);
  const auto phase = [&](memory::Phase p) { return mib(stats.phase_peak[static_cast<int>(p)]); };
  std::printf(" | %.0f %s (median step %.1f ms) | peak %s MiB (forward %s, backward %s, optimizer %s)\n",
              s.classifier ? s.samples_per_s : s.tokens_per_s, s.classifier ? "samples/s" : "tokens/s",
              s.step_ms_median, mib(s.peak_bytes).c_str(), phase(memory::Phase::forward).c_str(),
              phase(memory::Phase::backward).c_str(), phase(memory::Phase::optimizer).c_str());
  std::printf(
      "time per step on rank 0 (median ms): data %.1f, forward %.1f, backward %.1f, waiting for gradient "
      "reductions %.1f, optimizer %.1f, collectives after it %.1f\n",
      stats.median_phase_ms(&StepTimes::data), stats.median_phase_ms(&StepTimes::forward),
      stats.median_phase_ms(&StepTimes::backward), stats.median_phase_ms(&StepTimes::comm_wait),
      stats.median_phase_ms(&StepTimes::optimizer), stats.median_phase_ms(&StepTimes::after_step));
  if (s.world > 1)
    std::printf(
        "communication: %s per step per rank, %s of it between hosts (%s backend, %d host(s)); weights "
        "identical on all %d ranks: %s\n",
        format_bytes(s.comm_bytes_per_step).c_str(), format_bytes(s.comm_bytes_inter_per_step).c_str(),
        backend.c_str(), s.hosts, s.world, s.weights_identical ? "yes" : "NO");
}

}  // namespace slimshard
