// CpuTier: the CPU primary tier — vLLM's CPUOffloadingManager (vllm-compat.md B.6) exactly:
// ref counts (-1 writing, 0 evictable, > 0 pinned), slot order (fresh ids ascending, then a LIFO
// free list), prepare_store protecting its input keys and failing without side effects, one
// removal event before any store event, store_threshold counting in lookup. Internal to
// OffloadManager (which adds tiering, events and validation messages on top).
//
// Thread-compatible. Hot paths (Lookup, PrepareStore, CompleteStore) allocate only for their
// outputs and events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "manager/cache_policy.h"
#include "manager/offload_key.h"
#include "manager/offload_manager.h"
#include "manager/policy_table.h"

namespace kvo {

// The bounded LRU of lookup counts behind store_threshold (vLLM's `counts` OrderedDict): a new key
// evicts the least recently counted one when the tracker holds max_size keys.
class LookupTracker {
 public:
  explicit LookupTracker(size_t max_size) : max_size_(max_size) {}
  void Count(const OffloadKey& key);
  int64_t Get(const OffloadKey& key) const;  // 0 when absent
  bool Contains(const OffloadKey& key) const { return index_.count(key) != 0; }
  size_t size() const { return index_.size(); }

 private:
  using Entry = std::pair<OffloadKey, int64_t>;
  size_t max_size_;
  std::list<Entry> lru_;  // oldest first
  std::unordered_map<OffloadKey, std::list<Entry>::iterator, OffloadKeyHash> index_;
};

class CpuTier {
 public:
  // `track_slots`: keep the key of every slot (40 B/slot) so ListReady and CheckInvariants can
  // enumerate blocks (CachePolicy cannot be iterated).
  CpuTier(size_t num_blocks, std::unique_ptr<CachePolicy> policy, int64_t store_threshold,
          size_t max_tracker_size, bool enable_events, bool track_slots);

  // Inline: the hot path.
  LookupResult Lookup(const OffloadKey& key) {
    if (tracker_ != nullptr) tracker_->Count(key);
    // Built-in policies: probe their table directly (same answer as Get, no virtual call).
    return Verdict(fast_table_ != nullptr ? fast_table_->PeekStatus(key, fast_max_list_)
                                          : policy_->Get(key));
  }
  // Lookup of keys[0], keys[1], ... up to and including the first MISS (each counted for
  // store_threshold exactly as by Lookup); the index slots and nodes of the keys ahead are
  // prefetched so their misses overlap. Returns the number of keys before that MISS; *deferred is
  // set when one of them was HIT_PENDING.
  size_t PrefixLookup(std::span<const OffloadKey> keys, bool* deferred);
  // Appends each key's slot to *slots (key order) and pins them. Nothing changes on error.
  Status PrepareLoad(std::span<const OffloadKey> keys, std::vector<int32_t>* slots);
  void Touch(std::span<const OffloadKey> keys) { policy_->Touch(keys); }
  Status CompleteLoad(std::span<const OffloadKey> keys);
  // False: cannot store (nothing changed besides the allocation histogram and failure counter).
  // *out is overwritten. Duplicate input keys are stored once.
  bool PrepareStore(std::span<const OffloadKey> keys, PrepareStoreOutput* out);
  // Appends the keys that became ready (success) or were dropped (failure) to *changed.
  Status CompleteStore(std::span<const OffloadKey> keys, bool success,
                       std::vector<OffloadKey>* changed);
  // Clears everything (vLLM reset_cache).
  void Reset();

  // Events since the last take (removals before the stores that reuse their slots).
  void TakeEvents(std::vector<OffloadingEvent>* out);
  // Queues an event of this tier (used by the manager for reset announcements).
  void AddEvent(OffloadingEvent event);
  // Clears *events, keeping their key vectors for this tier's next events.
  void RecycleEvents(std::vector<OffloadingEvent>* events);

  const BlockStatus* Find(const OffloadKey& key) { return policy_->Get(key); }
  // Appends the ready blocks in slot order: from the slot-key table when tracked, else from a
  // built-in policy's table (nothing for other policies without tracking: with events on they
  // are always tracked).
  void ListReady(std::vector<OffloadKey>* out) const;
  bool track_slots() const { return !slot_keys_.empty() || num_blocks_ == 0; }
  void FillStats(ManagerStats* stats) const;
  Status CheckInvariants() const;

  CachePolicy& policy() { return *policy_; }
  const LookupTracker* tracker() const { return tracker_.get(); }
  size_t num_blocks() const { return num_blocks_; }
  size_t num_free() const { return free_list_.size() + num_blocks_ - num_allocated_; }

 private:
  // Counts and classifies a lookup's block (nullptr: absent).
  LookupResult Verdict(const BlockStatus* block) {
    if (block == nullptr) {
      ++misses_;
      return LookupResult::kMiss;
    }
    ++hits_;
    return block->ready() ? LookupResult::kHit : LookupResult::kHitPending;
  }
  void RecordAllocation(size_t n);
  // A new event at the end of events_, its keys vector taken from the spare pool.
  OffloadingEvent& NewEvent();
  int32_t AllocateSlot();

  const size_t num_blocks_;
  std::unique_ptr<CachePolicy> policy_;
  // The built-in policy's table (nullptr for other policies) and its last cached list id.
  const policy_internal::NodeTable* fast_table_ = nullptr;
  uint32_t fast_max_list_ = 0;
  const int64_t store_threshold_;
  const bool enable_events_;
  std::unique_ptr<LookupTracker> tracker_;  // only with store_threshold >= 2

  size_t num_allocated_ = 0;        // fresh slot ids handed out so far
  std::vector<int32_t> free_list_;  // LIFO
  // With track_slots: the key each slot was last given to; a slot is in use when the policy maps
  // that key back to it. Empty otherwise.
  std::vector<OffloadKey> slot_keys_;
  size_t num_evictable_ = 0;       // ref_cnt == 0
  size_t num_pending_writes_ = 0;  // ref_cnt == -1

  std::vector<OffloadingEvent> events_;

  // Scratch, reused across calls.
  std::vector<OffloadKey> filtered_;
  std::vector<OffloadKey> present_;  // PrepareStore's candidates already in the policy
  std::vector<BlockStatus*> blocks_;
  std::unordered_set<OffloadKey, OffloadKeyHash> dedup_;
  std::vector<std::pair<OffloadKey, BlockStatus>> evicted_;
  std::vector<std::vector<OffloadKey>> spare_keys_;  // emptied event key vectors (bounded pool)

  // Counters (cumulative).
  uint64_t allocation_count_ = 0;
  uint64_t allocation_sum_ = 0;
  uint64_t allocation_buckets_[ManagerStats::kAllocationBuckets] = {};
  uint64_t stores_skipped_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
  uint64_t evictions_ = 0;
  uint64_t store_failures_ = 0;
};

}  // namespace kvo
