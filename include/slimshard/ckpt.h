// ckpt.h — safetensors reading and writing, and whole-model weight files (full fp32 weights plus the model
// config in the safetensors metadata). Sharded checkpoints build on the same reader and writer.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace slimshard {

class Model;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct SafeTensorsFile {
  std::map<std::string, std::string> metadata;
  NamedTensors tensors;  // in file order
};

// The whole file in memory: 8-byte header length, JSON header, data.
std::string safetensors_bytes(const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata);
// Writes atomically (temp file, fsync, rename). Tensors must be CPU, contiguous-able;
// F32/F16/BF16/I64/I32/U8/U16.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata);
// Validates the header against the file (sizes, offsets, dtypes); problems -> UsageError naming file and
// tensor.
SafeTensorsFile load_safetensors(const std::string& path);
// The same from the bytes of a file; `path` names it in messages.
SafeTensorsFile parse_safetensors(const std::string& raw, const std::string& path);
// A safetensors dtype name ("F32", "U8", ...) → the scalar type; false if not one this reader knows.
bool dtype_from(const std::string& name, at::ScalarType* out);

struct ModelConfig;
// A model's full weights with its config ("slimshard.model" metadata). Row blocks of split ops ("w#0", "w#1",
// ...) are joined back into their logical tensor ("w").
void save_model_file(const std::string& path, const ModelConfig& config, const NamedTensors& full_values);
void save_model_file(const std::string& path, Model& model);
// A whole (unsharded) model holding `full_values` (as save_model_file writes them, or as DataParallel
// gathers).
std::unique_ptr<Model> model_from_values(const ModelConfig& config, const NamedTensors& full_values);
// Rebuilds the model from the config stored in the file and loads its weights.
std::unique_ptr<Model> load_model_file(const std::string& path);

// ---- Sharded checkpoints (checkpoint.cpp) ----
// A directory D/step-XXXXXXXX/ holding one safetensors file per rank (the pieces that rank owns) and
// index.json, written last: for every logical tensor its dtype, global shape and, per piece, the rank's file,
// the key and the flat range [start, end) of the tensor it covers; plus the step, the model config, the plan,
// the trainer state and a CRC-32 and size per file. A directory without a complete index is never taken as a
// checkpoint.
class Communicator;

// One rank's piece of a logical tensor: elements [start, start + data.numel()) of the flattened tensor.
struct TensorPiece {
  std::string name;            // logical name: "blocks.0.mlp.fc.weight", "blocks.0.mlp.fc.weight.exp_avg"
  std::vector<int64_t> shape;  // the logical tensor's shape
  int64_t start = 0;
  at::Tensor data;          // flat (any dtype safetensors has); saving reads it, loading writes into it
  bool replicated = false;  // the same on every rank (ddp): one rank saves it
  bool per_rank = false;    // each rank's own value (Slim-DP's local optimizer state): every rank saves it,
                            // and loads its own (rank 0's when the checkpoint had fewer ranks)
  bool saved = true;        // false: a rank on another host holds the same piece and saves it (hybrid shards)
};

struct CheckpointMeta {
  int64_t step = 0;                  // optimizer steps completed
  nlohmann::json model;              // the model config
  nlohmann::json plan;               // strategy and splits per op
  nlohmann::json state;              // trainer state (optimizer step count, seed, data position, ...)
  std::vector<std::string> tensors;  // the logical tensors the checkpoint holds
};

class ShardedParam;
// This rank's pieces of every logical tensor of `params`: fp32 values and optimizer state, row blocks "w#j"
// of split ops mapped back to ranges of their logical tensor "w". Replicated values (ddp, slim) are saved by
// one rank, Slim-DP's optimizer state by every rank (each its own). `extra(p)` adds named state of p that is
// the same on every rank (Slim-DP's signal and core). Hybrid shards (hsdp, hsdp2) are alike on every host:
// saved only where `first_host` (they load everywhere).
std::vector<TensorPiece> param_pieces(const std::vector<ShardedParam*>& params,
                                      const std::function<NamedTensors(const ShardedParam*)>& extra = nullptr,
                                      bool first_host = true);

// A collective: every rank writes its pieces; rank 0 then writes the index and makes the checkpoint visible
// (D/step-XXXXXXXX.partial renamed to D/step-XXXXXXXX), and removes all but the newest `keep_last` (0 = keep
// all). `before_index` runs on every rank after its file is written (tests use it to kill a rank mid-save).
std::string save_checkpoint(Communicator& comm, const std::string& dir, const CheckpointMeta& meta,
                            const std::vector<TensorPiece>& pieces, int keep_last,
                            const std::function<void()>& before_index = nullptr);
// The newest complete checkpoint under `dir` (or `dir` itself if it is one); "" if none.
std::string latest_checkpoint(const std::string& dir);
// The complete checkpoints directly under `dir`, newest first: all of them (run ""), or those whose index
// says they belong to run `run` (state.run; --keep-last removes only those of the run saving).
std::vector<std::string> run_checkpoints(const std::string& dir, const std::string& run);
// A fresh run id: a checkpoint directory belongs to the run that first wrote into it.
std::string new_run_id();
// The step, model, plan and state of a checkpoint, from its index alone (to check before loading).
CheckpointMeta checkpoint_meta(const std::string& path);
// Reads the index (CRC-checked files, shapes, names) and fills every piece from whatever pieces cover its
// range, at any world size and layout. Problems: UsageError naming the file and tensor.
CheckpointMeta load_checkpoint(const std::string& path, int rank, const std::vector<TensorPiece>& pieces);
// The newest complete checkpoint under `dir` as one safetensors file of full weights in `dtype` (fp32, or
// bf16 rounded from the fp32 masters; GPT: GPT-2/nanoGPT names) and OUT.config.json beside it (OUT without
// ".safetensors"); returns the checkpoint used. With `loss_text`, also the model's loss (fp32 weights) on the
// file's first 4 rows of T+1 bytes (GPT), into *loss.
std::string export_checkpoint(const std::string& dir, const std::string& out,
                              const std::string& loss_text = "", double* loss = nullptr,
                              at::ScalarType dtype = at::kFloat);
// Every logical tensor whole (name → full tensor), from any checkpoint: for export.
NamedTensors read_checkpoint_tensors(const std::string& path, CheckpointMeta* meta);

}  // namespace slimshard
