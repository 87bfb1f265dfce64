// train.h — training runs: the options and summary of a run and train() (the step loop, evaluation,
// checkpoints, metrics and progress), the profile of a model taken with real training steps, the curves of a
// metrics file, and text generation from a trained GPT.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "slimshard/charts.h"
#include "slimshard/data.h"
#include "slimshard/nn.h"
#include "slimshard/optim.h"
#include "slimshard/planner.h"
#include "slimshard/profile.h"
#include "slimshard/slim.h"

namespace slimshard {

class Communicator;

struct TrainOptions {
  ModelConfig model = ModelConfig::preset_config("gpt-small");
  DataOptions data;
  // The same strategy for every op (osdp: profiled, searched under mem_limit), unless plan_file is set.
  std::string strategy = "ddp";
  std::string plan_file;
  std::string profile;        // osdp: plan from this profile instead of profiling first
  int prefetch = 1;           // zero3: all-gathers issued ahead
  bool defer_gathers = true;  // zero1/zero2/hsdp2: the gathers after a step run into the next forward
  int64_t steps = 300;
  int64_t batch_size = 16;  // global, rows (sequences or images)
  int64_t micro_batch = 0;  // rows per forward/backward on one rank; 0 = the whole per-rank slice
  double lr = 1e-3;
  double min_lr = -1;   // <0: lr / 10
  int64_t warmup = -1;  // <0: min(100, steps / 10)
  OptimConfig optim;
  double clip = 1.0;  // global gradient-norm clip; 0 = off
  uint64_t seed = 1337;
  int64_t mem_limit = 0;  // bytes; 0 = none
  std::string metrics_path;
  int64_t eval_every = 0;  // 0 = only at the end
  std::string save_model;  // full-weight model file written at the end
  int64_t sample_tokens = 0;
  std::string sample_prompt = "In the beginning";
  int threads = 1;
  bool verbose = false;
  int64_t log_every = 0;  // plain progress lines every N steps when stderr is not a terminal; 0 = ~20 lines
  int64_t bucket_bytes = 25 << 20;  // DDP gradient bucket size
  // bf16: forward and backward on bf16 working copies of fp32 masters; gradients reduced in precision.reduce
  Precision precision;
  int64_t fuse_bytes = 256 << 10;  // sharded params up to this size are gathered/reduced per block together
  std::string recompute = "auto";  // none | all | auto (the plan's; osdp: the planner's)
  SlimOptions slim;                // for ops whose strategy is slim
  bool allow_slim = false;         // osdp: the search may choose slim for replicated ops
  bool allow_hybrid = true;        // osdp across hosts: the search may choose hsdp, hsdp2
  int tune_steps = 0;              // osdp: time its candidates this many steps each; 0 = trust the model
  // Checkpoints: every save_every steps (0 = only at the end and on exit-after) into ckpt_dir, keeping the
  // newest keep_last; resume from the newest complete checkpoint under `resume`.
  std::string ckpt_dir;
  int64_t save_every = 0;
  int keep_last = 0;  // 0 = keep all
  std::string resume;
  int64_t exit_after_steps = 0;  // save and exit 0 after this many steps of this run (0 = off)
  double exit_after_mins = 0;    // ... or after this many minutes (0 = off)
  // Testing aid: "sleep:R:S", "exit:R:S" or "kill:R:S" makes rank R sleep, exit or SIGKILL itself at step S;
  // "killsave:R:S": SIGKILL in the checkpoint of step S, after its own file is written, before the index.
  std::string fault;
};

struct TrainSummary {
  int64_t steps = 0;       // the step training stopped at (o.steps unless stopped by exit-after)
  int64_t first_step = 0;  // resumed from this step (0 = from scratch)
  std::string checkpoint;  // the last checkpoint written, if any
  int world = 1;
  int64_t params = 0;
  std::string precision = "fp32";
  bool classifier = false;
  double final_loss = 0;  // mean over the last 10 steps
  double val_loss = -1, val_acc = -1;
  double samples_per_s = 0;  // global rows (sequences or images) / median step time
  double tokens_per_s = 0;   // global tokens / median step time (GPT; 0 for classifiers)
  double step_ms_median = 0;
  int64_t peak_bytes = 0;
  double wall_s = 0;
  int64_t comm_bytes = 0;          // sent by this rank over the run
  double comm_bytes_per_step = 0;  // median over training steps
  int64_t comm_bytes_inter = 0;    // ... of which between hosts
  double comm_bytes_inter_per_step = 0;
  int hosts = 1;
  bool weights_identical = true;  // checksum of the final weights equal on every rank
  int64_t weights_checksum = 0;
  int64_t slim_rounds = 0, slim_digest = 0;
  bool slim_selection_identical = true;
  // osdp: the plan trained ("searched plan", or "zero2 everywhere" when measured faster) and the cost model's
  // figures for it
  std::string osdp_choice, osdp_plan;  // osdp_plan: as a plan file holds it
  double predicted_step_ms = 0;
  int64_t predicted_peak_bytes = 0;
  int stop_signal = 0;  // SIGTERM or SIGINT when a signal stopped the run (the process exits 128 + it)
  std::vector<double> losses;
  std::string sample;
};

// Runs on every rank of `comm` (a world of one without mpirun); rank 0 prints.
TrainSummary train(const TrainOptions& opts, Communicator& comm);

// What the planner knows of this run at `world` ranks, `ranks_per_host` on each host (0: one host).
RunSpec run_spec(const TrainOptions& opts, int world, int ranks_per_host = 0);

// measure_profile + calibrate_profile with real training steps (the same step train() takes): what
// `slimshard profile` writes and `--strategy osdp` plans from. Every rank of `comm` calls it.
Profile profile_training(const ModelConfig& model, const std::vector<int64_t>& micro_batches,
                         Communicator& comm, const ProfileOptions& o, uint64_t seed);

// osdp's candidates (plan_for_run) each timed for o.tune_steps steps after a warm-up, one after the other, at
// the run's model, batch (`local` rows per rank) and engine options: rank 0's step times (ms) per candidate,
// given to every rank.
std::vector<std::vector<double>> time_plans(const TrainOptions& o,
                                            const std::vector<PlanCandidate>& candidates, int64_t local,
                                            Communicator& comm);

// The curve of one metrics file (`train --metrics`): every step record holding `y`, by `x` = "step" or
// "bytes" (MiB sent so far, the running sum of each step's comm_bytes). With mean_of = k > 1, each point is
// the mean y of k consecutive records at the last one's x; a shorter tail is dropped unless it is all there
// is. `spec` is FILE or FILE:LABEL.
Curve metrics_curve(const std::string& spec, const std::string& x, const std::string& y, int mean_of);
// The last summary line of a metrics file ("summary": true), or an empty object.
nlohmann::json metrics_summary(const std::string& path);

struct GenerateOptions {
  std::string prompt = "In the beginning";
  int64_t tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
  uint64_t seed = 1337;
};
// Samples from a byte-level GPT; returns prompt + continuation.
std::string generate_text(Model& model, const GenerateOptions& opts);

}  // namespace slimshard
