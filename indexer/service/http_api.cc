// JSON adapter for the HTTP API: nlohmann_json exceptions stop in this file.
#include "indexer/service/http_api.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "common/json.h"
#include "common/json_fields.h"
#include "events/block_hash.h"

namespace kvo {
namespace {

using nlohmann::json;
using OJson = nlohmann::ordered_json;

Status Bad(const std::string& what) { return Status::InvalidArgument(what); }

std::string Show(const json& v) { return DescribeJson(v); }

const char* TypeName(const json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_float()) return "a float";
  if (v.is_number()) return "an integer";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

Status ParseTokens(const json& v, const ScoreRequestLimits& limits, ScoreQuery* q) {
  if (!v.is_array())
    return Bad(std::string("'token_ids' must be an array of integers, got ") + TypeName(v));
  if (v.empty()) return Bad("'token_ids' is empty");
  if (static_cast<int64_t>(v.size()) > limits.max_query_tokens) {
    return Bad("'token_ids' has " + std::to_string(v.size()) + " tokens, more than the maximum " +
               std::to_string(limits.max_query_tokens));
  }
  q->token_ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    if (!t.is_number_integer() ||
        (t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
      return Bad("'token_ids[" + std::to_string(i) + "]' must be an integer, got " + Show(t));
    }
    q->token_ids.push_back(t.get<int64_t>());
  }
  return Status::Ok();
}

Status ParseHashes(const json& v, const ScoreRequestLimits& limits, ScoreQuery* q) {
  if (!v.is_array()) {
    return Bad(std::string("'block_hashes' must be an array of integers or hex strings, got ") +
               TypeName(v));
  }
  if (v.empty()) return Bad("'block_hashes' is empty");
  if (static_cast<int64_t>(v.size()) > limits.max_query_tokens) {
    return Bad("'block_hashes' has " + std::to_string(v.size()) +
               " hashes, more than the maximum " + std::to_string(limits.max_query_tokens));
  }
  q->block_hashes.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& h = v[i];
    std::string where = "'block_hashes[" + std::to_string(i) + "]'";
    if (h.is_number_unsigned()) {
      q->block_hashes.push_back(h.get<uint64_t>());
    } else if (h.is_number_integer()) {
      // A negative int: an old publisher's Python hash(); keyed by its 64-bit pattern.
      q->block_hashes.push_back(static_cast<uint64_t>(h.get<int64_t>()));
    } else if (h.is_string()) {
      auto raw = ParseHex(h.get<std::string>());
      if (!raw.ok() || raw->empty()) {
        return Bad(where + " must be a u64 or a hex digest, got " + Show(h));
      }
      q->block_hashes.push_back(BlockDigest::Low64(*raw));
    } else {
      return Bad(where + " must be a u64 or a hex digest, got " + Show(h));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<ScoreQuery> ParseScoreRequest(std::string_view body, const ScoreRequestLimits& limits,
                                     const std::set<std::string, std::less<>>& known_sources) {
  // Refused before a value is built: a document nested deeper than kJsonMaxDepth, and an array
  // far longer than the query limit (the DOM of a 57 MB array of tokens costs ~1 GB). Up to twice
  // the limit, the DOM is built and the precise message below names the key and the count.
  JsonLimits json_limits;
  json_limits.max_array_elements = std::max(limits.max_query_tokens, int64_t{1}) * 2 + 16;
  if (Status st = CheckJsonLimits(body, json_limits); !st.ok()) {
    if (st.message().find("array longer") == std::string::npos) return st;
    return Bad("'token_ids' or 'block_hashes' holds more than the maximum " +
               std::to_string(limits.max_query_tokens) +
               " entries (max_query_tokens): " + st.message());
  }
  auto parsed = ParseJson(body);
  if (!parsed.ok()) return parsed.status();
  json doc = std::move(parsed).value();
  if (!doc.is_object())
    return Bad(std::string("the body must be a JSON object, got ") + TypeName(doc));
  ScoreQuery q;
  bool has_tokens = false;
  bool has_hashes = false;
  try {
    for (const auto& [key, v] : doc.items()) {
      if (key == "token_ids") {
        has_tokens = true;
        KVO_RETURN_IF_ERROR(ParseTokens(v, limits, &q));
      } else if (key == "block_hashes") {
        has_hashes = true;
        KVO_RETURN_IF_ERROR(ParseHashes(v, limits, &q));
      } else if (key == "block_size") {
        if (v.is_null()) continue;
        if (!v.is_number_integer() || v.is_number_float()) {
          return Bad("'block_size' must be a positive integer, got " + Show(v));
        }
        if ((v.is_number_unsigned() &&
             v.get<uint64_t>() > static_cast<uint64_t>(limits.max_block_size)) ||
            v.get<int64_t>() < 1 || v.get<int64_t>() > limits.max_block_size) {
          return Bad("'block_size' must be in [1, " + std::to_string(limits.max_block_size) +
                     "], got " + Show(v));
        }
        q.block_size = v.get<int64_t>();
      } else if (key == "lora_name") {
        if (v.is_null()) continue;
        if (!v.is_string()) return Bad("'lora_name' must be a string or null, got " + Show(v));
        q.lora_name = v.get<std::string>();
      } else if (key == "weights") {
        if (!v.is_object()) {
          return Bad(std::string("'weights' must be an object of medium: number, got ") +
                     TypeName(v));
        }
        for (const auto& [medium, w] : v.items()) {
          if (medium.empty()) return Bad("'weights' has an empty medium name");
          if (!w.is_number() || w.is_boolean() || !std::isfinite(w.get<double>()) ||
              w.get<double>() < 0) {
            return Bad("'weights." + CutForMessage(medium) +
                       "' must be a finite number >= 0, got " + Show(w));
          }
          q.weights[medium] = w.get<double>();
        }
      } else if (key == "sources") {
        if (v.is_null()) continue;
        if (!v.is_array()) {
          return Bad(std::string("'sources' must be an array of source names, got ") + TypeName(v));
        }
        for (size_t i = 0; i < v.size(); ++i) {
          if (!v[i].is_string()) {
            return Bad("'sources[" + std::to_string(i) + "]' must be a string, got " + Show(v[i]));
          }
          std::string name = v[i].get<std::string>();
          if (!known_sources.contains(name)) {
            return Bad("unknown source '" + CutForMessage(name) +
                       "' in 'sources' (see GET /v1/sources)");
          }
          q.sources.push_back(std::move(name));
        }
      } else {
        return Bad("unknown key '" + CutForMessage(key) +
                   "' (expected token_ids or block_hashes, block_size, lora_name, weights, "
                   "sources)");
      }
    }
  } catch (const json::exception& e) {
    return Bad("bad request: " + CutForMessage(e.what(), 256));
  }
  if (has_tokens == has_hashes) {
    return Bad(has_tokens ? "give either 'token_ids' or 'block_hashes', not both"
                          : "one of 'token_ids' or 'block_hashes' is required");
  }
  return q;
}

namespace {

OJson ScoreJson(const ScoreResult& result, int64_t query_tokens) {
  OJson out;
  out["block_size"] = result.block_size;
  out["query_blocks"] = result.query_blocks;
  out["query_tokens"] = query_tokens;
  OJson instances = OJson::array();
  for (const InstanceScore& s : result.instances) {
    OJson i;
    i["source"] = s.source;
    i["dp_rank"] = s.dp_rank;
    i["prefix_blocks"] = s.prefix_blocks;
    i["prefix_tokens"] = s.prefix_tokens;
    OJson media = OJson::object();
    for (const auto& [m, n] : s.blocks_per_medium) media[m] = n;
    i["blocks_per_medium"] = std::move(media);
    i["score"] = s.score;
    instances.push_back(std::move(i));
  }
  out["instances"] = std::move(instances);
  return out;
}

}  // namespace

std::string RenderScoreResponse(const ScoreResult& result, int64_t query_tokens) {
  return ScoreJson(result, query_tokens).dump(-1, ' ', false, OJson::error_handler_t::replace);
}

// The explain answer's rows, one table each (key order = table order = the answer's bytes).
const JsonFields<ExplainHolder> kExplainHolder = {
    {"source", &ExplainHolder::source},
    {"dp_rank", &ExplainHolder::dp_rank},
    {"medium", &ExplainHolder::medium},
    {"ownership",
     [](const ExplainHolder& h) {  // only where a secondary tier owns the residency
       return h.ownership.empty() ? std::nullopt : std::optional<std::string>(h.ownership);
     }},
    {"group", &ExplainHolder::group},
    {"refcount", &ExplainHolder::refcount},
    {"since_seq", &ExplainHolder::since_seq},
};
const JsonFields<ExplainBlock> kExplainBlock = {
    {"index", &ExplainBlock::index},
    {"content_key", &ExplainBlock::content_key},
    {"engine_hash", &ExplainBlock::engine_hash},
    {"known", &ExplainBlock::known},
    {"holders", [](const ExplainBlock& b) { return kExplainHolder.ArrayOf(b.holders); }},
};
const JsonFields<ExplainInstance> kExplainInstance = {
    {"source", &ExplainInstance::source},
    {"dp_rank", &ExplainInstance::dp_rank},
    {"prefix_blocks", &ExplainInstance::prefix_blocks},
    {"break_reason", &ExplainInstance::break_reason},
};

std::string RenderExplainResponse(const ExplainResult& result, int64_t query_tokens) {
  OJson out;
  out["score"] = ScoreJson(result.score, query_tokens);
  out["blocks"] = kExplainBlock.ArrayOf(result.blocks);
  out["instances"] = kExplainInstance.ArrayOf(result.instances);
  return out.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

Result<ScoreResult> ParseScoreResponse(std::string_view body) {
  auto parsed = ParseJson(body, "score response");
  if (!parsed.ok()) return parsed.status();
  try {
    const json& doc = *parsed;
    ScoreResult r;
    r.block_size = doc.at("block_size").get<int64_t>();
    r.query_blocks = doc.at("query_blocks").get<int64_t>();
    for (const json& i : doc.at("instances")) {
      InstanceScore s;
      s.source = i.at("source").get<std::string>();
      s.dp_rank = i.at("dp_rank").get<int64_t>();
      s.prefix_blocks = i.at("prefix_blocks").get<int64_t>();
      s.prefix_tokens = i.at("prefix_tokens").get<int64_t>();
      for (const auto& [m, n] : i.at("blocks_per_medium").items()) {
        s.blocks_per_medium[m] = n.get<int64_t>();
      }
      s.score = i.at("score").get<double>();
      r.instances.push_back(std::move(s));
    }
    return r;
  } catch (const json::exception& e) {
    return Status::InvalidArgument("score response: " + CutForMessage(e.what(), 256));
  }
}

std::string RenderError(std::string_view message) {
  OJson out;
  out["error"] = std::string(message);
  return out.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

const char* StreamPhaseName(StreamPhase phase) {
  switch (phase) {
    case StreamPhase::kConnecting:
      return "connecting";
    case StreamPhase::kFollowing:
      return "following";
    case StreamPhase::kSilent:
      return "silent";
    case StreamPhase::kRetrying:
      return "retrying";
  }
  return "connecting";
}

std::string ParseErrorMessage(std::string_view body) {
  auto doc = ParseJson(body);
  if (doc.ok() && doc->is_object() && doc->contains("error") && (*doc)["error"].is_string()) {
    return (*doc)["error"].get<std::string>();
  }
  return CutForMessage(body, 512);
}

std::string RenderScoreRequest(const ScoreQuery& q) {
  OJson out;
  if (!q.token_ids.empty()) out["token_ids"] = q.token_ids;
  if (!q.block_hashes.empty()) out["block_hashes"] = q.block_hashes;
  if (q.block_size) out["block_size"] = *q.block_size;
  if (q.lora_name) out["lora_name"] = *q.lora_name;
  if (!q.weights.empty()) {
    OJson w = OJson::object();
    for (const auto& [m, v] : q.weights) w[m] = v;
    out["weights"] = std::move(w);
  }
  if (!q.sources.empty()) out["sources"] = q.sources;
  return out.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

namespace {

OJson ParityJson(const SourceStatus& s) {
  OJson p;
  p["state"] = ParityStateName(s.parity.state);
  if (!s.hash_algo.empty()) {
    p["algo"] = s.hash_algo;
    p["seed"] = s.hash_seed;
    p["block_size"] = s.hash_block_size;
  }
  p["checked_blocks"] = s.parity.checked_blocks;
  p["matched_blocks"] = s.parity.matched_blocks;
  p["mismatched_blocks"] = s.parity.mismatched_blocks;
  p["unverifiable_blocks"] = s.parity.unverifiable_blocks;
  if (s.parity.state == ParityState::kMismatch) {
    p["cause"] = s.parity.cause;
    p["detail"] = s.parity.detail;
    p["example"] = s.parity.example;
  }
  return p;
}

}  // namespace

std::string RenderSources(const std::vector<SourceStatus>& sources) {
  OJson list = OJson::array();
  for (const SourceStatus& s : sources) {
    OJson o;
    o["name"] = s.name;
    o["endpoint"] = s.endpoint;
    o["replay_endpoint"] = s.replay_endpoint.empty() ? OJson() : OJson(s.replay_endpoint);
    o["topic"] = s.topic;
    o["connected"] = s.connected;
    const StreamStatus* first = s.streams.empty() ? nullptr : &s.streams.front();
    o["last_sequence"] = first && first->has_seq ? OJson(first->last_seq) : OJson();
    o["lag_seconds"] = first ? first->lag_seconds : 0.0;
    uint64_t gaps = 0, restarts = 0, lost = 0, decode = 0, malformed = 0, clears = 0;
    for (const StreamStatus& st : s.streams) {
      gaps += st.gaps_filled;
      restarts += st.restarts_seen;
      lost += st.batches_lost;
      decode += st.decode_errors;
      malformed += st.malformed_messages;
      clears += st.source_clears;
    }
    o["gaps_filled"] = gaps;
    o["restarts_seen"] = restarts;
    o["batches_lost"] = lost;
    o["decode_errors"] = decode;
    o["malformed_messages"] = malformed;
    o["source_clears"] = clears;
    o["hash_parity"] = ParityJson(s);
    OJson streams = OJson::array();
    for (const StreamStatus& st : s.streams) {
      OJson j;
      j["dp_rank"] = st.dp_rank;
      j["endpoint"] = st.endpoint;
      j["replay_endpoint"] = st.replay_endpoint.empty() ? OJson() : OJson(st.replay_endpoint);
      j["state"] = StreamPhaseName(st.state);
      j["connected"] = st.connected;
      j["last_sequence"] = st.has_seq ? OJson(st.last_seq) : OJson();
      j["durable_sequence"] = st.has_seq ? OJson(st.durable_seq) : OJson();
      j["lag_seconds"] = st.lag_seconds;
      j["batches_applied"] = st.batches_applied;
      j["gaps_filled"] = st.gaps_filled;
      j["batches_lost"] = st.batches_lost;
      j["restarts_seen"] = st.restarts_seen;
      j["source_clears"] = st.source_clears;
      j["decode_errors"] = st.decode_errors;
      j["malformed_messages"] = st.malformed_messages;
      j["apply_errors"] = st.apply_errors;
      j["connect_failures"] = st.connect_failures;
      j["last_error"] = st.last_error.empty() ? OJson() : OJson(st.last_error);
      streams.push_back(std::move(j));
    }
    o["streams"] = std::move(streams);
    list.push_back(std::move(o));
  }
  OJson out;
  out["sources"] = std::move(list);
  return out.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

std::string RenderMediaStats(const IndexerStats& stats) {
  OJson list = OJson::array();
  for (const StreamStats& st : stats.streams) {
    OJson o;
    o["source"] = st.source;
    o["dp_rank"] = st.dp_rank;
    o["last_sequence"] = st.has_seq ? OJson(st.last_seq) : OJson();
    OJson entries = OJson::object();
    for (const MediumStats& m : stats.per_medium) {
      if (m.source == st.source && m.dp_rank == st.dp_rank) entries[m.medium] = m.blocks;
    }
    o["entries"] = std::move(entries);
    list.push_back(std::move(o));
  }
  OJson out;
  out["streams"] = std::move(list);
  return out.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

namespace {
constexpr const char kOperatorPage[] =
#include "operator_page.inc"
    ;
}  // namespace

bool ServeOperatorPage(const HttpRequest& request, const Indexer& index, HttpResponse* out) {
  const bool page = request.path == "/" || request.path == "/index.html";
  if (!page && request.path != "/v1/media") return false;
  if (request.method != "GET") {
    *out = HttpResponse{
        405, "application/json",
        RenderError(CutForMessage(request.method, 16) + " " + request.path + ": use GET")};
  } else if (page) {
    *out = HttpResponse{200, "text/html; charset=utf-8", kOperatorPage};
  } else {
    *out = HttpResponse{200, "application/json", RenderMediaStats(index.Stats())};
  }
  return true;
}

}  // namespace kvo
