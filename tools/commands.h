// The `kvo` command line: each area registers its subcommands on the CLI11 app and their actions
// in the CommandTable (tools/cli_util.h); main() runs the action of the subcommand given and
// returns its exit status. Errors go to stderr naming what was wrong.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "common/status.h"
#include "tools/cli_util.h"

namespace kvo::cli {

void AddEventsCommands(CLI::App& app, CommandTable& commands);  // kvo events tail|publish|journal
void AddHashCommand(CLI::App& app, CommandTable& commands);     // kvo hash
void AddBenchCommand(CLI::App& app, CommandTable& commands);    // kvo bench <area> [--json]
void AddDemoCommand(CLI::App& app, CommandTable& commands);     // kvo demo
void AddPlanCommand(CLI::App& app, CommandTable& commands);     // kvo plan
void AddManagerCommand(CLI::App& app, CommandTable& commands);  // kvo manager ops
void AddFsCommand(CLI::App& app, CommandTable& commands);       // kvo fs scan|verify|du
void AddIndexCommands(CLI::App& app,
                      CommandTable& commands);  // kvo index serve|query|doctor|stats|dump|explain
void AddRouteCommand(CLI::App& app, CommandTable& commands);  // kvo route
void AddSimCommand(CLI::App& app, CommandTable& commands);    // kvo sim
void AddLoadCommand(CLI::App& app, CommandTable& commands);   // kvo load

// kvo demo --tour (tools/demo_tour.cc): the event bus in one process, then the pipeline.
Status RunTour(int batches, bool json);
// The tour's second part (tools/demo_pipeline.cc): two engines, offload tiers, events, indexer,
// router query, restart; working files under `dir`.
Status RunPipelineDemo(const std::string& dir);

}  // namespace kvo::cli
