// commands.h — each subcommand registers its flags on the CLI11 app and returns the function that runs it.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace slimshard::cli {

using Runner = std::function<int()>;
Runner add_train(CLI::App& app);
Runner add_generate(CLI::App& app);

}  // namespace slimshard::cli
