// safetensors.cpp — the safetensors format: 8-byte little-endian header length, a JSON header mapping each
// tensor name to {dtype, shape, data_offsets} (plus optional "__metadata__" of strings), then the raw bytes.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "slimshard/ckpt.h"
#include "slimshard/common.h"
#include "slimshard/json.h"
#include "slimshard/nn.h"

namespace slimshard {
namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {{at::kFloat, "F32"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
                                 {at::kLong, "I64"},  {at::kInt, "I32"},   {at::kByte, "U8"},
                                 {at::kShort, "I16"}, {at::kDouble, "F64"}};

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw std::logic_error(std::string("safetensors: unsupported dtype ") + c10::toString(t));
}

}  // namespace

bool dtype_from(const std::string& name, at::ScalarType* out) {
  for (const auto& d : kDtypes)
    if (name == d.name) return *out = d.type, true;
  return false;
}

std::string safetensors_bytes(const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> contiguous;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.contiguous();
    const size_t bytes = c.nbytes();
    header[name] = {{"dtype", dtype_name(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contiguous.push_back(c);
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the format pads the header to 8 bytes with spaces
  std::string out;
  out.reserve(8 + h.size() + offset);
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += h;
  for (const auto& c : contiguous) out.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, safetensors_bytes(tensors, metadata));
}

SafeTensorsFile load_safetensors(const std::string& path) {
  const std::string raw = read_file(path, "safetensors file");
  if (raw.size() < 8) throw UsageError(path + ": truncated (no safetensors header)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(raw[static_cast<size_t>(i)])) << (8 * i);
  if (n > raw.size() - 8) throw UsageError(path + ": truncated (header of " + std::to_string(n) + " bytes)");
  const nlohmann::json header = parse_json(raw.substr(8, n), path + ": corrupt safetensors header");
  if (!header.is_object()) throw UsageError(path + ": corrupt safetensors header (not an object)");
  const size_t data_start = 8 + n, data_size = raw.size() - data_start;
  SafeTensorsFile f;
  std::vector<std::pair<size_t, std::string>> order;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      for (auto m = it->begin(); m != it->end(); ++m)
        if (m->is_string()) f.metadata[m.key()] = m->get<std::string>();
      continue;
    }
    const std::string& name = it.key();
    at::ScalarType type;
    std::vector<int64_t> shape;
    size_t b = 0, e = 0;
    try {
      if (!dtype_from(it->at("dtype").get<std::string>(), &type))
        throw UsageError(path + ": tensor " + name + ": unsupported dtype " + it->at("dtype").dump());
      shape = it->at("shape").get<std::vector<int64_t>>();
      b = it->at("data_offsets").at(0).get<size_t>();
      e = it->at("data_offsets").at(1).get<size_t>();
    } catch (const nlohmann::json::exception& ex) {
      throw UsageError(path + ": tensor " + name + ": bad header entry (" + ex.what() + ")");
    }
    int64_t numel = 1;
    for (int64_t d : shape) {
      if (d < 0) throw UsageError(path + ": tensor " + name + ": negative dimension");
      numel *= d;
    }
    const size_t want = static_cast<size_t>(numel) * c10::elementSize(type);
    if (e < b || e - b != want)
      throw UsageError(path + ": tensor " + name + ": data_offsets [" + std::to_string(b) + ", " +
                       std::to_string(e) + ") do not match its shape and dtype (" + std::to_string(want) +
                       " bytes)");
    if (e > data_size)
      throw UsageError(path + ": tensor " + name + ": truncated (needs bytes up to " + std::to_string(e) +
                       ", file has " + std::to_string(data_size) + ")");
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
    if (want) std::memcpy(t.data_ptr(), raw.data() + data_start + b, want);
    order.emplace_back(b, name);
    f.tensors.emplace_back(name, t);
  }
  // Keep file order (the JSON object is sorted by name).
  std::vector<size_t> idx(order.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return order[a].first < order[b].first; });
  NamedTensors sorted;
  for (size_t i : idx) sorted.push_back(std::move(f.tensors[i]));
  f.tensors = std::move(sorted);
  return f;
}

namespace {

// Joins "name#0", "name#1", ... (row blocks of a split op) into "name", in block order.
NamedTensors join_blocks(const NamedTensors& in) {
  NamedTensors out;
  std::map<std::string, std::vector<std::pair<int, at::Tensor>>> blocks;
  for (const auto& [name, t] : in) {
    const size_t hash = name.find('#');
    if (hash == std::string::npos) {
      out.emplace_back(name, t);
      continue;
    }
    const std::string base = name.substr(0, hash);
    if (!blocks.count(base)) out.emplace_back(base, at::Tensor());
    blocks[base].emplace_back(std::stoi(name.substr(hash + 1)), t);
  }
  for (auto& [name, t] : out) {
    if (t.defined()) continue;
    auto& parts = blocks[name];
    std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<at::Tensor> ts;
    for (auto& p : parts) ts.push_back(p.second);
    t = at::cat(ts, 0);
  }
  return out;
}

}  // namespace

void save_model_file(const std::string& path, const ModelConfig& config, const NamedTensors& full_values) {
  save_safetensors(path, join_blocks(full_values),
                   {{"format", "slimshard.model"}, {"slimshard.model", config.to_json().dump()}});
}

void save_model_file(const std::string& path, Model& model) {
  NamedTensors tensors;
  for (ShardedParam* p : model.params().all()) tensors.emplace_back(p->name(), p->full_value());
  save_model_file(path, model.config(), tensors);
}

std::unique_ptr<Model> model_from_values(const ModelConfig& config, const NamedTensors& full_values) {
  const NamedTensors joined = join_blocks(full_values);
  auto model = build_model(config, 0);
  for (ShardedParam* p : model->params().all()) {
    const at::Tensor* t = nullptr;
    for (const auto& kv : joined)
      if (kv.first == p->name()) t = &kv.second;
    if (!t) throw UsageError("tensor " + p->name() + " is missing");
    if (t->sizes().vec() != p->shape())
      throw UsageError("tensor " + p->name() + " has shape " + c10::str(t->sizes()) + ", model expects " +
                       c10::str(at::IntArrayRef(p->shape())));
    p->set_value(t->to(at::kFloat));
  }
  return model;
}

std::unique_ptr<Model> load_model_file(const std::string& path) {
  SafeTensorsFile f = load_safetensors(path);
  auto it = f.metadata.find("slimshard.model");
  if (it == f.metadata.end())
    throw UsageError(path + ": not a slimshard model file (no slimshard.model metadata)");
  const nlohmann::json cj = parse_json(it->second, path + ": corrupt model config");
  try {
    return model_from_values(ModelConfig::from_json(cj, path), f.tensors);
  } catch (const UsageError& e) {
    throw UsageError(path + ": " + e.what());
  }
}

}  // namespace slimshard
