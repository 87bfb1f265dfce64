// test_data.cpp — llm.c .bin and gzip IDX readers (good, truncated and corrupt files), and deterministic
// batches whose rank slices add up to the same global batch.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "helpers.h"
#include "slimshard/common.h"
#include "slimshard/data.h"

using namespace slimshard;
namespace fs = std::filesystem;

namespace {

std::string write_text(const std::string& dir, size_t n) {
  std::string text;
  for (size_t i = 0; i < n; ++i) text.push_back(static_cast<char>('a' + (i * 7 + i / 13) % 26));
  std::string path = dir + "/text.txt";
  write_file_atomic(path, text);
  return path;
}

void expect_usage_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Data, LlmcBinRoundTripAndErrors) {
  const std::string dir = test::scratch_dir();
  std::vector<uint16_t> tokens{1, 2, 3, 50256, 7};
  write_llmc_bin(dir + "/a.bin", tokens);
  EXPECT_EQ(read_llmc_bin(dir + "/a.bin"), tokens);

  std::string raw = read_file(dir + "/a.bin", "test");
  write_file_atomic(dir + "/trunc.bin", raw.substr(0, raw.size() - 3));
  expect_usage_error([&] { read_llmc_bin(dir + "/trunc.bin"); }, "trunc.bin: truncated");
  write_file_atomic(dir + "/short.bin", raw.substr(0, 100));
  expect_usage_error([&] { read_llmc_bin(dir + "/short.bin"); }, "truncated header");
  std::string bad = raw;
  bad[0] = 1;
  write_file_atomic(dir + "/magic.bin", bad);
  expect_usage_error([&] { read_llmc_bin(dir + "/magic.bin"); }, "bad magic");
}

TEST(Data, FashionMnistIdx) {
  const std::string d = "/usr/share/datasets/fashion-mnist/";
  auto labels = read_idx_labels(d + "t10k-labels-idx1-ubyte.gz");
  ASSERT_EQ(labels.size(), 10000u);
  std::vector<int> per_class(10);
  for (uint8_t l : labels) per_class[l]++;
  for (int c : per_class) EXPECT_EQ(c, 1000);  // the test set is balanced
  IdxImages im = read_idx_images(d + "t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(im.n, 10000);
  EXPECT_EQ(im.rows, 28);
  EXPECT_EQ(im.pixels.size(), 10000u * 784);
}

TEST(Data, CorruptAndTruncatedGzip) {
  const std::string dir = test::scratch_dir();
  std::string raw = read_file("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", "test");
  std::string corrupt = raw;
  for (size_t i = 100; i < 200; ++i) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
  write_file_atomic(dir + "/corrupt.gz", corrupt);
  expect_usage_error([&] { read_idx_labels(dir + "/corrupt.gz"); }, "corrupt.gz");
  write_file_atomic(dir + "/trunc.gz", raw.substr(0, raw.size() / 2));
  expect_usage_error([&] { read_idx_labels(dir + "/trunc.gz"); }, "trunc.gz");
  expect_usage_error([&] { read_idx_labels(dir + "/missing.gz"); }, "missing.gz");
}

TEST(Data, TextBatchesAreDeterministicAndSliceable) {
  const std::string dir = test::scratch_dir();
  DataOptions o;
  o.spec = write_text(dir, 5000);
  o.seq_len = 16;
  o.seed = 7;
  auto ds = open_dataset(o);
  Batch whole = ds->train_rows(3, 8, 0, 8);
  Batch a = ds->train_rows(3, 8, 0, 3), b = ds->train_rows(3, 8, 3, 8);
  EXPECT_TRUE(at::equal(whole.x, at::cat({a.x, b.x})));
  EXPECT_TRUE(at::equal(whole.y, at::cat({a.y, b.y})));
  // Targets are the inputs shifted by one token.
  EXPECT_TRUE(at::equal(whole.x.slice(1, 1), whole.y.slice(1, 0, 15)));
  EXPECT_FALSE(at::equal(whole.x, ds->train_rows(4, 8, 0, 8).x));
  o.seed = 8;
  EXPECT_FALSE(at::equal(whole.x, open_dataset(o)->train_rows(3, 8, 0, 8).x));
  EXPECT_EQ(ds->val_size(), (500 - 1) / 16);
}

TEST(Data, ImageBatchesAreSliceable) {
  DataOptions o;
  o.spec = "fashion-mnist";
  o.eval_rows = 100;
  auto ds = open_dataset(o);
  ASSERT_TRUE(ds->classification());
  EXPECT_EQ(ds->val_size(), 100);
  Batch whole = ds->train_rows(5, 6, 0, 6), a = ds->train_rows(5, 6, 0, 2), b = ds->train_rows(5, 6, 2, 6);
  EXPECT_TRUE(at::equal(whole.x, at::cat({a.x, b.x})));
  EXPECT_TRUE(at::equal(whole.y, at::cat({a.y, b.y})));
  EXPECT_EQ(whole.x.sizes(), (std::vector<int64_t>{6, 1, 28, 28}));
}

TEST(Data, MissingAndUnsuitableFiles) {
  const std::string dir = test::scratch_dir();
  DataOptions o;
  o.spec = dir + "/nope.txt";
  expect_usage_error([&] { open_dataset(o); }, "nope.txt: no such file");
  o.spec = write_text(dir, 20);
  o.seq_len = 64;
  expect_usage_error([&] { open_dataset(o); }, "too short");
  std::vector<uint16_t> big{1, 2, 300};
  write_llmc_bin(dir + "/big.bin", big);
  o.spec = dir + "/big.bin";
  o.vocab = 256;
  expect_usage_error([&] { open_dataset(o); }, "outside the vocabulary");
}
