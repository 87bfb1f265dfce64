// safetensors.cpp — the safetensors format: 8-byte little-endian header length, a JSON header mapping each
// tensor name to {dtype, shape, data_offsets} (plus optional "__metadata__" of strings), then the raw bytes.
#include <algorithm>
#include <charconv>
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

SafeTensorsFile parse_safetensors(const std::string& raw, const std::string& path) {
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
      if (!it->is_object()) throw UsageError(path + ": __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m)
        if (m->is_string()) f.metadata[m.key()] = m->get<std::string>();
      continue;
    }
    const std::string& name = it.key();
    const std::string what = path + ": tensor " + name;
    at::ScalarType type;
    std::vector<int64_t> shape;
    size_t b = 0, e = 0;
    // Declared sizes are checked against the file before anything is allocated: no product overflows, and
    // the bytes the shape needs are the bytes its offsets span, inside the file.
    constexpr int64_t kMaxElements = int64_t{1} << 40;
    int64_t numel = 1;
    try {
      if (!it->is_object()) throw UsageError(what + ": header entry is not an object");
      if (!dtype_from(it->at("dtype").get<std::string>(), &type))
        throw UsageError(what + ": unsupported dtype " + it->at("dtype").dump());
      const auto& dims = it->at("shape");
      if (!dims.is_array() || dims.size() > 8)
        throw UsageError(what + ": shape must be a list of at most 8 sizes");
      for (const auto& d : dims) {
        const int64_t v = json_integer(d, what + ": shape", 0, kMaxElements);
        if (v > 0 && numel > kMaxElements / v)
          throw UsageError(what + ": shape " + dims.dump() + " is too large");
        numel *= v;
        shape.push_back(v);
      }
      const auto& off = it->at("data_offsets");
      if (!off.is_array() || off.size() != 2) throw UsageError(what + ": data_offsets must be [begin, end]");
      b = static_cast<size_t>(json_integer(off[0], what + ": data_offsets", 0, INT64_MAX));
      e = static_cast<size_t>(json_integer(off[1], what + ": data_offsets", 0, INT64_MAX));
    } catch (const nlohmann::json::exception& ex) {
      throw UsageError(what + ": bad header entry (" + ex.what() + ")");
    }
    const size_t want = static_cast<size_t>(numel) * c10::elementSize(type);
    if (e < b || e - b != want)
      throw UsageError(what + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                       ") do not match its shape and dtype (" + std::to_string(want) + " bytes)");
    if (e > data_size)
      throw UsageError(what + ": truncated (needs bytes up to " + std::to_string(e) + ", file has " +
                       std::to_string(data_size) + ")");
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

SafeTensorsFile load_safetensors(const std::string& path) {
  return parse_safetensors(read_file(path, "safetensors file"), path);
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
    const std::string base = name.substr(0, hash), index = name.substr(hash + 1);
    int block = -1;
    const auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), block);
    if (ec != std::errc() || end != index.data() + index.size() || block < 0 || block > 1 << 16)
      throw UsageError("tensor " + name + ": '#" + index + "' is not a block number");
    if (!blocks.count(base)) out.emplace_back(base, at::Tensor());
    blocks[base].emplace_back(block, t);
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

namespace {
// The CRC-32 of every tensor's bytes in order: a model file is checked whole before it is used.
uint32_t tensors_crc(const NamedTensors& tensors) {
  uint32_t crc = 0;
  for (const auto& [name, t] : tensors) {
    const at::Tensor c = t.contiguous();
    crc = crc32_of(c.data_ptr(), c.nbytes(), crc);
  }
  return crc;
}
}  // namespace

void save_model_file(const std::string& path, const ModelConfig& config, const NamedTensors& full_values) {
  const NamedTensors joined = join_blocks(full_values);
  save_safetensors(path, joined,
                   {{"format", "slimshard.model"},
                    {"slimshard.model", config.to_json().dump()},
                    {"slimshard.crc32", std::to_string(tensors_crc(joined))}});
}

void save_model_file(const std::string& path, Model& model) {
  NamedTensors tensors;
  for (ShardedParam* p : model.params().all()) tensors.emplace_back(p->name(), p->full_value());
  save_model_file(path, model.config(), tensors);
}

std::unique_ptr<Model> model_from_values(const ModelConfig& config, const NamedTensors& full_values) {
  const NamedTensors joined = join_blocks(full_values);
  // The config's sizes are checked against the tensors before the model is built (a config can ask for
  // terabytes; the tensors hold what is really there).
  std::map<std::string, int64_t> have;
  for (const auto& [name, t] : joined) have[name] = t.numel();
  for (const OpShape& op : op_shapes(config))
    for (size_t k = 0; k < op.param_numels.size(); ++k) {
      const std::string name = op.name + (k == 0 ? ".weight" : ".bias");
      auto it = have.find(name);
      if (it == have.end()) throw UsageError("tensor " + name + " is missing");
      if (it->second != op.param_numels[k])
        throw UsageError("tensor " + name + " has " + std::to_string(it->second) +
                         " elements, the model config " + "asks for " + std::to_string(op.param_numels[k]));
    }
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
  auto crc = f.metadata.find("slimshard.crc32");
  if (crc == f.metadata.end())
    throw UsageError(path + ": no checksum (slimshard.crc32; written by an older slimshard? save it again)");
  if (crc->second != std::to_string(tensors_crc(f.tensors)))
    throw UsageError(path + ": checksum mismatch (corrupted: the weights are not what was saved)");
  try {
    return model_from_values(ModelConfig::from_json(cj, path), f.tensors);
  } catch (const UsageError& e) {
    throw UsageError(path + ": " + e.what());
  }
}

}  // namespace slimshard
