// OffloadManager's state, shared by offload_manager.cc (the CPU-facing API, events, stats),
// tiering.cc (secondary tiers: promotion, cascade, jobs, request finalisation) and recovery.cc.
// Internal to manager/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "manager/cpu_tier.h"
#include "manager/event_translator.h"
#include "manager/offload_manager.h"
#include "manager/secondary_tier.h"

namespace kvo {

struct OffloadManager::Impl {
  Impl(ManagerOptions opts, std::unique_ptr<CachePolicy> policy)
      : options(std::move(opts)),
        cpu(options.num_blocks, std::move(policy), options.store_threshold,
            options.max_tracker_size, options.enable_events, options.track_blocks),
        tiers(std::move(options.secondary_tiers)),
        translator(options.self_describing_events),
        clock(options.clock != nullptr ? options.clock : SystemClock()),
        pending_promotions(tiers.size()),
        tier_counters(tiers.empty() ? 0 : tiers.size() + 1) {}

  // Sends one batch to the journal / publisher (offload_manager.cc).
  Status SendBatch(std::vector<KvEvent> events);

  // ---- tiering.cc ----
  LookupResult TieredLookup(const OffloadKey& key, const RequestContext& ctx);
  bool TierAllowed(const SecondaryTier& tier, const RequestContext& ctx) const;
  void MaybeProcessFinishedJobs();
  void ProcessFinishedJobs();
  void FlushPromotions();
  // Pins `keys` (ready CPU blocks) once per target tier and submits a store job to each tier
  // whose bit is set in `tier_mask`.
  void Cascade(std::span<const OffloadKey> keys, const std::string& req_id, uint64_t tier_mask);
  void MaybeFinishRequest(const std::string& req_id);
  void ResetTiering();

  ManagerOptions options;  // secondary_tiers moved out into `tiers`
  CpuTier cpu;
  std::vector<std::shared_ptr<SecondaryTier>> tiers;
  EventTranslator translator;
  Clock* clock;

  struct Job {
    size_t tier = 0;
    bool is_promotion = false;
    std::vector<OffloadKey> keys;
    std::string req_id;
  };
  uint64_t next_job_id = 0;
  std::unordered_map<uint64_t, Job> jobs;

  struct PendingPromotion {
    std::string req_id;
    std::vector<OffloadKey> keys;
    std::vector<int32_t> slots;
  };
  std::vector<std::vector<PendingPromotion>> pending_promotions;  // per tier, request order
  // ManagerOptions.announce_held_blocks: the tiers' blocks found at start, taken before any other
  // event.
  std::vector<OffloadingEvent> start_events;
  bool processed_jobs_this_step = false;

  struct RequestState {
    int64_t pending_primary_stores = 0;
    bool finished = false;
    RequestContext finished_ctx;
    uint64_t request_level_tiers = 0;  // bit i: tier i asked for REQUEST_LEVEL
  };
  std::unordered_map<std::string, RequestState> requests;

  // Scratch, reused.
  std::vector<OffloadKey> changed;
  std::vector<OffloadKey> scratch_keys;
  std::vector<int32_t> scratch_slots;
  std::vector<JobResult> finished;
  std::vector<OffloadingEvent> taken;

  // Per tier ([0] the CPU tier, [i + 1] secondary tier i), tiered managers only: the tiering
  // metric family's counters (ManagerStats::tiers; GetStats adds the label, the active jobs and
  // the usage gauges).
  struct TierCounters {
    TierStats stats;  // block_queries, block_hits, *_job_failures, lookup_*_delay
    // Keys this tier answered RETRY, since when (MonotonicNanos); bounded by kMaxRetryTracked.
    std::unordered_map<OffloadKey, int64_t, OffloadKeyHash> retry_since;
  };
  static constexpr size_t kMaxRetryTracked = size_t{1} << 20;
  std::vector<TierCounters> tier_counters;
  // Times one lookup call into tier `t` (an index into tier_counters) and counts it.
  template <class Fn>
  LookupResult TimedTierLookup(size_t t, const OffloadKey& key, Fn lookup);
  EventCounts events_taken;

  // Counters.
  uint64_t promotion_allocation_failures = 0;
  uint64_t promotion_job_failures = 0;
  uint64_t cascade_job_failures = 0;
  uint64_t unknown_job_results = 0;
  uint64_t events_published = 0;
  uint64_t event_batches_published = 0;
  uint64_t event_errors = 0;
};

}  // namespace kvo
