// A secondary tier over an in-memory index and a transport (vllm-compat.md B.11; kvo's bounded
// file tier, cf. vLLM #54327):
//   TierTransport     moves bytes between CPU slots and the medium (the transfer engine implements
//                     it for the file system; tests use a fake that completes jobs when told).
//   BoundedTierIndex  what the tier holds, within a byte budget, victims chosen by a CachePolicy.
//   IndexedTier       the SecondaryTier: lookups from the index, stores that make room by
//                     evicting (STORAGE removals, reason "evicted") and land as STORAGE stored
//                     events, loads that pin their blocks (from the moment the promotion is
//                     promised, HoldForPromotion), and loads that find a block corrupt drop it
//                     (STORAGE removal, reason "failed").
//
// Thread-compatible (the OffloadManager's thread). A transport may finish jobs on its own threads
// and must then make TakeFinished/Drain thread-safe itself.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/result.h"
#include "manager/cache_policy.h"
#include "manager/secondary_tier.h"

namespace kvo {

class TierTransport {
 public:
  virtual ~TierTransport() = default;
  // Start copying job.slots' CPU rows to the medium under job.keys (store), or the medium's
  // blocks into the rows (load). The result comes back from TakeFinished under job.job_id; a
  // load that finds a block corrupt or missing lists it in JobResult::lost_keys (and has removed
  // it from the medium).
  virtual Status SubmitStore(const TierJob& job) = 0;
  virtual Status SubmitLoad(const TierJob& job) = 0;
  virtual void TakeFinished(std::vector<JobResult>* out) = 0;
  // Blocks until every submitted job has finished.
  virtual void Drain() = 0;
  // Removes evicted blocks from the medium.
  virtual Status Delete(std::span<const OffloadKey> keys) = 0;
  // What the medium holds (at startup, to rebuild the index).
  virtual Status List(std::vector<OffloadKey>* out) = 0;
};

// What a secondary tier holds: a state per key (writing, ready, pinned by loads — the CPU tier's
// ref counts: -1, 0, > 0) in a CachePolicy that also picks victims, and a dense key array for
// enumeration (BlockStatus::slot is the key's position in it). Capacity = max_bytes / block_bytes
// blocks (max_bytes 0: unbounded), at most `max_blocks` (what the policy can hold).
class BoundedTierIndex {
 public:
  BoundedTierIndex(uint64_t max_bytes, uint64_t block_bytes, std::unique_ptr<CachePolicy> policy,
                   uint64_t max_blocks = UINT64_MAX);

  const BlockStatus* Find(const OffloadKey& key) { return policy_->Get(key); }
  // Makes room for one more block, evicting ready unpinned blocks not in `protect` (appended to
  // *evicted), then adds `key` as writing. False (and no change) when there is no room.
  bool Reserve(const OffloadKey& key, std::span<const OffloadKey> protect,
               std::vector<OffloadKey>* evicted);
  void Commit(const OffloadKey& key);  // writing -> ready
  void Erase(const OffloadKey& key);   // any state -> absent
  // Adds a ready block (startup); false when full.
  bool AddReady(const OffloadKey& key);
  bool Pin(const OffloadKey& key);  // ready -> pinned (ref_cnt++)
  void Unpin(const OffloadKey& key);
  void Touch(std::span<const OffloadKey> keys) { policy_->Touch(keys); }

  void ListReady(std::vector<OffloadKey>* out) const;
  size_t size() const { return keys_.size(); }
  uint64_t capacity_blocks() const { return capacity_; }
  uint64_t used_bytes() const { return keys_.size() * block_bytes_; }
  Status CheckInvariants() const;

 private:
  void Add(const OffloadKey& key, int32_t ref_cnt);

  const uint64_t block_bytes_;
  const uint64_t capacity_;  // blocks; max_blocks when unbounded
  std::unique_ptr<CachePolicy> policy_;
  std::vector<OffloadKey> keys_;  // dense; BlockStatus::slot indexes it
};

struct IndexedTierOptions {
  std::string name = "fs";
  std::optional<std::string> locality;  // "LOCAL" | "REMOTE"
  bool enable_kv_events = true;         // vLLM's per-tier enable_kv_events
  // 0: unbounded (vLLM's FS tier) up to the policy's limit (MaxPolicyBlocks blocks,
  // manager/cache_policy.h; Create refuses a bound past it).
  uint64_t max_bytes = 0;
  uint64_t block_bytes = 1;             // bytes per block (one CPU row)
  std::string eviction_policy = "lru";  // a CachePolicyRegistry name
  CachePolicyFactory policy_factory;    // overrides eviction_policy when set
  // vLLM's asynchronous secondary lookup (B.11; the FS tier checks files on its thread pool): the
  // first lookup of a key answers RETRY and starts the check; every lookup of it answers RETRY
  // until the step ends (OnScheduleEnd), which decides the verdict (HIT or MISS from the index at
  // that moment). As vLLM's AsyncLookupManager, the verdict is then cached while any request that
  // asked for the key is running (OnRequestFinished drops it with the last such request), and a
  // failed load marks its failed keys' verdicts MISS (no request re-issues a doomed promotion).
  // A verdict asked for without a req_id is given once, or dropped unclaimed after a step.
  // false: answer at once.
  bool async_lookup = false;
};

class IndexedTier final : public SecondaryTier {
 public:
  // Rebuilds the index from transport->List() (no events of its own: the manager announces them,
  // ManagerOptions.announce_held_blocks, or OffloadManager::Recover reconciles), deleting what
  // does not fit the budget. `transport` is shared with whoever completes its I/O.
  static Result<std::unique_ptr<IndexedTier>> Create(IndexedTierOptions options,
                                                     std::shared_ptr<TierTransport> transport);

  const std::string& name() const override { return options_.name; }
  const std::optional<std::string>& locality() const override { return options_.locality; }
  LookupResult Lookup(const OffloadKey& key, const RequestContext& ctx) override;
  Status SubmitStore(const TierJob& job) override;
  Status SubmitLoad(const TierJob& job) override;
  void HoldForPromotion(const OffloadKey& key) override;
  void ReleasePromotion(std::span<const OffloadKey> keys) override;
  void TakeFinished(std::vector<JobResult>* out) override;
  void Drain() override { transport_->Drain(); }
  void TakeEvents(std::vector<OffloadingEvent>* out) override;
  bool publishes_events() const override { return options_.enable_kv_events; }
  void ListHeld(std::vector<OffloadKey>* out) const override { index_.ListReady(out); }
  void Touch(std::span<const OffloadKey> keys, const RequestContext& ctx) override;
  bool HasPendingWork() const override { return !jobs_.empty() || !ready_results_.empty(); }
  void OnScheduleEnd() override;
  void OnRequestFinished(const RequestContext& ctx) override;

  const BoundedTierIndex& index() const { return index_; }
  uint64_t stores_rejected() const { return stores_rejected_; }  // no room for a block
  // Evicted blocks whose files could not be deleted yet (retried at each step's end, up to
  // kDeleteRetriesPerStep), and those given up on because too many were pending (kMaxUndeleted).
  size_t undeleted() const { return undeleted_.size(); }
  uint64_t undeleted_dropped() const { return undeleted_dropped_; }
  static constexpr size_t kMaxUndeleted = size_t{1} << 20;
  static constexpr size_t kDeleteRetriesPerStep = 64;

 private:
  IndexedTier(IndexedTierOptions options, std::unique_ptr<CachePolicy> policy,
              std::shared_ptr<TierTransport> transport, uint64_t max_blocks);
  void Emit(std::vector<OffloadKey> keys, bool removed, RemovalReason reason);

  struct Job {
    bool is_store = false;
    std::vector<OffloadKey> submitted;   // handed to the transport
    bool all_ok_so_far = true;           // false when some keys failed before submission
    std::vector<OffloadKey> ok_upfront;  // stores: already held, count as done
    std::vector<OffloadKey> not_loaded;  // loads: after the first block that could not load
  };

  IndexedTierOptions options_;
  BoundedTierIndex index_;
  std::shared_ptr<TierTransport> transport_;
  std::unordered_map<JobId, Job> jobs_;
  std::vector<JobResult> ready_results_;  // finished without the transport
  std::vector<OffloadingEvent> events_;
  std::vector<JobResult> scratch_;
  uint64_t stores_rejected_ = 0;
  // Evicted keys whose delete failed: out of the index (and announced removed) but maybe still on
  // the medium, outside the budget; deleted again at the steps' ends until the delete succeeds,
  // forgotten when the key is stored again (the file is then this block's own).
  void RememberUndeleted(std::span<const OffloadKey> keys);
  void RetryDeletes();
  std::unordered_set<OffloadKey, OffloadKeyHash> undeleted_;
  uint64_t undeleted_dropped_ = 0;
  // Keys pinned by HoldForPromotion, with the number of holds (released by ReleasePromotion).
  std::unordered_map<OffloadKey, uint32_t, OffloadKeyHash> promised_;
  // async_lookup: per key, the verdict (unset while its check runs) and the requests that asked;
  // per request, the keys it asked for; the keys whose check started this step.
  struct Verdict {
    std::optional<bool> hit;
    std::unordered_set<std::string> requests;
  };
  void MarkMiss(std::span<const OffloadKey> keys);
  std::unordered_map<OffloadKey, Verdict, OffloadKeyHash> verdicts_;
  std::unordered_map<std::string, std::vector<OffloadKey>> request_keys_;
  std::vector<OffloadKey> checking_;
  std::vector<OffloadKey> unclaimed_;  // decided at the last step's end, held by no request
};

}  // namespace kvo
