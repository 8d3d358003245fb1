// `kvo demo`: the deployment of docs/ARCHITECTURE.md §1–2 as real processes on loopback — a kvo
// indexer, N simulated vLLM engines (`kvo sim`) and a router (`kvo route`) — driven by `kvo load`
// once per routing policy, each time with fresh state (new directory, new processes). After each
// run quiesces, the indexer's view of every engine is compared with the engine's own state, medium
// by medium; the report sets the policies side by side. Children are run by the Supervisor
// (supervisor/): a child that dies ends the run naming it, with its last log lines.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/result.h"

namespace kvo::demo {

struct DemoOptions {
  std::string kvo_binary;  // absolute path of `kvo`: every child runs it
  std::string workdir;     // must exist; run i uses <workdir>/<i>-<policy>/
  int instances = 2;
  std::vector<std::string> policies = {"kv", "round-robin"};
  std::string trace;         // a Mooncake JSONL trace; empty: kvo load's synthetic workload
  int64_t max_requests = 0;  // 0: the whole workload
  double speedup = 0;        // 0: kvo load's default
  // The default workload (sized for < 60 s on 2 cores, both policies): 16 conversations of 5
  // turns sharing a 1024-token system prompt (kvo load's synthetic shape), engines with a GPU
  // prefix cache of 192 blocks and CPU rows of 256 (a whole conversation fits, not all of them:
  // evictions, so CPU and file hits happen), and a router load penalty of 16 blocks per request in
  // flight.
  int conversations = 16;
  int turns = 5;
  int64_t gpu_blocks = 192;  // kvo sim --gpu-blocks; 0: the sim's default
  int64_t cpu_blocks = 256;  // kvo sim --cpu-blocks (smaller than the working set: file hits too)
  // kvo route --load-penalty (blocks per in-flight request); < 0: the router's default. The
  // router's default (1) never outweighs the shared 64-block system prompt: the first engine to
  // hold it gets every request (demo/DESIGN.md, "Why a load penalty of 16").
  double load_penalty = 16;
  uint64_t seed = 1;
  std::vector<std::string> sim_args;               // appended to every `kvo sim` command line
  std::vector<std::string> route_args;             // appended to `kvo route`
  std::vector<std::string> load_args;              // appended to `kvo load`
  std::chrono::milliseconds start_timeout{30000};  // each server's listening line
  std::chrono::milliseconds load_timeout{600000};
  std::chrono::milliseconds quiesce_timeout{20000};
  std::FILE* progress = nullptr;  // one line per step (stderr), or nullptr
};

struct Tiers {
  int64_t gpu = 0, cpu = 0, disk = 0;
  int64_t total() const { return gpu + cpu + disk; }
};

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0;
};

// One (instance, medium) of the consistency check.
struct MediumCheck {
  std::string instance;
  std::string medium;  // GPU | CPU | DISK
  size_t engine_blocks = 0, index_blocks = 0;
  size_t only_engine = 0, only_index = 0;   // blocks in one set and not the other
  std::string engine_digest, index_digest;  // BlockSetDigest of each side's list
  bool equal() const { return only_engine == 0 && only_index == 0; }
};

// NOLINTNEXTLINE(bugprone-exception-escape): nlohmann::json members' implicit moves.
struct PolicyRun {
  std::string policy;
  std::string dir;         // this run's files and logs
  double wall_s = 0;       // processes up to processes down
  double load_wall_s = 0;  // kvo load's own wall time
  // From kvo load (client side).
  int64_t requests = 0, errors = 0;
  Percentiles ttft_ms, e2e_ms;
  std::vector<double> ttft_samples;  // per request, when kvo load wrote records
  // From the engines' GET /kvo/state, summed.
  int64_t engine_requests = 0, prompt_tokens = 0, prefill_computed = 0;
  Tiers hit_tokens;
  Tiers bytes_loaded;  // to GPU, from CPU / DISK
  Tiers bytes_stored;  // from GPU, to CPU / DISK
  double load_seconds = 0, store_seconds = 0;
  int64_t blocks_verified = 0, mismatches = 0;
  int64_t events_published = 0;
  // From the indexer.
  int64_t events_indexed = 0;  // block events applied (kvo_indexer_block_events_applied)
  int64_t batches_indexed = 0;
  // From the router's GET /route/stats.
  int64_t predicted_hit_tokens = 0, delivered_hit_tokens = 0;
  nlohmann::json router_stats;
  nlohmann::json load_summary;
  std::vector<nlohmann::json> engine_counters;  // per instance, as reported
  // The verdict.
  std::vector<MediumCheck> checks;
  bool consistent = false;
  std::string inconsistency;  // what differed, when not consistent

  // Hit tokens (all tiers) / prompt tokens.
  double hit_rate() const;
};

struct DemoReport {
  std::string workload;  // "synthetic (...)" or the trace
  int instances = 0;
  double wall_s = 0;
  std::vector<PolicyRun> runs;
  int64_t mismatches() const;
  bool consistent() const;
};

// Runs every policy of `options` in turn. Fails when a child fails (naming it, with its log's
// last lines), on SIGINT/SIGTERM (Cancelled; Supervisor::InstallSignalHandlers must have been
// called), or when an answer cannot be read. An inconsistent index is a report, not an error.
Result<DemoReport> RunDemo(const DemoOptions& options);

// The report for a terminal.
std::string RenderText(const DemoReport& report);
// One JSON object: {"mismatches", "consistent", "instances", "workload", "wall_s",
//   "policies": {name: {...}}, "ratio": {...}} (keys documented in demo/DESIGN.md).
nlohmann::ordered_json RenderJson(const DemoReport& report);
// A self-contained SVG: TTFT distribution (CDF) per policy and hit rate per tier per policy.
std::string RenderSvg(const DemoReport& report);

// Sorted-sample percentile (nearest rank); 0 for no samples.
double Percentile(std::vector<double> samples, double q);

}  // namespace kvo::demo
