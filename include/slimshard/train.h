// train.h — the training loop (Trainer), its options and summary, and text generation from a trained GPT.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "slimshard/data.h"
#include "slimshard/nn.h"
#include "slimshard/optim.h"
#include "slimshard/slim.h"

namespace slimshard {

class Communicator;

struct TrainOptions {
  ModelConfig model = ModelConfig::preset_config("gpt-small");
  DataOptions data;
  std::string strategy = "ddp";  // the same strategy for every op, unless plan_file is set
  std::string plan_file;
  std::string plan_text;  // a plan's JSON given inline (what --strategy osdp computes); wins over plan_file
  int prefetch = 1;       // zero3: all-gathers issued ahead
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
  SlimOptions slim;                 // for ops whose strategy is slim
  bool allow_slim = false;          // osdp: the search may choose slim for replicated ops
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
  int64_t steps = 0;        // the step training stopped at (o.steps unless stopped by exit-after)
  int64_t first_step = 0;   // resumed from this step (0 = from scratch)
  std::string checkpoint;   // the last checkpoint written, if any
  int64_t params = 0;
  double final_loss = 0;  // mean over the last 10 steps
  double val_loss = -1, val_acc = -1;
  double tokens_per_s = 0;  // global tokens (samples for classifiers) / median step time
  double step_ms_median = 0;
  int64_t peak_bytes = 0;
  double wall_s = 0;
  int64_t comm_bytes = 0;         // sent by this rank over the run
  bool weights_identical = true;  // checksum of the final weights equal on every rank
  std::vector<double> losses;
  std::string sample;
};

// Runs on every rank of `comm` (a world of one without mpirun); rank 0 prints.
TrainSummary train(const TrainOptions& opts, Communicator& comm);

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
