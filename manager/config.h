// OffloadConfig: vLLM's `kv_connector_extra_config` for the OffloadingConnector (vllm-compat.md
// B.2), parsed from the same JSON a vLLM user passes, with vLLM's defaults and rejections; and the
// CPU-tier geometry and sizing derived from it (B.3). Documented key by key in
// schemas/offload_config.schema.json. Plain values; thread-compatible.
//
// Accepted input: the inner extra-config object, or the whole --kv-transfer-config object
// ({"kv_connector":"OffloadingConnector","kv_role":...,"kv_connector_extra_config":{...}}),
// recognised by its "kv_connector" key.
//
// Where kvo differs from vLLM, on purpose:
// - Python-only keys (spec_module_path, cache_policy_module_path, a tier's module_path) are
//   rejected when vLLM would import them, and ignored with a warning when vLLM ignores them
//   (a built-in spec_name / eviction_policy).
// - Wrong JSON types are rejected even where Python would coerce them (int("4"), int(2.5)).
// - Secondary tier types other than "fs" are rejected ("not supported by kvo").
// - `max_bytes` in an fs tier is kvo's own (a bounded file tier; vLLM's is unbounded).
// Every error is InvalidArgument naming the key, the value and what is allowed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace kvo {

enum class OffloadSpec { kCpu, kTiering };
// "CPUOffloadingSpec" | "TieringOffloadingSpec".
std::string_view OffloadSpecName(OffloadSpec spec);

// vLLM's Locality of a secondary tier (matching is case-sensitive).
enum class TierLocality { kLocal, kRemote };
std::string_view TierLocalityName(TierLocality locality);  // "LOCAL" | "REMOTE"

// `{"type": "fs", ...}`: vLLM's FileSystemTierManager keyword arguments, plus kvo's max_bytes.
struct FsTierConfig {
  std::string root_dir;  // required
  // Each 0..kFsMaxThreadsPerPool (1024), together >= 1 (an empty pool's queue is taken by the
  // other pool's threads).
  int64_t n_read_threads = 16;
  int64_t n_write_threads = 16;
  bool enable_kv_events = false;         // also needs the global enable_kv_cache_events
  std::optional<TierLocality> locality;  // None by default
  uint64_t max_bytes = 0;                // kvo: bound on the tier's bytes; 0 = unbounded (vLLM)
};

struct SecondaryTierConfig {
  std::string type;  // "fs" (the only type kvo implements)
  FsTierConfig fs;
};

struct OffloadConfig {
  OffloadSpec spec = OffloadSpec::kCpu;
  // Bytes of CPU memory for the primary tier, in total across all workers (vLLM truncates a float
  // with int(); so does kvo). Required and non-zero.
  uint64_t cpu_bytes_to_use = 0;
  // Chunking, at most one of the two as given (both unset: one GPU block per chunk).
  std::optional<uint64_t> block_size;        // tokens per offloaded chunk
  std::optional<uint64_t> blocks_per_chunk;  // GPU blocks per offloaded chunk
  std::string eviction_policy = "lru";
  bool offload_prompt_only = true;
  int64_t store_threshold = 0;  // < 2: no filter
  int64_t max_tracker_size = 64000;
  bool self_describing_kv_events = false;
  bool canonical_layout = false;  // accepted; kvo rows always use the direct layout (B.10)
  // Ordered; only read with TieringOffloadingSpec (vLLM ignores it for the CPU spec).
  std::vector<SecondaryTierConfig> secondary_tiers;

  // From the wrapper object form only.
  std::optional<std::string> kv_role;  // "kv_producer" | "kv_consumer" | "kv_both"

  // Top-level extra-config keys vLLM does not read (kept, and logged as a warning).
  std::vector<std::string> unknown_keys;
  // Every warning logged while parsing, in order (also sent to KVO_LOG_WARN).
  std::vector<std::string> warnings;

  bool store_threshold_enabled() const { return store_threshold >= 2; }
};

// The GPU-side KV geometry of one engine (what vLLM's build_offloading_config derives).
struct KvGeometry {
  // All KV tensor bytes on one worker for one GPU block (for packed layouts, tensor 0's share).
  uint64_t worker_kv_bytes_per_block = 0;
  // Tokens per GPU block (the group block size times DCP); every group the same.
  uint64_t gpu_block_size = 16;
  // Tokens per block hash (vLLM's hash block size); divides gpu_block_size.
  uint64_t tokens_per_hash = 16;
  uint64_t world_size = 1;
  // Pure MLA, TP-only, single node: one copy of the KV serves every worker.
  bool replicated_layout = false;
};

// The CPU tier's shape (B.3). A CPU "block" (slot, row) holds one chunk for all workers.
struct OffloadGeometry {
  uint64_t blocks_per_chunk = 1;    // GPU blocks per chunk
  uint64_t tokens_per_chunk = 0;    // blocks_per_chunk * gpu_block_size
  uint64_t hashes_per_chunk = 0;    // tokens_per_chunk / tokens_per_hash
  uint64_t num_copies = 1;          // 1 if replicated_layout else world_size
  uint64_t kv_bytes_per_chunk = 0;  // worker_kv_bytes_per_block * num_copies * blocks_per_chunk
  uint64_t row_bytes = 0;           // kv_bytes_per_chunk rounded up to the page size (row stride)
  uint64_t num_blocks = 0;          // cpu_bytes_to_use / row_bytes (0 when row_bytes is 0)
  uint64_t cpu_page_size_per_worker = 0;  // kv_bytes_per_chunk / num_copies
};

// Parses the JSON text. Without a geometry, checks that need the GPU block size (block_size a
// multiple of it) are left to ComputeOffloadGeometry.
Result<OffloadConfig> ParseOffloadConfig(std::string_view json);
// Parses and checks against the engine's geometry (block_size multiple of gpu_block_size).
Result<OffloadConfig> ParseOffloadConfig(std::string_view json, const KvGeometry& geometry);

// InvalidArgument for a zero block size, tokens_per_hash not dividing gpu_block_size, or a zero
// world size.
Status ValidateKvGeometry(const KvGeometry& geometry);

// B.3's arithmetic. `page_size` is the host page size (the caller reads it once in main; the
// default is the common 4096). InvalidArgument for an invalid geometry, a block_size that is not
// a positive multiple of the GPU block size, a zero page size, an overflow, or more CPU blocks
// than the eviction policy holds (MaxPolicyBlocks, manager/cache_policy.h).
Result<OffloadGeometry> ComputeOffloadGeometry(const OffloadConfig& config,
                                               const KvGeometry& geometry,
                                               uint64_t page_size = 4096);

// The names eviction_policy may take: CachePolicyRegistry::Global().Names() ("arc", "lru" and
// any policy registered by name).
std::vector<std::string> SupportedEvictionPolicies();

// Keys the parser reads (for the schema test and for tools): top level of the extra config, an
// fs tier's keys, and the wrapper's (KVTransferConfig) keys.
const std::vector<std::string>& OffloadConfigKeys();
const std::vector<std::string>& FsTierConfigKeys();
const std::vector<std::string>& KvTransferConfigKeys();

}  // namespace kvo
