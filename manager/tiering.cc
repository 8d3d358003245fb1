// OffloadManager's tiering (vllm-compat.md B.11, TieringOffloadingManager): lookup falling through
// to the secondary tiers, promotion of secondary hits into the CPU tier, cascade of completed CPU
// stores to every secondary tier, job completion, and the finalisation of requests.
#include <algorithm>
#include <utility>

#include "common/logging.h"
#include "manager/metrics.h"
#include "manager/offload_manager_internal.h"

namespace kvo {

bool OffloadManager::Impl::TierAllowed(const SecondaryTier& tier, const RequestContext& ctx) const {
  if (!ctx.load_tier_filter.has_value()) return true;
  for (const TierMatcher& m : *ctx.load_tier_filter) {
    if (m.medium.has_value() && *m.medium != tier.medium()) continue;
    if (m.locality.has_value() &&
        (!tier.locality().has_value() || *m.locality != *tier.locality())) {
      continue;
    }
    return true;
  }
  return false;
}

template <class Fn>
LookupResult OffloadManager::Impl::TimedTierLookup(size_t t, const OffloadKey& key, Fn lookup) {
  static const std::vector<double> kSyncBounds = LookupSyncDelayBuckets();
  static const std::vector<double> kAsyncBounds = LookupAsyncDelayBuckets();
  TierCounters& c = tier_counters[t];
  const int64_t start = clock->MonotonicNanos();
  const LookupResult r = lookup();
  const int64_t end = clock->MonotonicNanos();
  c.stats.lookup_sync_delay.Observe(kSyncBounds, static_cast<double>(end - start) / 1e9);
  ++c.stats.block_queries;
  if (r == LookupResult::kHit || (t == 0 && r == LookupResult::kHitPending)) ++c.stats.block_hits;
  if (r == LookupResult::kRetry) {
    if (c.retry_since.size() >= kMaxRetryTracked) c.retry_since.clear();  // bounded memory
    c.retry_since.try_emplace(key, end);
  } else if (!c.retry_since.empty()) {
    auto it = c.retry_since.find(key);
    if (it != c.retry_since.end()) {
      c.stats.lookup_async_delay.Observe(kAsyncBounds, static_cast<double>(end - it->second) / 1e9);
      c.retry_since.erase(it);
    }
  }
  return r;
}

LookupResult OffloadManager::Impl::TieredLookup(const OffloadKey& key, const RequestContext& ctx) {
  MaybeProcessFinishedJobs();
  const LookupResult primary = TimedTierLookup(0, key, [&] { return cpu.Lookup(key); });
  if (primary == LookupResult::kHit || primary == LookupResult::kHitPending) return primary;

  bool retry = false;
  for (size_t i = 0; i < tiers.size(); ++i) {
    SecondaryTier& tier = *tiers[i];
    if (!TierAllowed(tier, ctx)) continue;
    const LookupResult r = TimedTierLookup(i + 1, key, [&] { return tier.Lookup(key, ctx); });
    if (r == LookupResult::kRetry) retry = true;
    if (r != LookupResult::kHit) continue;
    // Promotion: a CPU slot in the writing state now, so later lookups of the key (this step,
    // any request) see HIT_PENDING instead of promoting it twice; the load job is sent at the
    // end of the step, one per (tier, request).
    PrepareStoreOutput out;
    if (!cpu.PrepareStore({&key, 1}, &out) || out.keys_to_store.empty()) {
      ++promotion_allocation_failures;
      return LookupResult::kMiss;
    }
    std::vector<PendingPromotion>& pending = pending_promotions[i];
    auto it = std::find_if(pending.begin(), pending.end(),
                           [&](const PendingPromotion& p) { return p.req_id == ctx.req_id; });
    if (it == pending.end()) {
      pending.push_back(PendingPromotion{ctx.req_id, {}, {}});
      it = std::prev(pending.end());
    }
    it->keys.push_back(key);
    it->slots.push_back(out.slots.front());
    // The tier keeps the block until the load is submitted: a store in this step must not evict
    // it (the promised hit would fail at the step's end).
    tier.HoldForPromotion(key);
    return LookupResult::kHitPending;
  }
  return retry ? LookupResult::kRetry : LookupResult::kMiss;
}

void OffloadManager::Impl::MaybeProcessFinishedJobs() {
  if (processed_jobs_this_step) return;
  processed_jobs_this_step = true;
  ProcessFinishedJobs();
}

void OffloadManager::Impl::ProcessFinishedJobs() {
  for (size_t i = 0; i < tiers.size(); ++i) {
    finished.clear();
    tiers[i]->TakeFinished(&finished);
    for (JobResult& r : finished) {
      auto it = jobs.find(r.job_id);
      if (it == jobs.end() || it->second.tier != i) {
        ++unknown_job_results;
        KVO_LOG_WARN("offload manager: tier {} ({}) finished unknown job {}", i, tiers[i]->name(),
                     r.job_id);
        continue;
      }
      Job job = std::move(it->second);
      jobs.erase(it);
      if (!job.is_promotion) {
        // Cascade done: release the pins taken when it was submitted.
        if (!r.success) {
          ++cascade_job_failures;
          ++tier_counters[i + 1].stats.cascade_job_failures;
        }
        Status s = cpu.CompleteLoad(job.keys);
        if (!s.ok()) KVO_LOG_ERROR("offload manager: cascade unpin: {}", s.ToString());
        continue;
      }
      // Promotion landed: the keys that made it become ready CPU blocks (one stored event);
      // the others give their slots back.
      if (!r.success) {
        ++promotion_job_failures;
        ++tier_counters[i + 1].stats.promotion_job_failures;
      }
      std::vector<OffloadKey> ok_keys;
      std::vector<OffloadKey> failed_keys;
      if (r.success) {
        ok_keys = std::move(job.keys);
      } else {
        for (const OffloadKey& key : job.keys) {
          const bool ok = r.successful_keys.has_value() &&
                          std::find(r.successful_keys->begin(), r.successful_keys->end(), key) !=
                              r.successful_keys->end();
          (ok ? ok_keys : failed_keys).push_back(key);
        }
      }
      changed.clear();
      Status s = cpu.CompleteStore(ok_keys, true, &changed);
      if (s.ok()) s = cpu.CompleteStore(failed_keys, false, &changed);
      if (!s.ok()) KVO_LOG_ERROR("offload manager: promotion completion: {}", s.ToString());
      if (translator.self_describing()) {
        for (const OffloadKey& key : failed_keys) translator.ForgetUnannounced(key);
      }
    }
  }
}

void OffloadManager::Impl::FlushPromotions() {
  for (size_t i = 0; i < tiers.size(); ++i) {
    for (PendingPromotion& p : pending_promotions[i]) {
      TierJob job;
      job.job_id = next_job_id++;
      job.keys = p.keys;
      job.slots = std::move(p.slots);
      job.is_promotion = true;
      job.req_id = p.req_id;
      jobs.emplace(job.job_id, Job{i, true, std::move(p.keys), std::move(p.req_id)});
      Status s = tiers[i]->SubmitLoad(job);
      tiers[i]->ReleasePromotion(job.keys);  // the load holds its own pins now (or failed)
      if (!s.ok()) {
        KVO_LOG_WARN("offload manager: tier {} ({}) refused a promotion: {}", i, tiers[i]->name(),
                     s.ToString());
        ++promotion_job_failures;
        ++tier_counters[i + 1].stats.promotion_job_failures;
        Job failed = std::move(jobs[job.job_id]);
        jobs.erase(job.job_id);
        changed.clear();
        cpu.CompleteStore(failed.keys, false, &changed).IgnoreError();
      }
    }
    pending_promotions[i].clear();
  }
}

void OffloadManager::Impl::Cascade(std::span<const OffloadKey> keys, const std::string& req_id,
                                   uint64_t tier_mask) {
  for (size_t i = 0; i < tiers.size(); ++i) {
    if ((tier_mask & (uint64_t{1} << i)) == 0) continue;
    TierJob job;
    job.job_id = next_job_id++;
    job.keys.assign(keys.begin(), keys.end());
    // prepare_read: one pin per tier while it reads the CPU rows.
    Status s = cpu.PrepareLoad(keys, &job.slots);
    if (!s.ok()) {
      KVO_LOG_ERROR("offload manager: cascade pin: {}", s.ToString());
      ++cascade_job_failures;
      ++tier_counters[i + 1].stats.cascade_job_failures;
      continue;
    }
    job.req_id = req_id;
    jobs.emplace(job.job_id, Job{i, false, job.keys, req_id});
    s = tiers[i]->SubmitStore(job);
    if (!s.ok()) {
      KVO_LOG_WARN("offload manager: tier {} ({}) refused a cascade: {}", i, tiers[i]->name(),
                   s.ToString());
      ++cascade_job_failures;
      ++tier_counters[i + 1].stats.cascade_job_failures;
      jobs.erase(job.job_id);
      cpu.CompleteLoad(keys).IgnoreError();
    }
  }
}

void OffloadManager::Impl::MaybeFinishRequest(const std::string& req_id) {
  auto it = requests.find(req_id);
  if (it == requests.end() || it->second.pending_primary_stores != 0 || !it->second.finished) {
    return;
  }
  // Secondary tiers hear of the end only after the request's last CPU store has completed (its
  // cascade is submitted by then).
  const RequestContext ctx = std::move(it->second.finished_ctx);
  requests.erase(it);
  for (const auto& tier : tiers) tier->OnRequestFinished(ctx);
}

void OffloadManager::Impl::ResetTiering() {
  for (const auto& tier : tiers) tier->Drain();
  ProcessFinishedJobs();  // consume the completions: no tier I/O touches CPU slots any more
  for (size_t i = 0; i < pending_promotions.size(); ++i) {  // never submitted
    for (const PendingPromotion& p : pending_promotions[i]) tiers[i]->ReleasePromotion(p.keys);
    pending_promotions[i].clear();
  }
  if (!jobs.empty()) {
    KVO_LOG_WARN("offload manager: {} tier jobs unfinished after draining; forgotten", jobs.size());
    jobs.clear();
  }
  for (auto it = requests.begin(); it != requests.end();) {
    if (it->second.finished) {
      const RequestContext ctx = std::move(it->second.finished_ctx);
      it = requests.erase(it);
      for (const auto& tier : tiers) tier->OnRequestFinished(ctx);
    } else {
      it->second.pending_primary_stores = 0;  // abandoned by the reset; the request goes on
      ++it;
    }
  }
  processed_jobs_this_step = false;
  for (TierCounters& c : tier_counters) c.retry_since.clear();
}

}  // namespace kvo
