// kvo: the command line of the KV-cache offload manager.
#include <cstdio>
#include <exception>
#include <string>

#include "common/logging.h"
#include "tools/commands.h"

namespace {

int Main(int argc, char** argv) {
  CLI::App app{"kvo: KV-cache offload manager, KV-event bus and prefix indexer"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")
      ->capture_default_str();
  app.parse_complete_callback([&] { kvo::SetLogLevel(log_level); });

  kvo::cli::CommandTable commands;
  kvo::cli::AddEventsCommands(app, commands);
  kvo::cli::AddHashCommand(app, commands);
  kvo::cli::AddBenchCommand(app, commands);
  kvo::cli::AddDemoCommand(app, commands);
  kvo::cli::AddPlanCommand(app, commands);
  kvo::cli::AddManagerCommand(app, commands);
  kvo::cli::AddFsCommand(app, commands);
  kvo::cli::AddIndexCommands(app, commands);
  kvo::cli::AddRouteCommand(app, commands);
  kvo::cli::AddSimCommand(app, commands);
  kvo::cli::AddLoadCommand(app, commands);

  CLI11_PARSE(app, argc, argv);
  return commands.RunParsed();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {  // a bug: every expected failure is a Status
    std::fprintf(stderr, "kvo: unexpected error: %s\n", e.what());
    return 1;
  }
}
