// cmd_generate.cpp — `slimshard generate`: sample text from a model file written by `train --save-model`.
#include <ATen/Parallel.h>

#include <cstdio>
#include <memory>

#include "commands.h"
#include "slimshard/ckpt.h"
#include "slimshard/common.h"
#include "slimshard/train.h"

namespace slimshard::cli {

Runner add_generate(CLI::App& app) {
  struct Flags {
    std::string model_file;
    GenerateOptions g;
    int threads = 1;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand("generate", "Sample text from a trained GPT");
  sub->footer(
      "Example:\n  slimshard train --model gpt-small --data kjv --save-model kjv.safetensors\n"
      "  slimshard generate --model-file kjv.safetensors --prompt \"In the beginning\" --tokens 200");
  sub->add_option("--model-file", flags->model_file, "weights written by train --save-model")->required();
  sub->add_option("--prompt", flags->g.prompt, "text to continue")->capture_default_str();
  sub->add_option("--tokens", flags->g.tokens, "tokens to generate")
      ->capture_default_str()
      ->check(integer(1, 1 << 20));
  sub->add_option("--temperature", flags->g.temperature, "0 = greedy")
      ->capture_default_str()
      ->check(real(0, 100));
  sub->add_option("--top-k", flags->g.top_k, "sample among the k likeliest (0 = all)")
      ->capture_default_str()
      ->check(integer(0, 1 << 24));
  sub->add_option("--seed", flags->g.seed, "sampling seed")->capture_default_str()->check(seed_value());
  sub->add_option("--threads", flags->threads, "LibTorch threads")
      ->capture_default_str()
      ->check(integer(1, 256));
  return [flags]() {
    at::set_num_threads(flags->threads);
    auto model = load_model_file(flags->model_file);
    std::printf("%s\n", generate_text(*model, flags->g).c_str());
    return 0;
  };
}

}  // namespace slimshard::cli
