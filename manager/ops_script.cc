#include "manager/ops_script.h"

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json.h"
#include "common/result.h"
#include "common/status.h"
#include "events/block_hash.h"

namespace kvo {
namespace {

using Json = nlohmann::ordered_json;

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
      j["medium"] = std::string(MediumName(e.medium));
      j["removed"] = e.removed();
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

}  // namespace

std::optional<std::string> RunOpsScriptLine(OffloadManager& manager, std::string_view text,
                                            size_t number, bool* bad_line) {
  if (text.find_first_not_of(" \t\r") == std::string_view::npos) return std::nullopt;
  Json answer;
  Result<Json> line = ParseOrderedJson(text);
  if (!line.ok()) {
    // A syntax error keeps its short answer; a refused limit (nesting depth) says which.
    const std::string& why = line.status().message();
    answer = ErrorLine("line " + std::to_string(number) + ": " +
                       (why.rfind("invalid JSON", 0) == 0 ? std::string("not valid JSON") : why));
    *bad_line = true;
  } else {
    Result<Json> r = RunOp(manager, *line);
    if (r.ok()) {
      answer = std::move(r).value();
    } else {
      answer = ErrorLine("line " + std::to_string(number) + ": " + r.status().message());
      *bad_line = true;
    }
  }
  return answer.dump();
}

}  // namespace kvo
