// profile.h — what the cost model is fitted to, measured on the real hardware under mpirun: per-op forward
// and backward time and activation bytes at each micro-batch, a latency + bandwidth fit per collective at
// this world size, how much compute slows while communication runs, the optimizer's time per element, and the
// calibration of all that against whole training steps. Profiles are files: read back with every field
// checked (problems name the file and the field).
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "slimshard/memory_estimate.h"
#include "slimshard/plan.h"

namespace slimshard {

class Communicator;

struct CollectiveFit {
  double alpha_ms = 0, beta_ms_per_byte = 0;
  double residual = 0;                            // RMS relative error of the fit over the measured points
  std::vector<std::pair<double, double>> points;  // (bytes of the full tensor, median ms)
  double ms(double bytes) const { return alpha_ms + beta_ms_per_byte * bytes; }
};

struct OpProfile : OpShape {
  // Per micro-batch: time from the previous op's end to this op's end, forward and backward.
  std::map<int64_t, double> fwd_ms, bwd_ms;
  std::map<int64_t, int64_t> act_bytes;  // per micro-batch: what the op (and the code before it) keeps live
  // Per micro-batch: the activation peaks around and in the op (the probe's timeline).
  std::map<int64_t, OpMoments> act_moments;
  // Per micro-batch: live as the op's forward begins (between blocks: what the blocks before keep).
  std::map<int64_t, int64_t> live_before;
  // The same from a probe with every GPT block recomputing (nn.h: Block): live_before for every op,
  // act_moments for the ops in blocks; empty when not measured. (What a block keeps is the difference of
  // live_before between block starts: cost_model.cpp.)
  std::map<int64_t, int64_t> live_before_rc;
  std::map<int64_t, OpMoments> act_moments_rc;
};
// Ops with no measurements yet (what a profile or an analytic cost model starts from).
std::vector<OpProfile> unmeasured(const std::vector<OpShape>& shapes);

struct Profile {
  nlohmann::json machine;
  int world = 1, threads = 1;
  int hosts = 1, ranks_per_host = 0;  // where it was taken (0: one host)
  std::string libtorch, date;
  ModelConfig model;
  Precision precision;  // what the ops ran in and the collectives would carry (a plan must match it)
  std::vector<int64_t> micro_batches;
  std::vector<OpProfile> ops;                          // model order
  std::map<int64_t, double> loss_fwd_ms, loss_bwd_ms;  // after the last op: loss; backward's tail
  std::map<int64_t, int64_t> loss_act_bytes, backward_extra_bytes;
  std::map<int64_t, int64_t> loss_peak_bytes;  // the activation peak while the loss runs
  // all_gather, reduce_scatter, all_reduce (the world's); with several hosts also host_all_gather,
  // host_reduce_scatter (among a host's ranks) and peers_all_reduce (among the peers across hosts)
  std::map<std::string, CollectiveFit> collectives;
  double overlap_slowdown = 1;        // compute time while communication runs / compute time alone
  double collective_overhead_ms = 0;  // latency of a zero3 gather waited for among busy threads (fitted)
  // What a real zero1 / zero2 / zero3 (across hosts also ddp, hsdp, hsdp2) step took beyond the model's
  // prediction, by strategy and micro-batch, spread over the ops by their parameters: the cost model's
  // uniform plans then take the time measured. Measured at the largest micro-batch (across hosts at every
  // one); at another the nearest measured one's (cost_model.cpp).
  std::map<std::string, std::map<int64_t, double>> strategy_residual_ms;
  nlohmann::json measured_steps;  // the real steps that latency was fitted to
  double optimizer_ns_per_element = 0;
  double reduce_ns_per_byte = 0;  // the comm thread's own work per byte reduced (for scaling to other worlds)
};

struct ProfileOptions {
  int warmup = 2, repeats = 5;
  int64_t max_collective_bytes = 32 << 20;
  Precision precision;  // the model runs (and its steps are timed) in this precision
};

// The micro-batches worth profiling for a per-rank batch of `local` rows: up to four of its divisors, the
// largest and then halving, in increasing order (what `train --strategy osdp` and `bench` profile).
std::vector<int64_t> profile_micro_batches(int64_t local);
// The uniform strategies whose real steps calibrate strategy_residual_ms: zero1, zero2 and zero3 (whose steps
// also fit the gathers' latency), across hosts also ddp, hsdp and hsdp2. The profiler times them (and on one
// host ddp, for the compute scale).
std::vector<Strategy> residual_strategies(bool across_hosts);

// Measures ops, collectives, overlap and the optimizer (not yet calibrated). Every rank of `comm` must call
// it (collectives are timed); per-op times are rank 0's.
Profile measure_profile(const ModelConfig& model, const std::vector<int64_t>& micro_batches,
                        Communicator& comm, const ProfileOptions& o, uint64_t seed);
// Measured whole training steps (median ms), one strategy everywhere and one micro-batch per rank. ddp_ms
// scale the op times: DDP at every micro-batch, on one host (or with one rank). uniform_ms give residuals:
// with a world larger than one zero1, zero2 and zero3 at the largest micro-batch; across hosts ddp, zero1,
// zero2, zero3, hsdp and hsdp2 at every micro-batch, and the op times are not scaled. There a step is mostly
// the slow link's and the model hides the compute under it, so the scale that made the model's DDP step the
// measured one was ill-conditioned (gpt-25m at 100 Mbit/s: 0.97 or 2.35 at 2 rows, on DDP steps 2 % apart)
// and, applied where compute is exposed, over-charged every extra micro-batch (hsdp at 2 rows predicted 16 %
// long; an accumulated micro-batch measured 1.23 s, the op times as profiled 1.28). For the same reason no
// micro-batch's residual holds at another (a zero1 residual taken at 4 rows left an osdp plan at 2 rows
// predicted 25 % short): docs/cluster.md.
struct MeasuredSteps {
  std::map<int64_t, double> ddp_ms;
  std::map<std::string, std::map<int64_t, double>> uniform_ms;  // by strategy name, then micro-batch
};
// Calibration against real steps. (1) Op times measured in isolation run a little faster than inside a whole
// step, and by how much depends on the micro-batch: each micro-batch's op times in ddp_ms are scaled so that
// the model's DDP step equals the measured one. (2) What a zero3 step costs beyond the model, per gather, is
// the latency of a gather waited for among busy threads. (3) What each step in uniform_ms costs beyond the
// model is spread over the ops by their parameters (strategy_residual_ms, by micro-batch): for zero3 what (2)
// leaves, since the model hides most of that latency under compute.
void calibrate_profile(Profile& p, const MeasuredSteps& steps);

nlohmann::json profile_to_json(const Profile& p);
// Checks every field; problems -> UsageError naming `what` and the field.
Profile profile_from_json(const nlohmann::json& j, const std::string& what);
Profile load_profile(const std::string& path);
// The same profile for another world size: collective fits re-derived by the ring model from the measured
// bandwidth and latency (what `plan --scale-profile` does).
Profile scale_profile(const Profile& p, int world);
// What `slimshard profile` prints: forward/backward per micro-batch, the collective fits, overlap, optimizer.
void print_profile(const Profile& p);

}  // namespace slimshard
