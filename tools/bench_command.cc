// kvo bench <area> [--json]: each case prints its figure, a same-run baseline and the ratio.
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench.h"
#include "common/fd_limit.h"
#include "common/logging.h"
#include "tools/commands.h"

extern char** environ;

namespace kvo::cli {
namespace {

// `kvo bench python`: the Python package's benchmark (python/kvo/bench.py) in the interpreter the
// extension was built for, with the build tree's package on PYTHONPATH.
ExitCode RunPythonBench(const bench::BenchOptions& options) {
#if defined(KVO_PYTHON_EXECUTABLE) && defined(KVO_PYTHON_PATH)
  std::string path = KVO_PYTHON_PATH;
  if (const char* old = std::getenv("PYTHONPATH"); old != nullptr && *old != '\0') {
    path += ":" + std::string(old);
  }
  setenv("PYTHONPATH", path.c_str(), 1);
#ifdef KVO_PYTHON_PRELOAD  // a sanitizer build: the module needs the runtime loaded first
  setenv("LD_PRELOAD", KVO_PYTHON_PRELOAD, 1);
  setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
#endif
  std::vector<std::string> args = {KVO_PYTHON_EXECUTABLE, "-m", "kvo.bench", "--seconds",
                                   std::to_string(options.seconds_per_case)};
  if (options.json) args.push_back("--json");
  if (options.quick) args.push_back("--quick");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    return Status::IOError("bench python: cannot start " + args[0]);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status)) return 1;
  return WEXITSTATUS(status);
#else
  (void)options;
  return Status::Unavailable("bench python: kvo was built without the Python package (python/)");
#endif
}

// The area's own cases, then the cases registered for it (the CUDA engine's); exit status 1 when
// any failed.
ExitCode RunBench(const std::string& area, bench::BenchOptions options) {
  // The areas with cases of their own, in the order `kvo bench --help` names them.
  static const std::pair<const char*, int (*)(const bench::BenchOptions&)> kAreas[] = {
      {"events", bench::RunEventsBench},   {"journal", bench::RunJournalBench},
      {"manager", bench::RunManagerBench}, {"transfer", bench::RunTransferBench},
      {"fs", bench::RunFsBench},           {"indexer", bench::RunIndexerBench},
      {"route", bench::RunRouteBench},
  };
  if (options.quick) options.seconds_per_case = std::min(options.seconds_per_case, 0.1);
  // As `kvo index serve`: the indexer's register case holds 1 100 sources' sockets.
  if (auto lim = RaiseFdLimit(); !lim.ok()) KVO_LOG_WARN("kvo bench: {}", lim.status().ToString());
  if (area == "python") return RunPythonBench(options);
  const auto* own = std::find_if(std::begin(kAreas), std::end(kAreas),
                                 [&](const auto& a) { return area == a.first; });
  if (own == std::end(kAreas) && !bench::HasRegisteredBenchCases(area)) {
    return Status::InvalidArgument(
        "unknown bench area '" + area +
        "' (available: events, journal, manager, transfer, fs, indexer, route, python)");
  }
  int code = own != std::end(kAreas) ? own->second(options) : 0;
  if (bench::RunRegisteredBenchCases(area, options) != 0) code = 1;
  return code;
}

}  // namespace

void AddBenchCommand(CLI::App& app, CommandTable& commands) {
  auto* cmd = app.add_subcommand("bench", "Measure kvo against same-run baselines");
  auto area = std::make_shared<std::string>();
  auto options = std::make_shared<bench::BenchOptions>();
  cmd->add_option("area", *area,
                  "events | journal | manager | transfer | fs | indexer | route | python")
      ->required();
  cmd->add_flag("--json", options->json, "one JSON object per case");
  cmd->add_flag("--quick", options->quick, "small sizes (CI smoke run)");
  cmd->add_option(
      "--only", options->only,
      "run only the case groups whose name contains this (events: hash_chain, codec, "
      "pubsub, lag, restart, journal; indexer: ingest, score, router; fs: 2MiB_blocks_buffered, "
      "2MiB_blocks_odirect, 64KiB_blocks_buffered)");
  cmd->add_option("--seconds", options->seconds_per_case, "time budget per measured loop")
      ->capture_default_str();
  commands.Add(cmd, [area, options] { return RunBench(*area, *options); });
}

}  // namespace kvo::cli
