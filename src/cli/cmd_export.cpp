// cmd_export.cpp — `slimshard export D out.safetensors`: a checkpoint's full weights as one consolidated
// file.
#include "commands.h"
#include "slimshard/ckpt.h"

namespace slimshard::cli {

Runner add_export(CLI::App& app) {
  struct Flags {
    std::string dir, out, loss_on, dtype = "fp32";
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand(
      "export", "Write a checkpoint's full weights as one safetensors file (GPT-2/nanoGPT names) + config");
  sub->footer("Example:\n  slimshard export runs/ckpt model.safetensors   # also writes model.config.json");
  sub->add_option("dir", flags->dir, "checkpoint directory (its newest complete checkpoint is used)")
      ->required();
  sub->add_option("out", flags->out, "safetensors file to write")->required();
  sub->add_option("--loss-on", flags->loss_on,
                  "GPT: also print the loss on the first 4 x (T+1) bytes of this file");
  sub->add_option("--dtype", flags->dtype,
                  "fp32 | bf16: the dtype of the weights written (from fp32 masters)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  return [flags]() {
    double loss = 0;
    const std::string used = export_checkpoint(flags->dir, flags->out, flags->loss_on, &loss,
                                               parse_float_type(flags->dtype, "--dtype"));
    std::printf("exported %s to %s\n", used.c_str(), flags->out.c_str());
    if (!flags->loss_on.empty()) std::printf("loss on %s: %.6f\n", flags->loss_on.c_str(), loss);
    return 0;
  };
}

}  // namespace slimshard::cli
