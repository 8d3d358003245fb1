// LruPolicy: vLLM's LRUCachePolicy (vllm-compat.md B.7, cpu/policies/lru.py), exactly.
//
// State: every block (key -> BlockStatus) plus the evictable list, ordered LRU -> MRU, holding
// only blocks whose ref_cnt is 0.
//   Insert       adds the block; appends it at the MRU end only when its ref_cnt is 0.
//   Remove       drops the block (and its evictable entry); an absent key is a no-op.
//   Touch        walks the keys in reverse and moves each key that is *currently evictable* to
//                the MRU end, so the first key ends most recent; pinned or not-ready keys are not
//                reordered (they re-enter at MRU when they become evictable).
//   Evict(n, p)  scans the evictable list LRU -> MRU skipping keys in p until n are found; then
//                removes them and returns them in that order. Fewer than n: nullopt, no change.
//                n == 0: an empty list.
//   MarkEvictable      appends at MRU (no move when already evictable, like OrderedDict
//                      assignment; no-op for an absent key).
//   MarkNonEvictable   removes from the evictable list (no-op when not in it).
//   Clear        forgets everything.
// `capacity` is only a sizing hint (vLLM's LRU ignores it): more blocks than that still work.
//
// Invariants (CheckInvariants): the evictable list holds exactly the blocks whose ref_cnt is 0,
// each once; sizes agree; the table's structure is sound (see policy_table.h). The first holds
// as long as the caller reports every ref_cnt transition to or from 0 through Mark*Evictable,
// as the manager does.
//
// Storage: one 52-byte node per block in a slab plus ~5.3 bytes of index (policy_table.h).
// Thread-compatible: the manager serialises every call.
#pragma once

#include <memory>
#include <vector>

#include "manager/cache_policy.h"
#include "manager/policy_table.h"

namespace kvo {

class LruPolicy final : public CachePolicy, public policy_internal::TableBackedPolicy {
 public:
  explicit LruPolicy(size_t capacity);

  BlockStatus* Get(const OffloadKey& key) override;
  void Insert(const OffloadKey& key, BlockStatus block) override;
  void Remove(const OffloadKey& key) override;
  void Touch(std::span<const OffloadKey> keys) override;
  std::optional<std::vector<std::pair<OffloadKey, BlockStatus>>> Evict(
      size_t n, std::span<const OffloadKey> protected_keys) override;
  bool EvictInto(size_t n, std::span<const OffloadKey> protected_keys,
                 std::vector<std::pair<OffloadKey, BlockStatus>>* out) override;
  void Clear() override;
  void MarkEvictable(const OffloadKey& key) override;
  void MarkNonEvictable(const OffloadKey& key) override;

  size_t size() const override { return table_.size(); }
  size_t num_evictable() const override { return table_.ListSize(kEvictable); }
  Status CheckInvariants() const override;

  const policy_internal::NodeTable& table() const override { return table_; }
  // Every node is a cached block (evictable list or none).
  uint32_t max_cached_list() const override { return policy_internal::kNoList; }

  // The evictable keys, LRU first (tests).
  std::vector<OffloadKey> EvictableKeys() const;

 private:
  static constexpr uint32_t kEvictable = 0;

  policy_internal::NodeTable table_;
  policy_internal::ProtectedSet protected_;  // scratch for Evict
  std::vector<uint32_t> victims_;            // scratch for Evict
  std::vector<uint64_t> hashes_;             // scratch for Evict
};

std::unique_ptr<CachePolicy> NewLruPolicy(size_t capacity);

}  // namespace kvo
