#include "manager/request_params.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "common/json.h"
#include "common/logging.h"

namespace kvo {
namespace {

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

void Warn(std::string message, std::vector<std::string>* warnings) {
  KVO_LOG_WARN("{}", message);
  if (warnings != nullptr) warnings->push_back(std::move(message));
}

}  // namespace

std::optional<int64_t> ParseMaxOffloadTokens(const nlohmann::json& params, std::string* warning) {
  if (!params.is_object()) return std::nullopt;
  auto it = params.find("max_offload_tokens");
  if (it == params.end()) return std::nullopt;
  const nlohmann::json& raw = *it;
  // type(raw) is int: JSON integers only (bools and floats are other types here too).
  if (raw.is_number_unsigned()) {
    const uint64_t v = raw.get<uint64_t>();
    return static_cast<int64_t>(std::min<uint64_t>(v, INT64_MAX));
  }
  if (raw.is_number_integer() && raw.get<int64_t>() >= 0) return raw.get<int64_t>();
  std::string message =
      "max_offload_tokens must be a non-negative int, got " + DescribeJson(raw) + "; ignoring";
  KVO_LOG_WARN("{}", message);
  if (warning != nullptr) *warning = std::move(message);
  return std::nullopt;
}

std::optional<std::vector<TierMatcher>> ParseLoadTierFilter(const nlohmann::json& params,
                                                            std::vector<std::string>* warnings) {
  if (!params.is_object()) return std::nullopt;
  auto it = params.find("kv_load_tiers");
  if (it == params.end() || it->is_null()) return std::nullopt;
  if (!it->is_array()) {
    Warn("kv_load_tiers must be a list, got " + DescribeJson(*it) + "; loading from all tiers",
         warnings);
    return std::nullopt;
  }
  if (it->empty()) return std::vector<TierMatcher>{};
  std::vector<TierMatcher> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& entry = (*it)[i];
    const std::string where = "kv_load_tiers[" + std::to_string(i) + "]";
    if (!entry.is_object()) {
      Warn(where + " must be an object, got " + DescribeJson(entry) + "; skipped", warnings);
      continue;
    }
    TierMatcher m;
    bool bad = false;
    for (const auto& [k, v] : entry.items()) {
      if (k != "medium" && k != "locality") {
        Warn(where + ": unknown key '" + CutForMessage(k) + "'; entry skipped", warnings);
        bad = true;
        break;
      }
      if (v.is_null()) continue;
      if (!v.is_string()) {
        Warn(where + "." + k + " must be a string, got " + DescribeJson(v) + "; entry skipped",
             warnings);
        bad = true;
        break;
      }
      const std::string value = Upper(v.get<std::string>());
      if (k == "medium") {
        const Medium medium = MediumFromName(value);
        if (medium != Medium::kCpu && medium != Medium::kStorage) {
          Warn(where + ".medium must be 'cpu' or 'storage', got " + DescribeJson(v) +
                   "; entry skipped",
               warnings);
          bad = true;
          break;
        }
        m.medium = medium;
      } else {
        if (value != "LOCAL" && value != "REMOTE") {
          Warn(where + ".locality must be 'local' or 'remote', got " + DescribeJson(v) +
                   "; entry skipped",
               warnings);
          bad = true;
          break;
        }
        m.locality = value;
      }
    }
    if (!bad) out.push_back(std::move(m));
  }
  if (out.empty()) {
    Warn("kv_load_tiers has no valid entry; loading from all tiers", warnings);
    return std::nullopt;
  }
  return out;
}

int64_t NumStorableChunks(const StorableChunksInput& in) {
  if (in.tokens_per_chunk <= 0) return 0;
  int64_t n = std::min(in.num_tokens_after_batch, in.num_tokens);
  if (in.max_offload_tokens.has_value()) n = std::min(n, *in.max_offload_tokens);
  if (in.offload_prompt_only) n = std::min(n, in.num_prompt_tokens);
  if (n <= 0) return 0;
  return n / in.tokens_per_chunk;
}

}  // namespace kvo
