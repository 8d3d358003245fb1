// kvo manager ops: drive one OffloadManager (a CPU tier of N blocks, events on) from a script of
// API calls, to debug a policy or reproduce a report. Same answers as vLLM's CPUOffloadingManager
// for the same calls, slot numbers included.
//
//   kvo manager ops --num-blocks N --policy lru|arc [--store-threshold T]
//                   [--max-tracker-size M] --ops FILE      (FILE "-" reads stdin)
//
// Input: JSON lines {"op": "lookup"|"prepare_store"|"complete_store"|"prepare_load"|
// "complete_load"|"touch"|"take_events", "keys": ["<block hash hex>", ...], "success": true}
// (keys are group 0; success only for complete_store, default true). Blank lines are skipped.
// Output: one JSON line per op:
//   lookup         {"result":"HIT"|"MISS"|"HIT_PENDING"} (one key), {"results":[...]} (several)
//   prepare_store  {"result":null} when it cannot store, else
//                  {"keys_to_store":[...],"slots":[...],"evicted":[...]}
//   prepare_load   {"slots":[...]}
//   take_events    {"events":[{"keys":[...],"medium":"CPU","removed":false}, ...]}
//   others         {}
// An out-of-contract call (loading a missing key, completing an unknown one) prints
// {"error":"..."} and the script goes on. A bad line prints {"error":"line N: ..."}, goes on,
// and makes the exit status 2.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/json.h"
#include "common/result.h"
#include "common/status.h"
#include "manager/offload_manager.h"
#include "manager/ops_script.h"
#include "manager/policy_table.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace kvo::cli {
namespace {

// The largest CPU tier the manager holds: its policies index nodes with 28 bits and ARC keeps up
// to twice its capacity in nodes (ghost lists). A larger --num-blocks is an error naming the flag
// (it used to abort on a CHECK deep in the policy table).
constexpr uint64_t kMaxNumBlocks = policy_internal::kNil / 2 - 16;

struct OpsArgs {
  size_t num_blocks = 0;
  std::string policy = "lru";
  int64_t store_threshold = 0;
  size_t max_tracker_size = 64000;
  std::string ops;
};

Status RunOps(const OpsArgs& args, bool* bad_lines) {
  if (args.policy != "lru" && args.policy != "arc") {
    return Status::InvalidArgument("--policy must be lru or arc, got '" + args.policy + "'");
  }
  if (args.store_threshold < 0) {
    return Status::InvalidArgument("--store-threshold must be >= 0, got " +
                                   std::to_string(args.store_threshold));
  }
  ManagerOptions options;
  options.num_blocks = args.num_blocks;
  options.eviction_policy = args.policy;
  options.store_threshold = args.store_threshold;
  options.max_tracker_size = args.max_tracker_size;
  options.enable_events = true;
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadManager> manager,
                       OffloadManager::Create(std::move(options)));

  std::ifstream file;
  std::istream* in = &std::cin;
  if (args.ops != "-") {
    file.open(args.ops);
    if (!file) return Status::IOError("--ops: cannot open '" + args.ops + "'");
    in = &file;
  }
  std::string text;
  for (size_t number = 1; std::getline(*in, text); ++number) {
    std::optional<std::string> answer = RunOpsScriptLine(*manager, text, number, bad_lines);
    if (!answer) continue;
    *answer += '\n';
    std::fwrite(answer->data(), 1, answer->size(), stdout);
  }
  std::fflush(stdout);
  if (in->bad()) return Status::IOError("--ops: read error on '" + args.ops + "'");
  return Status::Ok();
}

}  // namespace

void AddManagerCommand(CLI::App& app, CommandTable& commands) {
  CLI::App* manager = app.add_subcommand("manager", "Drive the offload manager");
  manager->require_subcommand(1);
  auto args = std::make_shared<OpsArgs>();
  CLI::App* ops = manager->add_subcommand(
      "ops",
      "Run a script of manager API calls (JSON lines) against a CPU tier of N blocks and print "
      "one JSON answer per call");
  ops->add_option("--num-blocks", args->num_blocks, "CPU tier size in blocks")
      ->required()
      ->check(CLI::Range(uint64_t{0}, kMaxNumBlocks));
  ops->add_option("--policy", args->policy, "eviction policy: lru|arc")->capture_default_str();
  ops->add_option("--store-threshold", args->store_threshold,
                  "store a key only after this many lookups (< 2: always)")
      ->capture_default_str();
  ops->add_option("--max-tracker-size", args->max_tracker_size,
                  "keys whose lookups are counted for --store-threshold")
      ->capture_default_str();
  ops->add_option("--ops", args->ops, "the JSON-lines script ('-': stdin)")->required();
  commands.Add(ops, [args]() -> ExitCode {
    bool bad_lines = false;
    KVO_RETURN_IF_ERROR(RunOps(*args, &bad_lines));
    return bad_lines ? 2 : 0;
  });
}

}  // namespace kvo::cli
