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
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/json.h"
#include "common/result.h"
#include "common/status.h"
#include "events/block_hash.h"
#include "manager/offload_manager.h"
#include "tools/commands.h"

namespace kvo::cli {
namespace {

using Json = nlohmann::ordered_json;

struct OpsArgs {
  size_t num_blocks = 0;
  std::string policy = "lru";
  int64_t store_threshold = 0;
  size_t max_tracker_size = 64000;
  std::string ops;
};

Json Hexes(const std::vector<OffloadKey>& keys) {
  Json out = Json::array();
  for (const OffloadKey& k : keys) out.push_back(k.Hex());
  return out;
}

Result<std::vector<OffloadKey>> ParseKeys(const Json& line) {
  std::vector<OffloadKey> keys;
  auto it = line.find("keys");
  if (it == line.end()) return keys;
  if (!it->is_array()) {
    return Status::InvalidArgument("\"keys\" must be an array of hex strings, got " +
                                   DescribeJson(*it));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& k = (*it)[i];
    if (!k.is_string()) {
      return Status::InvalidArgument("keys[" + std::to_string(i) + "] must be a hex string, got " +
                                     DescribeJson(k));
    }
    Result<std::string> digest = ParseHex(k.get<std::string>());
    if (!digest.ok()) {
      return Status::InvalidArgument("keys[" + std::to_string(i) + "] " + DescribeJson(k) + ": " +
                                     digest.status().message());
    }
    if (digest->empty() || digest->size() > OffloadKey::kMaxHashBytes) {
      return Status::InvalidArgument("keys[" + std::to_string(i) + "] " + DescribeJson(k) +
                                     ": a block hash has 1 to 32 bytes, got " +
                                     std::to_string(digest->size()));
    }
    keys.push_back(OffloadKey::FromDigest(*digest, 0));
  }
  return keys;
}

Json ErrorLine(const std::string& message) {
  Json out;
  out["error"] = message;
  return out;
}

// Runs one parsed line; InvalidArgument for a malformed line, an {"error"} answer for a call out
// of contract.
Result<Json> RunOp(OffloadManager& m, const Json& line) {
  if (!line.is_object()) return Status::InvalidArgument("expected a JSON object");
  auto op_it = line.find("op");
  if (op_it == line.end() || !op_it->is_string()) {
    return Status::InvalidArgument(
        "\"op\" must be a string (lookup, prepare_store, "
        "complete_store, prepare_load, complete_load, touch, "
        "take_events)");
  }
  const std::string op = op_it->get<std::string>();
  KVO_ASSIGN_OR_RETURN(std::vector<OffloadKey> keys, ParseKeys(line));
  bool success = true;
  if (auto s = line.find("success"); s != line.end()) {
    if (!s->is_boolean()) {
      return Status::InvalidArgument("\"success\" must be true or false, got " + DescribeJson(*s));
    }
    success = s->get<bool>();
  }
  const RequestContext ctx;
  Json out = Json::object();
  if (op == "lookup") {
    if (keys.empty()) return Status::InvalidArgument("lookup needs at least one key");
    if (keys.size() == 1) {
      out["result"] = LookupResultName(m.Lookup(keys[0], ctx));
    } else {
      Json results = Json::array();
      for (const OffloadKey& k : keys) results.push_back(LookupResultName(m.Lookup(k, ctx)));
      out["results"] = std::move(results);
    }
  } else if (op == "prepare_store") {
    Result<std::optional<PrepareStoreOutput>> r = m.PrepareStore(keys, ctx);
    if (!r.ok()) return ErrorLine(r.status().ToString());
    if (!r->has_value()) {
      out["result"] = nullptr;
    } else {
      out["keys_to_store"] = Hexes((*r)->keys_to_store);
      out["slots"] = (*r)->slots;
      out["evicted"] = Hexes((*r)->evicted_keys);
    }
  } else if (op == "complete_store") {
    Status s = m.CompleteStore(keys, ctx, success);
    if (!s.ok()) return ErrorLine(s.ToString());
  } else if (op == "prepare_load") {
    Result<std::vector<int32_t>> r = m.PrepareLoad(keys, ctx);
    if (!r.ok()) return ErrorLine(r.status().ToString());
    out["slots"] = *r;
  } else if (op == "complete_load") {
    Status s = m.CompleteLoad(keys, ctx);
    if (!s.ok()) return ErrorLine(s.ToString());
  } else if (op == "touch") {
    m.Touch(keys, ctx);
  } else if (op == "take_events") {
    Json events = Json::array();
    for (const OffloadingEvent& e : m.TakeEvents()) {
      Json j;
      j["keys"] = Hexes(e.keys);
      j["medium"] = e.medium;
      j["removed"] = e.removed;
      events.push_back(std::move(j));
    }
    out["events"] = std::move(events);
  } else {
    return Status::InvalidArgument("unknown op \"" + op +
                                   "\" (expected lookup, prepare_store, complete_store, "
                                   "prepare_load, complete_load, touch or take_events)");
  }
  return out;
}

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
  std::string out;
  for (size_t number = 1; std::getline(*in, text); ++number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json answer;
    Result<Json> line = ParseOrderedJson(text);
    if (!line.ok()) {
      // A syntax error keeps its short answer; a refused limit says which.
      const std::string& why = line.status().message();
      answer = ErrorLine("line " + std::to_string(number) + ": " +
                         (why.rfind("invalid JSON", 0) == 0 ? std::string("not valid JSON") : why));
      *bad_lines = true;
    } else {
      Result<Json> r = RunOp(*manager, *line);
      if (r.ok()) {
        answer = std::move(r).value();
      } else {
        answer = ErrorLine("line " + std::to_string(number) + ": " + r.status().message());
        *bad_lines = true;
      }
    }
    out = answer.dump();
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fflush(stdout);
  if (in->bad()) return Status::IOError("--ops: read error on '" + args.ops + "'");
  return Status::Ok();
}

}  // namespace

void AddManagerCommand(CLI::App& app) {
  CLI::App* manager = app.add_subcommand("manager", "Drive the offload manager");
  manager->require_subcommand(1);
  auto args = std::make_shared<OpsArgs>();
  CLI::App* ops = manager->add_subcommand(
      "ops",
      "Run a script of manager API calls (JSON lines) against a CPU tier of N blocks and print "
      "one JSON answer per call");
  ops->add_option("--num-blocks", args->num_blocks, "CPU tier size in blocks")->required();
  ops->add_option("--policy", args->policy, "eviction policy: lru|arc")->capture_default_str();
  ops->add_option("--store-threshold", args->store_threshold,
                  "store a key only after this many lookups (< 2: always)")
      ->capture_default_str();
  ops->add_option("--max-tracker-size", args->max_tracker_size,
                  "keys whose lookups are counted for --store-threshold")
      ->capture_default_str();
  ops->add_option("--ops", args->ops, "the JSON-lines script ('-': stdin)")->required();
  ops->callback([args] {
    bool bad_lines = false;
    const Status s = RunOps(*args, &bad_lines);
    if (!s.ok()) {
      Fail(s);
    } else if (bad_lines) {
      SetExitCode(2);
    }
  });
}

}  // namespace kvo::cli
