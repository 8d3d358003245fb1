// The CPU tier of OffloadManager against vLLM's tests/v1/kv_offload/cpu/test_manager.py (our own
// code and names): the exact LRU trace with slot ids and evicted keys, HIT_PENDING before
// completion, "cannot store" when nothing is evictable or blocks are pinned, failed stores, event
// order, protected input keys (LRU and ARC), the store_threshold tracker, evictable bookkeeping,
// the usage gauges and allocation histogram, key order of prepare_load, the ARC manager scenarios;
// plus kvo's contract for out-of-contract calls, and a randomized invariant check.
#include "manager/offload_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "manager/arc_policy.h"
#include "manager/lru_policy.h"
#include "manager/testing/offload_manager_peer.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

// vLLM's to_key: make_offload_key(str(i).encode(), 0).
OffloadKey K(int i) { return OffloadKey::FromDigest(std::to_string(i), 0); }
std::vector<OffloadKey> Ks(std::initializer_list<int> ids) {
  std::vector<OffloadKey> out;
  for (int i : ids) out.push_back(K(i));
  return out;
}

const RequestContext kCtx{};

std::unique_ptr<OffloadManager> Make(size_t num_blocks, const std::string& policy = "lru",
                                     int64_t store_threshold = 0, size_t max_tracker_size = 64000,
                                     bool events = true) {
  ManagerOptions o;
  o.num_blocks = num_blocks;
  o.eviction_policy = policy;
  o.store_threshold = store_threshold;
  o.max_tracker_size = max_tracker_size;
  o.enable_events = events;
  o.track_blocks = true;
  auto m = OffloadManager::Create(std::move(o));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

std::optional<PrepareStoreOutput> Store(OffloadManager& m, const std::vector<OffloadKey>& keys) {
  auto r = m.PrepareStore(keys, kCtx);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::nullopt;
}

void ExpectStore(const std::optional<PrepareStoreOutput>& out, std::initializer_list<int> keys,
                 std::vector<int32_t> slots, std::initializer_list<int> evicted) {
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->keys_to_store, Ks(keys));
  EXPECT_EQ(out->slots, slots);
  EXPECT_EQ(out->evicted_keys, Ks(evicted));
}

void Complete(OffloadManager& m, const std::vector<OffloadKey>& keys, bool success = true) {
  Status s = m.CompleteStore(keys, kCtx, success);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

std::vector<int32_t> Load(OffloadManager& m, const std::vector<OffloadKey>& keys) {
  auto r = m.PrepareLoad(keys, kCtx);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<int32_t>{};
}

// vLLM's verify_events: the stored and removed key sets, in order, all medium CPU.
void ExpectEvents(OffloadManager& m, std::vector<std::set<int>> stores,
                  std::vector<std::set<int>> evictions) {
  std::vector<std::set<std::string>> got_stores, got_evictions;
  for (const OffloadingEvent& e : m.TakeEvents()) {
    EXPECT_EQ(e.medium, Medium::kCpu);
    std::set<std::string> keys;
    for (const OffloadKey& k : e.keys) keys.insert(std::string(k.digest()));
    (e.removed() ? got_evictions : got_stores).push_back(keys);
  }
  auto names = [](const std::vector<std::set<int>>& sets) {
    std::vector<std::set<std::string>> out;
    for (const auto& s : sets) {
      std::set<std::string> set;
      for (int i : s) set.insert(std::to_string(i));
      out.push_back(set);
    }
    return out;
  };
  EXPECT_EQ(got_stores, names(stores));
  EXPECT_EQ(got_evictions, names(evictions));
}

TEST(OffloadManagerTest, LruTraceMatchesVllm) {
  auto m = Make(4);
  ExpectStore(Store(*m, Ks({1, 2})), {1, 2}, {0, 1}, {});
  // Write in flight, not yet ready.
  EXPECT_EQ(m->Lookup(K(1), kCtx), LookupResult::kHitPending);
  EXPECT_EQ(m->Lookup(K(2), kCtx), LookupResult::kHitPending);
  EXPECT_TRUE(m->TakeEvents().empty());

  Complete(*m, Ks({1, 2}));
  ExpectEvents(*m, {{1, 2}}, {});
  EXPECT_EQ(m->Lookup(K(1), kCtx), LookupResult::kHit);
  EXPECT_EQ(m->Lookup(K(2), kCtx), LookupResult::kHit);
  EXPECT_EQ(m->Lookup(K(3), kCtx), LookupResult::kMiss);

  ExpectStore(Store(*m, Ks({2, 3, 4, 5})), {3, 4, 5}, {2, 3, 0}, {1});
  ExpectEvents(*m, {}, {{1}});

  // No space: everything else is being written.
  EXPECT_FALSE(Store(*m, Ks({1, 6})).has_value());

  Complete(*m, Ks({2, 3, 4, 5}));
  EXPECT_EQ(m->Lookup(K(1), kCtx), LookupResult::kMiss);
  for (int i : {2, 3, 4, 5}) EXPECT_EQ(m->Lookup(K(i), kCtx), LookupResult::kHit) << i;
  EXPECT_EQ(m->Lookup(K(0), kCtx), LookupResult::kMiss);

  EXPECT_EQ(Load(*m, Ks({2, 3})), (std::vector<int32_t>{1, 2}));
  // No space: [2, 3] are being loaded.
  EXPECT_FALSE(Store(*m, Ks({6, 7, 8})).has_value());
  // complete_load makes 2, 3 most recent.
  ASSERT_TRUE(m->CompleteLoad(Ks({2, 3}), kCtx).ok());

  ExpectStore(Store(*m, Ks({6, 7, 8})), {6, 7, 8}, {1, 0, 3}, {4, 5, 2});
  Complete(*m, Ks({6, 7, 8}));

  m->Touch(Ks({3, 6, 7}), kCtx);
  ExpectStore(Store(*m, Ks({9})), {9}, {3}, {8});

  // Failed store of [7, 9]: 7 is ready and stays, 9 goes; no event.
  Complete(*m, Ks({7, 9}), false);
  EXPECT_EQ(m->Lookup(K(7), kCtx), LookupResult::kHit);
  EXPECT_EQ(m->Lookup(K(9), kCtx), LookupResult::kMiss);

  ExpectEvents(*m, {{3, 4, 5}, {6, 7, 8}}, {{4, 5, 2}, {8}});
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*m).ok())
      << OffloadManagerPeer::CheckInvariants(*m).ToString();
}

TEST(OffloadManagerTest, EvictionIsAnnouncedBeforeTheStoreReusingItsSlot) {
  auto m = Make(2);
  Store(*m, Ks({1, 2}));
  Complete(*m, Ks({1, 2}));
  m->TakeEvents();
  Store(*m, Ks({3}));
  Complete(*m, Ks({3}));
  std::vector<OffloadingEvent> events = m->TakeEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0].removed());
  EXPECT_EQ(events[0].reason(), RemovalReason::kEvicted);
  EXPECT_EQ(events[0].keys, Ks({1}));
  EXPECT_FALSE(events[1].removed());
  EXPECT_EQ(events[1].keys, Ks({3}));
}

class BothPoliciesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BothPoliciesTest, AlreadyStoredInputKeysAreNeverEvicted) {
  auto m = Make(4, GetParam());
  Store(*m, Ks({1, 2}));
  Complete(*m, Ks({1, 2}));
  m->Touch(Ks({1}), kCtx);  // 2 becomes the LRU candidate
  // 2 is already stored: filtered from keys_to_store and protected; 1 (slot 0) goes instead.
  ExpectStore(Store(*m, Ks({2, 3, 4, 5})), {3, 4, 5}, {2, 3, 0}, {1});
  Complete(*m, Ks({2, 3, 4, 5}));
  EXPECT_EQ(m->Lookup(K(2), kCtx), LookupResult::kHit);
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*m).ok());
}

TEST_P(BothPoliciesTest, CannotStoreWhenEverythingIsPinnedAndChangesNothing) {
  auto m = Make(4, GetParam());
  Store(*m, Ks({1, 2, 3, 4}));
  Complete(*m, Ks({1, 2, 3, 4}));
  Load(*m, Ks({2, 3}));
  const ManagerStats before = m->GetStats();
  EXPECT_FALSE(Store(*m, Ks({5, 6, 7})).has_value());
  const ManagerStats after = m->GetStats();
  EXPECT_EQ(after.num_evictable, before.num_evictable);
  EXPECT_EQ(after.num_free, before.num_free);
  EXPECT_EQ(after.store_failures, before.store_failures + 1);
  m->TakeEvents();
  ASSERT_TRUE(m->CompleteLoad(Ks({2, 3}), kCtx).ok());
  auto out = Store(*m, Ks({5, 6, 7}));
  ASSERT_TRUE(out.has_value());
  EXPECT_GE(out->evicted_keys.size(), 1u);
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*m).ok());
}

INSTANTIATE_TEST_SUITE_P(Policies, BothPoliciesTest, ::testing::Values("lru", "arc"));

// A CPU tier past the policy table's limit is refused by name (it used to abort the process in
// the table's constructor: ~240M blocks, rc 134).
TEST_P(BothPoliciesTest, TooManyCpuBlocksIsAnErrorNotAnAbort) {
  const size_t limit = MaxPolicyBlocks(GetParam());
  EXPECT_EQ(limit, GetParam() == "arc" ? size_t{1} << 23 : size_t{1} << 25);
  for (const size_t n : {limit + 1, size_t{240'000'000}}) {
    ManagerOptions o;
    o.num_blocks = n;
    o.eviction_policy = GetParam();
    auto m = OffloadManager::Create(std::move(o));
    ASSERT_FALSE(m.ok()) << n;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("num_blocks=" + std::to_string(n) +
                                        ": a CPU tier holds at most " + std::to_string(limit) +
                                        " blocks with the '" + GetParam() + "' policy"),
              std::string::npos)
        << m.status().ToString();
  }
}

TEST(OffloadManagerTest, StoreThresholdSkipsAndCountsCumulatively) {
  auto m = Make(4, "lru", /*store_threshold=*/2);
  ExpectStore(Store(*m, Ks({1, 2, 3})), {}, {}, {});
  EXPECT_EQ(m->GetStats().stores_skipped, 3u);
  EXPECT_EQ(m->GetStats().stores_skipped, 3u);  // cumulative: reading does not reset
}

TEST(OffloadManagerTest, StoreThresholdTrackerIsABoundedLru) {
  auto m = Make(4, "lru", /*store_threshold=*/2, /*max_tracker_size=*/3);
  EXPECT_EQ(m->Lookup(K(1), kCtx), LookupResult::kMiss);
  EXPECT_EQ(m->Lookup(K(2), kCtx), LookupResult::kMiss);
  ExpectStore(Store(*m, Ks({1, 2})), {}, {}, {});         // counted once each: filtered
  EXPECT_EQ(m->Lookup(K(1), kCtx), LookupResult::kMiss);  // 1 counted twice now
  ExpectStore(Store(*m, Ks({1, 2})), {1}, {0}, {});
  // 3 and 4 push 2 (least recently counted) out of the 3-entry tracker: [1, 3, 4].
  EXPECT_EQ(m->Lookup(K(3), kCtx), LookupResult::kMiss);
  EXPECT_EQ(m->Lookup(K(4), kCtx), LookupResult::kMiss);
  // 2 comes back with count 1: still not eligible.
  EXPECT_EQ(m->Lookup(K(2), kCtx), LookupResult::kMiss);
  ExpectStore(Store(*m, Ks({2})), {}, {}, {});
  Complete(*m, Ks({1}));
  // One more count makes it eligible.
  EXPECT_EQ(m->Lookup(K(2), kCtx), LookupResult::kMiss);
  ExpectStore(Store(*m, Ks({2})), {2}, {1}, {});
  EXPECT_EQ(m->GetStats().stores_skipped, 4u);
}

TEST(OffloadManagerTest, UsageGauges) {
  EXPECT_EQ(Make(0)->GetStats().usage, 0.0);  // zero capacity always reports 0
  auto m = Make(4);
  EXPECT_EQ(m->GetStats().usage, 0.0);
  Store(*m, Ks({1, 2}));
  EXPECT_DOUBLE_EQ(m->GetStats().usage, 0.5);
  EXPECT_DOUBLE_EQ(m->GetStats().write_usage, 0.5);
  EXPECT_DOUBLE_EQ(m->GetStats().read_usage, 0.0);
  Store(*m, Ks({3, 4}));
  EXPECT_DOUBLE_EQ(m->GetStats().usage, 1.0);
  Complete(*m, Ks({1, 2}));
  EXPECT_DOUBLE_EQ(m->GetStats().usage, 0.5);
  Complete(*m, Ks({3, 4}));
  EXPECT_DOUBLE_EQ(m->GetStats().usage, 0.0);
  EXPECT_DOUBLE_EQ(m->GetStats().write_usage, 0.0);

  // Read pins, then write and read pins together (additive).
  EXPECT_EQ(m->Lookup(K(1), kCtx), LookupResult::kHit);
  Load(*m, Ks({1}));
  ManagerStats s = m->GetStats();
  EXPECT_DOUBLE_EQ(s.usage, 0.25);
  EXPECT_DOUBLE_EQ(s.read_usage, 0.25);
  EXPECT_DOUBLE_EQ(s.write_usage, 0.0);
  ASSERT_TRUE(m->CompleteLoad(Ks({1}), kCtx).ok());
  EXPECT_DOUBLE_EQ(m->GetStats().usage, 0.0);
  Store(*m, Ks({5, 6}));  // evicts two of 1..4
  Load(*m, Ks({4}));
  s = m->GetStats();
  EXPECT_DOUBLE_EQ(s.write_usage, 0.5);
  EXPECT_DOUBLE_EQ(s.read_usage, 0.25);
  EXPECT_DOUBLE_EQ(s.usage, 0.75);
}

TEST(OffloadManagerTest, FailedStoreClearsWriteUsage) {
  auto m = Make(4);
  Store(*m, Ks({1, 2}));
  EXPECT_DOUBLE_EQ(m->GetStats().write_usage, 0.5);
  Complete(*m, Ks({1, 2}), false);
  const ManagerStats s = m->GetStats();
  EXPECT_DOUBLE_EQ(s.write_usage, 0.0);
  EXPECT_DOUBLE_EQ(s.usage, 0.0);
  EXPECT_EQ(s.num_free, 4u);
  EXPECT_TRUE(m->TakeEvents().empty());  // no event, not even a removal
}

TEST(OffloadManagerTest, AllocationHistogramCountsNewKeysIncludingFailures) {
  auto m = Make(4);
  Store(*m, Ks({1, 2}));
  Complete(*m, Ks({1, 2}));
  Store(*m, Ks({1, 2, 3}));  // one new key
  ManagerStats s = m->GetStats();
  EXPECT_EQ(s.allocation_count, 2u);
  EXPECT_EQ(s.allocation_sum, 3u);
  EXPECT_EQ(s.allocation_buckets[0], 1u);  // <= 1
  EXPECT_EQ(s.allocation_buckets[1], 1u);  // <= 4

  auto one = Make(1);
  Store(*one, Ks({1}));
  EXPECT_FALSE(Store(*one, Ks({2})).has_value());  // eviction impossible: still recorded
  s = one->GetStats();
  EXPECT_EQ(s.allocation_count, 2u);
  EXPECT_EQ(s.allocation_sum, 2u);
}

TEST(OffloadManagerTest, PrepareLoadPreservesKeyOrder) {
  auto m = Make(4);
  auto out = Store(*m, Ks({0, 1, 2}));
  ASSERT_TRUE(out.has_value());
  Complete(*m, Ks({0, 1, 2}));
  const std::vector<int32_t>& s = out->slots;
  EXPECT_EQ(Load(*m, Ks({0, 1, 2})), (std::vector<int32_t>{s[0], s[1], s[2]}));
  ASSERT_TRUE(m->CompleteLoad(Ks({0, 1, 2}), kCtx).ok());
  EXPECT_EQ(Load(*m, Ks({1, 2, 0})), (std::vector<int32_t>{s[1], s[2], s[0]}));
  ASSERT_TRUE(m->CompleteLoad(Ks({0, 1, 2}), kCtx).ok());  // order irrelevant
}

// Forwards to a real policy and counts the calls the manager makes.
class SpyPolicy : public CachePolicy {
 public:
  explicit SpyPolicy(std::unique_ptr<CachePolicy> inner) : inner_(std::move(inner)) {}
  BlockStatus* Get(const OffloadKey& key) override { return inner_->Get(key); }
  void Insert(const OffloadKey& key, BlockStatus block) override { inner_->Insert(key, block); }
  void Remove(const OffloadKey& key) override { inner_->Remove(key); }
  void Touch(std::span<const OffloadKey> keys) override {
    touched.emplace_back(keys.begin(), keys.end());
    inner_->Touch(keys);
  }
  std::optional<std::vector<std::pair<OffloadKey, BlockStatus>>> Evict(
      size_t n, std::span<const OffloadKey> protected_keys) override {
    ++evict_calls;
    return inner_->Evict(n, protected_keys);
  }
  void Clear() override { inner_->Clear(); }
  void MarkEvictable(const OffloadKey& key) override { inner_->MarkEvictable(key); }
  void MarkNonEvictable(const OffloadKey& key) override { inner_->MarkNonEvictable(key); }
  size_t size() const override { return inner_->size(); }
  size_t num_evictable() const override { return inner_->num_evictable(); }
  Status CheckInvariants() const override { return inner_->CheckInvariants(); }

  int evict_calls = 0;
  std::vector<std::vector<OffloadKey>> touched;

 private:
  std::unique_ptr<CachePolicy> inner_;
};

std::unique_ptr<OffloadManager> MakeWithSpy(size_t num_blocks, SpyPolicy** spy) {
  ManagerOptions o;
  o.num_blocks = num_blocks;
  o.track_blocks = true;
  o.policy_factory = [spy](size_t capacity) {
    auto p = std::make_unique<SpyPolicy>(NewLruPolicy(capacity));
    *spy = p.get();
    return p;
  };
  return std::move(OffloadManager::Create(std::move(o))).value();
}

TEST(OffloadManagerTest, EvictableCountBookkeeping) {
  SpyPolicy* spy = nullptr;
  auto m = MakeWithSpy(4, &spy);
  auto evictable = [&] { return m->GetStats().num_evictable; };
  EXPECT_EQ(evictable(), 0u);
  Store(*m, Ks({1, 2, 3}));
  EXPECT_EQ(evictable(), 0u);
  Complete(*m, Ks({1, 2, 3}));
  EXPECT_EQ(evictable(), 3u);
  Load(*m, Ks({1}));
  EXPECT_EQ(evictable(), 2u);
  Load(*m, Ks({1}));  // a second concurrent load: no double decrement
  EXPECT_EQ(evictable(), 2u);
  ASSERT_TRUE(m->CompleteLoad(Ks({1}), kCtx).ok());
  EXPECT_EQ(evictable(), 2u);  // ref_cnt still 1
  ASSERT_TRUE(m->CompleteLoad(Ks({1}), kCtx).ok());
  EXPECT_EQ(evictable(), 3u);
  Store(*m, Ks({4, 5, 6}));  // 1 free slot + 2 evictions
  EXPECT_EQ(evictable(), 1u);
  Complete(*m, Ks({4, 5, 6}), false);
  EXPECT_EQ(evictable(), 1u);
  m->ResetCache();
  EXPECT_EQ(evictable(), 0u);

  Store(*m, Ks({10, 11, 12}));
  Complete(*m, Ks({10, 11, 12}));
  Load(*m, Ks({10, 11, 12}));
  EXPECT_EQ(evictable(), 0u);
  const int calls = spy->evict_calls;
  EXPECT_FALSE(Store(*m, Ks({14, 15})).has_value());
  EXPECT_EQ(spy->evict_calls, calls) << "nothing evictable must fail before calling Evict";
  ASSERT_TRUE(m->CompleteLoad(Ks({10, 11, 12}), kCtx).ok());
  EXPECT_EQ(evictable(), 3u);
  EXPECT_TRUE(Store(*m, Ks({14, 15})).has_value());
  EXPECT_EQ(evictable(), 2u);
  Complete(*m, Ks({14, 15}));
  EXPECT_EQ(evictable(), 4u);
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*m).ok());
}

TEST(OffloadManagerTest, TouchReachesThePolicyInOrder) {
  SpyPolicy* spy = nullptr;
  auto m = MakeWithSpy(4, &spy);
  RequestContext ctx;
  ctx.req_id = "test-req";
  m->Touch(Ks({1, 2}), ctx);
  ASSERT_EQ(spy->touched.size(), 1u);
  EXPECT_EQ(spy->touched[0], Ks({1, 2}));
}

TEST(OffloadManagerTest, DuplicateInputKeysAreStoredOnce) {
  auto m = Make(4);
  ExpectStore(Store(*m, Ks({1, 1, 2})), {1, 2}, {0, 1}, {});
  Complete(*m, Ks({1, 2, 1}));
  ExpectEvents(*m, {{1, 2}}, {});
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*m).ok());
}

// ---- kvo's contract: out-of-contract calls fail and change nothing ----

TEST(OffloadManagerTest, PrepareLoadOfMissingOrNotReadyKeyFailsWithoutSideEffects) {
  auto m = Make(4);
  Store(*m, Ks({1, 2}));
  Complete(*m, Ks({1}));
  auto missing = m->PrepareLoad(Ks({1, 3}), kCtx);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find(K(3).Hex()), std::string::npos);
  auto pending = m->PrepareLoad(Ks({1, 2}), kCtx);
  ASSERT_FALSE(pending.ok());
  EXPECT_NE(pending.status().message().find("not ready"), std::string::npos);
  // 1 was not pinned by either call.
  EXPECT_EQ(m->GetStats().num_evictable, 1u);
  EXPECT_FALSE(m->CompleteLoad(Ks({1}), kCtx).ok());
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*m).ok());
}

TEST(OffloadManagerTest, DoubleCompleteLoadFailsAndRollsBack) {
  auto m = Make(4);
  Store(*m, Ks({1, 2}));
  Complete(*m, Ks({1, 2}));
  Load(*m, Ks({1, 2}));
  // [2, 1, 1]: 1 is pinned once; the whole call fails and 2 stays pinned.
  Status s = m->CompleteLoad(Ks({2, 1, 1}), kCtx);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(m->GetStats().num_evictable, 0u);
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*m).ok())
      << OffloadManagerPeer::CheckInvariants(*m).ToString();
  ASSERT_TRUE(m->CompleteLoad(Ks({1, 2}), kCtx).ok());
  EXPECT_FALSE(m->CompleteLoad(Ks({1}), kCtx).ok());  // double complete
  EXPECT_EQ(m->GetStats().num_evictable, 2u);
  EXPECT_FALSE(m->CompleteLoad(Ks({7}), kCtx).ok());  // unknown key
}

TEST(OffloadManagerTest, CompleteStoreIgnoresKeysNotPendingAndCompletesTheRest) {
  // vLLM's complete_store skips keys that are absent (never prepared, evicted, reset) or already
  // ready, and applies the others: no error, nothing half-applied.
  auto m = Make(4);
  Store(*m, Ks({1, 2}));
  ASSERT_TRUE(m->CompleteStore(Ks({1, 9, 2}), kCtx, true).ok());
  EXPECT_EQ(m->Lookup(K(1), kCtx), LookupResult::kHit);
  EXPECT_EQ(m->Lookup(K(2), kCtx), LookupResult::kHit);
  EXPECT_EQ(m->Lookup(K(9), kCtx), LookupResult::kMiss);
  std::vector<OffloadingEvent> events = m->TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].keys, Ks({1, 2}));
  EXPECT_EQ(m->GetStats().num_pending_writes, 0u);
  // A failed completion of unknown and ready keys changes nothing.
  ASSERT_TRUE(m->CompleteStore(Ks({9, 1}), kCtx, false).ok());
  EXPECT_EQ(m->Lookup(K(1), kCtx), LookupResult::kHit);
  // The already-ready case stays silent (no duplicate event).
  Complete(*m, Ks({1, 2}));
  EXPECT_TRUE(m->TakeEvents().empty());
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*m).ok())
      << OffloadManagerPeer::CheckInvariants(*m).ToString();
}

TEST(OffloadManagerTest, ResetClearsEverythingAndAnnouncesTheReadyCpuBlocksRemoved) {
  auto m = Make(4);
  Store(*m, Ks({1, 2, 3}));
  Complete(*m, Ks({1, 2}));
  m->TakeEvents();
  m->ResetCache();
  const ManagerStats s = m->GetStats();
  EXPECT_EQ(s.num_stored, 0u);
  EXPECT_EQ(s.num_free, 4u);
  EXPECT_EQ(s.num_pending_writes, 0u);
  std::vector<OffloadingEvent> events = m->TakeEvents();
  // One CPU removal of what was announced (3 was still being written: never announced).
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(events[0].removed());
  EXPECT_EQ(events[0].medium, Medium::kCpu);
  EXPECT_EQ(events[0].reason(), RemovalReason::kCleared);
  EXPECT_EQ(events[0].keys, Ks({1, 2}));  // slot order
  // Slots start over from 0 after a reset.
  ExpectStore(Store(*m, Ks({5})), {5}, {0}, {});
  ASSERT_TRUE(m->CompleteStore(Ks({3}), kCtx, true).ok());  // a stale completion: ignored
  EXPECT_EQ(m->Lookup(K(3), kCtx), LookupResult::kMiss);
  EXPECT_TRUE(m->TakeEvents().empty());
}

TEST(OffloadManagerTest, CreateRejectsUnknownPolicy) {
  ManagerOptions o;
  o.num_blocks = 4;
  o.eviction_policy = "nope";
  auto m = OffloadManager::Create(std::move(o));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("nope"), std::string::npos);
}

// ---- ARC through the manager (vLLM's TestARCPolicy) ----

ArcPolicy& Arc(OffloadManager& m) {
  return dynamic_cast<ArcPolicy&>(OffloadManagerPeer::CpuPolicy(m));
}

TEST(OffloadManagerArcTest, Basic) {
  auto m = Make(4, "arc");
  ExpectStore(Store(*m, Ks({1, 2})), {1, 2}, {0, 1}, {});
  EXPECT_EQ(m->Lookup(K(1), kCtx), LookupResult::kHitPending);
  EXPECT_TRUE(m->TakeEvents().empty());
  Complete(*m, Ks({1, 2}));
  ExpectEvents(*m, {{1, 2}}, {});
  EXPECT_EQ(m->Lookup(K(1), kCtx), LookupResult::kHit);
  EXPECT_EQ(m->Lookup(K(3), kCtx), LookupResult::kMiss);
  EXPECT_EQ(Arc(*m).ListSize(ArcPolicy::List::kT1), 2u);
  EXPECT_EQ(Arc(*m).ListSize(ArcPolicy::List::kT2), 0u);
}

TEST(OffloadManagerArcTest, TouchPromotesToT2AndGhostHitRaisesTarget) {
  auto m = Make(2, "arc", 0, 64000, false);
  Store(*m, Ks({1}));
  Complete(*m, Ks({1}));
  EXPECT_EQ(Arc(*m).Where(K(1)), ArcPolicy::List::kT1);
  m->Touch(Ks({1}), kCtx);
  EXPECT_EQ(Arc(*m).Where(K(1)), ArcPolicy::List::kT2);

  auto g = Make(2, "arc", 0, 64000, false);
  Store(*g, Ks({1, 2}));
  Complete(*g, Ks({1, 2}));
  const double target = Arc(*g).target_t1_size();
  Store(*g, Ks({3}));
  Complete(*g, Ks({3}));
  EXPECT_EQ(Arc(*g).Where(K(1)), ArcPolicy::List::kB1);
  g->Touch(Ks({1}), kCtx);
  EXPECT_GT(Arc(*g).target_t1_size(), target);
}

TEST(OffloadManagerArcTest, EvictionFollowsTargetAndTouchOrdering) {
  auto m = Make(4, "arc", 0, 64000, false);
  Store(*m, Ks({1, 2, 3, 4}));
  Complete(*m, Ks({1, 2, 3, 4}));
  m->Touch(Ks({3, 4}), kCtx);
  Arc(*m).set_target_t1_size_for_testing(1);
  auto out = Store(*m, Ks({5}));
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->evicted_keys, Ks({1}));
  Complete(*m, Ks({5}));
  EXPECT_EQ(Arc(*m).Where(K(1)), ArcPolicy::List::kB1);
  EXPECT_EQ(Arc(*m).Where(K(5)), ArcPolicy::List::kT1);

  auto t = Make(4, "arc");
  Store(*t, Ks({1, 2, 3, 4}));
  Complete(*t, Ks({1, 2, 3, 4}));
  t->Touch(Ks({3, 4}), kCtx);
  t->Touch(Ks({1, 3, 4}), kCtx);
  EXPECT_EQ(Arc(*t).ListSize(ArcPolicy::List::kT1), 1u);
  EXPECT_EQ(Arc(*t).ListSize(ArcPolicy::List::kT2), 3u);
  ExpectStore(Store(*t, Ks({5})), {5}, {1}, {2});  // reuses block 2's slot
}

TEST(OffloadManagerArcTest, GhostListsStayBoundedAndFailedStoreCleansUp) {
  auto m = Make(2, "arc", 0, 64000, false);
  Store(*m, Ks({1, 2}));
  Complete(*m, Ks({1, 2}));
  for (int i = 3; i < 20; ++i) {
    Store(*m, Ks({i}));
    Complete(*m, Ks({i}));
  }
  EXPECT_LE(Arc(*m).ListSize(ArcPolicy::List::kB1), 2u);
  EXPECT_LE(Arc(*m).ListSize(ArcPolicy::List::kB2), 2u);

  auto f = Make(4, "arc");
  Store(*f, Ks({1, 2, 3, 4}));
  Complete(*f, Ks({1, 2, 3, 4}));
  auto out = Store(*f, Ks({5}));
  ASSERT_TRUE(out.has_value());
  ASSERT_EQ(out->evicted_keys.size(), 1u);
  Complete(*f, Ks({5}), false);
  EXPECT_EQ(f->Lookup(K(5), kCtx), LookupResult::kMiss);
  EXPECT_FALSE(Arc(*f).Where(K(5)).has_value());
  EXPECT_EQ(Arc(*f).Where(out->evicted_keys[0]), ArcPolicy::List::kB1);
  EXPECT_TRUE(OffloadManagerPeer::CheckInvariants(*f).ok());
}

TEST(OffloadManagerArcTest, FullScenarioKeepsFrequentBlocks) {
  auto m = Make(4, "arc");
  Store(*m, Ks({1, 2}));
  Complete(*m, Ks({1, 2}));
  auto out = Store(*m, Ks({3, 4, 5}));
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->evicted_keys.size(), 1u);
  Complete(*m, Ks({3, 4, 5}));
  m->Touch(Ks({2, 3}), kCtx);
  EXPECT_EQ(Arc(*m).ListSize(ArcPolicy::List::kT1), 2u);
  EXPECT_EQ(Arc(*m).ListSize(ArcPolicy::List::kT2), 2u);
  ASSERT_TRUE(Store(*m, Ks({6})).has_value());
  Complete(*m, Ks({6}));
  EXPECT_EQ(m->Lookup(K(2), kCtx), LookupResult::kHit);
  EXPECT_EQ(m->Lookup(K(3), kCtx), LookupResult::kHit);
  EXPECT_FALSE(m->TakeEvents().empty());
}

// ---- randomized: invariants hold after every operation ----

TEST_P(BothPoliciesTest, RandomOperationsKeepInvariants) {
  const unsigned seed = kvo::testing::TestSeed();
  std::mt19937 rng(seed);
  auto m = Make(16, GetParam(), 0, 64000, true);
  std::vector<std::vector<OffloadKey>> writing, loading;
  auto pick_keys = [&](size_t n) {
    std::vector<OffloadKey> keys;
    for (size_t i = 0; i < n; ++i) keys.push_back(K(static_cast<int>(rng() % 40)));
    return keys;
  };
  for (int step = 0; step < 5000; ++step) {
    switch (rng() % 7) {
      case 0:
      case 1: {
        auto out = Store(*m, pick_keys(1 + rng() % 6));
        if (out && !out->keys_to_store.empty()) writing.push_back(out->keys_to_store);
        break;
      }
      case 2:
        if (!writing.empty()) {
          const size_t i = rng() % writing.size();
          Complete(*m, writing[i], rng() % 5 != 0);
          writing.erase(writing.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
      case 3: {
        std::vector<OffloadKey> keys;
        for (const OffloadKey& k : pick_keys(1 + rng() % 4)) {
          if (m->Lookup(k, kCtx) == LookupResult::kHit) keys.push_back(k);
        }
        if (!keys.empty()) {
          Load(*m, keys);
          loading.push_back(keys);
        }
        break;
      }
      case 4:
        if (!loading.empty()) {
          const size_t i = rng() % loading.size();
          ASSERT_TRUE(m->CompleteLoad(loading[i], kCtx).ok());
          loading.erase(loading.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
      case 5:
        m->Touch(pick_keys(1 + rng() % 5), kCtx);
        break;
      case 6: {
        // Out of contract: must fail or succeed atomically, never corrupt.
        std::vector<OffloadKey> keys = pick_keys(2);
        (void)m->PrepareLoad(keys, kCtx);
        if (m->PrepareLoad(keys, kCtx).ok()) {
          ASSERT_TRUE(m->CompleteLoad(keys, kCtx).ok());
          ASSERT_TRUE(m->CompleteLoad(keys, kCtx).ok());
        }
        break;
      }
    }
    Status s = OffloadManagerPeer::CheckInvariants(*m);
    ASSERT_TRUE(s.ok()) << "step " << step << " seed " << seed << ": " << s.ToString();
  }
}

}  // namespace
}  // namespace kvo

namespace kvo {
namespace {

// MaximalPrefixLookup (prefetching prefix scan) against the per-key Lookup loop it replaces, on
// two managers driven by the same random stores, completions and failures: same hit counts,
// same deferral, and — through store_threshold's tracker — the same later prepare_store answers.
TEST(OffloadManagerPrefixLookupTest, EqualsThePerKeyLoopIncludingThresholdCounting) {
  const unsigned seed = kvo::testing::TestSeed();
  std::mt19937 rng(seed);
  int scans_with_hits = 0, deferred_scans = 0;
  for (const char* policy : {"lru", "arc"}) {
    auto a = Make(24, policy, /*store_threshold=*/2, /*max_tracker_size=*/40);
    auto b = Make(24, policy, 2, 40);
    for (int step = 0; step < 600; ++step) {
      std::vector<OffloadKey> keys;
      const int start = static_cast<int>(rng() % 60);
      const int len = 1 + static_cast<int>(rng() % 12);
      for (int i = 0; i < len; ++i) keys.push_back(K(start + i));
      const int op = static_cast<int>(rng() % 3);
      if (op == 0) {
        // The scheduler's scan vs the loop.
        const auto fast = a->MaximalPrefixLookup(keys, kCtx);
        size_t hits = 0;
        bool deferred = false;
        for (const OffloadKey& k : keys) {
          const LookupResult r = b->Lookup(k, kCtx);
          if (r == LookupResult::kMiss) break;
          deferred |= r != LookupResult::kHit;
          ++hits;
        }
        ASSERT_EQ(fast.hits, hits) << policy << " step " << step << " seed " << seed;
        ASSERT_EQ(fast.deferred, deferred) << policy << " step " << step << " seed " << seed;
        scans_with_hits += hits > 0 ? 1 : 0;
        deferred_scans += deferred ? 1 : 0;
      } else {
        auto sa = a->PrepareStore(keys, kCtx);
        auto sb = b->PrepareStore(keys, kCtx);
        ASSERT_TRUE(sa.ok() && sb.ok());
        ASSERT_EQ(sa->has_value(), sb->has_value())
            << policy << " step " << step << " seed " << seed;
        if (!sa->has_value()) continue;
        ASSERT_EQ((*sa)->keys_to_store, (*sb)->keys_to_store) << "seed " << seed;
        ASSERT_EQ((*sa)->slots, (*sb)->slots) << "seed " << seed;
        if (op == 1 || rng() % 4 != 0) {  // most stores complete (a few stay pending)
          const bool ok = rng() % 8 != 0;
          ASSERT_TRUE(a->CompleteStore((*sa)->keys_to_store, kCtx, ok).ok());
          ASSERT_TRUE(b->CompleteStore((*sb)->keys_to_store, kCtx, ok).ok());
        }
      }
    }
  }
  // The walk covered hits and pending blocks, not just misses.
  EXPECT_GT(scans_with_hits, 20) << "seed " << seed;
  EXPECT_GT(deferred_scans, 2) << "seed " << seed;
}

}  // namespace
}  // namespace kvo
