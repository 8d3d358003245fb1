// msgpack codec for EventBatch, byte-for-byte as vLLM's msgspec encoder (vllm-compat.md A.2/A.3).
// Stateless functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/result.h"
#include "events/event.h"

namespace kvo {

enum class EventEncoding {
  kMap,    // tagged maps: vLLM since #42892 (v0.26+). The default.
  kArray,  // legacy positional arrays, tag first (v0.23 and earlier consumers).
};

struct EncodeOptions {
  EventEncoding encoding = EventEncoding::kMap;
};

// Encodes `batch` as msgspec would: [ts float64, events, data_parallel_rank].
std::string EncodeBatch(const EventBatch& batch, const EncodeOptions& options = {});
// Appends the encoding of `batch` to *out (reuses its capacity on hot paths).
void EncodeBatchTo(const EventBatch& batch, std::string* out, const EncodeOptions& options = {});

// Bounds a decoder enforces so hostile input cannot exhaust memory.
struct DecodeLimits {
  size_t max_payload_bytes = 256u << 20;
  size_t max_array_elements = 16u << 20;
  size_t max_map_entries = 4096;
  size_t max_string_bytes = 1u << 20;
  size_t max_depth = 32;
};

// Decodes one EventBatch. Accepts map- and array-encoded events (any schema generation in A.2),
// shorter and longer arrays, unknown map keys. Errors name what was wrong and where
// ("events[2].block_hashes[0]: expected int or bin, got str"). Never throws.
Result<EventBatch> DecodeBatch(std::string_view payload, const DecodeLimits& limits = {});

}  // namespace kvo
