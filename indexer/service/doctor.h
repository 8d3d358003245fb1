// Hash parity doctor: proves that the indexer (and so a router asking with token ids) computes
// the same block hashes as the engine. For each self-describing BlockStored (one that carries its
// token ids) it recomputes vLLM's chained hashes (events/block_hash.h) with the source's
// configured algorithm, PYTHONHASHSEED and hash block size, and compares them with the hashes on
// the wire (low 64 bits, or the raw digest when the engine sends bytes).
//
// A mismatch is loud: logged as an error (rate-limited), counted, and diagnosed by trying the
// alternatives — the other three algorithms (sha256, sha256_cbor, xxhash, xxhash_cbor), other
// seeds (vLLM's fixed default "vllm-none-hash" among them), the block size the event implies, the
// extra keys with and without LoRA — and naming the likely cause: "algorithm", "seed",
// "block_size", "extra_keys". When nothing reproduces the first block of a prefix and the source
// is configured with vLLM's default seed (no seed given, a sha256 variant), the cause is "seed":
// "seed unset on a vLLM older than the fixed default" (before #51875 an engine without
// PYTHONHASHSEED hashed with a random NONE_HASH). Otherwise "unknown".
//
// Thread-safe: Check() may be called from every stream thread of a source; report() from any.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/metrics.h"
#include "common/mutex.h"
#include "events/block_hash.h"
#include "events/event.h"
#include "indexer/service/sources_config.h"

namespace kvo {

enum class ParityState {
  kUnconfigured,  // the source has no hash settings: nothing is checked
  kPending,       // configured, but no self-describing block verified yet
  kOk,            // every verified block matched
  kMismatch,      // at least one block's hash differs from the recomputed one
};
// "unconfigured" | "pending" | "ok" | "mismatch"
const char* ParityStateName(ParityState state);

struct ParityReport {
  ParityState state = ParityState::kUnconfigured;
  uint64_t checked_blocks = 0;  // blocks whose hash was recomputed
  uint64_t matched_blocks = 0;
  uint64_t mismatched_blocks = 0;
  uint64_t unverifiable_blocks = 0;  // no token ids, unknown parent, odd hash form
  uint64_t skipped_events = 0;       // sampled out after the warm-up
  // For a mismatch: "algorithm" | "seed" | "algorithm+seed" | "block_size" | "extra_keys" |
  // "unknown"; and a sentence an operator can act on.
  std::string cause;
  std::string detail;
  std::string example;  // the first mismatching block: expected vs got
};

struct DoctorOptions {
  // Check every event until this many blocks were verified, then one event in `sample_every`.
  uint64_t warmup_blocks = 4096;
  uint64_t sample_every = 16;
  // Seeds tried when diagnosing ("0".."max_seed_tried" plus a few common ones).
  int max_seed_tried = 128;
  // Digests remembered to verify chained events whose parent arrives as a 64-bit wire hash.
  size_t max_remembered_digests = 1 << 16;
};

class HashParityDoctor {
 public:
  // `config` unset: the doctor reports kUnconfigured and checks nothing.
  HashParityDoctor(std::string source, std::optional<HashParityConfig> config,
                   DoctorOptions options = {});
  ~HashParityDoctor();
  HashParityDoctor(const HashParityDoctor&) = delete;
  HashParityDoctor& operator=(const HashParityDoctor&) = delete;

  // Optional metrics (not owned; any may be null): checked and mismatched blocks, and a gauge
  // that is 1 while the state is a mismatch.
  void SetMetrics(Counter* checked, Counter* mismatched, Gauge* mismatch_state);

  // Verifies the self-describing BlockStored events of `batch`.
  void Check(const EventBatch& batch);
  // Verifies one event (exposed for tests and `kvo index doctor`).
  void CheckStored(const BlockStored& stored);

  ParityReport report() const;
  bool configured() const { return config_.has_value(); }

 private:
  struct Verdict;
  // Recomputes the event's hashes with (algo, none_hash, granularity, extra-key mode); returns
  // how many of its hashes match, or nullopt when the event cannot be verified that way.
  std::optional<size_t> CountMatches(const BlockStored& stored, HashAlgo algo,
                                     const std::string& none_hash, int64_t granularity,
                                     int extra_mode, std::vector<std::string>* digests)
      EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Diagnose(const BlockStored& stored) EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remember(const BlockStored& stored, const std::vector<std::string>& digests)
      EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string source_;
  const std::optional<HashParityConfig> config_;
  const DoctorOptions options_;

  mutable Mutex mu_;
  ParityReport report_ GUARDED_BY(mu_);
  uint64_t events_seen_ GUARDED_BY(mu_) = 0;
  std::string none_hash_ GUARDED_BY(mu_);                              // configured NONE_HASH
  std::unordered_map<uint64_t, std::string> digests_ GUARDED_BY(mu_);  // wire hash -> digest
  std::unique_ptr<BlockHasher> hashers_[std::size(kAllHashAlgos)] GUARDED_BY(mu_);  // by algo
  // Events with a parent hash whose every block matched: the chain agrees past NONE_HASH.
  uint64_t chained_matched_events_ GUARDED_BY(mu_) = 0;
  Counter* checked_metric_ = nullptr;
  Counter* mismatched_metric_ = nullptr;
  Gauge* state_metric_ = nullptr;
};

}  // namespace kvo
