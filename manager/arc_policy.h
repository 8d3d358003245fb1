// ArcPolicy: vLLM's ARCCachePolicy (vllm-compat.md B.7, cpu/policies/arc.py), exactly.
// Not textbook ARC: each ghost list is bounded by the capacity on its own, and the target is
// adapted only by touches of ghost keys.
//
// State: T1 (seen once) and T2 (seen again), key -> BlockStatus, each LRU -> MRU; ghost lists B1
// and B2 (keys of blocks evicted from T1 / T2), LRU -> MRU; target_t1_size, a double from 0.
//   Get          T1, then T2 (ghost keys are absent).
//   Insert       always at the T1 MRU end; the key leaves B1/B2 if it was a ghost.
//   Remove       from T1 or T2; ghosts are untouched; absent: no-op.
//   Touch        walks the keys in reverse:
//                  in T1: ready -> T2 MRU; not ready -> T1 MRU (vLLM #34576)
//                  in T2: -> T2 MRU
//                  in B1: target = min(target + max(1, |B2|/|B1|), capacity); -> B1 MRU
//                  in B2: target = max(target - max(1, |B1|/|B2|), 0);        -> B2 MRU
//                  else nothing.
//   Evict(n, p)  n == 0: an empty list. Otherwise selects first, with one monotonic scan per
//                list (vLLM #50992): for each victim, when virtual_|T1| >= int(target) the next
//                T1 entry with ref_cnt 0 not in p (virtual_|T1| -= 1); otherwise, or when T1 has
//                none left, the next such T2 entry; when T2 has none left either, the next T1
//                entry (vLLM #55461; ArcOptions::t1_fallback, default on) or, without it, nullopt.
//                Nothing found: nullopt, no change. Then applies: T1 victims to the B1 MRU end,
//                T2 victims to B2, in selection order; then trims B1, then B2, to `capacity` from
//                their LRU ends. Returns the victims in selection order.
//   MarkEvictable / MarkNonEvictable   no-ops for the order, as in vLLM (the eviction scan reads
//                ref_cnt directly); they only keep num_evictable() counted, so the caller must
//                report each transition of a present block's ref_cnt to / from 0 exactly once.
//   Clear        forgets everything, target back to 0.
//
// Invariants (CheckInvariants): T1, T2, B1, B2 pairwise disjoint (one node per key, one list per
// node); |B1|, |B2| <= capacity; 0 <= target <= capacity; num_evictable() == the number of T1/T2
// blocks with ref_cnt 0; the table's structure is sound (policy_table.h).
//
// Storage: one 52-byte node per block or ghost plus ~5.3 bytes of index; sized for `capacity`
// blocks, growing as ghosts accumulate (at most 2 * capacity of them).
// Thread-compatible: the manager serialises every call.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "manager/cache_policy.h"
#include "manager/policy_table.h"

namespace kvo {

struct ArcOptions {
  // Fall back to T1 when T2 has no eligible entry left (vLLM #55461). false = the snapshot
  // behaviour, which fails the eviction (nullopt) instead.
  bool t1_fallback = true;
};

class ArcPolicy final : public CachePolicy, public policy_internal::TableBackedPolicy {
 public:
  enum class List { kT1, kT2, kB1, kB2 };

  explicit ArcPolicy(size_t capacity, ArcOptions options = {});

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

  size_t size() const override { return table_.ListSize(kT1) + table_.ListSize(kT2); }
  size_t num_evictable() const override { return num_evictable_; }
  Status CheckInvariants() const override;

  const policy_internal::NodeTable& table() const override { return table_; }
  uint32_t max_cached_list() const override { return kT2; }  // B1 / B2 hold ghosts

  // Inspection (tests): which list holds the key, a list's keys LRU first, the target.
  std::optional<List> Where(const OffloadKey& key) const;
  std::vector<OffloadKey> Keys(List list) const;
  size_t ListSize(List list) const { return table_.ListSize(static_cast<uint32_t>(list)); }
  double target_t1_size() const { return target_t1_size_; }
  void set_target_t1_size_for_testing(double target) { target_t1_size_ = target; }
  size_t capacity() const { return capacity_; }

 private:
  static constexpr uint32_t kT1 = 0, kT2 = 1, kB1 = 2, kB2 = 3;
  struct Victim {
    uint32_t node;
    bool from_t1;
  };

  const size_t capacity_;
  const ArcOptions options_;
  double target_t1_size_ = 0.0;
  size_t num_evictable_ = 0;
  policy_internal::NodeTable table_;
  policy_internal::ProtectedSet protected_;             // scratch for Evict
  std::vector<Victim> victims_;                         // scratch for Evict
  std::vector<std::pair<uint32_t, uint64_t>> trimmed_;  // scratch for Evict: ghost, hash
};

std::unique_ptr<CachePolicy> NewArcPolicy(size_t capacity, ArcOptions options = {});

}  // namespace kvo
