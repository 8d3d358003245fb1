// OffloadManager: construction, the CPU-facing API, events and stats. Tiering lives in tiering.cc,
// restart recovery in recovery.cc.
#include "manager/offload_manager.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "common/json.h"
#include "common/logging.h"
#include "events/codec.h"
#include "manager/metrics.h"
#include "manager/offload_manager_internal.h"
#include "manager/testing/offload_manager_peer.h"

namespace kvo {

const char* LookupResultName(LookupResult r) {
  switch (r) {
    case LookupResult::kMiss:
      return "MISS";
    case LookupResult::kHit:
      return "HIT";
    case LookupResult::kHitPending:
      return "HIT_PENDING";
    case LookupResult::kRetry:
      return "RETRY";
  }
  return "?";
}

void BucketCounts::Observe(const std::vector<double>& upper_bounds, double v) {
  if (counts.size() != upper_bounds.size() + 1) counts.assign(upper_bounds.size() + 1, 0);
  // First bucket whose upper bound is >= v (Prometheus' le is inclusive).
  const size_t i = static_cast<size_t>(
      std::lower_bound(upper_bounds.begin(), upper_bounds.end(), v) - upper_bounds.begin());
  ++counts[i];
  sum += v;
}

namespace {

// Positions in EventCounts::kMedia / kKinds (the metric label names).
size_t MediumIndex(Medium medium) {
  switch (medium) {
    case Medium::kCpu:
      return 0;
    case Medium::kStorage:
      return 1;
    case Medium::kGpu:
      return 2;
    case Medium::kOther:
      break;
  }
  return EventCounts::kNumMedia - 1;
}

size_t KindIndex(const OffloadingEvent& e) {
  if (!e.removed()) return 0;
  switch (e.reason()) {
    case RemovalReason::kEvicted:
      return 1;
    case RemovalReason::kFailed:
      return 2;
    case RemovalReason::kCleared:
      return 3;
    case RemovalReason::kRestart:
      return 4;
    case RemovalReason::kNone:
    case RemovalReason::kDemoted:
      break;
  }
  return EventCounts::kNumKinds - 1;
}

void CountEvents(std::span<const OffloadingEvent> events, EventCounts* counts) {
  for (const OffloadingEvent& e : events) {
    counts->blocks[MediumIndex(e.medium)][KindIndex(e)] += e.keys.size();
  }
}

}  // namespace

OffloadingEvent OffloadingEvent::Stored(std::vector<OffloadKey> keys, Medium medium,
                                        std::optional<std::string> locality) {
  return OffloadingEvent{std::move(keys), medium, std::move(locality), 0, KeysStored{}};
}

OffloadingEvent OffloadingEvent::Removed(std::vector<OffloadKey> keys, Medium medium,
                                         RemovalReason reason,
                                         std::optional<std::string> locality) {
  return OffloadingEvent{std::move(keys), medium, std::move(locality), 0, KeysRemoved{reason}};
}

OffloadingEvent OffloadingEvent::Cleared(std::vector<OffloadKey> keys, Medium medium) {
  return OffloadingEvent{std::move(keys), medium, std::nullopt, 0, KeysCleared{}};
}

RemovalReason OffloadingEvent::reason() const {
  if (const auto* r = std::get_if<KeysRemoved>(&change)) return r->reason;
  return std::holds_alternative<KeysCleared>(change) ? RemovalReason::kCleared
                                                     : RemovalReason::kNone;
}

Result<std::unique_ptr<OffloadManager>> OffloadManager::Create(ManagerOptions options) {
  if (options.store_threshold >= 2 && !options.secondary_tiers.empty()) {
    return Status::InvalidArgument("store_threshold=" + std::to_string(options.store_threshold) +
                                   " is not supported together with secondary tiers (vLLM: "
                                   "store_threshold is not supported for TieringOffloadingSpec)");
  }
  if (options.secondary_tiers.size() > 62) {
    return Status::InvalidArgument("at most 62 secondary tiers are supported, got " +
                                   std::to_string(options.secondary_tiers.size()));
  }
  const size_t max_blocks =
      options.policy_factory ? kMaxLruBlocks : MaxPolicyBlocks(options.eviction_policy);
  if (options.num_blocks > max_blocks) {
    return Status::InvalidArgument(
        "num_blocks=" + std::to_string(options.num_blocks) + ": a CPU tier holds at most " +
        std::to_string(max_blocks) + " blocks with the '" +
        (options.policy_factory ? std::string("custom") : CutForMessage(options.eviction_policy)) +
        "' policy (its table's limit); use larger blocks");
  }
  for (size_t i = 0; i < options.secondary_tiers.size(); ++i) {
    if (options.secondary_tiers[i] == nullptr) {
      return Status::InvalidArgument("secondary_tiers[" + std::to_string(i) + "] is null");
    }
  }
  std::unique_ptr<CachePolicy> policy;
  if (options.policy_factory) {
    policy = options.policy_factory(options.num_blocks);
    if (policy == nullptr) {
      return Status::InvalidArgument("policy_factory returned no policy");
    }
  } else {
    KVO_ASSIGN_OR_RETURN(
        policy, CachePolicyRegistry::Global().Create(options.eviction_policy, options.num_blocks));
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(policy));
  if (impl->options.announce_held_blocks) {
    // What the media hold from an earlier run, announced once (Recover with an empty journal).
    for (size_t i = 0; i < impl->tiers.size(); ++i) {
      const SecondaryTier& t = *impl->tiers[i];
      if (!t.publishes_events()) continue;
      std::vector<OffloadKey> held;
      t.ListHeld(&held);
      if (held.empty()) continue;
      OffloadingEvent e = OffloadingEvent::Stored(std::move(held), t.medium(), t.locality());
      e.tier = static_cast<int32_t>(i + 1);
      impl->start_events.push_back(std::move(e));
    }
  }
  return std::unique_ptr<OffloadManager>(new OffloadManager(std::move(impl)));
}

OffloadManager::OffloadManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OffloadManager::~OffloadManager() = default;

LookupResult OffloadManager::Lookup(const OffloadKey& key, const RequestContext& ctx) {
  if (impl_->tiers.empty()) return impl_->cpu.Lookup(key);
  return impl_->TieredLookup(key, ctx);
}

OffloadManager::PrefixLookupResult OffloadManager::MaximalPrefixLookup(
    std::span<const OffloadKey> keys, const RequestContext& ctx) {
  PrefixLookupResult out;
  if (impl_->tiers.empty()) {
    out.hits = impl_->cpu.PrefixLookup(keys, &out.deferred);
    return out;
  }
  for (const OffloadKey& key : keys) {
    const LookupResult r = impl_->TieredLookup(key, ctx);
    if (r == LookupResult::kMiss) break;
    if (r != LookupResult::kHit) out.deferred = true;
    ++out.hits;
  }
  return out;
}

Result<std::vector<int32_t>> OffloadManager::PrepareLoad(std::span<const OffloadKey> keys,
                                                         const RequestContext& /*ctx*/) {
  Impl& m = *impl_;
  if (!m.tiers.empty()) m.MaybeProcessFinishedJobs();  // completed promotions become loadable
  std::vector<int32_t> slots;
  slots.reserve(keys.size());
  KVO_RETURN_IF_ERROR(m.cpu.PrepareLoad(keys, &slots));
  return slots;
}

void OffloadManager::Touch(std::span<const OffloadKey> keys, const RequestContext& ctx) {
  impl_->cpu.Touch(keys);
  for (const auto& tier : impl_->tiers) tier->Touch(keys, ctx);
}

Status OffloadManager::CompleteLoad(std::span<const OffloadKey> keys,
                                    const RequestContext& /*ctx*/) {
  return impl_->cpu.CompleteLoad(keys);
}

Result<std::optional<PrepareStoreOutput>> OffloadManager::PrepareStore(
    std::span<const OffloadKey> keys, const RequestContext& ctx) {
  PrepareStoreOutput out;
  KVO_ASSIGN_OR_RETURN(const bool stored, PrepareStore(keys, ctx, &out));
  if (!stored) return std::optional<PrepareStoreOutput>();
  return std::optional<PrepareStoreOutput>(std::move(out));
}

Result<bool> OffloadManager::PrepareStore(std::span<const OffloadKey> keys,
                                          const RequestContext& ctx, PrepareStoreOutput* out_ptr) {
  Impl& m = *impl_;
  PrepareStoreOutput& out = *out_ptr;
  const bool tiered = !m.tiers.empty();
  if (tiered) m.MaybeProcessFinishedJobs();  // release cascade pins before choosing victims
  if (!m.cpu.PrepareStore(keys, &out)) return false;
  if (tiered) {
    if (!out.keys_to_store.empty()) ++m.requests[ctx.req_id].pending_primary_stores;
    // REQUEST_LEVEL tiers also get the chunks the CPU tier already holds, at once.
    auto it = m.requests.find(ctx.req_id);
    if (it != m.requests.end() && it->second.request_level_tiers != 0) {
      m.scratch_keys.clear();
      for (const OffloadKey& key : keys) {
        const BlockStatus* b = m.cpu.Find(key);
        if (b == nullptr || !b->ready()) continue;
        if (std::find(out.keys_to_store.begin(), out.keys_to_store.end(), key) !=
            out.keys_to_store.end()) {
          continue;
        }
        if (std::find(m.scratch_keys.begin(), m.scratch_keys.end(), key) != m.scratch_keys.end()) {
          continue;
        }
        m.scratch_keys.push_back(key);
      }
      if (!m.scratch_keys.empty()) {
        const std::vector<OffloadKey> existing = m.scratch_keys;
        m.Cascade(existing, ctx.req_id, it->second.request_level_tiers);
      }
    }
  }
  return true;
}

Status OffloadManager::CompleteStore(std::span<const OffloadKey> keys, const RequestContext& ctx,
                                     bool success) {
  Impl& m = *impl_;
  m.changed.clear();
  KVO_RETURN_IF_ERROR(m.cpu.CompleteStore(keys, success, &m.changed));
  if (!success && m.translator.self_describing()) {
    for (const OffloadKey& key : m.changed) m.translator.ForgetUnannounced(key);
  }
  if (m.tiers.empty()) return Status::Ok();
  if (success && !m.changed.empty()) {
    const std::vector<OffloadKey> stored = m.changed;
    m.Cascade(stored, ctx.req_id, (uint64_t{1} << m.tiers.size()) - 1);
  }
  auto it = m.requests.find(ctx.req_id);
  if (it != m.requests.end() && it->second.pending_primary_stores > 0) {
    --it->second.pending_primary_stores;
    m.MaybeFinishRequest(ctx.req_id);
  }
  return Status::Ok();
}

void OffloadManager::RecordChunkMetadata(const OffloadKey& key, BlockStored chunk, bool overwrite) {
  impl_->translator.Record(key, std::move(chunk), overwrite);
}

OffloadPolicy OffloadManager::OnNewRequest(const RequestContext& ctx) {
  Impl& m = *impl_;
  if (m.tiers.empty()) return OffloadPolicy::kBlockLevel;
  uint64_t request_level = 0;
  for (size_t i = 0; i < m.tiers.size(); ++i) {
    if (m.tiers[i]->OnNewRequest(ctx) == OffloadPolicy::kRequestLevel) {
      request_level |= uint64_t{1} << i;
    }
  }
  m.requests[ctx.req_id].request_level_tiers = request_level;
  return request_level != 0 ? OffloadPolicy::kRequestLevel : OffloadPolicy::kBlockLevel;
}

void OffloadManager::OnRequestFinished(const RequestContext& ctx) {
  Impl& m = *impl_;
  if (m.tiers.empty()) return;
  Impl::RequestState& state = m.requests[ctx.req_id];
  state.finished = true;
  state.finished_ctx = ctx;
  m.MaybeFinishRequest(ctx.req_id);
}

void OffloadManager::OnScheduleEnd() {
  Impl& m = *impl_;
  if (m.tiers.empty()) return;
  m.MaybeProcessFinishedJobs();
  m.processed_jobs_this_step = false;
  m.FlushPromotions();
  for (const auto& tier : m.tiers) tier->OnScheduleEnd();
}

bool OffloadManager::HasPendingWork() const {
  const Impl& m = *impl_;
  if (!m.jobs.empty()) return true;
  for (const auto& pending : m.pending_promotions) {
    if (!pending.empty()) return true;
  }
  for (const auto& tier : m.tiers) {
    if (tier->HasPendingWork()) return true;
  }
  return false;
}

void OffloadManager::ResetCache() {
  Impl& m = *impl_;
  if (!m.tiers.empty()) m.ResetTiering();  // drains tier I/O touching CPU slots first
  // The CPU blocks announced (ready) go with the reset: one removal, as consumers read it
  // (vLLM's AllBlocksCleared means "the GPU prefix cache", never the CPU tier).
  std::vector<OffloadKey> ready;
  if (m.options.enable_events) m.cpu.ListReady(&ready);
  m.cpu.Reset();
  if (!m.options.enable_events) return;  // the tiers keep their own queues
  // The tiers' queued events happened before the reset: keep them before its removal.
  for (size_t i = 0; i < m.tiers.size(); ++i) {
    m.taken.clear();
    m.tiers[i]->TakeEvents(&m.taken);
    for (OffloadingEvent& e : m.taken) {
      e.tier = static_cast<int32_t>(i + 1);
      m.cpu.AddEvent(std::move(e));
    }
  }
  m.taken.clear();
  if (ready.empty()) return;
  m.cpu.AddEvent(OffloadingEvent::Cleared(std::move(ready), Medium::kCpu));
  // The secondary tiers keep their data and their announcements.
}

std::vector<OffloadingEvent> OffloadManager::TakeEvents() {
  std::vector<OffloadingEvent> out;
  TakeEvents(&out);
  return out;
}

void OffloadManager::TakeEvents(std::vector<OffloadingEvent>* out) {
  Impl& m = *impl_;
  m.cpu.RecycleEvents(out);
  if (!m.start_events.empty()) {  // before anything that happened since the start
    for (OffloadingEvent& e : m.start_events) out->push_back(std::move(e));
    m.start_events.clear();
  }
  m.cpu.TakeEvents(out);
  for (size_t i = 0; i < m.tiers.size(); ++i) {
    const size_t first = out->size();
    m.tiers[i]->TakeEvents(out);
    for (size_t j = first; j < out->size(); ++j) (*out)[j].tier = static_cast<int32_t>(i + 1);
  }
  CountEvents(*out, &m.events_taken);
}

Status OffloadManager::TakeEventsAndJournal(std::vector<OffloadingEvent>* out) {
  Impl& m = *impl_;
  TakeEvents(out);
  if (m.options.publisher == nullptr && m.options.journal == nullptr) return Status::Ok();
  std::vector<KvEvent> events;
  for (const OffloadingEvent& e : *out) m.translator.Translate(e, &events);
  return m.SendBatch(std::move(events));
}

void OffloadManager::TakeKvEvents(std::vector<KvEvent>* out) {
  Impl& m = *impl_;
  TakeEvents(&m.taken);
  for (const OffloadingEvent& e : m.taken) m.translator.Translate(e, out);
  m.cpu.RecycleEvents(&m.taken);
}

Status OffloadManager::PublishEvents() {
  std::vector<KvEvent> events;
  TakeKvEvents(&events);
  return impl_->SendBatch(std::move(events));
}

Status OffloadManager::Impl::SendBatch(std::vector<KvEvent> events) {
  if (events.empty()) return Status::Ok();
  EventBatch batch;
  batch.events = std::move(events);
  batch.ts = clock->NowSeconds();
  batch.data_parallel_rank = options.data_parallel_rank;
  const size_t n = batch.events.size();
  Status status;
  if (options.publisher != nullptr) {
    status = options.publisher->Publish(std::move(batch));
  } else if (options.journal != nullptr) {
    Journal& j = *options.journal;
    const uint64_t seq = j.seq_floor();  // past every record and every seq used unjournaled
    status = j.Append(seq, EncodeBatch(batch));
    if (status.ok()) status = j.Flush();
  } else {
    return Status::Ok();  // no sink: the events are dropped
  }
  if (!status.ok()) {
    ++event_errors;
    KVO_LOG_ERROR("offload manager: publishing {} events failed: {}", n, status.ToString());
    return status;
  }
  events_published += n;
  ++event_batches_published;
  return Status::Ok();
}

ManagerStats OffloadManager::GetStats() const {
  const Impl& m = *impl_;
  ManagerStats s;
  m.cpu.FillStats(&s);
  s.promotion_allocation_failures = m.promotion_allocation_failures;
  s.promotion_job_failures = m.promotion_job_failures;
  s.cascade_job_failures = m.cascade_job_failures;
  for (const auto& [id, job] : m.jobs) {
    if (job.is_promotion) {
      ++s.active_promotion_jobs;
    } else {
      ++s.active_cascade_jobs;
    }
  }
  s.events_published = m.events_published;
  s.event_batches_published = m.event_batches_published;
  s.event_errors = m.event_errors;
  s.events_taken = m.events_taken;
  if (m.options.journal != nullptr) s.journal_bytes = m.options.journal->total_bytes();
  if (!m.tiers.empty()) {
    s.tiers.resize(m.tiers.size() + 1);
    for (size_t t = 0; t < s.tiers.size(); ++t) {
      TierStats& ts = s.tiers[t];
      ts = m.tier_counters[t].stats;
      ts.label = t == 0 ? PrimaryTierLabel() : SecondaryTierLabel(t - 1, m.tiers[t - 1]->name());
    }
    std::vector<size_t> writing(s.tiers.size(), 0), reading(s.tiers.size(), 0);
    for (const auto& [id, job] : m.jobs) {
      TierStats& ts = s.tiers[job.tier + 1];
      if (job.is_promotion) {
        ++ts.active_promotion_jobs;
        writing[job.tier + 1] += job.keys.size();
      } else {
        ++ts.active_cascade_jobs;
        reading[job.tier + 1] += job.keys.size();
      }
    }
    for (size_t i = 0; i < m.pending_promotions.size(); ++i) {
      for (const Impl::PendingPromotion& p : m.pending_promotions[i])
        writing[i + 1] += p.keys.size();
    }
    if (s.num_blocks > 0) {
      for (size_t t = 1; t < s.tiers.size(); ++t) {
        s.tiers[t].primary_write_usage = double(writing[t]) / double(s.num_blocks);
        s.tiers[t].primary_read_usage = double(reading[t]) / double(s.num_blocks);
      }
    }
  }
  return s;
}

namespace {

bool KeyLess(const OffloadKey& a, const OffloadKey& b) {
  return std::make_tuple(a.group(), a.Wire(), a.digest()) <
         std::make_tuple(b.group(), b.Wire(), b.digest());
}

}  // namespace

Result<ManagerSnapshot> OffloadManager::Snapshot() const {
  const Impl& m = *impl_;
  if (!m.cpu.track_slots()) {
    return Status::FailedPrecondition("Snapshot needs ManagerOptions.track_blocks");
  }
  ManagerSnapshot snap;
  std::vector<uint64_t> hashes;
  m.cpu.ListReady(&snap.cpu);
  for (const OffloadKey& key : snap.cpu) {
    hashes.clear();
    m.translator.AnnouncedHashes(key, 0, &hashes);
    for (uint64_t h : hashes) ++snap.cpu_hashes[{key.group(), h}];
  }
  std::vector<OffloadKey> held;
  for (size_t i = 0; i < m.tiers.size(); ++i) {
    if (!m.tiers[i]->publishes_events()) continue;
    held.clear();
    m.tiers[i]->ListHeld(&held);
    for (const OffloadKey& key : held) {
      hashes.clear();
      m.translator.AnnouncedHashes(key, static_cast<int32_t>(i + 1), &hashes);
      for (uint64_t h : hashes) ++snap.storage_hashes[{key.group(), h}];
      snap.storage.push_back(key);
    }
  }
  std::sort(snap.cpu.begin(), snap.cpu.end(), KeyLess);
  std::sort(snap.storage.begin(), snap.storage.end(), KeyLess);
  return snap;
}

size_t OffloadManager::num_secondary_tiers() const { return impl_->tiers.size(); }
SecondaryTier& OffloadManager::secondary_tier(size_t i) { return *impl_->tiers[i]; }

// The test hooks (manager/testing/offload_manager_peer.h).
Status OffloadManagerPeer::CheckInvariants(const OffloadManager& m) {
  return m.impl_->cpu.CheckInvariants();
}
CachePolicy& OffloadManagerPeer::CpuPolicy(OffloadManager& m) { return m.impl_->cpu.policy(); }

}  // namespace kvo
