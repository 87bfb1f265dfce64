// datasets.cpp — token datasets (byte-level text, KJV, llm.c .bin shards) and Fashion-MNIST, with
// deterministic per-row sampling (see data.h).
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "slimshard/common.h"
#include "slimshard/data.h"
#include "slimshard/hash.h"

namespace fs = std::filesystem;

namespace slimshard {

namespace {

uint64_t row_key(uint64_t seed, int64_t a, int64_t b) {
  return mix64(mix64(seed ^ 0x5EEDull) ^
               mix64(static_cast<uint64_t>(a) * kFnvPrime + static_cast<uint64_t>(b)));
}

// Evenly spread choice of `want` items out of `have` (all of them when want <= 0 or want >= have).
std::vector<int64_t> spread(int64_t have, int64_t want) {
  if (want <= 0 || want > have) want = have;
  std::vector<int64_t> idx(static_cast<size_t>(want));
  for (int64_t i = 0; i < want; ++i) idx[static_cast<size_t>(i)] = i * have / want;
  return idx;
}

// ---------------------------------------------------------------------------------------------------------------
class TokenDataset final : public Dataset {
 public:
  TokenDataset(std::string desc, std::vector<uint16_t> train, std::vector<uint16_t> val, int64_t T,
               uint64_t seed, int64_t eval_rows)
      : desc_(std::move(desc)), train_(std::move(train)), val_(std::move(val)), T_(T), seed_(seed) {
    val_chunks_ = spread((static_cast<int64_t>(val_.size()) - 1) / T_, eval_rows);
  }
  std::string describe() const override { return desc_; }
  bool classification() const override { return false; }
  int64_t tokens_per_row() const override { return T_; }

  Batch train_rows(int64_t step, int64_t, int64_t lo, int64_t hi) const override {
    const uint64_t span = train_.size() - static_cast<size_t>(T_);  // valid starts: [0, span)
    std::vector<int64_t> starts;
    for (int64_t r = lo; r < hi; ++r) starts.push_back(static_cast<int64_t>(row_key(seed_, step, r) % span));
    return gather(train_, starts);
  }
  int64_t val_size() const override { return static_cast<int64_t>(val_chunks_.size()); }
  Batch val_rows(int64_t lo, int64_t hi) const override {
    std::vector<int64_t> starts;
    for (int64_t r = lo; r < hi; ++r) starts.push_back(val_chunks_[static_cast<size_t>(r)] * T_);
    return gather(val_, starts);
  }

 private:
  Batch gather(const std::vector<uint16_t>& tokens, const std::vector<int64_t>& starts) const {
    const int64_t n = static_cast<int64_t>(starts.size());
    Batch b{at::empty({n, T_}, at::kLong), at::empty({n, T_}, at::kLong)};
    int64_t* x = b.x.data_ptr<int64_t>();
    int64_t* y = b.y.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t* src = tokens.data() + starts[static_cast<size_t>(i)];
      for (int64_t t = 0; t < T_; ++t) x[i * T_ + t] = src[t], y[i * T_ + t] = src[t + 1];
    }
    return b;
  }

  std::string desc_;
  std::vector<uint16_t> train_, val_;
  int64_t T_;
  uint64_t seed_;
  std::vector<int64_t> val_chunks_;
};

// ---------------------------------------------------------------------------------------------------------------
class ImageDataset final : public Dataset {
 public:
  ImageDataset(IdxImages train_x, std::vector<uint8_t> train_y, IdxImages test_x, std::vector<uint8_t> test_y,
               uint64_t seed, int64_t eval_rows)
      : train_x_(std::move(train_x)),
        train_y_(std::move(train_y)),
        test_x_(std::move(test_x)),
        test_y_(std::move(test_y)),
        seed_(seed) {
    test_idx_ = spread(test_x_.n, eval_rows);
  }
  std::string describe() const override {
    return "Fashion-MNIST (" + std::to_string(train_x_.n) + " train, " + std::to_string(test_idx_.size()) +
           " test images)";
  }
  bool classification() const override { return true; }
  int64_t tokens_per_row() const override { return 1; }

  // Sample k of the stream is image perm_e[k mod N] with e = k / N: an epoch is one pass in a seeded order.
  Batch train_rows(int64_t step, int64_t global_rows, int64_t lo, int64_t hi) const override {
    std::vector<int64_t> idx;
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t k = step * global_rows + r;
      idx.push_back(permutation(k / train_x_.n)[static_cast<size_t>(k % train_x_.n)]);
    }
    return gather(train_x_, train_y_, idx);
  }
  int64_t val_size() const override { return static_cast<int64_t>(test_idx_.size()); }
  Batch val_rows(int64_t lo, int64_t hi) const override {
    return gather(test_x_, test_y_, std::vector<int64_t>(test_idx_.begin() + lo, test_idx_.begin() + hi));
  }

 private:
  const std::vector<int64_t>& permutation(int64_t epoch) const {
    if (epoch != perm_epoch_) {
      perm_.resize(static_cast<size_t>(train_x_.n));
      for (int64_t i = 0; i < train_x_.n; ++i) perm_[static_cast<size_t>(i)] = i;
      for (int64_t i = train_x_.n - 1; i > 0; --i)  // Fisher-Yates with a portable generator
        std::swap(perm_[static_cast<size_t>(i)],
                  perm_[static_cast<size_t>(row_key(seed_, epoch, i) % static_cast<uint64_t>(i + 1))]);
      perm_epoch_ = epoch;
    }
    return perm_;
  }

  static Batch gather(const IdxImages& images, const std::vector<uint8_t>& labels,
                      const std::vector<int64_t>& idx) {
    const int64_t n = static_cast<int64_t>(idx.size()), px = images.rows * images.cols;
    Batch b{at::empty({n, 1, images.rows, images.cols}, at::kFloat), at::empty({n}, at::kLong)};
    float* x = b.x.data_ptr<float>();
    int64_t* y = b.y.data_ptr<int64_t>();
    // Fashion-MNIST's pixel mean and standard deviation.
    constexpr float kMean = 0.2860f, kStd = 0.3530f;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* src = images.pixels.data() + idx[static_cast<size_t>(i)] * px;
      for (int64_t p = 0; p < px; ++p) x[i * px + p] = (static_cast<float>(src[p]) / 255.0f - kMean) / kStd;
      y[i] = labels[static_cast<size_t>(idx[static_cast<size_t>(i)])];
    }
    return b;
  }

  IdxImages train_x_;
  std::vector<uint8_t> train_y_;
  IdxImages test_x_;
  std::vector<uint8_t> test_y_;
  uint64_t seed_;
  std::vector<int64_t> test_idx_;
  mutable std::vector<int64_t> perm_;
  mutable int64_t perm_epoch_ = -1;
};

// ---------------------------------------------------------------------------------------------------------------
std::vector<uint16_t> bytes_to_tokens(const std::string& bytes) {
  std::vector<uint16_t> t(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) t[i] = static_cast<unsigned char>(bytes[i]);
  return t;
}

void split_train_val(std::vector<uint16_t>& all, std::vector<uint16_t>& val) {
  const size_t cut = all.size() * 9 / 10;
  val.assign(all.begin() + static_cast<std::ptrdiff_t>(cut), all.end());
  all.resize(cut);
}

// `flag` names where the file came from (--data or --val-data) in every message.
std::vector<uint16_t> load_tokens(const std::string& path, const DataOptions& o, const std::string& flag) {
  require_regular_file(path, flag);
  if (path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0) {
    std::vector<uint16_t> t = read_llmc_bin(path, flag);
    for (uint16_t v : t)
      if (v >= o.vocab)
        throw UsageError(flag + " " + path + ": token " + std::to_string(v) +
                         " is outside the vocabulary (--vocab " + std::to_string(o.vocab) + ")");
    return t;
  }
  if (o.vocab < 256)
    throw UsageError("--vocab " + std::to_string(o.vocab) + " is too small for byte-level text " + path +
                     " (needs 256)");
  return bytes_to_tokens(read_file(path, flag));
}

std::string default_cache_dir() {
  if (const char* c = std::getenv("SLIMSHARD_CACHE")) return c;
  if (const char* h = std::getenv("HOME")) return std::string(h) + "/.cache/slimshard";
  return "/tmp/slimshard-cache";
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
std::string kjv_text_path(const std::string& cache_dir) {
  const std::string dir = cache_dir.empty() ? default_cache_dir() : cache_dir;
  const std::string path = dir + "/kjv.txt";
  std::error_code ec;
  if (fs::exists(path, ec) && fs::file_size(path, ec) > 0) return path;
  fs::create_directories(dir, ec);
  if (ec) throw UsageError("--data kjv: cannot create cache directory " + dir + ": " + ec.message());
  FILE* p = ::popen("bible -f 'Gen1:1-Rev22:21' 2>/dev/null", "r");
  if (!p) throw UsageError("--data kjv: cannot run the `bible` program (install the bible-kjv package)");
  std::string text, line;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  int rc = ::pclose(p);
  if (rc != 0 || text.size() < 1000000)
    throw UsageError(
        "--data kjv: `bible -f Gen1:1-Rev22:21` failed (is the bible-kjv package installed? "
        "scripts/install-deps.sh installs it)");
  // Lines look like "Ge1:1 In the beginning ...": keep the verse, drop the reference.
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    size_t sp = text.find(' ', pos);
    size_t start = (sp != std::string::npos && sp < eol) ? sp + 1 : pos;
    out.append(text, start, eol - start);
    out.push_back('\n');
    pos = eol + 1;
  }
  write_file_atomic(path, out);
  return path;
}

std::vector<uint16_t> read_llmc_bin(const std::string& path, const std::string& flag) {
  require_regular_file(path, flag);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(flag + " " + path + ": cannot open");
  int32_t header[256] = {0};
  in.read(reinterpret_cast<char*>(header), sizeof header);
  if (in.gcount() != static_cast<std::streamsize>(sizeof header))
    throw UsageError(flag + " " + path + ": truncated header (llm.c .bin needs a 1024-byte header)");
  if (header[0] != 20240520)
    throw UsageError(flag + " " + path + ": bad magic " + std::to_string(header[0]) + " (expected 20240520)");
  if (header[1] != 1)
    throw UsageError(flag + " " + path + ": unsupported version " + std::to_string(header[1]) +
                     " (expected 1: uint16 tokens)");
  if (header[2] <= 0)
    throw UsageError(flag + " " + path + ": token count " + std::to_string(header[2]) + " <= 0");
  const auto count = static_cast<size_t>(header[2]);
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || size != sizeof header + count * 2)
    throw UsageError(flag + " " + path + ": truncated or oversized: header says " + std::to_string(count) +
                     " tokens (" + std::to_string(sizeof header + count * 2) + " bytes), file has " +
                     std::to_string(size) + " bytes");
  std::vector<uint16_t> tokens(count);
  in.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(count * 2));
  if (in.gcount() != static_cast<std::streamsize>(count * 2))
    throw UsageError(flag + " " + path + ": read error");
  return tokens;
}

void write_llmc_bin(const std::string& path, const std::vector<uint16_t>& tokens) {
  int32_t header[256] = {0};
  header[0] = 20240520, header[1] = 1, header[2] = static_cast<int32_t>(tokens.size());
  std::string data(reinterpret_cast<const char*>(header), sizeof header);
  data.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  write_file_atomic(path, data);
}

namespace {

std::string gunzip_file(const std::string& path) {
  require_regular_file(path, "--data");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw UsageError("--data " + path + ": cannot open (" + std::strerror(errno) + ")");
  std::string out;
  char buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      throw UsageError("--data " + path + ": unreadable gzip (" + msg + ")");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  int err = Z_OK;
  const char* msg = gzerror(f, &err);
  std::string m = msg ? msg : "";
  gzclose(f);
  if (err != Z_OK && err != Z_STREAM_END)
    throw UsageError("--data " + path + ": unreadable gzip (" + m + ")");
  return out;
}

uint32_t be32(const std::string& s, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + at);
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace

IdxImages read_idx_images(const std::string& gz_path) {
  const std::string raw = gunzip_file(gz_path);
  if (raw.size() < 16) throw UsageError("--data " + gz_path + ": truncated IDX header");
  if (be32(raw, 0) != 0x00000803)
    throw UsageError("--data " + gz_path + ": bad IDX magic (expected 0x00000803, images)");
  IdxImages im;
  im.n = be32(raw, 4), im.rows = be32(raw, 8), im.cols = be32(raw, 12);
  if (im.n == 0) throw UsageError("--data " + gz_path + ": no images");
  // Declared sizes checked against the file: no product of them overflows.
  if (im.rows == 0 || im.cols == 0 || im.rows > 4096 || im.cols > 4096 ||
      static_cast<uint64_t>(im.n) * static_cast<uint64_t>(im.rows * im.cols) != raw.size() - 16)
    throw UsageError("--data " + gz_path + ": IDX size mismatch: header says " + std::to_string(im.n) +
                     " x " + std::to_string(im.rows) + " x " + std::to_string(im.cols) +
                     " pixels, file has " + std::to_string(raw.size() - 16) + " pixel bytes");
  im.pixels.assign(raw.begin() + 16, raw.end());
  return im;
}

std::vector<uint8_t> read_idx_labels(const std::string& gz_path) {
  const std::string raw = gunzip_file(gz_path);
  if (raw.size() < 8) throw UsageError("--data " + gz_path + ": truncated IDX header");
  if (be32(raw, 0) != 0x00000801)
    throw UsageError("--data " + gz_path + ": bad IDX magic (expected 0x00000801, labels)");
  const size_t n = be32(raw, 4);
  if (n == 0) throw UsageError("--data " + gz_path + ": no labels");
  if (raw.size() != 8 + n)
    throw UsageError("--data " + gz_path + ": IDX size mismatch: header says " + std::to_string(n) +
                     " labels, file has " + std::to_string(raw.size() - 8));
  std::vector<uint8_t> labels(raw.begin() + 8, raw.end());
  for (uint8_t l : labels)
    if (l > 9) throw UsageError("--data " + gz_path + ": label " + std::to_string(l) + " out of range 0..9");
  return labels;
}

std::unique_ptr<Dataset> open_dataset(const DataOptions& o) {
  if (o.spec == "fashion-mnist") {
    const std::string d = o.mnist_dir + "/";
    IdxImages tx = read_idx_images(d + "train-images-idx3-ubyte.gz");
    auto ty = read_idx_labels(d + "train-labels-idx1-ubyte.gz");
    IdxImages vx = read_idx_images(d + "t10k-images-idx3-ubyte.gz");
    auto vy = read_idx_labels(d + "t10k-labels-idx1-ubyte.gz");
    if (tx.n != static_cast<int64_t>(ty.size()) || vx.n != static_cast<int64_t>(vy.size()))
      throw UsageError("--data fashion-mnist: image and label counts differ in " + o.mnist_dir);
    if (tx.rows != 28 || tx.cols != 28 || vx.rows != 28 || vx.cols != 28)
      throw UsageError("--data fashion-mnist: images in " + o.mnist_dir + " are not 28x28");
    return std::make_unique<ImageDataset>(std::move(tx), std::move(ty), std::move(vx), std::move(vy), o.seed,
                                          o.eval_rows);
  }
  std::string path = o.spec == "kjv" ? kjv_text_path(o.cache_dir) : o.spec;
  std::vector<uint16_t> train = load_tokens(path, o, "--data"), val;
  std::string val_path = o.val_spec;
  if (val_path.empty()) {
    const size_t at = path.rfind("_train");
    if (at != std::string::npos) {
      std::string sibling = path.substr(0, at) + "_val" + path.substr(at + 6);
      if (fs::exists(sibling)) val_path = sibling;
    }
  }
  if (!val_path.empty())
    val = load_tokens(val_path, o, o.val_spec.empty() ? "--data" : "--val-data");
  else
    split_train_val(train, val);
  const auto need = static_cast<size_t>(o.seq_len + 2);
  if (train.size() < need)
    throw UsageError("--data " + path + ": too short for --seq-len " + std::to_string(o.seq_len) + " (" +
                     std::to_string(train.size()) + " train tokens)");
  if (val.size() < need)
    throw UsageError((o.val_spec.empty() ? "--data " + path : "--val-data " + val_path) +
                     ": too short for --seq-len " + std::to_string(o.seq_len) + " (" +
                     std::to_string(val.size()) + " validation tokens)");
  std::string desc = (o.spec == "kjv" ? std::string("KJV Bible") : path) + " (" +
                     std::to_string(train.size()) + " train / " + std::to_string(val.size()) + " val tokens" +
                     (val_path.empty() ? ", 90/10 split)" : ", val " + val_path + ")");
  return std::make_unique<TokenDataset>(desc, std::move(train), std::move(val), o.seq_len, o.seed,
                                        o.eval_rows);
}

}  // namespace slimshard
