// The indexer daemon's configuration: which publishers (sources) to follow, how to reach each DP
// rank, the hash settings the parity doctor checks against, and the HTTP listener. Parsed from the
// `--config indexer.json` file or from repeated `--source NAME=ENDPOINT[,key=value...]` flags.
// Plain values and pure functions; thread-compatible.
//
// A source is one engine publisher (a vLLM engine or a kvo publisher). An engine with several
// data-parallel ranks publishes one stream per rank on offset ports (vLLM's offset_endpoint_port):
// `dp_ranks` ranks starting at `dp_rank_start`, each endpoint offset by its rank. A stream is
// therefore identified by (source name, DP rank) and has its own sequence numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "events/block_hash.h"
#include "http/address.h"

namespace kvo {

// What the engine hashes with (vllm-compat.md A.7): --prefix-caching-hash-algo, PYTHONHASHSEED
// and the hash block size. The doctor recomputes self-describing events' hashes with these.
struct HashParityConfig {
  HashAlgo algo = HashAlgo::kSha256;
  // PYTHONHASHSEED (a string: NONE_HASH = hash_fn(seed)). The parsers resolve a seed left out with
  // current vLLM's rule (ResolveNoneHashSeed): "vllm-none-hash" for the sha256 variants, an error
  // for the xxhash variants (their engines' seed must be given).
  std::string seed = std::string(kDefaultNoneHashSeed);
  int64_t block_size = 16;
};

// The longest source name (a registration's is "<instance_id>@<tenant_id>@<dp_rank>").
inline constexpr size_t kMaxSourceName = 128;

struct SourceConfig {
  std::string name;  // [A-Za-z0-9_.:@-]{1,kMaxSourceName}
  std::string endpoint;
  std::optional<std::string> replay_endpoint;
  std::string topic;
  int64_t dp_ranks = 1;       // number of DP ranks this source publishes
  int64_t dp_rank_start = 0;  // the first rank (vLLM's data_parallel_index), ports offset by it
  bool bind = false;          // bind the SUB socket (for publishers that connect)
  std::optional<HashParityConfig> hash;
};

// One subscribed stream: a source's DP rank with its resolved endpoints.
struct SourceStream {
  std::string source;
  int64_t dp_rank = 0;
  std::string endpoint;
  std::optional<std::string> replay_endpoint;
};

// A vLLM API server polled for its engines' KV-event endpoints (`--discover`, config "discover"):
// GET /kv_event_sources every discover_interval_ms; each data-parallel rank it reports becomes a
// registration "<instance_id>|<tenant_id>|<rank>" (as POST /register would make it).
struct DiscoverTarget {
  std::string url;  // "http://HOST:PORT" (normalised: no trailing '/')
  HttpAddress address;
  std::string instance_id;  // default "HOST:PORT" (IPv6 without brackets)
  std::string tenant_id = "default";
  std::string model;  // "" = the first model of the server's GET /v1/models
  std::string lora_name;
  int64_t block_size = 16;  // vLLM's default (--block-size)
  std::string additional_salt;
};

struct IndexerConfig {
  std::string db;                       // SQLite file
  std::string http = "127.0.0.1:8080";  // host:port of the HTTP API (port 0: any free port)
  int64_t max_query_tokens = 1 << 20;   // a larger /v1/score request is a 400
  // Registrations (POST /register, discovery) beyond this many followed streams are refused
  // (429): each stream holds a thread and a ZeroMQ socket, so an unbounded register loop would
  // exhaust the process. --source / --config streams count but are never refused.
  int64_t max_sources = 4096;
  int64_t default_block_size = 16;  // /v1/score with token_ids and no block_size
  // Subscriber tuning (events/zmq_subscriber.h).
  int64_t replay_timeout_ms = 2'000;
  int64_t idle_probe_ms = 1'000;
  int64_t hwm = 100'000;
  // A stream whose subscriber cannot be created (bad endpoint, bind refused) is retried with
  // exponential backoff between these bounds.
  int64_t retry_initial_ms = 100;
  int64_t retry_max_ms = 5'000;
  // A stream with nothing delivered for this long after start is reported "not answering".
  int64_t silent_after_ms = 10'000;
  std::vector<SourceConfig> sources;
  // vLLM API servers to discover engines from, and how often / how patiently to ask them.
  std::vector<DiscoverTarget> discover;
  int64_t discover_interval_ms = 2'000;
  int64_t discover_retry_initial_ms = 500;  // after a failed poll: doubles up to the max
  int64_t discover_retry_max_ms = 30'000;
  int64_t discover_timeout_ms = 2'000;  // one HTTP request
};

// Parses one `--discover` flag: http://HOST:PORT[,instance_id=ID][,tenant_id=T][,model=M]
// [,lora_name=L][,block_size=B][,additionalsalt=S]. InvalidArgument naming the part.
Result<DiscoverTarget> ParseDiscoverFlag(std::string_view flag);
// Checks the list: each URL once, each (instance_id, tenant_id) once.
Status ValidateDiscoverTargets(const std::vector<DiscoverTarget>& targets);

// Parses the JSON config file text (`origin` names it in errors). Unknown keys, wrong types,
// duplicate source names and invalid endpoints are InvalidArgument naming the key and value.
Result<IndexerConfig> ParseIndexerConfig(std::string_view json_text, std::string_view origin);

// Parses one `--source` flag: NAME=ENDPOINT[,replay=EP][,topic=T][,dp_ranks=N][,dp_rank_start=K]
// [,bind=true|false][,hash_algo=sha256|sha256_cbor|xxhash|xxhash_cbor][,hash_seed=S]
// [,block_size=B]. Any hash_* or block_size key enables the parity doctor for that source
// (defaults: sha256, vLLM's seed rule, 16).
Result<SourceConfig> ParseSourceFlag(std::string_view flag);

// Checks one source: name, endpoints (tcp://, ipc://, inproc://), rank counts, DP offsets.
Status ValidateSource(const SourceConfig& source);
// Checks the whole list: each source, then unique names and no endpoint used twice.
Status ValidateSources(const std::vector<SourceConfig>& sources);

// The source's streams, one per DP rank, with vLLM's port offsets applied.
Result<std::vector<SourceStream>> ExpandStreams(const SourceConfig& source);

// "HOST:PORT" (IPv6 as "[::1]:PORT"); port 0..65535. InvalidArgument naming the text.
Result<HttpAddress> ParseHttpAddress(std::string_view text);
// 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackHost(std::string_view host);

// Whether an identity (instance id, model, tenant, LoRA name) may become part of a source name:
// [A-Za-z0-9_.:-]{1,100} (`@` separates the parts). Used by the config file and the router API.
bool ValidSourceIdentity(std::string_view v);

}  // namespace kvo
