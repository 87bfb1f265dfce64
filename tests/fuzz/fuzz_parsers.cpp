// fuzz_parsers.cpp — libFuzzer harnesses, one per parser of user input (built by `make fuzz`, one binary
// each: -DFUZZ_TARGET=<name>). The contract each checks: bad input is a UsageError (exit 2 in the CLI) or a
// valid result — never another exception (uncaught: libFuzzer reports it), a crash, undefined behaviour or a
// leak (AddressSanitizer and UndefinedBehaviorSanitizer are linked in).
#include <zlib.h>

#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "slimshard/ckpt.h"
#include "slimshard/common.h"
#include "slimshard/cost_model.h"
#include "slimshard/data.h"
#include "slimshard/json.h"
#include "slimshard/plan.h"
#include "slimshard/profile.h"
#include "slimshard/train.h"

using namespace slimshard;

namespace {

// A scratch directory of this process, for parsers that read files.
const std::string& scratch() {
  static const std::string dir = [] {
    const std::string d =
        std::filesystem::temp_directory_path() / ("slimshard-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

std::string put(const std::string& name, const std::string& bytes) {
  const std::string path = scratch() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f) std::fwrite(bytes.data(), 1, bytes.size(), f), std::fclose(f);
  return path;
}

std::string gzip(const std::string& raw) {
  const std::string path = scratch() + "/in.gz";
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, raw.data(), static_cast<unsigned>(raw.size()));
  gzclose(f);
  return path;
}

void one(const std::string& in) {
  const std::string target = FUZZ_TARGET;
  if (target == "plan") {
    const Plan p = parse_plan(in, "fuzz");
    resolve_plan(p, op_shapes(ModelConfig::preset_config("gpt-tiny")));
  } else if (target == "profile") {
    const Profile p = profile_from_json(parse_json(in, "fuzz"), "fuzz");
    CostOptions o;
    o.world = p.world, o.global_batch = p.world * p.micro_batches.back();
    CostModel::from_profile(p, o).evaluate({}, p.micro_batches.back());
  } else if (target == "cluster") {
    const ClusterSpec c = cluster_from_json(parse_json(in, "fuzz"), "fuzz");
    CostOptions o;
    o.world = c.devices, o.global_batch = c.devices;
    CostModel::from_cluster(c, ModelConfig::preset_config("gpt-tiny"), o, {1}).evaluate({}, 1);
  } else if (target == "safetensors") {
    parse_safetensors(in, "fuzz");
  } else if (target == "model_file") {
    load_model_file(put("model.safetensors", in));
  } else if (target == "checkpoint_index") {
    const std::string dir = scratch() + "/step-00000001";
    std::filesystem::create_directories(dir);
    put("step-00000001/index.json", in);
    checkpoint_meta(dir);
    read_checkpoint_tensors(dir, nullptr);
  } else if (target == "llmc_bin") {
    read_llmc_bin(put("tokens.bin", in));
  } else if (target == "idx") {
    // The first byte chooses: the bytes as a gzip file, or gzipped here (so the IDX header parser is
    // reached).
    const std::string body = in.empty() ? in : in.substr(1);
    const std::string path = !in.empty() && (in[0] & 1) ? gzip(body) : put("in.gz", body);
    if (!in.empty() && (in[0] & 2))
      read_idx_images(path);
    else
      read_idx_labels(path);
  } else if (target == "metrics") {
    metrics_curve(put("m.jsonl", in), "bytes", "loss", 2);
  } else {
    std::fprintf(stderr, "unknown FUZZ_TARGET %s\n", target.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    one(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const UsageError&) {
    // the contract: bad input is a usage error
  }
  return 0;
}
