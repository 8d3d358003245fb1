#include "manager/cpu_tier.h"

#include <algorithm>
#include <utility>

namespace kvo {

// ---- LookupTracker ----

void LookupTracker::Count(const OffloadKey& key) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    lru_.splice(lru_.end(), lru_, it->second);  // move_to_end
    ++it->second->second;
    return;
  }
  if (max_size_ == 0) return;
  if (index_.size() >= max_size_) {  // popitem(last=False)
    index_.erase(lru_.front().first);
    lru_.pop_front();
  }
  lru_.emplace_back(key, 1);
  index_.emplace(key, std::prev(lru_.end()));
}

int64_t LookupTracker::Get(const OffloadKey& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? 0 : it->second->second;
}

// ---- CpuTier ----

CpuTier::CpuTier(size_t num_blocks, std::unique_ptr<CachePolicy> policy, int64_t store_threshold,
                 size_t max_tracker_size, bool enable_events, bool track_slots)
    : num_blocks_(num_blocks),
      policy_(std::move(policy)),
      store_threshold_(store_threshold),
      enable_events_(enable_events),
      slot_keys_(track_slots ? num_blocks : 0) {
  if (store_threshold_ >= 2) tracker_ = std::make_unique<LookupTracker>(max_tracker_size);
  if (const auto* backed = dynamic_cast<const policy_internal::TableBackedPolicy*>(policy_.get())) {
    fast_table_ = &backed->table();
    fast_max_list_ = backed->max_cached_list();
  }
  // A reset announces the removal of every ready block, so with events on the blocks must be
  // enumerable: the built-in policies' tables are; other policies get the slot-key table.
  if (enable_events_ && fast_table_ == nullptr && slot_keys_.empty()) slot_keys_.resize(num_blocks);
}

Status CpuTier::PrepareLoad(std::span<const OffloadKey> keys, std::vector<int32_t>* slots) {
  blocks_.clear();
  for (const OffloadKey& key : keys) {  // validate first: nothing changes on error
    BlockStatus* block = policy_->Get(key);
    blocks_.push_back(block);
    if (block == nullptr) {
      return Status::FailedPrecondition("prepare_load: block " + key.Hex() + " (group " +
                                        std::to_string(key.group()) + ") is not in the CPU tier");
    }
    if (!block->ready()) {
      return Status::FailedPrecondition("prepare_load: block " + key.Hex() + " (group " +
                                        std::to_string(key.group()) +
                                        ") is not ready for reading (store in flight)");
    }
  }
  // Pointers stay valid: nothing is removed in between.
  for (size_t i = 0; i < keys.size(); ++i) {
    BlockStatus* block = blocks_[i];
    if (block->ref_cnt == 0) {
      policy_->MarkNonEvictable(keys[i]);
      --num_evictable_;
    }
    ++block->ref_cnt;
    slots->push_back(block->slot);
  }
  return Status::Ok();
}

Status CpuTier::CompleteLoad(std::span<const OffloadKey> keys) {
  size_t done = 0;
  Status error;
  for (; done < keys.size(); ++done) {
    const OffloadKey& key = keys[done];
    BlockStatus* block = policy_->Get(key);
    if (block == nullptr || block->ref_cnt <= 0) {
      error = Status::FailedPrecondition(
          "complete_load: block " + key.Hex() + " (group " + std::to_string(key.group()) + ") " +
          (block == nullptr
               ? "is not in the CPU tier"
               : "is not being loaded (ref_cnt " + std::to_string(block->ref_cnt) + ")"));
      break;
    }
    --block->ref_cnt;
    if (block->ref_cnt == 0) {
      ++num_evictable_;
      policy_->MarkEvictable(key);
    }
  }
  if (error.ok()) return error;
  // Undo in reverse (a key may repeat): the state is exactly as before the call.
  while (done > 0) {
    const OffloadKey& key = keys[--done];
    BlockStatus* block = policy_->Get(key);
    if (block->ref_cnt == 0) {
      policy_->MarkNonEvictable(key);
      --num_evictable_;
    }
    ++block->ref_cnt;
  }
  return error;
}

void CpuTier::RecordAllocation(size_t n) {
  ++allocation_count_;
  allocation_sum_ += n;
  size_t b = 0;
  while (b < ManagerStats::kAllocationBuckets - 1 &&
         static_cast<int64_t>(n) > ManagerStats::kAllocationBucketBounds[b]) {
    ++b;
  }
  ++allocation_buckets_[b];
}

int32_t CpuTier::AllocateSlot() {
  if (num_allocated_ < num_blocks_) return static_cast<int32_t>(num_allocated_++);
  const int32_t slot = free_list_.back();
  free_list_.pop_back();
  return slot;
}

size_t CpuTier::PrefixLookup(std::span<const OffloadKey> keys, bool* deferred) {
  *deferred = false;
  const size_t n = keys.size();
  // Built-in policies: two stages ahead of the lookup, index slots kSlotAhead keys ahead and nodes
  // kNodeAhead ahead. Each key is hashed once, when its slot is prefetched; the ring keeps the
  // hash until its lookup (kRing > kSlotAhead, so none is overwritten before use).
  constexpr size_t kSlotAhead = 8;
  constexpr size_t kNodeAhead = 4;
  constexpr size_t kRing = 16;
  uint64_t hashes[kRing];
  const bool fast = fast_table_ != nullptr;
  auto start = [&](size_t j) {
    hashes[j % kRing] = policy_internal::HashKey(keys[j]);
    fast_table_->Prefetch(hashes[j % kRing]);
  };
  if (fast) {
    for (size_t j = 0; j < std::min(n, kSlotAhead); ++j) start(j);
  }
  for (size_t i = 0; i < n; ++i) {
    if (fast) {
      if (i + kSlotAhead < n) start(i + kSlotAhead);
      if (i + kNodeAhead < n) fast_table_->PrefetchNode(hashes[(i + kNodeAhead) % kRing]);
    }
    if (tracker_ != nullptr) tracker_->Count(keys[i]);  // as Lookup
    const LookupResult r =
        Verdict(fast ? fast_table_->PeekStatus(keys[i], hashes[i % kRing], fast_max_list_)
                     : policy_->Get(keys[i]));
    if (r == LookupResult::kMiss) return i;
    if (r != LookupResult::kHit) *deferred = true;
  }
  return n;
}

bool CpuTier::PrepareStore(std::span<const OffloadKey> keys, PrepareStoreOutput* out) {
  out->keys_to_store.clear();
  out->slots.clear();
  out->evicted_keys.clear();

  std::span<const OffloadKey> candidates = keys;
  if (tracker_ != nullptr) {
    filtered_.clear();
    for (const OffloadKey& key : keys) {
      if (tracker_->Get(key) >= store_threshold_) filtered_.push_back(key);
    }
    stores_skipped_ += keys.size() - filtered_.size();
    candidates = filtered_;
  }

  // Start every candidate's index miss before probing any (a chunk's keys are independent
  // random probes; one at a time they serialise on the probe loop's data-dependent branch).
  if (fast_table_ != nullptr && candidates.size() > 1) {
    for (const OffloadKey& key : candidates) fast_table_->Prefetch(policy_internal::HashKey(key));
  }
  // keys_to_store: the candidates not present in any state, each once.
  const bool use_set = candidates.size() > 32;
  if (use_set) dedup_.clear();
  present_.clear();
  for (const OffloadKey& key : candidates) {
    if (policy_->Get(key) != nullptr) {
      present_.push_back(key);
      continue;
    }
    if (use_set) {
      if (!dedup_.insert(key).second) continue;
    } else if (std::find(out->keys_to_store.begin(), out->keys_to_store.end(), key) !=
               out->keys_to_store.end()) {
      continue;
    }
    out->keys_to_store.push_back(key);
  }
  const size_t n = out->keys_to_store.size();
  if (n == 0) return true;

  RecordAllocation(n);
  const size_t free = num_free();
  if (n > free) {
    const size_t need = n - free;
    if (need > num_evictable_) {
      ++store_failures_;
      out->keys_to_store.clear();
      return false;
    }
    // Every (post-threshold) input key is protected, including already-stored ones; only the
    // present ones can be victims, so only they are passed.
    if (!policy_->EvictInto(need, present_, &evicted_)) {
      ++store_failures_;
      out->keys_to_store.clear();
      return false;
    }
    evictions_ += evicted_.size();
    num_evictable_ -= evicted_.size();
    out->evicted_keys.reserve(evicted_.size());
    for (const auto& [key, block] : evicted_) {
      free_list_.push_back(block.slot);
      out->evicted_keys.push_back(key);
    }
    if (enable_events_) {
      OffloadingEvent& e = NewEvent();
      e.keys.assign(out->evicted_keys.begin(), out->evicted_keys.end());
      e.medium = Medium::kCpu;
      e.change = KeysRemoved{RemovalReason::kEvicted};
    }
  }

  out->slots.reserve(n);
  for (const OffloadKey& key : out->keys_to_store) {
    const int32_t slot = AllocateSlot();
    policy_->Insert(key, BlockStatus{-1, slot});
    if (!slot_keys_.empty()) slot_keys_[static_cast<size_t>(slot)] = key;
    out->slots.push_back(slot);
  }
  num_pending_writes_ += n;
  return true;
}

Status CpuTier::CompleteStore(std::span<const OffloadKey> keys, bool success,
                              std::vector<OffloadKey>* changed) {
  // vLLM's complete_store: keys absent from the policy (never prepared, evicted, reset) are
  // ignored, as are ready ones; every other key is applied.
  blocks_.clear();
  for (const OffloadKey& key : keys) blocks_.push_back(policy_->Get(key));
  const size_t first = changed->size();
  if (success) {
    for (size_t i = 0; i < keys.size(); ++i) {
      BlockStatus* block = blocks_[i];                   // valid: nothing is removed on this path
      if (block == nullptr || block->ready()) continue;  // absent, or already stored (repeated)
      block->ref_cnt = 0;
      --num_pending_writes_;
      ++num_evictable_;
      policy_->MarkEvictable(keys[i]);
      changed->push_back(keys[i]);
    }
    if (enable_events_ && changed->size() > first) {
      OffloadingEvent& e = NewEvent();
      e.keys.assign(changed->begin() + static_cast<std::ptrdiff_t>(first), changed->end());
      e.medium = Medium::kCpu;
      e.change = KeysStored{};
    }
  } else {
    for (const OffloadKey& key : keys) {
      const BlockStatus* block = policy_->Get(key);
      if (block == nullptr || block->ready()) continue;  // a repeated key is already gone
      const int32_t slot = block->slot;
      --num_pending_writes_;
      policy_->Remove(key);
      free_list_.push_back(slot);
      changed->push_back(key);
    }
  }
  return Status::Ok();
}

void CpuTier::Reset() {
  policy_->Clear();
  num_evictable_ = 0;
  num_pending_writes_ = 0;
  free_list_.clear();
  num_allocated_ = 0;
}

void CpuTier::TakeEvents(std::vector<OffloadingEvent>* out) {
  for (OffloadingEvent& e : events_) out->push_back(std::move(e));
  events_.clear();
}

OffloadingEvent& CpuTier::NewEvent() {
  OffloadingEvent& e = events_.emplace_back();
  if (!spare_keys_.empty()) {
    e.keys = std::move(spare_keys_.back());
    spare_keys_.pop_back();
  }
  return e;
}

void CpuTier::RecycleEvents(std::vector<OffloadingEvent>* events) {
  constexpr size_t kMaxSpare = 256;
  for (OffloadingEvent& e : *events) {
    if (spare_keys_.size() >= kMaxSpare) break;
    if (e.keys.capacity() == 0) continue;
    e.keys.clear();
    spare_keys_.push_back(std::move(e.keys));
  }
  events->clear();
}

void CpuTier::AddEvent(OffloadingEvent event) {
  if (enable_events_) events_.push_back(std::move(event));
}

void CpuTier::ListReady(std::vector<OffloadKey>* out) const {
  if (slot_keys_.empty()) {
    if (fast_table_ == nullptr) return;
    // Slot order, as with the slot-key table (the hash table's order is arbitrary).
    std::vector<std::pair<int32_t, OffloadKey>> ready;
    fast_table_->ForEach([&](uint32_t i) {
      const policy_internal::Node& n = fast_table_->at(i);
      if (n.list() <= fast_max_list_ && n.status.ready())
        ready.emplace_back(n.status.slot, n.Key());
    });
    std::sort(ready.begin(), ready.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [slot, key] : ready) out->push_back(key);
    return;
  }
  for (size_t s = 0; s < num_allocated_; ++s) {
    const BlockStatus* block = policy_->Get(slot_keys_[s]);
    if (block != nullptr && block->slot == static_cast<int32_t>(s) && block->ready()) {
      out->push_back(slot_keys_[s]);
    }
  }
}

void CpuTier::FillStats(ManagerStats* stats) const {
  stats->num_blocks = num_blocks_;
  stats->num_allocated = num_allocated_;
  stats->num_free = num_free();
  stats->num_evictable = num_evictable_;
  stats->num_pending_writes = num_pending_writes_;
  stats->num_stored = policy_->size();
  if (num_blocks_ > 0) {
    const size_t used = num_allocated_ - free_list_.size() - num_evictable_;
    stats->usage = static_cast<double>(used) / static_cast<double>(num_blocks_);
    stats->write_usage =
        static_cast<double>(num_pending_writes_) / static_cast<double>(num_blocks_);
    stats->read_usage = std::max(stats->usage - stats->write_usage, 0.0);
  }
  stats->allocation_count = allocation_count_;
  stats->allocation_sum = allocation_sum_;
  std::copy(std::begin(allocation_buckets_), std::end(allocation_buckets_),
            std::begin(stats->allocation_buckets));
  stats->stores_skipped = stores_skipped_;
  stats->lookups = hits_ + misses_;
  stats->hits = hits_;
  stats->misses = misses_;
  stats->evictions = evictions_;
  stats->store_failures = store_failures_;
}

Status CpuTier::CheckInvariants() const {
  auto fail = [](const std::string& what) { return Status::Internal("CPU tier: " + what); };
  if (num_allocated_ > num_blocks_) return fail("more slots allocated than exist");
  std::vector<uint8_t> is_free(num_blocks_, 0);
  for (int32_t slot : free_list_) {
    if (slot < 0 || static_cast<size_t>(slot) >= num_allocated_) {
      return fail("free slot " + std::to_string(slot) + " was never allocated");
    }
    if (is_free[static_cast<size_t>(slot)]++ != 0) {
      return fail("slot " + std::to_string(slot) + " is free twice");
    }
  }
  if (policy_->size() != num_allocated_ - free_list_.size()) {
    return fail("policy holds " + std::to_string(policy_->size()) + " blocks, " +
                std::to_string(num_allocated_ - free_list_.size()) + " slots in use");
  }
  if (policy_->num_evictable() != num_evictable_) {
    return fail("evictable count " + std::to_string(num_evictable_) + ", policy says " +
                std::to_string(policy_->num_evictable()));
  }
  if (slot_keys_.empty()) return policy_->CheckInvariants();
  size_t used = 0, evictable = 0, writing = 0;
  for (size_t s = 0; s < num_allocated_; ++s) {
    const BlockStatus* block = policy_->Get(slot_keys_[s]);
    const bool in_use = block != nullptr && block->slot == static_cast<int32_t>(s);
    if (in_use == (is_free[s] != 0)) {
      return fail("slot " + std::to_string(s) + (in_use ? " is free but in use" : " is leaked"));
    }
    if (!in_use) continue;
    ++used;
    if (block->ref_cnt < -1) return fail("ref_cnt below -1 at slot " + std::to_string(s));
    if (block->ref_cnt == 0) ++evictable;
    if (block->ref_cnt == -1) ++writing;
  }
  if (used != policy_->size()) {
    return fail("policy holds " + std::to_string(policy_->size()) + " blocks, slots " +
                std::to_string(used));
  }
  if (evictable != num_evictable_ || evictable != policy_->num_evictable()) {
    return fail("evictable count " + std::to_string(num_evictable_) + " / policy " +
                std::to_string(policy_->num_evictable()) + " / actual " +
                std::to_string(evictable));
  }
  if (writing != num_pending_writes_) return fail("pending-write count mismatch");
  return policy_->CheckInvariants();
}

}  // namespace kvo
