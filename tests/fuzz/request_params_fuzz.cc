// libFuzzer target: per-request offloading params (vLLM's kv_transfer_params): the JSON text is
// parsed as the engine receives it, then kvo::ParseMaxOffloadTokens and ParseLoadTierFilter read
// it. Never a crash or throw; every warning is bounded. max_offload_tokens is a non-negative cap or
// none; tier matchers are normalised (CPU | STORAGE, LOCAL | REMOTE); NumStorableChunks with that
// cap stays within [0, min(tokens...) / tokens_per_chunk].
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "manager/request_params.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  nlohmann::json params = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (params.is_discarded()) return 0;

  std::string warning;
  std::optional<int64_t> cap = kvo::ParseMaxOffloadTokens(params, &warning);
  if (!warning.empty()) FUZZ_CHECK_MESSAGE(warning);
  FUZZ_CHECK(!cap || *cap >= 0, "a negative cap %lld", static_cast<long long>(*cap));
  FUZZ_CHECK(!(cap && !warning.empty()), "a cap and a warning");

  std::vector<std::string> warnings;
  std::optional<std::vector<kvo::TierMatcher>> tiers = kvo::ParseLoadTierFilter(params, &warnings);
  for (const std::string& w : warnings) FUZZ_CHECK_MESSAGE(w);
  if (tiers) {
    for (const kvo::TierMatcher& m : *tiers) {
      FUZZ_CHECK(!m.medium || *m.medium == kvo::Medium::kCpu || *m.medium == kvo::Medium::kStorage,
                 "medium %s", std::string(kvo::MediumName(*m.medium)).c_str());
      FUZZ_CHECK(!m.locality || *m.locality == "LOCAL" || *m.locality == "REMOTE", "locality %s",
                 m.locality->c_str());
    }
  }

  for (int64_t tokens : {int64_t{0}, int64_t{1000}, INT64_MAX}) {
    for (int64_t per_chunk : {int64_t{1}, int64_t{16}, int64_t{1000}}) {
      for (bool prompt_only : {false, true}) {
        kvo::StorableChunksInput in;
        in.num_tokens_after_batch = tokens;
        in.num_tokens = tokens;
        in.num_prompt_tokens = tokens / 2;
        in.offload_prompt_only = prompt_only;
        in.max_offload_tokens = cap;
        in.tokens_per_chunk = per_chunk;
        int64_t n = kvo::NumStorableChunks(in);
        int64_t bound = prompt_only ? tokens / 2 : tokens;
        if (cap) bound = std::min(bound, *cap);
        FUZZ_CHECK(n >= 0 && n <= bound / per_chunk, "%lld storable chunks, bound %lld",
                   static_cast<long long>(n), static_cast<long long>(bound / per_chunk));
      }
    }
  }
  return 0;
}
