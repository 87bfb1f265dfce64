// checkpoint.cpp — sharded checkpoints: every rank writes the pieces it owns as one safetensors file, rank 0
// writes index.json last and renames the directory into place, so a checkpoint is either complete or
// invisible. Loading fills any layout (world size, strategy, splits) from the index's flat ranges, checking
// CRCs, names and shapes.
#include <zlib.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "slimshard/ckpt.h"
#include "slimshard/comm.h"
#include "slimshard/common.h"
#include "slimshard/json.h"
#include "slimshard/nn.h"
#include "slimshard/sharded_param.h"

namespace slimshard {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "slimshard-checkpoint";
constexpr int kVersion = 2;  // 2: per-piece byte offsets and CRCs
constexpr int64_t kMaxRanks = 1 << 20, kMaxSteps = int64_t{1} << 50;

std::string rank_file(int r) {
  char b[40];
  std::snprintf(b, sizeof b, "rank-%05d.safetensors", r);
  return b;
}

std::string piece_key(const TensorPiece& p) { return p.name + "@" + std::to_string(p.start); }

uint32_t crc_of(const char* data, size_t size) { return crc32_of(data, size); }

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) ::fsync(fd), ::close(fd);
}

// Only complete checkpoints, newest first.
std::vector<std::pair<int64_t, std::string>> checkpoints_in(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 13 || name.rfind("step-", 0) != 0 ||
        name.find_first_not_of("0123456789", 5) != std::string::npos)
      continue;
    if (!fs::exists(e.path() / "index.json", ec)) continue;
    out.emplace_back(std::stoll(name.substr(5)), e.path().string());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

nlohmann::json read_index(const std::string& path) {
  const std::string file = path + "/index.json";
  const nlohmann::json j = parse_json(read_file(file, "checkpoint index"), file);
  if (!j.is_object() || !j.contains("format") || j.at("format") != kFormat || !j.contains("tensors") ||
      !j.contains("files") || !j.at("tensors").is_object() || !j.at("files").is_array())
    throw UsageError(file + ": not a slimshard checkpoint index");
  const nlohmann::json version = j.value("version", nlohmann::json());
  if (!version.is_number_integer() || version.get<int>() != kVersion)
    throw UsageError(file + ": checkpoint format version " + version.dump() +
                     ", this slimshard reads version " + std::to_string(kVersion));
  return j;
}

// Reads pieces out of the rank files: only the byte ranges a piece occupies (so a rank loading 1/M of a
// model reads about 1/M of the checkpoint), each checked against its own CRC-32 from the index; a file's
// size is checked against the index when it is first opened.
class PieceReader {
 public:
  PieceReader(std::string path, const nlohmann::json& files) : path_(std::move(path)) {
    const std::string where = path_ + "/index.json: files";
    try {
      for (const auto& f : files) {
        const int r = static_cast<int>(json_integer(f.at("rank"), where + ": rank", 0, kMaxRanks));
        bytes_[r] = json_integer(f.at("bytes"), where + ": bytes", 0, INT64_MAX);
      }
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(where + ": bad entry (" + e.what() + ")");
    }
  }
  ~PieceReader() {
    for (auto& kv : fds_) ::close(kv.second);
  }
  PieceReader(const PieceReader&) = delete;
  PieceReader& operator=(const PieceReader&) = delete;

  // Piece `q` (an index entry: rank, key, start, end, offset, crc32; checked by piece_range) as a flat
  // tensor of `dtype`. Its bytes must lie inside the rank's file, whose size the index records and the file
  // has, before anything is allocated.
  at::Tensor read(const nlohmann::json& q, int r, int64_t start, int64_t end, at::ScalarType dtype) {
    const std::string file = path_ + "/" + rank_file(r);
    const int fd = open(r, file);
    const int64_t numel = end - start;
    const int64_t offset = json_integer(q.at("offset"), file + ": piece offset", 0, INT64_MAX);
    const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
    if (numel > (bytes_.at(r) - std::min(offset, bytes_.at(r))) / element)
      throw UsageError(path_ + "/index.json: a piece of " + q.at("key").dump() + " lies outside " +
                       rank_file(r));
    const auto crc =
        static_cast<uint32_t>(json_integer(q.at("crc32"), file + ": piece crc32", 0, UINT32_MAX));
    at::Tensor out = at::empty({numel}, dtype);
    char* dst = static_cast<char*>(out.data_ptr());
    const size_t bytes = out.nbytes();
    for (size_t done = 0; done < bytes;) {
      const ssize_t n =
          ::pread(fd, dst + done, bytes - done, static_cast<off_t>(offset) + static_cast<off_t>(done));
      if (n <= 0)
        throw UsageError(file + ": cannot read tensor " + q.at("key").get<std::string>() + " (truncated)");
      done += static_cast<size_t>(n);
    }
    if (crc_of(dst, bytes) != crc)
      throw UsageError(file + ": checksum mismatch in tensor " + q.at("key").get<std::string>() +
                       " (corrupted)");
    return out;
  }

 private:
  int open(int rank, const std::string& file) {
    auto it = fds_.find(rank);
    if (it != fds_.end()) return it->second;
    auto f = bytes_.find(rank);
    if (f == bytes_.end())
      throw UsageError(path_ + "/index.json: no file listed for rank " + std::to_string(rank));
    const int fd = ::open(file.c_str(), O_RDONLY);
    if (fd < 0) throw UsageError(file + ": cannot open checkpoint file (" + std::strerror(errno) + ")");
    fds_[rank] = fd;
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw UsageError(file + ": not a regular file");
    if (st.st_size != f->second)
      throw UsageError(file + ": " + std::to_string(st.st_size) + " bytes, the index says " +
                       std::to_string(f->second) + " (truncated or replaced)");
    return fd;
  }

  std::string path_;
  std::map<int, int64_t> bytes_;  // each rank file's size, as the index records it
  std::map<int, int> fds_;
};

}  // namespace

std::vector<TensorPiece> param_pieces(const std::vector<ShardedParam*>& params,
                                      const std::function<NamedTensors(const ShardedParam*)>& extra,
                                      bool first_host) {
  // Split ops keep row blocks "w#0", "w#1", ...: consecutive ranges of the flattened logical tensor "w".
  std::map<std::string, std::pair<int64_t, std::vector<int64_t>>> logical;  // name -> (numel so far, shape)
  std::vector<std::pair<std::string, int64_t>> where;                       // per param: logical name, offset
  for (const ShardedParam* p : params) {
    const std::string base = p->name().substr(0, p->name().find('#'));
    auto& [numel, shape] = logical[base];
    if (shape.empty())
      shape = p->shape();
    else
      shape[0] += p->shape()[0];
    where.emplace_back(base, numel);
    numel += p->numel();
  }
  std::vector<TensorPiece> out;
  for (size_t i = 0; i < params.size(); ++i) {
    ShardedParam* p = params[i];
    const bool full = is_replicated(p->strategy());
    const int64_t lo = full ? 0 : p->shard_offset();
    const int64_t len = full ? p->numel() : std::min(p->numel(), lo + p->shard_numel()) - lo;
    if (len <= 0) continue;  // this rank's shard is all padding
    auto add = [&](const std::string& name, const at::Tensor& t, bool per_rank) {
      TensorPiece piece;
      piece.name = name;
      piece.shape = logical[where[i].first].second;
      piece.start = where[i].second + lo;
      piece.data = t.reshape({-1}).slice(0, 0, len);
      piece.replicated = full && !per_rank;
      piece.per_rank = per_rank;
      piece.saved = first_host || !shards_within_host(p->strategy());
      out.push_back(piece);
    };
    add(where[i].first, p->master(), false);
    // Slim-DP's optimizer state is each rank's own; ddp's is identical everywhere; zero's is the owned slice.
    for (auto& [key, t] : p->optim_state())
      add(where[i].first + "." + key, t, p->strategy() == Strategy::slim);
    if (extra)
      for (auto& [key, t] : extra(p)) add(where[i].first + "." + key, t, false);
  }
  return out;
}

namespace {

// This rank's safetensors file in `partial`: its sharded and per-rank pieces, and the replicated ones it owns
// (replicated pieces, the same list on every rank, go to the rank with the fewest such bytes so far, so the
// files come out about the same size). Returns the file's index entry, with each piece's absolute byte
// offset and CRC-32 from the bytes written (loaders read just the pieces they need) and the whole file's
// CRC; or {"error": ...}.
nlohmann::json write_rank_file(const std::string& partial, int rank, int world,
                               const std::vector<TensorPiece>& pieces) {
  NamedTensors out;
  nlohmann::json listed = nlohmann::json::array();
  std::vector<int64_t> assigned(static_cast<size_t>(world), 0);
  for (const TensorPiece& p : pieces) {
    if (!p.saved) continue;
    if (p.replicated) {
      const auto owner = std::min_element(assigned.begin(), assigned.end()) - assigned.begin();
      assigned[static_cast<size_t>(owner)] += p.data.numel();
      if (owner != rank) continue;
    }
    out.emplace_back(piece_key(p), p.data.reshape({-1}));
    listed.push_back({{"name", p.name},
                      {"key", piece_key(p)},
                      {"shape", p.shape},
                      {"start", p.start},
                      {"end", p.start + p.data.numel()},
                      {"per_rank", p.per_rank}});
  }
  try {
    const std::string raw = safetensors_bytes(out, {{"slimshard.rank", std::to_string(rank)}});
    write_file_atomic(partial + "/" + rank_file(rank), raw);
    uint64_t header = 0;
    for (int i = 0; i < 8; ++i)
      header |= static_cast<uint64_t>(static_cast<unsigned char>(raw[i])) << (8 * i);
    const auto offsets =
        nlohmann::json::parse(raw.begin() + 8, raw.begin() + 8 + static_cast<std::ptrdiff_t>(header));
    for (auto& q : listed) {
      const nlohmann::json& entry = offsets.at(q["key"].get<std::string>());
      const size_t b = entry.at("data_offsets")[0].get<size_t>(),
                   e = entry.at("data_offsets")[1].get<size_t>();
      q["dtype"] = entry.at("dtype");
      q["offset"] = 8 + header + b;
      q["crc32"] = crc_of(raw.data() + 8 + header + b, e - b);
    }
    return {{"rank", rank},
            {"file", rank_file(rank)},
            {"bytes", raw.size()},
            {"crc32", crc_of(raw.data(), raw.size())},
            {"pieces", listed}};
  } catch (const std::exception& e) {
    return {{"error", e.what()}};
  }
}

// Rank 0: the index from every rank's entry, written last; then the directory renamed into place and all but
// the newest `keep_last` checkpoints removed.
void publish(const std::string& dir, const std::string& partial, const std::string& final_dir,
             const CheckpointMeta& meta, int world, std::vector<nlohmann::json> all, int keep_last) {
  nlohmann::json index = {{"format", kFormat},  {"version", kVersion}, {"step", meta.step},
                          {"world", world},     {"model", meta.model}, {"plan", meta.plan},
                          {"state", meta.state}};
  nlohmann::json files = nlohmann::json::array(), tensors = nlohmann::json::object();
  for (auto& m : all) {
    for (const auto& p : m["pieces"]) {
      nlohmann::json& t = tensors[p["name"].get<std::string>()];
      t["dtype"] = p["dtype"];
      t["shape"] = p["shape"];
      t["per_rank"] = p["per_rank"];
      t["pieces"].push_back({{"rank", m["rank"]},
                             {"key", p["key"]},
                             {"start", p["start"]},
                             {"end", p["end"]},
                             {"offset", p["offset"]},
                             {"crc32", p["crc32"]}});
    }
    m.erase("pieces");
    files.push_back(m);
  }
  index["files"] = files;
  index["tensors"] = tensors;
  write_file_atomic(partial + "/index.json", index.dump(1));
  fsync_dir(partial);
  std::error_code ec;
  fs::remove_all(final_dir, ec);
  fs::rename(partial, final_dir, ec);
  if (ec) throw RuntimeError("cannot rename " + partial + " to " + final_dir + ": " + ec.message());
  fsync_dir(dir);
  if (keep_last > 0) {
    const auto mine = run_checkpoints(dir, meta.state.value("run", std::string()));
    for (size_t i = static_cast<size_t>(keep_last); i < mine.size(); ++i) fs::remove_all(mine[i], ec);
  }
}

// Rank 0's error (or "") on every rank, thrown there as a RuntimeError.
void agree_on(Communicator& comm, std::string error) {
  error = broadcast_string(comm, error, 0);
  if (!error.empty()) throw RuntimeError(error);
}

}  // namespace

std::string save_checkpoint(Communicator& comm, const std::string& dir, const CheckpointMeta& meta,
                            const std::vector<TensorPiece>& pieces, int keep_last,
                            const std::function<void()>& before_index) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(meta.step));
  const std::string final_dir = dir + "/" + name, partial = final_dir + ".partial";
  const int rank = comm.rank(), world = comm.world();
  std::string error;
  if (rank == 0) {
    std::error_code ec;
    fs::remove_all(partial, ec);
    fs::create_directories(partial, ec);
    if (ec) error = "cannot create " + partial + ": " + ec.message();
  }
  agree_on(comm, error);
  const nlohmann::json mine = write_rank_file(partial, rank, world, pieces);
  if (before_index) before_index();
  std::vector<nlohmann::json> all;
  for (int r = 0; r < world; ++r)
    all.push_back(nlohmann::json::parse(broadcast_string(comm, mine.dump(), r)));
  for (const auto& m : all)
    if (m.contains("error"))
      throw RuntimeError("checkpoint " + final_dir + ": " + m["error"].get<std::string>());
  if (rank == 0) {
    try {
      publish(dir, partial, final_dir, meta, world, std::move(all), keep_last);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_on(comm, error);
  return final_dir;
}

std::vector<std::string> run_checkpoints(const std::string& dir, const std::string& run) {
  std::vector<std::string> out;
  for (const auto& [step, path] : checkpoints_in(dir)) {
    if (!run.empty()) {
      try {
        if (checkpoint_meta(path).state.value("run", std::string()) != run) continue;
      } catch (const UsageError&) {
        continue;  // unreadable: not this run's to remove
      }
    }
    out.push_back(path);
  }
  return out;
}

std::string new_run_id() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                     static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  char b[24];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "index.json", ec)) return dir;
  const auto all = checkpoints_in(dir);
  return all.empty() ? "" : all.front().second;
}

namespace {
CheckpointMeta meta_of(const nlohmann::json& index, const std::string& where) {
  CheckpointMeta meta;
  try {
    meta.step = json_integer(index.at("step"), where + ": step", 0, kMaxSteps);
    meta.model = index.at("model");
    if (!meta.model.is_object()) throw UsageError(where + ": model: not an object");
    meta.plan = index.value("plan", nlohmann::json::object());
    meta.state = index.value("state", nlohmann::json::object());
    if (!meta.plan.is_object() || !meta.state.is_object())
      throw UsageError(where + ": plan and state must be objects");
    // The trainer state's fields, exactly typed: a resumed run continues from them.
    for (const char* key : {"optimizer_steps", "data_position", "global_batch"})
      if (meta.state.contains(key)) json_integer(meta.state[key], where + ": state." + key, 0, kMaxSteps);
    for (const char* key : {"run", "optimizer"})
      if (meta.state.contains(key) && !meta.state[key].is_string())
        throw UsageError(where + ": state." + key + ": must be a string");
    if (meta.state.contains("slim") && !meta.state["slim"].is_object())
      throw UsageError(where + ": state.slim: must be an object");
    if (meta.plan.contains("world")) json_integer(meta.plan["world"], where + ": plan.world", 1, kMaxRanks);
    for (const auto& t : index.at("tensors").items()) meta.tensors.push_back(t.key());
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(where + ": bad entry (" + e.what() + ")");
  }
  return meta;
}

// A logical tensor's shape from the index: at most 8 sizes, their product bounded.
std::vector<int64_t> shape_of(const nlohmann::json& t, const std::string& what, int64_t* numel) {
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  const nlohmann::json& dims = t.at("shape");
  if (!dims.is_array() || dims.size() > 8)
    throw UsageError(what + ": shape must be a list of at most 8 sizes");
  std::vector<int64_t> shape;
  *numel = 1;
  for (const auto& d : dims) {
    const int64_t v = json_integer(d, what + ": shape", 0, kMaxElements);
    if (v > 0 && *numel > kMaxElements / v)
      throw UsageError(what + ": shape " + dims.dump() + " is too large");
    *numel *= v;
    shape.push_back(v);
  }
  return shape;
}
}  // namespace

CheckpointMeta checkpoint_meta(const std::string& path) {
  return meta_of(read_index(path), path + "/index.json");
}

CheckpointMeta load_checkpoint(const std::string& path, int rank, const std::vector<TensorPiece>& pieces) {
  const nlohmann::json index = read_index(path);
  const std::string where = path + "/index.json";
  const CheckpointMeta meta = meta_of(index, where);
  PieceReader files(path, index.at("files"));
  try {
    for (const TensorPiece& p : pieces) {
      const auto t = index.at("tensors").find(p.name);
      if (t == index.at("tensors").end()) throw UsageError(where + ": tensor " + p.name + " is missing");
      if (!t->is_object()) throw UsageError(where + ": tensor " + p.name + ": not an object");
      int64_t numel = 0;
      if (shape_of(*t, where + ": tensor " + p.name, &numel) != p.shape)
        throw UsageError(where + ": tensor " + p.name + " has shape " + t->at("shape").dump() +
                         ", this model expects " + nlohmann::json(p.shape).dump());
      at::ScalarType type;
      if (!dtype_from(t->value("dtype", "F32"), &type) || type != p.data.scalar_type())
        throw UsageError(where + ": tensor " + p.name + " has dtype " +
                         t->value("dtype", nlohmann::json()).dump() + ", this run expects " +
                         c10::toString(p.data.scalar_type()));
      const int64_t lo = p.start, hi = p.start + p.data.numel();
      const bool per_rank = t->value("per_rank", false);
      int from = -1;  // per-rank tensors: this rank's own copy if the checkpoint has one, else rank 0's
      const std::string piece = where + ": tensor " + p.name + ": piece";
      if (!t->at("pieces").is_array())
        throw UsageError(where + ": tensor " + p.name + ": pieces is not a list");
      if (per_rank)
        for (const auto& q : t->at("pieces"))
          from = json_integer(q.at("rank"), piece + " rank", 0, kMaxRanks) == rank ? rank : std::max(from, 0);
      int64_t covered = 0;
      at::Tensor dst = p.data.reshape({-1});
      for (const auto& q : t->at("pieces")) {
        const int r = static_cast<int>(json_integer(q.at("rank"), piece + " rank", 0, kMaxRanks));
        const int64_t start = json_integer(q.at("start"), piece + " start", 0, numel);
        const int64_t end = json_integer(q.at("end"), piece + " end", start, numel);
        if (per_rank && r != from) continue;
        const int64_t a = std::max(lo, start), b = std::min(hi, end);
        if (a >= b) continue;
        const at::Tensor src = files.read(q, r, start, end, dst.scalar_type());
        dst.slice(0, a - lo, b - lo).copy_(src.slice(0, a - start, b - start));
        covered += b - a;
      }
      if (covered != hi - lo)
        throw UsageError(where + ": tensor " + p.name + ": elements [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + ") not covered by its pieces");
    }
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(where + ": bad entry (" + e.what() + ")");
  }
  return meta;
}

NamedTensors read_checkpoint_tensors(const std::string& path, CheckpointMeta* meta) {
  const nlohmann::json index = read_index(path);
  const std::string where = path + "/index.json";
  struct Declared {
    std::string name;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    at::ScalarType type = at::kFloat;
  };
  std::vector<Declared> declared;
  try {
    // Every tensor whole: no more bytes than the rank files hold, checked before anything is allocated.
    int64_t file_bytes = 0, want = 0;
    for (const auto& f : index.at("files"))
      file_bytes += json_integer(f.at("bytes"), where + ": files: bytes", 0, INT64_MAX / 4);
    for (const auto& [name, t] : index.at("tensors").items()) {
      Declared d;
      d.name = name;
      if (!t.is_object() || !dtype_from(t.value("dtype", "F32"), &d.type))
        throw UsageError(where + ": tensor " + name + ": unknown dtype");
      d.shape = shape_of(t, where + ": tensor " + name, &d.numel);
      want += d.numel * static_cast<int64_t>(c10::elementSize(d.type));
      if (want > file_bytes)
        throw UsageError(where + ": the tensors need more bytes than the rank files hold (" +
                         std::to_string(file_bytes) + ")");
      declared.push_back(std::move(d));
    }
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(where + ": bad entry (" + e.what() + ")");
  }
  NamedTensors out;
  std::vector<TensorPiece> whole;
  for (const Declared& d : declared) {
    TensorPiece p;
    p.name = d.name;
    p.shape = d.shape;
    p.data = at::empty({d.numel}, d.type);
    out.emplace_back(d.name, p.data.view(d.shape));
    whole.push_back(std::move(p));
  }
  CheckpointMeta m = load_checkpoint(path, 0, whole);
  if (meta) *meta = m;
  return out;
}

}  // namespace slimshard

namespace slimshard {
namespace {

// slimshard's GPT names → GPT-2/nanoGPT's ("blocks.3.mlp.fc.weight" → "transformer.h.3.mlp.c_fc.weight").
// Linear weights are [out, in] in both (nanoGPT's nn.Linear, not GPT-2's transposed Conv1D).
std::string nanogpt_name(const std::string& n) {
  static const std::vector<std::pair<std::string, std::string>> parts = {{".ln1.", ".ln_1."},
                                                                         {".ln2.", ".ln_2."},
                                                                         {".attn.qkv.", ".attn.c_attn."},
                                                                         {".attn.proj.", ".attn.c_proj."},
                                                                         {".mlp.fc.", ".mlp.c_fc."},
                                                                         {".mlp.proj.", ".mlp.c_proj."}};
  if (n.rfind("blocks.", 0) == 0) {
    std::string out = "transformer.h." + n.substr(7);
    for (const auto& [from, to] : parts) {
      const size_t at = out.find(from);
      if (at != std::string::npos) return out.replace(at, from.size(), to);
    }
    return out;
  }
  if (n.rfind("wte.", 0) == 0 || n.rfind("wpe.", 0) == 0 || n.rfind("ln_f.", 0) == 0)
    return "transformer." + n;
  return n;  // lm_head.weight, and every name of the MLP and CNN
}

}  // namespace

std::string export_checkpoint(const std::string& dir, const std::string& out, const std::string& loss_text,
                              double* loss, at::ScalarType dtype) {
  const std::string stem = out.size() > 12 && out.compare(out.size() - 12, 12, ".safetensors") == 0
                               ? out.substr(0, out.size() - 12)
                               : out;
  check_output_file(out, "export");
  check_output_file(stem + ".config.json", "export");
  const std::string path = latest_checkpoint(dir);
  if (path.empty()) throw UsageError("export: " + dir + ": no complete checkpoint there");
  // Everything is read and checked before anything is written: the config, the --loss-on text, the tensors.
  const nlohmann::json model = checkpoint_meta(path).model;
  const ModelConfig cfg = ModelConfig::from_json(model, path + "/index.json");
  const bool gpt = cfg.arch == "gpt";
  std::string text;
  if (!loss_text.empty()) {
    if (!gpt) throw UsageError("export --loss-on: only for GPT checkpoints");
    text = read_file(loss_text, "--loss-on");
    const int64_t need = 4 * (cfg.seq_len + 1);
    if (static_cast<int64_t>(text.size()) < need)
      throw UsageError("--loss-on " + loss_text + ": needs at least " + std::to_string(need) + " bytes");
  }
  CheckpointMeta meta;
  NamedTensors all = read_checkpoint_tensors(path, &meta);
  auto whole = model_from_values(cfg, all);  // checks every tensor against the config
  if (!text.empty() && loss) {
    // The model's loss on the first 4 rows of T+1 bytes of the file: an oracle for other implementations.
    const int64_t rows = 4, T = cfg.seq_len;
    at::Tensor tok = at::empty({rows, T + 1}, at::kLong);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t <= T; ++t)
        tok[r][t] =
            static_cast<int64_t>(static_cast<unsigned char>(text[static_cast<size_t>(r * (T + 1) + t)]));
    at::NoGradGuard no_grad;
    *loss = whole->loss(tok.slice(1, 0, T), tok.slice(1, 1, T + 1)).item<double>();
  }
  NamedTensors weights;
  for (auto& [name, t] : all) {
    const bool param = name.size() > 7 && (name.compare(name.size() - 7, 7, ".weight") == 0 ||
                                           name.compare(name.size() - 5, 5, ".bias") == 0);
    if (param) weights.emplace_back(gpt ? nanogpt_name(name) : name, t.to(dtype));
  }
  nlohmann::json config = model;
  if (gpt)
    config = {{"model_type", "gpt2"}, {"n_layer", cfg.n_layer},    {"n_head", cfg.n_head},
              {"n_embd", cfg.n_embd}, {"block_size", cfg.seq_len}, {"vocab_size", cfg.vocab},
              {"bias", true},         {"lm_head_bias", false}};
  config["step"] = meta.step;
  config["dtype"] = dtype == at::kBFloat16 ? "bfloat16" : "float32";
  // Both files or neither: the config first, and taken back if the weights cannot be written.
  const std::string bytes = safetensors_bytes(weights, {{"format", "pt"}, {"slimshard.model", model.dump()}});
  write_file_atomic(stem + ".config.json", config.dump(2) + "\n");
  try {
    write_file_atomic(out, bytes);
  } catch (...) {
    std::error_code ec;
    fs::remove(stem + ".config.json", ec);
    throw;
  }
  return path;
}

}  // namespace slimshard
