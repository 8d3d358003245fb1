#include "indexer/service/doctor.h"

#include <algorithm>
#include <bit>
#include <span>
#include <vector>

#include "common/logging.h"

namespace kvo {

const char* ParityStateName(ParityState state) {
  switch (state) {
    case ParityState::kUnconfigured:
      return "unconfigured";
    case ParityState::kPending:
      return "pending";
    case ParityState::kOk:
      return "ok";
    case ParityState::kMismatch:
      return "mismatch";
  }
  return "unknown";
}

namespace {

// Extra-key modes tried: as the event says, none at all, and (lora_name,) on every block.
constexpr int kExtraAsEvent = 0;
constexpr int kExtraNone = 1;
constexpr int kExtraLora = 2;

bool HashMatches(const BlockHash& wire, const std::string& digest) {
  switch (wire.kind) {
    case BlockHash::Kind::kUint:
      return BlockDigest::Low64(digest) == wire.value;
    case BlockHash::Kind::kBytes:
      return wire.bytes == digest;
    case BlockHash::Kind::kInt:
      return false;
  }
  return false;
}

std::string ShowHash(const BlockHash& h) { return h.ToString(); }

}  // namespace

HashParityDoctor::HashParityDoctor(std::string source, std::optional<HashParityConfig> config,
                                   DoctorOptions options)
    : source_(std::move(source)), config_(std::move(config)), options_(options) {
  MutexLock lock(&mu_);
  report_.state = config_ ? ParityState::kPending : ParityState::kUnconfigured;
  if (config_) none_hash_ = NoneHash(config_->algo, config_->seed);
  for (HashAlgo algo : kAllHashAlgos) {
    hashers_[static_cast<size_t>(algo)] = std::make_unique<BlockHasher>(algo);
  }
}

HashParityDoctor::~HashParityDoctor() = default;

void HashParityDoctor::SetMetrics(Counter* checked, Counter* mismatched, Gauge* mismatch_state) {
  MutexLock lock(&mu_);
  checked_metric_ = checked;
  mismatched_metric_ = mismatched;
  state_metric_ = mismatch_state;
}

void HashParityDoctor::Check(const EventBatch& batch) {
  if (!config_) return;
  for (const KvEvent& e : batch.events) {
    if (const auto* stored = std::get_if<BlockStored>(&e)) CheckStored(*stored);
  }
}

std::optional<size_t> HashParityDoctor::CountMatches(const BlockStored& stored, HashAlgo algo,
                                                     const std::string& none_hash,
                                                     int64_t granularity, int extra_mode,
                                                     std::vector<std::string>* digests) {
  const size_t n = stored.block_hashes.size();
  const size_t tokens = stored.token_ids.size();
  if (n == 0 || tokens == 0 || tokens % n != 0 || granularity <= 0) return std::nullopt;
  const size_t per_hash = tokens / n;
  if (per_hash % static_cast<size_t>(granularity) != 0) return std::nullopt;
  const size_t sub_blocks = per_hash / static_cast<size_t>(granularity);
  std::string parent;
  if (!stored.parent_block_hash) {
    parent = none_hash;
  } else if (stored.parent_block_hash->is_bytes()) {
    parent = stored.parent_block_hash->bytes;
  } else if (stored.parent_block_hash->kind == BlockHash::Kind::kUint) {
    auto it = digests_.find(stored.parent_block_hash->value);
    if (it == digests_.end()) return std::nullopt;
    parent = it->second;
  } else {
    return std::nullopt;
  }
  for (const BlockHash& h : stored.block_hashes) {
    if (h.kind == BlockHash::Kind::kInt) return std::nullopt;  // Python's builtin hash()
  }
  BlockHasher* hasher = hashers_[static_cast<size_t>(algo)].get();
  // vLLM's offload events (CPU, STORAGE; B.9) carry the request's lora_name but never extra_keys,
  // although the engine hashed every block with (lora_name,) first in its extra keys (A.7): such
  // an event means those extra keys. (GPU events always carry extra_keys, one per hash.)
  const bool offload_lora = extra_mode == kExtraAsEvent && !stored.extra_keys &&
                            stored.lora_name.has_value() && stored.medium.has_value() &&
                            *stored.medium != kMediumGpu;
  Value lora;
  if (extra_mode == kExtraLora || offload_lora) {
    if (!stored.lora_name) return std::nullopt;
    lora.v = ValueArray{Value{*stored.lora_name}};
  }
  size_t matches = 0;
  std::span<const int64_t> all(stored.token_ids);
  for (size_t i = 0; i < n; ++i) {
    std::string digest;
    for (size_t j = 0; j < sub_blocks; ++j) {
      const Value* extra = nullptr;
      if (extra_mode == kExtraLora || offload_lora) {
        extra = &lora;
      } else if (extra_mode == kExtraAsEvent && j + 1 == sub_blocks && stored.extra_keys &&
                 i < stored.extra_keys->size()) {
        extra = &(*stored.extra_keys)[i];
      }
      size_t begin = i * per_hash + j * static_cast<size_t>(granularity);
      auto d = hasher->Hash(parent, all.subspan(begin, static_cast<size_t>(granularity)), extra);
      if (!d.ok()) return std::nullopt;  // extra keys that cannot be hashed
      digest = std::move(d).value();
      parent = digest;
    }
    if (HashMatches(stored.block_hashes[i], digest)) ++matches;
    if (digests != nullptr) digests->push_back(std::move(digest));
  }
  return matches;
}

void HashParityDoctor::Remember(const BlockStored& stored,
                                const std::vector<std::string>& digests) {
  for (size_t i = 0; i < digests.size() && i < stored.block_hashes.size(); ++i) {
    if (!HashMatches(stored.block_hashes[i], digests[i])) break;  // only a verified chain
    if (digests_.size() >= options_.max_remembered_digests) digests_.clear();
    digests_[BlockDigest::Low64(digests[i])] = digests[i];
  }
}

void HashParityDoctor::CheckStored(const BlockStored& stored) {
  if (!config_) return;
  MutexLock lock(&mu_);
  const uint64_t n = stored.block_hashes.size();
  if (n == 0) return;
  ++events_seen_;
  if (report_.checked_blocks >= options_.warmup_blocks && options_.sample_every > 1 &&
      events_seen_ % options_.sample_every != 0) {
    ++report_.skipped_events;
    return;
  }
  if (stored.token_ids.empty()) {
    report_.unverifiable_blocks += n;  // a placeholder (CPU offload without self-describing)
    return;
  }
  const size_t tokens = stored.token_ids.size();
  if (stored.block_size <= 0 || tokens % static_cast<uint64_t>(stored.block_size) != 0 ||
      tokens / static_cast<uint64_t>(stored.block_size) != n) {
    // Tokens that are not the event's own block_size per hash: vLLM's Mamba-align events span
    // the null blocks their hashes leave out (vllm#44451). Nothing to recompute, and no sign of a
    // misconfiguration (the indexer counts these as content mismatches, not keyed by content).
    report_.unverifiable_blocks += n;
    return;
  }
  std::vector<std::string> digests;
  auto matches =
      CountMatches(stored, config_->algo, none_hash_, config_->block_size, kExtraAsEvent, &digests);
  bool shape_mismatch =
      tokens % n == 0 && (tokens / n) % static_cast<uint64_t>(config_->block_size) != 0;
  if (!matches && !shape_mismatch) {
    report_.unverifiable_blocks += n;  // parent unknown, odd hash form, ragged tokens
    return;
  }
  uint64_t matched = matches.value_or(0);
  report_.checked_blocks += n;
  report_.matched_blocks += matched;
  if (checked_metric_ != nullptr) checked_metric_->Increment(static_cast<double>(n));
  if (matched == n) {
    Remember(stored, digests);
    if (stored.parent_block_hash) ++chained_matched_events_;
    if (report_.state == ParityState::kPending) report_.state = ParityState::kOk;
    return;
  }
  uint64_t before = report_.mismatched_blocks;
  report_.mismatched_blocks += n - matched;
  if (mismatched_metric_ != nullptr)
    mismatched_metric_->Increment(static_cast<double>(n - matched));
  if (state_metric_ != nullptr) state_metric_->Set(1);
  report_.state = ParityState::kMismatch;
  if (report_.cause.empty()) {
    size_t first_bad = 0;
    while (first_bad < digests.size() &&
           HashMatches(stored.block_hashes[first_bad], digests[first_bad])) {
      ++first_bad;
    }
    report_.example =
        "block " + std::to_string(first_bad) + " of an event with " + std::to_string(n) +
        " hashes and " + std::to_string(tokens) + " tokens: engine sent " +
        ShowHash(stored.block_hashes[std::min<size_t>(first_bad, n - 1)]) +
        (first_bad < digests.size()
             ? ", recomputed " + std::to_string(BlockDigest::Low64(digests[first_bad]))
             : std::string(", tokens per hash not a multiple of the configured block size"));
    Diagnose(stored);
  }
  // Loud but bounded: the first mismatch, then at every power of two.
  uint64_t after = report_.mismatched_blocks;
  if (before == 0 || (std::bit_width(before) != std::bit_width(after))) {
    KVO_LOG_ERROR(
        "hash parity MISMATCH on source '{}': {} of {} verified blocks differ; likely cause: {} "
        "({}); e.g. {}",
        source_, report_.mismatched_blocks, report_.checked_blocks, report_.cause, report_.detail,
        report_.example);
  }
}

void HashParityDoctor::Diagnose(const BlockStored& stored) {
  const HashParityConfig& cfg = *config_;
  const size_t n = stored.block_hashes.size();
  const size_t tokens = stored.token_ids.size();
  // Diagnose on the event's first hash only: cheap, and enough to tell the settings apart.
  BlockStored first = stored;
  first.block_hashes.resize(1);
  int64_t per_hash = tokens % n == 0 ? static_cast<int64_t>(tokens / n) : 0;
  if (per_hash > 0) first.token_ids.resize(static_cast<size_t>(per_hash));
  if (first.extra_keys && first.extra_keys->size() > 1) first.extra_keys->resize(1);

  // Partial agreement (a prefix of the event matched): the settings agree, something per block
  // (multimodal items, cache_salt, prompt embeddings) is not in the event's extra keys.
  auto full = CountMatches(stored, cfg.algo, none_hash_, cfg.block_size, kExtraAsEvent, nullptr);
  if (full && *full > 0) {
    report_.cause = "extra_keys";
    report_.detail = std::to_string(*full) + " of " + std::to_string(n) +
                     " hashes of one event match: per-block extra keys (multimodal items, "
                     "cache_salt, prompt embeddings) differ from the event's";
    return;
  }

  std::vector<std::string> seeds = {cfg.seed};
  if (cfg.seed != kDefaultNoneHashSeed) seeds.emplace_back(kDefaultNoneHashSeed);
  for (int s = 0; s <= options_.max_seed_tried; ++s) seeds.push_back(std::to_string(s));
  for (const char* s : {"42", "1234", "12345", "2024", "2025", "2026", "31337"}) {
    seeds.push_back(s);
  }
  std::vector<int64_t> sizes = {cfg.block_size};
  if (per_hash > 0 && per_hash != cfg.block_size) sizes.push_back(per_hash);
  if (stored.block_size > 0 && stored.block_size != cfg.block_size &&
      stored.block_size != per_hash) {
    sizes.push_back(stored.block_size);
  }
  // The configured algorithm first, then the other three.
  std::vector<HashAlgo> algos = {cfg.algo};
  for (HashAlgo a : kAllHashAlgos) {
    if (a != cfg.algo) algos.push_back(a);
  }
  for (int mode : {kExtraAsEvent, kExtraNone, kExtraLora}) {
    for (int64_t size : sizes) {
      for (HashAlgo algo : algos) {
        for (size_t si = 0; si < seeds.size(); ++si) {
          if (si > 0 && seeds[si] == cfg.seed) continue;
          std::string none_hash = NoneHash(algo, seeds[si]);
          auto m = CountMatches(first, algo, none_hash, size, mode, nullptr);
          if (!m || *m != 1) {
            // With a chained parent the seed plays no part: one try per algorithm is enough.
            if (stored.parent_block_hash) break;
            continue;
          }
          std::vector<std::string> causes;
          std::vector<std::string> fixes;
          if (algo != cfg.algo) {
            causes.push_back("algorithm");
            fixes.push_back(std::string("the engine hashes with ") + HashAlgoName(algo) +
                            ", configured " + HashAlgoName(cfg.algo));
          }
          if (seeds[si] != cfg.seed) {
            causes.push_back("seed");
            if (seeds[si] == kDefaultNoneHashSeed) {
              fixes.push_back(
                  "the engine uses vLLM's fixed default seed 'vllm-none-hash' (PYTHONHASHSEED "
                  "unset on a vLLM with the fixed default), configured '" +
                  cfg.seed + "': leave the seed out (or set it to vllm-none-hash)");
            } else {
              fixes.push_back("the engine's PYTHONHASHSEED is '" + seeds[si] + "', configured '" +
                              cfg.seed + "'");
            }
          }
          if (size != cfg.block_size) {
            causes.push_back("block_size");
            fixes.push_back("the engine hashes every " + std::to_string(size) +
                            " tokens, configured " + std::to_string(cfg.block_size));
          }
          if (mode != kExtraAsEvent) {
            causes.push_back("extra_keys");
            fixes.push_back(mode == kExtraNone
                                ? "the engine hashes without the event's extra keys"
                                : "the engine hashes with (lora_name,) as extra keys");
          }
          if (causes.empty()) continue;  // cannot happen: the configured try failed
          report_.cause.clear();
          report_.detail.clear();
          for (size_t c = 0; c < causes.size(); ++c) {
            report_.cause += (c ? "+" : "") + causes[c];
            report_.detail += (c ? "; " : "") + fixes[c];
          }
          return;
        }
      }
    }
  }
  const std::string tried =
      "no alternative reproduces the engine's hash (algorithms sha256, sha256_cbor, xxhash and "
      "xxhash_cbor, seeds vllm-none-hash, 0-" +
      std::to_string(options_.max_seed_tried) +
      " and common ones, the event's block size, extra keys with and without LoRA)";
  const std::string chained =
      chained_matched_events_ > 0
          ? "; " + std::to_string(chained_matched_events_) +
                " events chained from a parent hash matched, so only NONE_HASH differs"
          : std::string();
  // The configured seed is vLLM's fixed default (no seed given) and the first block of a prefix
  // cannot be reproduced with any seed: the engine's NONE_HASH is random, which is what a vLLM
  // from before the fixed default (#51875) does when PYTHONHASHSEED is unset.
  if (!stored.parent_block_hash && IsCryptographic(cfg.algo) && cfg.seed == kDefaultNoneHashSeed) {
    report_.cause = "seed";
    report_.detail =
        "seed unset on a vLLM older than the fixed default: before vLLM #51875 an engine without "
        "PYTHONHASHSEED hashed with a random NONE_HASH, and kvo assumes the fixed "
        "'vllm-none-hash' when no seed is given (" +
        tried + chained +
        ") — set PYTHONHASHSEED on the engine and give the same hash seed here, or upgrade vLLM";
    return;
  }
  report_.cause = "unknown";
  report_.detail =
      tried + chained +
      ": an engine without PYTHONHASHSEED hashes with a random NONE_HASH (every algorithm on a "
      "vLLM older than the fixed default, the xxhash ones always) — set PYTHONHASHSEED on the "
      "engine and give the same hash seed here";
}

ParityReport HashParityDoctor::report() const {
  MutexLock lock(&mu_);
  return report_;
}

}  // namespace kvo
