// kvo: the command line of the KV-cache offload manager.
#include <cstdio>
#include <string>

#include "common/logging.h"
#include "tools/commands.h"

namespace kvo::cli {
namespace {
int g_exit_code = 0;
}  // namespace

void SetExitCode(int code) { g_exit_code = code; }

void Fail(const Status& status) {
  std::fprintf(stderr, "kvo: %s\n", status.ToString().c_str());
  SetExitCode(status.code() == StatusCode::kInvalidArgument ? 2 : 1);
}

}  // namespace kvo::cli

int main(int argc, char** argv) {
  CLI::App app{"kvo: KV-cache offload manager, KV-event bus and prefix indexer"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")
      ->capture_default_str();
  app.parse_complete_callback([&] { kvo::SetLogLevel(log_level); });

  kvo::cli::AddEventsCommands(app);
  kvo::cli::AddHashCommand(app);
  kvo::cli::AddBenchCommand(app);
  kvo::cli::AddDemoCommand(app);
  kvo::cli::AddPlanCommand(app);
  kvo::cli::AddManagerCommand(app);
  kvo::cli::AddFsCommand(app);
  kvo::cli::AddIndexCommands(app);
  kvo::cli::AddRouteCommand(app);
  kvo::cli::AddSimCommand(app);
  kvo::cli::AddLoadCommand(app);

  CLI11_PARSE(app, argc, argv);
  return kvo::cli::g_exit_code;
}
