// kvo bench <area> [--json]: each case prints its figure, a same-run baseline and the ratio.
#include <string>

#include "bench/bench.h"
#include "tools/commands.h"

namespace kvo::cli {

void AddBenchCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Measure kvo against same-run baselines");
  auto area = std::make_shared<std::string>();
  auto options = std::make_shared<bench::BenchOptions>();
  cmd->add_option("area", *area, "events | journal | manager | indexer")->required();
  cmd->add_flag("--json", options->json, "one JSON object per case");
  cmd->add_flag("--quick", options->quick, "small sizes (CI smoke run)");
  cmd->add_option("--seconds", options->seconds_per_case, "time budget per measured loop")
      ->capture_default_str();
  cmd->callback([area, options] {
    if (options->quick) options->seconds_per_case = std::min(options->seconds_per_case, 0.1);
    if (*area == "events") {
      SetExitCode(bench::RunEventsBench(*options));
    } else if (*area == "journal") {
      SetExitCode(bench::RunJournalBench(*options));
    } else if (*area == "manager") {
      SetExitCode(bench::RunManagerBench(*options));
    } else if (*area == "indexer") {
      SetExitCode(bench::RunIndexerBench(*options));
    } else {
      Fail(Status::InvalidArgument("unknown bench area '" + *area +
                                   "' (available: events, journal, manager, indexer)"));
    }
  });
}

}  // namespace kvo::cli
