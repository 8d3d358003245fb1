// OffloadManager: vLLM's scheduler-side offloading manager (vllm-compat.md B.5, B.6, B.11) in C++.
// A CPU primary tier of `num_blocks` slots (CPUOffloadingManager's exact semantics: ref counts,
// slot order, "cannot store" without side effects, eviction events before store events,
// store_threshold) plus ordered secondary tiers (TieringOffloadingManager: lookup falls through,
// promotion into CPU, cascade of every completed CPU store). Every state change becomes an
// OffloadingEvent; PublishEvents() turns them into vLLM KV events (placeholder or self-describing,
// B.9), journals and publishes them, and Recover() rebuilds a manager from that journal.
//
// Thread-compatible: like vLLM's scheduler, the caller serialises every call (one thread, or an
// external mutex). Nothing here locks; secondary tiers and publishers own their own threads.
// Out-of-contract calls (loading a missing or not-ready key, completing an unknown key, a double
// complete_load) return an error Status and change nothing. See manager/DESIGN.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "events/event.h"
#include "events/journal.h"
#include "events/medium.h"
#include "events/zmq_publisher.h"
#include "manager/cache_policy.h"
#include "manager/offload_key.h"

namespace kvo {

// vLLM's LookupResult. kRetry: unknown yet (a secondary tier is still looking); ask again later.
enum class LookupResult { kMiss, kHit, kHitPending, kRetry };
const char* LookupResultName(LookupResult r);  // "MISS" | "HIT" | "HIT_PENDING" | "RETRY"

// vLLM's OffloadPolicy: BLOCK_LEVEL stores only newly computed chunks; REQUEST_LEVEL (asked for by
// a secondary tier in on_new_request) also cascades chunks the CPU tier already holds.
enum class OffloadPolicy { kBlockLevel, kRequestLevel };

// vLLM's TierMatcher: an unset field matches anything. medium kCpu | kStorage, locality
// "LOCAL" | "REMOTE" (normalised upper case; see ParseLoadTierFilter in manager/request_params.h).
struct TierMatcher {
  std::optional<Medium> medium;
  std::optional<std::string> locality;
};

// vLLM's ReqContext.
struct RequestContext {
  std::string req_id;
  // kv_transfer_params["max_offload_tokens"], already validated (ParseMaxOffloadTokens): nullopt
  // is no cap, 0 disables offloading. Read by the caller's chunking (NumStorableChunks).
  std::optional<int64_t> max_offload_tokens;
  // Which *secondary* tiers a lookup may consult: nullopt = all (TierFilter.ALL); otherwise a tier
  // is consulted when any matcher matches it (an empty list consults none). The CPU tier is always
  // consulted.
  std::optional<std::vector<TierMatcher>> load_tier_filter;
};

// vLLM's PrepareStoreOutput; `slots` (the CPULoadStoreSpec) is co-indexed with keys_to_store.
struct PrepareStoreOutput {
  std::vector<OffloadKey> keys_to_store;
  std::vector<int32_t> slots;
  std::vector<OffloadKey> evicted_keys;
};

// What an OffloadingEvent says happened to its keys: stored; removed, with kvo's `reason`
// extension of BlockRemoved (vLLM decoders ignore it: kEvicted | kFailed | kRestart | kDemoted, or
// kNone when none is given); or cleared by ResetCache (announced as a removal, reason "cleared").
struct KeysStored {
  friend bool operator==(const KeysStored&, const KeysStored&) = default;
};
struct KeysRemoved {
  RemovalReason reason = RemovalReason::kNone;
  friend bool operator==(const KeysRemoved&, const KeysRemoved&) = default;
};
struct KeysCleared {
  friend bool operator==(const KeysCleared&, const KeysCleared&) = default;
};
using OffloadChange = std::variant<KeysStored, KeysRemoved, KeysCleared>;

// vLLM's OffloadingEvent, with the change as a type and the tier that emitted it.
struct OffloadingEvent {
  std::vector<OffloadKey> keys;
  Medium medium = Medium::kCpu;  // kCpu | kStorage
  std::optional<std::string> locality;
  int32_t tier = 0;  // 0: the CPU primary tier; i + 1: secondary tier i
  OffloadChange change;

  static OffloadingEvent Stored(std::vector<OffloadKey> keys, Medium medium,
                                std::optional<std::string> locality = std::nullopt);
  static OffloadingEvent Removed(std::vector<OffloadKey> keys, Medium medium, RemovalReason reason,
                                 std::optional<std::string> locality = std::nullopt);
  static OffloadingEvent Cleared(std::vector<OffloadKey> keys, Medium medium);

  // vLLM's `removed` flag: a removal or a clear.
  bool removed() const { return !std::holds_alternative<KeysStored>(change); }
  // The reason a removal is announced with: kNone for a store, kCleared for a clear.
  RemovalReason reason() const;

  friend bool operator==(const OffloadingEvent&, const OffloadingEvent&) = default;
};

// Cumulative counters (never reset by reading; a metrics exporter takes deltas) and gauges.
// Pre-bucketed observations of one histogram: counts[i] observations in bucket i (non-cumulative,
// one per upper bound, then +Inf) and their sum.
struct BucketCounts {
  std::vector<uint64_t> counts;
  double sum = 0;
  void Observe(const std::vector<double>& upper_bounds, double v);
};

// One tier's share of vLLM's tiering metric family (B.12, label `tier`).
struct TierStats {
  std::string label;           // "0:primary" (the CPU tier), "<i+1>:<name>" (secondary tier i)
  uint64_t block_queries = 0;  // lookups this tier answered (tiered manager only)
  uint64_t block_hits = 0;     // of which HIT (the CPU tier: HIT or HIT_PENDING)
  uint64_t promotion_job_failures = 0;
  uint64_t cascade_job_failures = 0;
  size_t active_promotion_jobs = 0;
  size_t active_cascade_jobs = 0;
  // CPU blocks being written by promotions from this tier / read by cascades to it, over the CPU
  // tier's size (vLLM's primary_write_usage_perc / primary_read_usage_perc).
  double primary_write_usage = 0;
  double primary_read_usage = 0;
  // Time of each lookup call into this tier (ManagerOptions.clock), LookupSyncDelayBuckets(); and
  // from a key's first RETRY from this tier until this tier answers it HIT or MISS,
  // LookupAsyncDelayBuckets() (manager/metrics.h).
  BucketCounts lookup_sync_delay;
  BucketCounts lookup_async_delay;
};

// KV events taken from the manager, per medium and kind, in blocks (a reset's removal counts its
// blocks under medium "CPU" and kind "cleared").
struct EventCounts {
  // Index = medium (kMedia) x kind (kKinds).
  static constexpr const char* kMedia[] = {"CPU", "STORAGE", "GPU", "other"};
  static constexpr const char* kKinds[] = {
      "stored",  "evicted", "failed",
      "cleared", "restart", "removed"};  // "removed": any other removal reason
  static constexpr size_t kNumMedia = 4;
  static constexpr size_t kNumKinds = 6;
  uint64_t blocks[kNumMedia][kNumKinds] = {};
};

struct ManagerStats {
  // CPU tier gauges, as vLLM's get_stats (0 for a zero-capacity tier).
  double usage = 0;        // (allocated - free - evictable) / num_blocks: the pinned fraction
  double write_usage = 0;  // pending writes / num_blocks
  double read_usage = 0;   // max(usage - write_usage, 0)
  size_t num_blocks = 0;
  size_t num_allocated = 0;  // slots ever handed out and not yet returned by a reset
  size_t num_free = 0;       // never-used slots + the free list
  size_t num_evictable = 0;  // ref_cnt == 0
  size_t num_pending_writes = 0;
  size_t num_stored = 0;  // blocks in the CPU tier, any state

  // vLLM's kv_offload_cpu_allocation_size histogram (buckets 1, 4, 16, ..., 262144, +Inf):
  // one sample per prepare_store with new keys, failures included.
  static constexpr size_t kAllocationBuckets = 11;
  static constexpr int64_t kAllocationBucketBounds[kAllocationBuckets - 1] = {
      1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144};
  uint64_t allocation_count = 0;
  uint64_t allocation_sum = 0;
  uint64_t allocation_buckets[kAllocationBuckets] = {};  // non-cumulative per-bucket counts

  uint64_t stores_skipped = 0;  // store_threshold >= 2 only
  uint64_t lookups = 0;         // CPU tier lookups
  uint64_t hits = 0;            // CPU HIT or HIT_PENDING
  uint64_t misses = 0;
  uint64_t evictions = 0;       // CPU blocks evicted
  uint64_t store_failures = 0;  // prepare_store answered "cannot store"

  // Tiering (B.12's tiering family).
  uint64_t promotion_allocation_failures = 0;
  uint64_t promotion_job_failures = 0;
  uint64_t cascade_job_failures = 0;
  size_t active_promotion_jobs = 0;
  size_t active_cascade_jobs = 0;

  // Events.
  uint64_t events_published = 0;  // KV events handed to the journal / publisher
  uint64_t event_batches_published = 0;
  uint64_t event_errors = 0;
  EventCounts events_taken;    // OffloadingEvents taken (TakeEvents / TakeKvEvents / Publish)
  uint64_t journal_bytes = 0;  // ManagerOptions.journal's total_bytes() (0 without one)

  // With secondary tiers: [0] the CPU tier, [i + 1] secondary tier i. Empty otherwise.
  std::vector<TierStats> tiers;
};

// The blocks a manager holds and has announced as stored, per medium (tests, recovery, audits).
struct ManagerSnapshot {
  std::vector<OffloadKey> cpu;      // ready CPU blocks (ref_cnt >= 0), sorted by (group, wire)
  std::vector<OffloadKey> storage;  // each secondary tier's held keys (once per tier), sorted
  // The per-block hashes those blocks were announced with (placeholder: the key's wire hash;
  // self-describing: the chunk's block hashes), as (group, hash) -> count, per medium: what a
  // reference-counting consumer of the published events holds.
  std::map<std::pair<int64_t, uint64_t>, int64_t> cpu_hashes;
  std::map<std::pair<int64_t, uint64_t>, int64_t> storage_hashes;
};

class SecondaryTier;  // manager/secondary_tier.h

struct ManagerOptions {
  size_t num_blocks = 0;
  std::string eviction_policy = "lru";  // a CachePolicyRegistry name
  // Optional: builds the CPU policy instead of the registry (tests, out-of-tree policies).
  CachePolicyFactory policy_factory;
  int64_t store_threshold = 0;  // < 2: no filter (vLLM); rejected together with secondary tiers
  size_t max_tracker_size = 64000;
  bool enable_events = true;  // CPU tier + reset events (vLLM's enable_events); tiers: their own
  bool self_describing_events = false;  // B.9 self-describing form (needs RecordChunkMetadata)
  std::vector<std::shared_ptr<SecondaryTier>> secondary_tiers;  // in lookup order
  // A first start (no journal history): Create queues, for each secondary tier that publishes, one
  // STORAGE stored event of every block it already holds (SecondaryTier::ListHeld; placeholder
  // form), taken first by the next TakeEvents / PublishEvents — the reconcile of Recover against
  // an empty journal. Without it a medium's blocks from an earlier run are never announced, and
  // their later eviction is a removal consumers never saw stored. BuildOffloadManager sets it
  // when events are on; Recover ignores it (it reconciles against the journal).
  bool announce_held_blocks = false;
  // Keep the key of every CPU slot (40 bytes per slot) so Snapshot() and the invariant check
  // (manager/testing/offload_manager_peer.h) can enumerate the CPU tier. Off by default: the
  // policy alone is the per-block state.
  bool track_blocks = false;

  // Where PublishEvents sends the KV events. A publisher with a journal (PublisherOptions.journal
  // or KvEventsConfig.journal_dir) journals each batch before sending it; with only `journal`
  // set, PublishEvents appends the encoded batches itself. Not owned; may both be null.
  EventPublisher* publisher = nullptr;
  Journal* journal = nullptr;  // ignored when `publisher` is set
  Clock* clock = nullptr;      // batch timestamps; Default: SystemClock()
  std::optional<int64_t> data_parallel_rank;
};

class OffloadManager {
 public:
  // InvalidArgument for an unknown policy, store_threshold >= 2 together with secondary tiers, a
  // null tier, or more CPU blocks than its policy holds (MaxPolicyBlocks, manager/cache_policy.h).
  // With announce_held_blocks, queues
  // the tiers' held blocks as stored events.
  static Result<std::unique_ptr<OffloadManager>> Create(ManagerOptions options);

  // Restart: rebuilds what `journal` says was announced, then publishes (through options' sink)
  // one batch that makes consumers exact again: every CPU block removed (reason "restart", the CPU
  // tier starts empty) and each secondary tier reconciled with what it reports holding
  // (SecondaryTier::ListHeld): announced-but-gone blocks removed, held-but-unannounced stored.
  // `journal` may be the same journal the sink appends to.
  static Result<std::unique_ptr<OffloadManager>> Recover(ManagerOptions options, Journal& journal);

  ~OffloadManager();
  OffloadManager(const OffloadManager&) = delete;
  OffloadManager& operator=(const OffloadManager&) = delete;

  // vLLM's lookup (one key): counts the key for store_threshold, then CPU HIT / HIT_PENDING, else
  // the secondary tiers in order (a HIT starts a promotion: HIT_PENDING, or MISS when the CPU tier
  // cannot make room), else RETRY if a tier said so, else MISS.
  LookupResult Lookup(const OffloadKey& key, const RequestContext& ctx);
  // The scheduler's maximal prefix lookup over a request's chunk keys (vLLM's
  // `_maximal_prefix_lookup` for full-attention groups): Lookup of each key in order until the
  // first MISS (which is looked up too, so store_threshold counts exactly as the per-key loop);
  // HIT and HIT_PENDING count, RETRY keeps scanning. `hits`: keys before that MISS; `deferred`:
  // one of them was HIT_PENDING or RETRY (vLLM answers "ask again next step"). Same effects as
  // calling Lookup per key; without secondary tiers the keys ahead are prefetched.
  struct PrefixLookupResult {
    size_t hits = 0;
    bool deferred = false;
  };
  PrefixLookupResult MaximalPrefixLookup(std::span<const OffloadKey> keys,
                                         const RequestContext& ctx);
  // Pins every key (ref_cnt++) and returns their slots in key order. FailedPrecondition naming the
  // key when one is missing or not ready; nothing changes then.
  Result<std::vector<int32_t>> PrepareLoad(std::span<const OffloadKey> keys,
                                           const RequestContext& ctx);
  // Recency update in the CPU policy (first key ends most recent) and every secondary tier.
  void Touch(std::span<const OffloadKey> keys, const RequestContext& ctx);
  // Unpins. FailedPrecondition when a key is unknown or not pinned (nothing changes).
  Status CompleteLoad(std::span<const OffloadKey> keys, const RequestContext& ctx);
  // nullopt: cannot store (no side effects). Empty keys_to_store when nothing is new. New keys get
  // slots (fresh ascending, then the LIFO free list) and ref_cnt -1; all input keys are protected
  // from eviction; the evictions are announced before any store.
  Result<std::optional<PrepareStoreOutput>> PrepareStore(std::span<const OffloadKey> keys,
                                                         const RequestContext& ctx);
  // The same into a caller-kept output (overwritten; its vectors' capacity is reused, so a
  // scheduler loop allocates nothing once warm): true when stored, false for "cannot store".
  Result<bool> PrepareStore(std::span<const OffloadKey> keys, const RequestContext& ctx,
                            PrepareStoreOutput* out);
  // Success: keys not yet ready become ready (one stored event) and are cascaded to every
  // secondary tier. Failure: not-ready keys are dropped, no event. As in vLLM, keys that are
  // already ready or not in the CPU tier at all (evicted, reset, never prepared) are ignored and
  // the rest of the call is applied.
  Status CompleteStore(std::span<const OffloadKey> keys, const RequestContext& ctx,
                       bool success = true);

  // Self-describing events: the chunk payload of `key` (vLLM's _OffloadEventMetadata, B.9), as the
  // BlockStored it is announced as: block_hashes (the chunk's per-block hashes at the group block
  // size), parent_block_hash (None: chunk 0), token_ids (the whole chunk's), block_size, LoRA,
  // kv_cache_spec_*; medium, group_idx (the key's group) and locality are set per announcement.
  // Used by the events of every tier while the key is held somewhere; dropped when the last tier
  // removes it (or its store fails). With `overwrite` false an existing snapshot is kept (vLLM's
  // record_lookup).
  void RecordChunkMetadata(const OffloadKey& key, BlockStored chunk, bool overwrite = true);

  OffloadPolicy OnNewRequest(const RequestContext& ctx);
  void OnRequestFinished(const RequestContext& ctx);
  // Once per scheduler step: finished tier jobs, then the step's promotions (one job per tier and
  // request), then each tier's hook.
  void OnScheduleEnd();
  bool HasPendingWork() const;
  // Drains the secondary tiers' jobs, then clears the CPU tier (secondary data persists). Announced
  // as one CPU removal (reason "cleared") of every ready CPU block: never as AllBlocksCleared,
  // which vLLM's consumers read as "the GPU prefix cache is gone" (schemas/kv_events.md,
  // Semantics). The secondary tiers' announcements stand.
  void ResetCache();

  // The OffloadingEvents since the last take: CPU tier first, then each secondary tier's.
  std::vector<OffloadingEvent> TakeEvents();
  // The same into *out, which is cleared first; the key vectors of the events already in *out go
  // back to the manager for reuse (a loop that keeps *out allocates nothing for events once warm).
  void TakeEvents(std::vector<OffloadingEvent>* out);
  // TakeEvents(out), and the same events in their KV form (B.9) sent as one batch to the journal /
  // publisher (when options set one), for a caller that hands the OffloadingEvents on itself
  // (vLLM's connector publishes what take_events returns) and keeps kvo's durable journal too.
  // *out is filled even when sending fails; the error is counted in stats and returned.
  Status TakeEventsAndJournal(std::vector<OffloadingEvent>* out);
  // Takes the events and appends their vLLM KV form (B.9) to *out.
  void TakeKvEvents(std::vector<KvEvent>* out);
  // Takes the events and sends them as one EventBatch to the journal / publisher (nothing when
  // there are none). Errors are counted in stats and returned.
  Status PublishEvents();

  ManagerStats GetStats() const;
  // FailedPrecondition unless options.track_blocks.
  Result<ManagerSnapshot> Snapshot() const;

  size_t num_secondary_tiers() const;
  SecondaryTier& secondary_tier(size_t i);

  struct Impl;

 private:
  friend class OffloadManagerPeer;  // manager/testing/offload_manager_peer.h

  explicit OffloadManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvo
