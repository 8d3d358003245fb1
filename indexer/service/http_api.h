// The indexer's HTTP JSON contract, as pure functions (no sockets): parsing and validating
// `POST /v1/score` bodies, rendering score results, source status and errors. The names below are
// a contract with routers: keep them; add fields freely.
//
//   POST /v1/score
//     {"token_ids": [int, ...]}  or  {"block_hashes": [u64 | "hex digest", ...]}   (exactly one)
//     optional "block_size": int > 0, "lora_name": str | null,
//              "weights": {"GPU": 1.0, "CPU": 0.8, "STORAGE": 0.5, <medium>: number >= 0},
//              "sources": [str, ...]   (every name must be a configured source)
//   -> 200 {"block_size", "query_blocks", "query_tokens",
//           "instances": [{"source", "dp_rank", "prefix_blocks", "prefix_tokens",
//                          "blocks_per_medium": {"GPU": n, ...}, "score"}, ...]}   best first
//   -> 400 {"error": "<what was wrong, naming the key>"}
//
// Thread-safe (stateless).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "http/http_server.h"
#include "indexer/indexer.h"
#include "indexer/service/doctor.h"

namespace kvo {

struct ScoreRequestLimits {
  int64_t max_query_tokens = 1 << 20;  // token_ids (or block_hashes) longer than this: 400
  int64_t max_block_size = 1 << 20;
};

// Parses and validates a /v1/score body. `known_sources`: names that "sources" may use.
// InvalidArgument messages name the key and what was wrong; they are sent as the 400 body.
Result<ScoreQuery> ParseScoreRequest(std::string_view body, const ScoreRequestLimits& limits,
                                     const std::set<std::string, std::less<>>& known_sources);

// The 200 body for a score result (query_tokens: the query's token count, or blocks x block size
// for a hash query).
std::string RenderScoreResponse(const ScoreResult& result, int64_t query_tokens);
// Parses a 200 body back (the C++ client and `kvo index query`).
Result<ScoreResult> ParseScoreResponse(std::string_view body);

// POST /v1/explain (same body as /v1/score): {"score": <score response>, "blocks": [{"index",
// "content_key", "engine_hash", "known", "holders": [{"source", "dp_rank", "medium", "group",
// "refcount", "since_seq"}]}], "instances": [{"source", "dp_rank", "prefix_blocks",
// "break_reason"}]}
std::string RenderExplainResponse(const ExplainResult& result, int64_t query_tokens);

// {"error": message}
std::string RenderError(std::string_view message);
// The "error" of such a body; the body itself when it is not one.
std::string ParseErrorMessage(std::string_view body);

// The /v1/score body for a query (the inverse of ParseScoreRequest).
std::string RenderScoreRequest(const ScoreQuery& query);

// A stream's state in GET /v1/sources and GET /workers.
enum class StreamPhase {
  kConnecting,  // no subscriber yet, or subscribed and nothing received yet
  kFollowing,   // something received within silent_after_ms
  kSilent,      // something received once, nothing within silent_after_ms
  kRetrying,    // the subscriber could not be created; waiting out the backoff
};
// "connecting" | "following" | "silent" | "retrying"
const char* StreamPhaseName(StreamPhase phase);

// One stream's status in GET /v1/sources.
struct StreamStatus {
  int64_t dp_rank = 0;
  std::string endpoint;
  std::string replay_endpoint;  // empty: none
  bool connected = false;       // subscriber up and something received within silent_after_ms
  StreamPhase state = StreamPhase::kConnecting;
  bool has_seq = false;
  uint64_t last_seq = 0;         // last applied sequence
  uint64_t durable_seq = 0;      // last sequence committed to SQLite
  double lag_seconds = 0;        // now - timestamp of the last applied batch (0 when none)
  uint64_t batches_applied = 0;  // by this process
  uint64_t gaps_filled = 0;
  uint64_t batches_lost = 0;
  uint64_t restarts_seen = 0;
  uint64_t source_clears = 0;  // times this stream's entries were cleared (restart, lost batches)
  uint64_t decode_errors = 0;
  uint64_t malformed_messages = 0;
  uint64_t apply_errors = 0;
  uint64_t connect_failures = 0;
  std::string last_error;
};

struct SourceStatus {
  std::string name;
  std::string endpoint;
  std::string replay_endpoint;
  std::string topic;
  bool connected = false;  // every stream connected
  std::vector<StreamStatus> streams;
  // Source-level aggregates (sums over streams; last_seq/lag from rank dp_rank_start).
  ParityReport parity;
  std::string hash_algo;  // empty when the doctor is unconfigured
  std::string hash_seed;
  int64_t hash_block_size = 0;
};

// {"sources": [{"name", "endpoint", "replay_endpoint", "topic", "connected", "last_sequence",
//   "lag_seconds", "gaps_filled", "restarts_seen", "hash_parity": {"state", ...},
//   "streams": [{"dp_rank", "endpoint", "connected", "last_sequence", "lag_seconds", ...}]}]}
std::string RenderSources(const std::vector<SourceStatus>& sources);

// GET /v1/media: {"streams": [{"source", "dp_rank", "last_sequence", "entries": {medium: n}}]}
// (entries held in memory per stream and medium; a stream with none has an empty object).
std::string RenderMediaStats(const IndexerStats& stats);

// The operator's page (indexer/operator_page.html, embedded at build time): GET / and
// GET /index.html serve it, GET /v1/media answers RenderMediaStats(index.Stats()). Returns false
// (and leaves *out alone) for every other path.
bool ServeOperatorPage(const HttpRequest& request, const Indexer& index, HttpResponse* out);

}  // namespace kvo
