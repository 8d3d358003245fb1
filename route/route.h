// kvo route: an OpenAI-compatible router in front of N engines (route/DESIGN.md).
//
// Two layers:
//  - policy.cc: pure functions (no sockets, no clocks): the policies, the kv score, parsing the
//    flags' values and the indexer's /query answer. Thread-safe (stateless).
//  - router.cc: `Router`, the stateful part: engines, in-flight counts, the indexer client,
//    forwarding (streaming relayed chunk by chunk), retries, metrics. Handle() is thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "http/http_server.h"

namespace kvo::route {

enum class Policy { kKv, kRoundRobin, kRandom, kLeastLoaded };
// "kv" | "round-robin" | "random" | "least-loaded"; InvalidArgument naming the value.
Result<Policy> ParsePolicy(std::string_view text);
std::string_view PolicyName(Policy policy);

// What a matched token is worth by the medium that holds it (a GPU hit costs nothing to load;
// CPU and disk hits cost a transfer).
struct TierWeights {
  double gpu = 1.0;
  double cpu = 0.8;
  double disk = 0.5;
};
// "GPU=1,CPU=0.8,DISK=0.5" (any subset, any order; STORAGE is DISK); weights finite and >= 0.
Result<TierWeights> ParseTierWeights(std::string_view text);

// One instance's answer from the indexer's POST /query, in tokens: Mooncake's tiered match (the
// GPU prefix, then the cumulative boundary once CPU is consumed, then once DISK is; 0 when a
// medium adds nothing).
struct PrefixMatch {
  int64_t longest = 0;
  int64_t gpu = 0;
  int64_t cpu = 0;
  int64_t disk = 0;

  // The tokens each medium contributes to the prefix (they sum to the prefix length).
  int64_t GpuTokens() const;
  int64_t CpuTokens() const;
  int64_t DiskTokens() const;
  int64_t PrefixTokens() const;  // max(longest, gpu, cpu, disk)
};

// Parses {tenant: {instance_id: {"longest_matched", "GPU", "CPU", "DISK", "DP"}}} (the tenant's
// object; other tenants are ignored). InvalidArgument naming what was wrong.
Result<std::map<std::string, PrefixMatch>> ParseQueryResponse(std::string_view body,
                                                              std::string_view tenant);
// The /query body: {"model", "token_ids", "block_size", "tenant_id"}.
std::string RenderQueryRequest(std::string_view model, int64_t block_size,
                               std::span<const int64_t> token_ids);

struct PolicyConfig {
  Policy policy = Policy::kKv;
  TierWeights weights;
  double load_penalty = 1.0;  // blocks of score per in-flight request
  int64_t block_size = 16;
};

struct Candidate {
  PrefixMatch match;  // zero unless the kv policy asked the indexer
  int64_t in_flight = 0;
  bool available = true;  // false: down, or already tried for this request
};

// The kv policy's score of one candidate, in blocks:
//   (w_GPU * gpu_tokens + w_CPU * cpu_tokens + w_DISK * disk_tokens) / block_size
//     - load_penalty * in_flight
double KvScore(const PolicyConfig& config, const Candidate& candidate);

struct Choice {
  int index = -1;                    // -1: no candidate is available
  double score = 0;                  // the kv score (0 for the other policies)
  int64_t predicted_hit_tokens = 0;  // the chosen candidate's prefix tokens (kv only)
};

// Picks among the available candidates. `turn`: a counter the caller advances per request
// (round-robin, and the rotation that breaks ties); `draw`: a uniform random number (random).
//  - round-robin: the first available at or after turn % n;
//  - random: the (draw % available)-th available;
//  - least-loaded: fewest in-flight, ties by rotation from turn;
//  - kv: highest KvScore, ties by fewest in-flight, then by rotation from turn.
Choice Pick(const PolicyConfig& config, std::span<const Candidate> candidates, uint64_t turn,
            uint64_t draw);

// The hit tokens an engine reports having delivered for one request: the sum of its
// "kvo".hit_tokens over tiers, else usage.prompt_tokens_details.cached_tokens; none: nullopt.
// `body` is a completion object (or the JSON of one SSE chunk).
std::optional<int64_t> DeliveredHitTokens(std::string_view body);

struct EngineConfig {
  std::string url;          // base URL, e.g. http://127.0.0.1:8001
  HttpAddress address;      // parsed from url
  std::string instance_id;  // the indexer's instance id of this engine
};

struct RouterOptions {
  PolicyConfig policy;
  std::optional<HttpAddress> indexer;  // required by the kv policy
  std::string model = "kvo-sim";       // the model the engines serve (the /query "model")
  std::string tenant = "default";
  uint64_t seed = 0;
  int indexer_timeout_ms = 1000;
  int engine_timeout_ms = 600000;
  int64_t down_ms = 1000;  // an engine that could not be reached is skipped this long
  Clock* clock = nullptr;  // nullptr: SystemClock()
};

// Asks each engine for its instance id (GET /kvo/state, else HOST:PORT) and, unless
// `register_with` is unset, its event sources (GET /kv_event_sources), registering each with
// the indexer (POST /register). Unavailable / InvalidArgument naming the engine.
Result<std::vector<EngineConfig>> DiscoverEngines(const std::vector<std::string>& urls,
                                                  const std::optional<HttpAddress>& register_with,
                                                  const std::string& model, int64_t block_size,
                                                  int timeout_ms);

class Router {
 public:
  static Result<std::unique_ptr<Router>> Create(RouterOptions options,
                                                std::vector<EngineConfig> engines);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Serves: POST /v1/completions, POST /v1/chat/completions (forwarded; a streaming answer is
  // relayed chunk by chunk), GET /v1/models (forwarded), GET /health, GET /metrics,
  // GET /route/stats. Thread-safe.
  HttpResponse Handle(const HttpRequest& request);

  std::string StatsJson() const;
  std::string MetricsText() const;

 private:
  struct Impl;
  explicit Router(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvo::route
