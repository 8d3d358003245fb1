// SecondaryTier: vLLM's SecondaryTierManager (vllm-compat.md B.11) — a tier below the CPU primary
// tier (file system, object store, peer). It never touches GPU memory: the OffloadManager hands it
// store jobs (CPU slots -> tier, "cascade") and load jobs (tier -> CPU slots, "promotion") and
// polls for their completion. Data movement itself goes through a TierTransport (the transfer
// engine); IndexedTier (manager/indexed_tier.h) is the tier over an in-memory index plus a
// transport.
//
// Thread-compatible: the OffloadManager calls a tier from its caller's thread only. A transport
// may complete jobs on its own threads; it hands results back through TakeFinished.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "manager/offload_key.h"
#include "manager/offload_manager.h"
#include "transfer/job.h"

namespace kvo {

// vLLM's TransferJob (kvo's name TierJob, so it does not read as a transfer-engine job). `slots`
// are CPU primary slots, co-indexed with `keys`.
struct TierJob {
  JobId job_id = 0;
  std::vector<OffloadKey> keys;
  std::vector<int32_t> slots;
  bool is_promotion = false;  // true: tier -> CPU (load); false: CPU -> tier (store)
  std::string req_id;
};

// vLLM's JobResult. With success false, `successful_keys` lists the keys that did make it
// (partial success); nullopt means none did. Per key rather than per block index, as vLLM's.
struct JobResult {
  JobId job_id = 0;
  bool success = false;
  std::optional<std::vector<OffloadKey>> successful_keys;
  // Keys the tier found corrupt or missing while loading and has dropped (kvo: a torn file is a
  // miss, is deleted, and its removal is published).
  std::vector<OffloadKey> lost_keys;
};

class SecondaryTier {
 public:
  virtual ~SecondaryTier() = default;

  virtual const std::string& name() const = 0;  // e.g. "fs": stats label
  virtual Medium medium() const { return Medium::kStorage; }
  virtual const std::optional<std::string>& locality() const = 0;  // "LOCAL" | "REMOTE" | unset

  // kMiss, kHit or kRetry (the answer is not known yet; vLLM's FS tier answers RETRY on the first
  // lookup of a key and the verdict on a later step).
  virtual LookupResult Lookup(const OffloadKey& key, const RequestContext& ctx) = 0;
  // The job contract (transfer/job.h): submit, take finished, drain. Start a job; its result
  // comes back from TakeFinished. An error means the job was not started (the manager releases
  // what it pinned and counts a failure).
  virtual Status SubmitStore(const TierJob& job) = 0;
  virtual Status SubmitLoad(const TierJob& job) = 0;
  // A promotion of `key` from this tier was promised (its HIT made the manager answer
  // HIT_PENDING); the load job is submitted only at the step's end. Until ReleasePromotion the
  // tier must keep the key (never evict it for a store in between, which would turn the promised
  // hit into a failed load). SubmitLoad takes its own hold on the keys it loads.
  virtual void HoldForPromotion(const OffloadKey& /*key*/) {}
  // Drops one HoldForPromotion per key: after SubmitLoad (accepted or refused), or when the
  // promotion is dropped unsubmitted (ResetCache).
  virtual void ReleasePromotion(std::span<const OffloadKey> /*keys*/) {}
  // Appends the results of the jobs finished since the last call.
  virtual void TakeFinished(std::vector<JobResult>* out) = 0;
  // Blocks until every submitted job has finished (their results stay queued).
  virtual void Drain() = 0;

  // Appends the tier's own events (STORAGE stored on finished stores, removals on eviction).
  virtual void TakeEvents(std::vector<OffloadingEvent>* /*out*/) {}
  // Whether the tier's events are published (vLLM: the tier's enable_kv_events). Recovery only
  // reconciles tiers that publish.
  virtual bool publishes_events() const { return true; }

  // The keys the tier holds now: what its events announced (live), or after a restart what its
  // medium reports (used by OffloadManager::Recover to reconcile the journal).
  virtual void ListHeld(std::vector<OffloadKey>* out) const = 0;

  virtual void Touch(std::span<const OffloadKey> /*keys*/, const RequestContext& /*ctx*/) {}
  virtual OffloadPolicy OnNewRequest(const RequestContext& /*ctx*/) {
    return OffloadPolicy::kBlockLevel;
  }
  virtual void OnRequestFinished(const RequestContext& /*ctx*/) {}
  virtual void OnScheduleEnd() {}
  virtual bool HasPendingWork() const { return false; }
};

}  // namespace kvo
