// CachePolicy: vLLM's cache-policy contract (vllm-compat.md B.7) over OffloadKeys. Pure
// bookkeeping: no I/O, no locks, no clock; the manager serialises every call. Implementations:
// LRU and ARC (exactly as vLLM's), plus any registered by name (CachePolicyRegistry).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"
#include "manager/offload_key.h"

namespace kvo {

// vLLM's BlockStatus: ref_cnt -1 = being written (not ready), 0 = ready and evictable,
// > 0 = pinned by that many loads. `slot` is the CPU slot (row) id.
struct BlockStatus {
  int32_t ref_cnt = -1;
  int32_t slot = -1;
  bool ready() const { return ref_cnt >= 0; }
};

class CachePolicy {
 public:
  virtual ~CachePolicy() = default;

  // nullptr when absent. The pointer stays valid until the key is removed or evicted.
  virtual BlockStatus* Get(const OffloadKey& key) = 0;
  // Adds an absent key. A block with ref_cnt 0 is evictable at once; others are not.
  virtual void Insert(const OffloadKey& key, BlockStatus block) = 0;
  virtual void Remove(const OffloadKey& key) = 0;
  // Recency/frequency update, iterating `keys` in reverse (the first key ends up most recent).
  virtual void Touch(std::span<const OffloadKey> keys) = 0;
  // Evicts exactly n evictable blocks (ref_cnt == 0) that are not in `protected_keys`, removing
  // them from the policy; nullopt (and no change at all) when that is impossible.
  virtual std::optional<std::vector<std::pair<OffloadKey, BlockStatus>>> Evict(
      size_t n, std::span<const OffloadKey> protected_keys) = 0;
  // Evict's effect with the victims written to *out (cleared first; its capacity is reused, so a
  // caller that keeps the vector allocates nothing once warm). False, with no change, when Evict
  // would return nullopt. The default calls Evict; the built-in policies implement it directly.
  virtual bool EvictInto(size_t n, std::span<const OffloadKey> protected_keys,
                         std::vector<std::pair<OffloadKey, BlockStatus>>* out);
  virtual void Clear() = 0;
  // The block's ref_cnt just became 0 / just left 0.
  virtual void MarkEvictable(const OffloadKey& key) = 0;
  virtual void MarkNonEvictable(const OffloadKey& key) = 0;

  virtual size_t size() const = 0;
  virtual size_t num_evictable() const = 0;
  // Checks the policy's internal invariants (tests and debug builds); Internal error if broken.
  virtual Status CheckInvariants() const = 0;
};

using CachePolicyFactory = std::function<std::unique_ptr<CachePolicy>(size_t capacity)>;

// The most blocks a tier may have with a policy: OffloadManager::Create, ComputeOffloadGeometry
// and IndexedTier::Create refuse more, naming the limit (past it the built-in policies' node
// table aborted the process). That table's hash slots are 32 bits holding a node index and a
// 6-bit probe distance, so it holds fewer than 2^26 * 6/7 nodes (it grows at 7/8 load, doubling).
//   LRU: one node per block. Sized for its capacity it holds ~57M; grown from a small hint (a
//        secondary tier's), ~39M. Limit 2^25.
//   ARC: up to three nodes per block (the resident blocks, and two ghost lists of up to
//        `capacity` each): ~14M blocks. Limit 2^23.
//   Any other (registered) policy: 2^25, the CPU tier's own bound.
inline constexpr size_t kMaxLruBlocks = size_t{1} << 25;
inline constexpr size_t kMaxArcBlocks = size_t{1} << 23;
size_t MaxPolicyBlocks(std::string_view policy_name);

// Name -> factory. "lru" and "arc" are built in. Thread-safe.
class CachePolicyRegistry {
 public:
  // A registry holding only the built-in policies (tests; everyone else uses Global()).
  CachePolicyRegistry();
  ~CachePolicyRegistry();
  CachePolicyRegistry(const CachePolicyRegistry&) = delete;
  CachePolicyRegistry& operator=(const CachePolicyRegistry&) = delete;

  static CachePolicyRegistry& Global();
  // AlreadyExists when the name is taken (vLLM raises ValueError on duplicates).
  Status Register(const std::string& name, CachePolicyFactory factory);
  // InvalidArgument "Unknown cache policy: 'x'. Supported: [...]" when absent.
  Result<std::unique_ptr<CachePolicy>> Create(const std::string& name, size_t capacity) const;
  std::vector<std::string> Names() const;  // sorted

 private:
  struct State;  // a mutex and the name -> factory map (cache_policy.cc)
  std::unique_ptr<State> state_;
};

}  // namespace kvo
