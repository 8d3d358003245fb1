// The `kvo` command line: each area registers its subcommands on the CLI11 app. A subcommand's
// callback stores its exit status with SetExitCode; errors go to stderr naming what was wrong.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "common/status.h"

namespace kvo::cli {

void AddEventsCommands(CLI::App& app);  // kvo events tail|publish|journal
void AddHashCommand(CLI::App& app);     // kvo hash
void AddBenchCommand(CLI::App& app);    // kvo bench <area> [--json]
void AddDemoCommand(CLI::App& app);     // kvo demo
void AddPlanCommand(CLI::App& app);     // kvo plan
void AddManagerCommand(CLI::App& app);  // kvo manager ops
void AddFsCommand(CLI::App& app);       // kvo fs scan|verify|du
void AddIndexCommands(CLI::App& app);   // kvo index serve|query|doctor|stats|dump|explain
void AddRouteCommand(CLI::App& app);    // kvo route
void AddSimCommand(CLI::App& app);      // kvo sim
void AddLoadCommand(CLI::App& app);     // kvo load

// kvo demo --tour (tools/demo_tour.cc): the event bus in one process, then the pipeline.
Status RunTour(int batches, bool json);
// The tour's second part (tools/demo_pipeline.cc): two engines, offload tiers, events, indexer,
// router query, restart; working files under `dir`.
Status RunPipelineDemo(const std::string& dir);

void SetExitCode(int code);
// Prints "kvo: <status>" to stderr and records exit code 1 (2 for invalid arguments).
void Fail(const Status& status);

}  // namespace kvo::cli
