// SimEngine: the KV-cache side of one simulated vLLM engine (sim/DESIGN.md). A GPU prefix cache
// of `gpu_blocks` blocks with vLLM's block-pool event semantics (BlockStored medium GPU for each
// newly full block, BlockRemoved when a cached block's memory is reused, AllBlocksCleared on a
// reset), kvo's offload stack built from the vLLM `--kv-transfer-config` (CPU rows, optional file
// tier), and a journaled ZeroMQ publisher from `--kv-events-config`. Every block has real bytes:
// a prefill writes them (derived from the block hash and the layer), a hit from CPU or disk moves
// them (memcpy, file reads) and checks them byte for byte.
//
// No model: time for prefill and decode is the caller's model (sim/server.h). Thread-safe: one
// request at a time holds the engine (Serve), as one GPU's block manager would.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "events/block_hash.h"
#include "events/kv_events_config.h"

namespace kvo::sim {

struct SimEngineOptions {
  std::string instance_id = "sim";
  std::string model = "kvo-sim";
  std::string workdir;  // journal/ and the file tier's default root
  int64_t block_size = 16;
  size_t gpu_blocks = 1024;
  uint64_t bytes_per_token = 2048;  // KV bytes per token over all layers
  int num_layers = 8;               // a block's bytes are num_layers equal segments
  // vLLM's --kv-transfer-config (OffloadingConnector); empty: no offload (GPU cache only).
  std::string kv_transfer_config;
  KvEventsConfig events;  // enable_kv_cache_events, endpoints (resolved: no port 0), topic
  HashAlgo hash_algo = HashAlgo::kSha256;
  std::string hash_seed;  // resolved (ResolveNoneHashSeed)
  // Every scheduler step waits for the file tier's jobs, and no background step loop runs: the
  // same requests give the same figures run after run (`kvo demo --tour`). Off: the file tier's
  // writes go on between requests, as in a serving engine (`kvo sim`).
  bool synchronous_steps = false;
};

// The media of /kvo/state.
enum Medium { kGpu = 0, kCpu = 1, kDisk = 2, kNumMedia = 3 };
const char* MediumName(int m);  // "GPU" | "CPU" | "DISK"

struct ServeResult {
  size_t prompt_tokens = 0;
  size_t hit_tokens[kNumMedia] = {};  // tokens served from each medium
  size_t computed_tokens = 0;         // prompt tokens prefilled
  uint64_t bytes_loaded[kNumMedia] = {};
  double load_seconds = 0;   // real time of lookups, promotions and loads (CPU/disk hits)
  double store_seconds = 0;  // real time of the GPU -> CPU offload copies
  size_t blocks_verified = 0;
  size_t mismatches = 0;
};

struct EngineCounters {
  uint64_t requests = 0, prompt_tokens = 0, prefill_tokens_computed = 0;
  uint64_t hit_tokens[kNumMedia] = {};
  uint64_t bytes_loaded[kNumMedia] = {};
  uint64_t bytes_stored[kNumMedia] = {};
  double load_seconds = 0, store_seconds = 0;
  uint64_t blocks_verified = 0, mismatches = 0;
  uint64_t events_published = 0;  // block hashes (+1 per clear) published, GPU and offload events
  uint64_t gpu_blocks_used = 0, gpu_blocks_total = 0;
  uint64_t resets = 0;
  uint64_t deferred_steps = 0;  // scheduler steps a prefix lookup waited on the file tier
  uint64_t cpu_evictions = 0;   // the offload manager's CPU-tier evictions (since its restart)
};

struct EngineState {
  EngineCounters counters;
  std::vector<uint64_t> blocks[kNumMedia];  // wire hashes per medium, sorted
};

// Order-independent digest of a set of u64 block hashes: hex of the sum (mod 2^64) of
// SplitMix64(h) over the set, 16 lowercase hex digits (sim/DESIGN.md).
std::string SetDigest(const std::vector<uint64_t>& hashes);
std::string HashHex(uint64_t h);  // 16 lowercase hex digits

// The bytes a prefill writes for `layer` of the block with wire hash `wire` (deterministic, any
// process can check them).
void FillLayer(uint64_t wire, int layer, uint8_t* p, uint64_t bytes);

class SimEngine {
 public:
  static Result<std::unique_ptr<SimEngine>> Open(const SimEngineOptions& options);
  ~SimEngine();
  SimEngine(const SimEngine&) = delete;
  SimEngine& operator=(const SimEngine&) = delete;

  // One request's prompt: GPU prefix hit, then the offload tiers (bytes loaded and checked), then
  // prefill (bytes written) of the rest, GPU events, offload of the computed blocks, the step's
  // offload events. Errors are engine failures (Internal/IOError), not bad input.
  Result<ServeResult> Serve(const std::vector<uint32_t>& tokens, const std::string& req_id);
  // POST /reset_prefix_cache: the GPU prefix cache is emptied (AllBlocksCleared).
  Status ResetPrefixCache();
  // The offload manager restarts: a new one recovers from the event journal (the CPU rows are
  // lost and announced removed; the file tier is reconciled with its directory). The GPU prefix
  // cache is kept.
  Status RestartOffloadManager();

  const SimEngineOptions& options() const;
  EngineState State();
  EngineCounters Counters();
  // The publisher's resolved endpoints (client form: tcp://127.0.0.1:P).
  const KvEventsConfig& events_config() const;
  std::string PrometheusText();  // the offload stack's metrics (vLLM's names)
  // Waits until every event published so far is journaled and sent.
  void FlushEvents();
  // The publisher's next sequence number (unset before its first batch).
  std::optional<uint64_t> NextEventSeq();

  struct Impl;

 private:
  explicit SimEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvo::sim
