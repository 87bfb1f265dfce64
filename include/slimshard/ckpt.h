// ckpt.h — safetensors reading and writing, and whole-model weight files (full fp32 weights plus the model
// config in the safetensors metadata). Sharded checkpoints build on the same reader and writer.
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace slimshard {

class Model;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct SafeTensorsFile {
  std::map<std::string, std::string> metadata;
  NamedTensors tensors;  // in file order
  const at::Tensor* find(const std::string& name) const;
};

// Writes atomically (temp file, fsync, rename). Tensors must be CPU, contiguous-able;
// F32/F16/BF16/I64/I32/U8/U16.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata);
// Validates the header against the file (sizes, offsets, dtypes); problems -> UsageError naming file and
// tensor.
SafeTensorsFile load_safetensors(const std::string& path);

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

}  // namespace slimshard
