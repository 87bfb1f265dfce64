// test_safetensors.cpp — safetensors round trip (dtypes, metadata), corrupt and truncated files, model files.
#include <gtest/gtest.h>

#include "helpers.h"
#include "slimshard/ckpt.h"
#include "slimshard/common.h"
#include "slimshard/nn.h"

using namespace slimshard;

TEST(Safetensors, RoundTrip) {
  const std::string dir = test::scratch_dir();
  NamedTensors t{{"b.f32", at::randn({3, 4})},
                 {"a.i64", at::arange(10, at::kLong)},
                 {"c.bf16", at::randn({5}).to(at::kBFloat16)},
                 {"d.empty", at::empty({0, 3})}};
  save_safetensors(dir + "/x.safetensors", t, {{"k", "v"}});
  SafeTensorsFile f = load_safetensors(dir + "/x.safetensors");
  EXPECT_EQ(f.metadata.at("k"), "v");
  ASSERT_EQ(f.tensors.size(), t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(f.tensors[i].first, t[i].first);  // file order kept
    EXPECT_TRUE(at::equal(f.tensors[i].second, t[i].second)) << t[i].first;
  }
  // The layout is the public one: 8-byte little-endian header size, then JSON.
  std::string raw = read_file(dir + "/x.safetensors", "test");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(raw[size_t(i)])) << (8 * i);
  auto header = nlohmann::json::parse(raw.substr(8, n));
  EXPECT_EQ(header["b.f32"]["dtype"], "F32");
  EXPECT_EQ(header["b.f32"]["shape"], nlohmann::json({3, 4}));
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, CorruptAndTruncatedFilesNameTheProblem) {
  const std::string dir = test::scratch_dir();
  save_safetensors(dir + "/x.safetensors", {{"w", at::randn({64})}}, {});
  std::string raw = read_file(dir + "/x.safetensors", "test");
  auto expect_error = [&](const std::string& name, const std::string& bytes, const std::string& needle) {
    write_file_atomic(dir + "/" + name, bytes);
    try {
      load_safetensors(dir + "/" + name);
      ADD_FAILURE() << name << " loaded";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("trunc.safetensors", raw.substr(0, raw.size() - 10), "tensor w: truncated");
  expect_error("tiny.safetensors", raw.substr(0, 5), "truncated");
  std::string bad = raw;
  bad[8] = '#';  // the header's opening brace
  expect_error("json.safetensors", bad, "corrupt safetensors header");
  std::string huge = raw;
  huge[7] = 0x7f;
  expect_error("size.safetensors", huge, "truncated");
}

TEST(Safetensors, ModelFileRoundTrip) {
  const std::string dir = test::scratch_dir();
  auto model = build_model(ModelConfig::preset_config("gpt-tiny"), 3);
  save_model_file(dir + "/m.safetensors", *model);
  auto loaded = load_model_file(dir + "/m.safetensors");
  EXPECT_EQ(loaded->config().to_json(), model->config().to_json());
  at::NoGradGuard no_grad;
  at::Tensor ids = at::randint(0, 256, {2, 10}, at::kLong);
  EXPECT_TRUE(at::equal(loaded->logits(ids), model->logits(ids)));
  // A model of another shape does not load silently.
  auto other = build_model(ModelConfig::preset_config("mlp"), 3);
  save_model_file(dir + "/mlp.safetensors", *other);
  std::string raw = read_file(dir + "/mlp.safetensors", "test");
  write_file_atomic(dir + "/bad.safetensors", raw.substr(0, raw.size() / 2));
  EXPECT_THROW(load_model_file(dir + "/bad.safetensors"), UsageError);
}
