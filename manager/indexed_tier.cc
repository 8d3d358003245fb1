#include "manager/indexed_tier.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "common/json.h"
#include "common/logging.h"

namespace kvo {

// ---- BoundedTierIndex ----

BoundedTierIndex::BoundedTierIndex(uint64_t max_bytes, uint64_t block_bytes,
                                   std::unique_ptr<CachePolicy> policy, uint64_t max_blocks)
    : block_bytes_(block_bytes == 0 ? 1 : block_bytes),
      capacity_(std::min(max_bytes == 0 ? UINT64_MAX : max_bytes / block_bytes_, max_blocks)),
      policy_(std::move(policy)) {}

void BoundedTierIndex::Add(const OffloadKey& key, int32_t ref_cnt) {
  policy_->Insert(key, BlockStatus{ref_cnt, static_cast<int32_t>(keys_.size())});
  keys_.push_back(key);
}

bool BoundedTierIndex::Reserve(const OffloadKey& key, std::span<const OffloadKey> protect,
                               std::vector<OffloadKey>* evicted) {
  if (keys_.size() >= capacity_) {
    const size_t need = keys_.size() - static_cast<size_t>(capacity_) + 1;
    if (need > policy_->num_evictable()) return false;
    auto victims = policy_->Evict(need, protect);
    if (!victims.has_value()) return false;
    // Swap-remove from the dense array, highest position first: the last key is then never a
    // victim still to be processed, so its status can be updated in the policy.
    std::sort(victims->begin(), victims->end(),
              [](const auto& a, const auto& b) { return a.second.slot > b.second.slot; });
    for (const auto& [victim, status] : *victims) {
      const size_t pos = static_cast<size_t>(status.slot);
      if (pos + 1 != keys_.size()) {
        keys_[pos] = keys_.back();
        policy_->Get(keys_[pos])->slot = static_cast<int32_t>(pos);
      }
      keys_.pop_back();
      evicted->push_back(victim);
    }
  }
  Add(key, -1);
  return true;
}

void BoundedTierIndex::Commit(const OffloadKey& key) {
  BlockStatus* b = policy_->Get(key);
  if (b == nullptr || b->ready()) return;
  b->ref_cnt = 0;
  policy_->MarkEvictable(key);
}

void BoundedTierIndex::Erase(const OffloadKey& key) {
  const BlockStatus* b = policy_->Get(key);
  if (b == nullptr) return;
  const size_t pos = static_cast<size_t>(b->slot);
  policy_->Remove(key);
  if (pos + 1 != keys_.size()) {
    keys_[pos] = keys_.back();
    policy_->Get(keys_[pos])->slot = static_cast<int32_t>(pos);
  }
  keys_.pop_back();
}

bool BoundedTierIndex::AddReady(const OffloadKey& key) {
  if (policy_->Get(key) != nullptr) return true;
  if (keys_.size() >= capacity_) return false;
  Add(key, 0);
  return true;
}

bool BoundedTierIndex::Pin(const OffloadKey& key) {
  BlockStatus* b = policy_->Get(key);
  if (b == nullptr || !b->ready()) return false;
  if (b->ref_cnt == 0) policy_->MarkNonEvictable(key);
  ++b->ref_cnt;
  return true;
}

void BoundedTierIndex::Unpin(const OffloadKey& key) {
  BlockStatus* b = policy_->Get(key);
  if (b == nullptr || b->ref_cnt <= 0) return;
  if (--b->ref_cnt == 0) policy_->MarkEvictable(key);
}

void BoundedTierIndex::ListReady(std::vector<OffloadKey>* out) const {
  for (const OffloadKey& key : keys_) {
    const BlockStatus* b = policy_->Get(key);
    if (b != nullptr && b->ready()) out->push_back(key);
  }
}

Status BoundedTierIndex::CheckInvariants() const {
  if (policy_->size() != keys_.size()) {
    return Status::Internal("tier index: policy holds " + std::to_string(policy_->size()) +
                            " blocks, the key array " + std::to_string(keys_.size()));
  }
  if (keys_.size() > capacity_) return Status::Internal("tier index: over capacity");
  for (size_t i = 0; i < keys_.size(); ++i) {
    const BlockStatus* b = policy_->Get(keys_[i]);
    if (b == nullptr || b->slot != static_cast<int32_t>(i)) {
      return Status::Internal("tier index: key at " + std::to_string(i) + " is misplaced");
    }
  }
  return policy_->CheckInvariants();
}

// ---- IndexedTier ----

IndexedTier::IndexedTier(IndexedTierOptions options, std::unique_ptr<CachePolicy> policy,
                         std::shared_ptr<TierTransport> transport, uint64_t max_blocks)
    : options_(std::move(options)),
      index_(options_.max_bytes, options_.block_bytes, std::move(policy), max_blocks),
      transport_(std::move(transport)) {}

Result<std::unique_ptr<IndexedTier>> IndexedTier::Create(IndexedTierOptions options,
                                                         std::shared_ptr<TierTransport> transport) {
  if (transport == nullptr)
    return Status::InvalidArgument("tier '" + options.name + "': no transport");
  if (options.block_bytes == 0) {
    return Status::InvalidArgument("tier '" + options.name + "': block_bytes must be > 0");
  }
  if (options.max_bytes != 0 && options.max_bytes < options.block_bytes) {
    return Status::InvalidArgument(
        "tier '" + options.name + "': max_bytes=" + std::to_string(options.max_bytes) +
        " is smaller than one block (" + std::to_string(options.block_bytes) + " bytes)");
  }
  const uint64_t blocks = options.max_bytes == 0 ? 0 : options.max_bytes / options.block_bytes;
  uint64_t capacity = options.max_bytes == 0 ? 1024 : blocks;
  // LRU's capacity is only a sizing hint and the table grows: a large bound must not size it up
  // front. Each policy holds at most MaxPolicyBlocks (manager/cache_policy.h; a custom one: the
  // LRU bound): a bound past it is refused, and an unbounded tier holds that many (its index
  // evicts past it, rather than the table aborting the process).
  constexpr uint64_t kMaxHint = uint64_t{1} << 20;
  const bool lru = !options.policy_factory && options.eviction_policy == "lru";
  const uint64_t max_blocks =
      options.policy_factory ? kMaxLruBlocks : MaxPolicyBlocks(options.eviction_policy);
  if (blocks > max_blocks) {
    return Status::InvalidArgument(
        "tier '" + options.name + "': max_bytes=" + std::to_string(options.max_bytes) + " gives " +
        std::to_string(blocks) + " blocks; at most " + std::to_string(max_blocks) + " with the '" +
        (options.policy_factory ? std::string("custom") : CutForMessage(options.eviction_policy)) +
        "' policy");
  }
  if (lru) capacity = std::min(capacity, kMaxHint);
  std::unique_ptr<CachePolicy> policy;
  if (options.policy_factory) {
    policy = options.policy_factory(static_cast<size_t>(capacity));
  } else {
    KVO_ASSIGN_OR_RETURN(policy, CachePolicyRegistry::Global().Create(
                                     options.eviction_policy, static_cast<size_t>(capacity)));
  }
  if (policy == nullptr) return Status::InvalidArgument("tier '" + options.name + "': no policy");
  std::unique_ptr<IndexedTier> tier(
      new IndexedTier(std::move(options), std::move(policy), std::move(transport), max_blocks));
  std::vector<OffloadKey> held;
  KVO_RETURN_IF_ERROR(tier->transport_->List(&held));
  std::vector<OffloadKey> over;
  for (const OffloadKey& key : held) {
    if (!tier->index_.AddReady(key)) over.push_back(key);
  }
  if (!over.empty()) {
    KVO_LOG_WARN("tier '{}': {} blocks on the medium exceed max_bytes; deleting them",
                 tier->options_.name, over.size());
    KVO_RETURN_IF_ERROR(tier->transport_->Delete(over));
  }
  return tier;
}

void IndexedTier::Emit(std::vector<OffloadKey> keys, bool removed, RemovalReason reason) {
  if (!options_.enable_kv_events || keys.empty()) return;
  events_.push_back(
      removed
          ? OffloadingEvent::Removed(std::move(keys), Medium::kStorage, reason, options_.locality)
          : OffloadingEvent::Stored(std::move(keys), Medium::kStorage, options_.locality));
}

LookupResult IndexedTier::Lookup(const OffloadKey& key, const RequestContext& ctx) {
  if (options_.async_lookup) {
    auto [it, inserted] = verdicts_.try_emplace(key);
    if (inserted) checking_.push_back(key);  // the check starts now
    Verdict& v = it->second;
    if (!ctx.req_id.empty() && v.requests.insert(ctx.req_id).second) {
      request_keys_[ctx.req_id].push_back(key);
    }
    if (!v.hit.has_value()) return LookupResult::kRetry;  // still checking this step
    const LookupResult r = *v.hit ? LookupResult::kHit : LookupResult::kMiss;
    // Asked by no request (no req_id): nothing would ever drop it, so it is given once.
    if (v.requests.empty()) verdicts_.erase(it);
    return r;
  }
  const BlockStatus* b = index_.Find(key);
  return b != nullptr && b->ready() ? LookupResult::kHit : LookupResult::kMiss;
}

void IndexedTier::RememberUndeleted(std::span<const OffloadKey> keys) {
  for (const OffloadKey& key : keys) {
    if (undeleted_.size() >= kMaxUndeleted) {  // bounded: a medium that never deletes
      ++undeleted_dropped_;
      continue;
    }
    undeleted_.insert(key);
  }
}

void IndexedTier::RetryDeletes() {
  // A few per step, one at a time (each key's own outcome; absent files count as deleted): a
  // medium that keeps failing costs the scheduler a bounded amount per step.
  size_t tried = 0;
  for (auto it = undeleted_.begin(); it != undeleted_.end() && tried < kDeleteRetriesPerStep;
       ++tried) {
    if (transport_->Delete({&*it, 1}).ok()) {
      it = undeleted_.erase(it);
    } else {
      ++it;
    }
  }
}

void IndexedTier::OnScheduleEnd() {
  RetryDeletes();
  if (!options_.async_lookup) return;
  // Verdicts no request holds, unclaimed for a step, are dropped (bounded without requests).
  for (const OffloadKey& key : unclaimed_) {
    auto it = verdicts_.find(key);
    if (it != verdicts_.end() && it->second.requests.empty() && it->second.hit.has_value()) {
      verdicts_.erase(it);
    }
  }
  unclaimed_.clear();
  for (const OffloadKey& key : checking_) {  // the step's checks finish
    auto it = verdicts_.find(key);
    if (it == verdicts_.end() || it->second.hit.has_value()) continue;
    const BlockStatus* b = index_.Find(key);
    it->second.hit = b != nullptr && b->ready();
    if (it->second.requests.empty()) unclaimed_.push_back(key);
  }
  checking_.clear();
}

void IndexedTier::OnRequestFinished(const RequestContext& ctx) {
  auto rk = request_keys_.find(ctx.req_id);
  if (rk == request_keys_.end()) return;
  for (const OffloadKey& key : rk->second) {
    auto it = verdicts_.find(key);
    if (it == verdicts_.end()) continue;
    it->second.requests.erase(ctx.req_id);
    if (it->second.requests.empty()) verdicts_.erase(it);
  }
  request_keys_.erase(rk);
}

void IndexedTier::MarkMiss(std::span<const OffloadKey> keys) {
  for (const OffloadKey& key : keys) {
    auto it = verdicts_.find(key);
    if (it != verdicts_.end()) it->second.hit = false;
  }
}

Status IndexedTier::SubmitStore(const TierJob& job) {
  Job state;
  state.is_store = true;
  TierJob sub;
  sub.job_id = job.job_id;
  sub.req_id = job.req_id;
  std::vector<OffloadKey> evicted;
  for (size_t i = 0; i < job.keys.size(); ++i) {
    const OffloadKey& key = job.keys[i];
    if (index_.Find(key) != nullptr) {  // held or being written: nothing to do
      state.ok_upfront.push_back(key);
      continue;
    }
    if (!index_.Reserve(key, job.keys, &evicted)) {
      ++stores_rejected_;
      state.all_ok_so_far = false;
      continue;
    }
    // Stored again before its file could be deleted: the file is this block's (the store skips
    // it or replaces it), so a retried delete must not remove it.
    if (!undeleted_.empty()) undeleted_.erase(key);
    sub.keys.push_back(key);
    sub.slots.push_back(job.slots[i]);
  }
  if (!evicted.empty()) {
    Status s = transport_->Delete(evicted);
    if (!s.ok()) {
      KVO_LOG_WARN("tier '{}': deleting evicted blocks: {} (retried every step)", name(),
                   s.ToString());
      RememberUndeleted(evicted);
    }
    Emit(std::move(evicted), /*removed=*/true, RemovalReason::kEvicted);
  }
  if (sub.keys.empty()) {
    JobResult r;
    r.job_id = job.job_id;
    r.success = state.all_ok_so_far;
    if (!r.success && !state.ok_upfront.empty()) r.successful_keys = state.ok_upfront;
    ready_results_.push_back(std::move(r));
    return Status::Ok();
  }
  state.submitted = sub.keys;
  Status s = transport_->SubmitStore(sub);
  if (!s.ok()) {
    for (const OffloadKey& key : sub.keys) index_.Erase(key);
    return s;
  }
  jobs_.emplace(job.job_id, std::move(state));
  return Status::Ok();
}

Status IndexedTier::SubmitLoad(const TierJob& job) {
  Job state;
  TierJob sub;
  sub.job_id = job.job_id;
  sub.is_promotion = true;
  sub.req_id = job.req_id;
  // As vLLM's batched load, a job stops at its first block that cannot load: a block gone
  // meanwhile ends the job there, and the blocks after it fail with it.
  for (size_t i = 0; i < job.keys.size(); ++i) {
    if (!index_.Pin(job.keys[i])) {
      state.all_ok_so_far = false;
      state.not_loaded.assign(job.keys.begin() + static_cast<ptrdiff_t>(i), job.keys.end());
      break;
    }
    sub.keys.push_back(job.keys[i]);
    sub.slots.push_back(job.slots[i]);
  }
  if (sub.keys.empty()) {  // an empty job succeeds (nothing to load), as in vLLM
    MarkMiss(state.not_loaded);
    ready_results_.push_back(JobResult{job.job_id, job.keys.empty(), std::nullopt, {}});
    return Status::Ok();
  }
  state.submitted = sub.keys;
  Status s = transport_->SubmitLoad(sub);
  if (!s.ok()) {
    for (const OffloadKey& key : sub.keys) index_.Unpin(key);
    return s;
  }
  jobs_.emplace(job.job_id, std::move(state));
  return Status::Ok();
}

void IndexedTier::HoldForPromotion(const OffloadKey& key) {
  // A key no longer ready (a stale async verdict) is not held: its load fails at SubmitLoad.
  if (index_.Pin(key)) ++promised_[key];
}

void IndexedTier::ReleasePromotion(std::span<const OffloadKey> keys) {
  for (const OffloadKey& key : keys) {
    auto it = promised_.find(key);
    if (it == promised_.end()) continue;
    index_.Unpin(key);
    if (--it->second == 0) promised_.erase(it);
  }
}

void IndexedTier::TakeFinished(std::vector<JobResult>* out) {
  for (JobResult& r : ready_results_) out->push_back(std::move(r));
  ready_results_.clear();
  scratch_.clear();
  transport_->TakeFinished(&scratch_);
  for (JobResult& r : scratch_) {
    auto it = jobs_.find(r.job_id);
    if (it == jobs_.end()) {
      KVO_LOG_WARN("tier '{}': transport finished unknown job {}", name(), r.job_id);
      continue;
    }
    Job job = std::move(it->second);
    jobs_.erase(it);
    auto succeeded = [&](const OffloadKey& key) {
      return r.success || (r.successful_keys.has_value() &&
                           std::find(r.successful_keys->begin(), r.successful_keys->end(), key) !=
                               r.successful_keys->end());
    };
    JobResult result;
    result.job_id = r.job_id;
    std::vector<OffloadKey> ok = std::move(job.ok_upfront);
    std::vector<OffloadKey> stored;
    std::vector<OffloadKey> lost;
    bool all_ok = job.all_ok_so_far;
    std::vector<OffloadKey> failed = std::move(job.not_loaded);
    bool stopped = false;  // loads: a batch stops at its first failed block (vLLM)
    for (const OffloadKey& key : job.submitted) {
      const bool good = succeeded(key) && !stopped;
      if (!job.is_store && !good) stopped = true;
      if (job.is_store) {
        if (good) {
          index_.Commit(key);
          stored.push_back(key);
        } else {
          index_.Erase(key);
        }
      } else {
        index_.Unpin(key);
        if (!good && std::find(r.lost_keys.begin(), r.lost_keys.end(), key) != r.lost_keys.end()) {
          index_.Erase(key);  // corrupt or missing on the medium: never served again
          lost.push_back(key);
        }
        if (!good) failed.push_back(key);
      }
      if (good) {
        ok.push_back(key);
      } else {
        all_ok = false;
      }
    }
    Emit(std::move(stored), /*removed=*/false, RemovalReason::kNone);
    Emit(std::move(lost), /*removed=*/true, RemovalReason::kFailed);
    MarkMiss(failed);  // this step's requests do not re-issue the failed promotion
    result.success = all_ok;
    if (!all_ok && !ok.empty()) result.successful_keys = std::move(ok);
    out->push_back(std::move(result));
  }
}

void IndexedTier::TakeEvents(std::vector<OffloadingEvent>* out) {
  for (OffloadingEvent& e : events_) out->push_back(std::move(e));
  events_.clear();
}

void IndexedTier::Touch(std::span<const OffloadKey> keys, const RequestContext& /*ctx*/) {
  index_.Touch(keys);
}

}  // namespace kvo
