// The planner's replay loop over the real OffloadManager, and the independent theoretical maximum.
#include <algorithm>
#include <unordered_set>

#include "manager/offload_manager.h"
#include "manager/policy_table.h"
#include "planner/planner.h"

namespace kvo {

static_assert(kMaxPlanCapacityBlocks == policy_internal::kNil / 2 - 16,
              "the planner's limit is the manager's largest CPU tier");

namespace {

uint64_t HitTokens(size_t hits, uint64_t block_tokens, int64_t input_length) {
  return std::min<uint64_t>(hits * block_tokens, static_cast<uint64_t>(input_length));
}

}  // namespace

Result<PlanPoint> SimulateCapacity(const std::vector<TraceRequest>& trace,
                                   const std::string& policy, uint64_t capacity_blocks,
                                   uint64_t block_tokens, const ProgressFn& progress) {
  // A tier with room for every distinct block of the trace never evicts: any larger capacity
  // gives the same answers, so the manager is built no larger than that (a capacity of 3e14
  // one-token blocks used to abort on a CHECK in the policy table).
  uint64_t distinct = 0;
  {
    std::unordered_set<uint64_t> seen;
    for (const TraceRequest& r : trace) seen.insert(r.hash_ids.begin(), r.hash_ids.end());
    distinct = seen.size();
  }
  const uint64_t manager_blocks = std::min(capacity_blocks, distinct + 1);
  if (manager_blocks > kMaxPlanCapacityBlocks) {
    return Status::InvalidArgument("a capacity of " + std::to_string(capacity_blocks) +
                                   " blocks (the trace has " + std::to_string(distinct) +
                                   " distinct) exceeds the largest CPU tier the manager holds, " +
                                   std::to_string(kMaxPlanCapacityBlocks) + " blocks");
  }
  ManagerOptions options;
  options.num_blocks = manager_blocks;
  options.eviction_policy = policy;
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadManager> manager, OffloadManager::Create(options));

  PlanPoint point;
  point.policy = policy;
  point.capacity_blocks = capacity_blocks;
  point.capacity_tokens = capacity_blocks * block_tokens;
  std::vector<OffloadKey> keys;
  RequestContext ctx;
  for (size_t i = 0; i < trace.size(); ++i) {
    const TraceRequest& r = trace[i];
    keys.clear();
    for (uint64_t id : r.hash_ids) keys.push_back(OffloadKey::FromWireHash(id, 0));
    // The scheduler's prefix scan: consecutive hits from the start, stopping at the first miss.
    size_t hits = 0;
    while (hits < keys.size() && manager->Lookup(keys[hits], ctx) == LookupResult::kHit) ++hits;
    point.hit_tokens += HitTokens(hits, block_tokens, r.input_length);
    point.input_tokens += static_cast<uint64_t>(r.input_length);
    ++point.requests;
    // vLLM's scheduler touches the request's keys on lookup, then stores what is new.
    manager->Touch(keys, ctx);
    KVO_ASSIGN_OR_RETURN(std::optional<PrepareStoreOutput> out, manager->PrepareStore(keys, ctx));
    if (!out) {
      ++point.stores_rejected;
    } else {
      point.blocks_evicted += out->evicted_keys.size();
      KVO_RETURN_IF_ERROR(manager->CompleteStore(out->keys_to_store, ctx, true));
    }
    manager->TakeEvents();  // keep the event queue from growing; the plan does not publish
    if (progress && (i % 256 == 0 || i + 1 == trace.size())) progress(i + 1, trace.size());
  }
  return point;
}

PlanPoint TheoreticalMaximum(const std::vector<TraceRequest>& trace, uint64_t block_tokens) {
  PlanPoint point;
  point.policy = "unbounded";
  std::unordered_set<uint64_t> seen;
  for (const TraceRequest& r : trace) {
    size_t hits = 0;
    while (hits < r.hash_ids.size() && seen.count(r.hash_ids[hits]) != 0) ++hits;
    point.hit_tokens += HitTokens(hits, block_tokens, r.input_length);
    point.input_tokens += static_cast<uint64_t>(r.input_length);
    ++point.requests;
    seen.insert(r.hash_ids.begin(), r.hash_ids.end());
  }
  point.capacity_blocks = seen.size();
  point.capacity_tokens = seen.size() * block_tokens;
  return point;
}

}  // namespace kvo
