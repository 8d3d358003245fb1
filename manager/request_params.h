// Per-request offloading limits from vLLM's kv_transfer_params (vllm-compat.md B.2, B.8):
// `max_offload_tokens`, `offload_prompt_only` and `kv_load_tiers`, and how many chunks of a
// request may be stored. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "manager/offload_manager.h"

namespace kvo {

// vLLM's max_offload_tokens rule: accepted only when the JSON value is an integer (not a bool)
// >= 0; anything else (bool, float, string, negative, null) logs "max_offload_tokens must be a
// non-negative int, got <value>; ignoring" (once into *warning when given) and means no cap.
// 0 disables offloading for the request. An absent key is no cap, without a warning.
std::optional<int64_t> ParseMaxOffloadTokens(const nlohmann::json& kv_transfer_params,
                                             std::string* warning = nullptr);

// vLLM's kv_load_tiers: a list of {"medium": "cpu"|"storage", "locality": "local"|"remote"},
// case-insensitive, either key optional. Not a list: warning, ALL (nullopt). A bad entry is skipped
// (warning); every entry bad: ALL. [] : no secondary tier. Absent: ALL. Normalised upper case.
std::optional<std::vector<TierMatcher>> ParseLoadTierFilter(
    const nlohmann::json& kv_transfer_params, std::vector<std::string>* warnings = nullptr);

// The scheduler's storable-chunk count (_build_store_jobs):
//   num_offloadable = min(num_tokens_after_batch, num_tokens, max_offload_tokens?,
//                         num_prompt_tokens if offload_prompt_only)
//   storable chunks = floor(num_offloadable / tokens_per_chunk)
// (the caller also caps it at the chunks whose GPU blocks are allocated).
struct StorableChunksInput {
  int64_t num_tokens_after_batch = 0;  // aborted: computed; finished: num_tokens; else computed +
                                       // scheduled
  int64_t num_tokens = 0;
  int64_t num_prompt_tokens = 0;
  bool offload_prompt_only = true;  // vLLM's default since #43797
  std::optional<int64_t> max_offload_tokens;
  int64_t tokens_per_chunk = 0;  // tokens_per_block x blocks_per_chunk; REQUIRES: > 0
};
int64_t NumStorableChunks(const StorableChunksInput& in);

}  // namespace kvo
