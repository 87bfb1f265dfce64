// commands.h — each subcommand registers its flags on the CLI11 app and returns the function that runs it.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

#include "slimshard/comm.h"

namespace slimshard::cli {

// The process's communicator, started by the subcommands that train (MPI under mpirun, else a world of one).
Communicator& start_comm(const CommOptions& opts);
// Flags of the communicator, shared by every subcommand that starts one.
void add_comm_flags(CLI::App* sub, CommOptions& opts);

using Runner = std::function<int()>;
Runner add_train(CLI::App& app);
Runner add_generate(CLI::App& app);

}  // namespace slimshard::cli
