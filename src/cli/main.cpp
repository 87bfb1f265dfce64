// main.cpp — the slimshard executable: parses the subcommand, runs it, and maps errors to exit codes
// (0 ok, 1 runtime failure, 2 bad usage or bad input; one line naming the flag or file).
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

#include "commands.h"
#include "slimshard/common.h"
#include "slimshard/memory.h"

namespace {

std::unique_ptr<slimshard::Communicator> g_comm;
std::vector<std::string> g_args;

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// Under mpirun every rank parses the same flags: only rank 0 reports a usage error found before MPI starts.
bool quiet_rank() {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  return r && std::string(r) != "0";
}

// `agreed`: every rank has the same error (AgreedUsageError, or one found before MPI started), so each exits
// on its own and rank 0 alone says why. Otherwise the other ranks may be blocked in a collective: the job
// ends through the communicator (MPI_Abort), the failing rank naming itself.
int fail(int code, const std::string& msg, bool agreed = false) {
  const std::string line = "slimshard: error: " + first_line(msg);
  if (g_comm && g_comm->world() > 1 && !agreed) g_comm->abort(line, code);
  if (!quiet_rank()) std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  g_comm.reset();  // every rank reaches here: MPI_Finalize together
  return code;
}

}  // namespace

namespace slimshard::cli {

const std::vector<std::string>& raw_args() { return g_args; }

Communicator& start_comm(const CommOptions& opts) {
  if (!g_comm) g_comm = Communicator::create(opts);
  memory::set_rank(g_comm->rank());
  return *g_comm;
}

void add_comm_flags(CLI::App* sub, CommOptions& o) {
  sub->add_option("--comm-timeout", o.timeout_s,
                  "seconds a collective may take before the watchdog ends the job")
      ->capture_default_str()
      ->check(positive_real(1e6));
  sub->add_option("--comm-backend", o.backend,
                  "auto (shared memory on one host, hier across hosts) | shm | mpi (plain MPI collectives) | "
                  "hier (shared memory within each host, MPI between hosts among ranks of one local index)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "shm", "mpi", "hier"}));
  sub->add_option_function<std::string>(
      "--comm-buffer", [&o](const std::string& v) { o.shm_bytes = parse_bytes(v, "--comm-buffer"); },
      "shared-memory staging per rank (default 16MiB)");
}

}  // namespace slimshard::cli

int main(int argc, char** argv) {
  using namespace slimshard;
  memory::install();  // first, so that every tensor is counted
  at::set_num_interop_threads(1);

  CLI::App app{
      "slimshard — trains deep neural networks data-parallel across processes (run under mpirun -n N).\n"
      "Start with:  slimshard train --model gpt-small --data kjv --steps 300 --sample-tokens 200",
      "slimshard"};
  app.require_subcommand(1);
  app.footer("Run 'slimshard <subcommand> --help' for the flags of each subcommand.");
  for (int i = 1; i < argc; ++i) g_args.emplace_back(argv[i]);
  const std::map<std::string, cli::Runner> runners{
      {"train", cli::add_train(app)}, {"generate", cli::add_generate(app)}, {"memory", cli::add_memory(app)},
      {"bench", cli::add_bench(app)}, {"profile", cli::add_profile(app)},   {"plan", cli::add_plan(app)},
      {"plot", cli::add_plot(app)},   {"export", cli::add_export(app)}};

  if (argc > 1 && argv[1][0] != '-' && !runners.count(argv[1]))
    return fail(2,
                std::string("unknown subcommand '") + argv[1] +
                    "' (expected train, generate, memory, bench, profile, plan, plot or export; see --help)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return fail(2, std::string(e.what()) + " (see --help)");
  } catch (const UsageError& e) {
    return fail(2, e.what());
  }
  try {
    for (auto& [name, run] : runners)
      if (app.get_subcommand(name)->parsed()) {
        const int rc = run();
        g_comm.reset();  // joins the comm thread, MPI_Finalize
        return rc;
      }
    return fail(2, "no subcommand");
  } catch (const AgreedUsageError& e) {
    return fail(2, e.what(), /*agreed=*/true);
  } catch (const UsageError& e) {
    return fail(2, e.what());
  } catch (const std::exception& e) {
    // A memory-limit error may reach here wrapped by LibTorch; the allocator kept the original message.
    const std::string oom = memory::limit_error_message();
    if (!oom.empty()) return fail(1, oom);
    if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) return fail(1, ce->what_without_backtrace());
    return fail(1, e.what());
  }
}
