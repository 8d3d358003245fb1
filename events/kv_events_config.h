// KvEventsConfig: vLLM's `--kv-events-config` JSON (vllm-compat.md A.5), same keys, defaults and
// rejections, plus kvo's own optional keys. Plain value; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"
#include "common/status.h"

namespace kvo {

struct KvEventsConfig {
  bool enable_kv_cache_events = false;
  std::string publisher = "null";  // "null" | "zmq"; unset resolves to zmq when enabled
  std::string endpoint = "tcp://*:5557";
  std::optional<std::string> replay_endpoint;  // replay disabled when unset
  int64_t buffer_steps = 10'000;               // batches kept in memory for replay
  int64_t hwm = 100'000;                       // ZMQ high-water mark
  int64_t max_queue_size = 100'000;            // in-process queue; Publish blocks when full
  std::string topic;

  // kvo extensions (not in vLLM):
  std::optional<std::string> journal_dir;  // durable journal: replay beyond the ring, seq survives
  std::string journal_fsync = "never";     // "never" | "batch" | "interval"
  std::string encoding = "map";            // "map" (vLLM >= 0.26) | "array" (legacy consumers)
};

// Parses the JSON object a vLLM user passes to --kv-events-config. Unknown keys, wrong types and
// out-of-range values are InvalidArgument naming the key and the value.
Result<KvEventsConfig> ParseKvEventsConfig(std::string_view text);

// Checks a ZeroMQ endpoint before it reaches a socket: tcp://HOST:PORT (PORT 1-65535 or "*",
// HOST non-empty, IPv6 in brackets), ipc://PATH or inproc://NAME; at most 1024 bytes, no control
// characters (a NUL would silently cut the string ZeroMQ sees). InvalidArgument names `what` and
// the value (shortened, escaped).
Status ValidateEndpoint(std::string_view ep, std::string_view what);

// vLLM's offset_endpoint_port: rank 0 or an empty endpoint is unchanged; "inproc" endpoints get
// "_dp<rank>"; "tcp" endpoints get rank added to the port after the last ':'; anything else is
// InvalidArgument("Invalid endpoint: must contain 'inproc' or 'tcp'").
Result<std::string> OffsetEndpointPort(std::string_view endpoint, int64_t data_parallel_rank);

// vLLM's bind-or-connect rule for the PUB socket: bind if the endpoint contains "*" or "::" or
// starts with ipc:// or inproc://; otherwise connect.
bool ShouldBind(std::string_view endpoint);

// True when a bound endpoint listens beyond loopback (tcp://*:..., tcp://0.0.0.0:..., "::").
bool BindsBeyondLoopback(std::string_view endpoint);

}  // namespace kvo
