// The JSON form of event batches used by `kvo events tail|publish|journal`: every field that is on
// the wire, with the wire's names; u64 hashes as JSON integers, byte hashes as lowercase hex
// strings. Stateless; thread-safe.
//   {"seq":N,"topic":"..","ts":F,"data_parallel_rank":R,
//    "events":[{"type":"BlockStored","block_hashes":[..],"parent_block_hash":null,...}]}
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "events/event.h"

namespace kvo {

// One line of JSON (no trailing newline). seq/topic are omitted when nullopt.
std::string BatchToJson(const EventBatch& batch, std::optional<uint64_t> seq,
                        std::optional<std::string_view> topic);

// A human-readable form: one line per event, prefixed with seq.
std::string BatchToText(const EventBatch& batch, uint64_t seq);

// Parses one JSON line of the form above ("seq" and "topic" are accepted and ignored). Errors name
// the field ("events[1].block_hashes[0]: expected integer or hex string").
Result<EventBatch> BatchFromJson(std::string_view json);

// Extra keys in the JSON form above: an array with one entry per block, each null or an array of
// strings, integers, {"bytes":"<hex>"} and nested arrays. `what` names the input in errors
// ("--extra-keys[1][0]: ...").
Result<std::vector<Value>> ExtraKeysFromJsonText(std::string_view json, const std::string& what);

}  // namespace kvo
