// cmd_plot.cpp — `slimshard plot`: curves from `train --metrics` files on one SVG chart, e.g. validation loss
// by step or by bytes communicated, DDP and Slim-DP side by side.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "slimshard/charts.h"
#include "slimshard/common.h"

namespace slimshard::cli {

Runner add_plot(CLI::App& app) {
  struct Flags {
    std::vector<std::string> files;
    std::string x = "step", y = "val_loss", title, out = "plot.svg";
    int mean_of = 1;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand("plot", "Draw curves from train --metrics files as one SVG chart");
  sub->footer(
      "Example:\n"
      "  slimshard plot --x bytes --y val_loss ddp.jsonl:DDP slim.jsonl:Slim-DP --out loss-vs-bytes.svg");
  sub->add_option("files", flags->files, "metrics files, each FILE or FILE:LABEL")->required();
  sub->add_option("--x", flags->x, "step | bytes (MiB sent per rank so far)")
      ->capture_default_str()
      ->check(CLI::IsMember({"step", "bytes"}));
  sub->add_option("--y", flags->y, "a per-step metric: loss, val_loss, val_acc, step_ms, ...")
      ->capture_default_str();
  sub->add_option("--mean-of", flags->mean_of,
                  "plot the mean of every K consecutive points (e.g. the training loss)")
      ->capture_default_str()
      ->check(integer(1, 1 << 20));
  sub->add_option("--title", flags->title, "chart title (default: y by x)");
  sub->add_option("--out", flags->out, "SVG file to write")->capture_default_str();
  return [flags]() {
    check_output_file(flags->out, "--out");
    std::vector<Curve> curves;
    for (const std::string& spec : flags->files)
      curves.push_back(metrics_curve(spec, flags->x, flags->y, flags->mean_of));
    const std::string xlabel = flags->x == "step" ? "step" : "MiB sent per rank";
    const std::string ylabel =
        flags->mean_of > 1 ? flags->y + " (mean of " + std::to_string(flags->mean_of) + ")" : flags->y;
    const std::string title = flags->title.empty() ? ylabel + " by " + xlabel : flags->title;
    write_file_atomic(flags->out, line_chart(curves, title, xlabel, ylabel));
    std::printf("wrote %s (%zu curves)\n", flags->out.c_str(), curves.size());
    return 0;
  };
}

}  // namespace slimshard::cli
