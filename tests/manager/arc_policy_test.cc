// ArcPolicy: vLLM's arc.py behaviours (B.7) and the ARC cases of vLLM's test_manager.py replayed
// at the policy level, plus random operation sequences against a plain std::list model of the
// same rules (with and without the #55461 T1 fallback).
#include "manager/arc_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <list>
#include <map>
#include <random>
#include <set>

#include "tests/manager/policy_test_util.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

using policy_test::CompleteStore;
using policy_test::ExpectOk;
using policy_test::Key;
using policy_test::Keys;
using policy_test::NotReady;
using policy_test::Pin;
using policy_test::Ready;
using policy_test::Store;
using policy_test::Unpin;
using policy_test::VictimKeys;
using List = ArcPolicy::List;

TEST(ArcPolicyTest, InsertsGoToT1) {
  ArcPolicy p(4);
  p.Insert(Key(1), NotReady(0));
  p.Insert(Key(2), NotReady(1));
  EXPECT_EQ(p.Keys(List::kT1), Keys({1, 2}));
  EXPECT_EQ(p.ListSize(List::kT2), 0u);
  EXPECT_EQ(p.size(), 2u);
  EXPECT_EQ(p.num_evictable(), 0u);
  CompleteStore(p, {1, 2});
  EXPECT_EQ(p.num_evictable(), 2u);
  EXPECT_EQ(p.Keys(List::kT1), Keys({1, 2}));  // completion does not reorder ARC lists
  ExpectOk(p);
}

TEST(ArcPolicyTest, TouchPromotesReadyT1BlocksToT2) {
  ArcPolicy p(4);
  Store(p, {1});
  p.Touch(Keys({1}));
  EXPECT_EQ(p.Where(Key(1)), List::kT2);
  EXPECT_EQ(p.ListSize(List::kT1), 0u);
  ExpectOk(p);
}

// vLLM #34576: a block still being written is re-inserted at the T1 MRU end, not promoted.
TEST(ArcPolicyTest, TouchKeepsUnreadyBlocksInT1AtMru) {
  ArcPolicy p(4);
  p.Insert(Key(1), NotReady(0));
  Store(p, {2});
  p.Touch(Keys({1}));
  EXPECT_EQ(p.Keys(List::kT1), Keys({2, 1}));
  EXPECT_EQ(p.ListSize(List::kT2), 0u);
  ExpectOk(p);
}

TEST(ArcPolicyTest, TouchOrdering) {
  ArcPolicy p(4);
  Store(p, {1, 2, 3, 4});
  p.Touch(Keys({3, 4}));  // reversed: 4 then 3 to T2
  EXPECT_EQ(p.Keys(List::kT1), Keys({1, 2}));
  EXPECT_EQ(p.Keys(List::kT2), Keys({4, 3}));
  p.Touch(Keys({1, 3, 4}));  // 4, 3 to T2 MRU, then 1 promoted
  EXPECT_EQ(p.Keys(List::kT1), Keys({2}));
  EXPECT_EQ(p.Keys(List::kT2), Keys({4, 3, 1}));
  // A repeated key: promoted by its last occurrence, then moved to MRU by its first.
  p.Touch(Keys({2, 4, 2}));
  EXPECT_EQ(p.Keys(List::kT2), Keys({3, 1, 4, 2}));
  // store 5 evicts from T1 if any there: T1 is empty now, so T2's LRU goes.
  p.Insert(Key(5), NotReady(9));
  auto v = p.Evict(1, Keys({5}));
  EXPECT_EQ(VictimKeys(v), Keys({3}));
  EXPECT_EQ(p.Where(Key(3)), List::kB2);
  ExpectOk(p);
}

// vLLM TestARCPolicy.test_touch_ordering: the T1 block goes.
TEST(ArcPolicyTest, VllmTouchOrderingEvictsTheOnlyT1Block) {
  ArcPolicy p(4);
  Store(p, {1, 2, 3, 4});
  p.Touch(Keys({3, 4}));
  p.Touch(Keys({1, 3, 4}));
  EXPECT_EQ(p.ListSize(List::kT1), 1u);
  EXPECT_EQ(p.ListSize(List::kT2), 3u);
  auto v = p.Evict(1, Keys({5}));
  EXPECT_EQ(VictimKeys(v), Keys({2}));
  EXPECT_EQ((*v)[0].second.slot, 1);
}

TEST(ArcPolicyTest, GetChecksT1ThenT2AndNotGhosts) {
  ArcPolicy p(2);
  Store(p, {1, 2});
  p.Touch(Keys({2}));
  ASSERT_NE(p.Get(Key(1)), nullptr);
  ASSERT_NE(p.Get(Key(2)), nullptr);
  EXPECT_EQ(p.Get(Key(2))->slot, 1);
  auto v = p.Evict(1, {});
  EXPECT_EQ(VictimKeys(v), Keys({1}));
  EXPECT_EQ(p.Where(Key(1)), List::kB1);
  EXPECT_EQ(p.Get(Key(1)), nullptr);
  EXPECT_EQ(p.size(), 1u);
}

TEST(ArcPolicyTest, PinnedBlocksAreNotEvicted) {
  ArcPolicy p(4);
  Store(p, {1, 2, 3, 4});
  Pin(p, 2);
  Pin(p, 3);
  EXPECT_EQ(p.num_evictable(), 2u);
  EXPECT_FALSE(p.Evict(3, Keys({5, 6, 7})).has_value());
  Unpin(p, 2);
  Unpin(p, 3);
  auto v = p.Evict(3, Keys({5, 6, 7}));
  EXPECT_EQ(VictimKeys(v), Keys({1, 2, 3}));
  ExpectOk(p);
}

TEST(ArcPolicyTest, ProtectedKeysAreNeverEvicted) {
  ArcPolicy p(8);
  Store(p, {1, 2, 3, 4});
  p.Touch(Keys({3}));
  // T1 = [1, 2, 4], T2 = [3]; target 0 so T1 first.
  auto v = p.Evict(2, Keys({1, 4}));
  EXPECT_EQ(VictimKeys(v), Keys({2, 3}));
  std::vector<OffloadKey> many;
  for (int i = 100; i < 140; ++i) many.push_back(Key(i));
  many.push_back(Key(1));
  v = p.Evict(1, many);  // hashed protected set
  EXPECT_EQ(VictimKeys(v), Keys({4}));
  ExpectOk(p);
}

// vLLM test_already_stored_block_not_evicted_during_prepare_store, for ARC.
TEST(ArcPolicyTest, AlreadyStoredInputKeyIsNotEvicted) {
  ArcPolicy p(4);
  Store(p, {1, 2});
  p.Touch(Keys({1}));  // T1 = [2], T2 = [1]
  auto v = p.Evict(1, Keys({2, 3, 4, 5}));
  EXPECT_EQ(VictimKeys(v), Keys({1}));
  EXPECT_NE(p.Get(Key(2)), nullptr);
}

TEST(ArcPolicyTest, EvictionSourceFollowsTheTarget) {
  ArcPolicy p(4);
  Store(p, {1, 2, 3, 4});
  p.Touch(Keys({3, 4}));  // T1 = [1, 2], T2 = [4, 3]
  p.set_target_t1_size_for_testing(1);
  auto v = p.Evict(1, Keys({5}));  // |T1| 2 >= 1: T1
  EXPECT_EQ(VictimKeys(v), Keys({1}));
  EXPECT_EQ(p.Where(Key(1)), List::kB1);
  p.set_target_t1_size_for_testing(2.9);  // int(2.9) = 2 > |T1| 1: T2
  v = p.Evict(1, {});
  EXPECT_EQ(VictimKeys(v), Keys({4}));
  EXPECT_EQ(p.Where(Key(4)), List::kB2);
  ExpectOk(p);
}

// One monotonic pass per list, T1/T2 interleaved by the virtual |T1| (vLLM #50992).
TEST(ArcPolicyTest, BatchEvictionOrderFollowsTheVirtualT1Size) {
  ArcPolicy p(16);
  Store(p, {1, 2, 3, 4, 5, 6});
  p.Touch(Keys({6, 5, 4}));  // T1 = [1, 2, 3], T2 = [4, 5, 6]
  Pin(p, 1);
  p.set_target_t1_size_for_testing(2);
  // virtual |T1| = 3 >= 2: 2 (skipping pinned 1), virtual 2 >= 2: 3, virtual 1 < 2: T2's 4, 5.
  auto v = p.Evict(4, {});
  EXPECT_EQ(VictimKeys(v), Keys({2, 3, 4, 5}));
  EXPECT_EQ(p.Keys(List::kB1), Keys({2, 3}));
  EXPECT_EQ(p.Keys(List::kB2), Keys({4, 5}));
  EXPECT_EQ(p.Keys(List::kT1), Keys({1}));
  EXPECT_EQ(p.Keys(List::kT2), Keys({6}));
  ExpectOk(p);
}

// When T1 has no eligible entry left the scan continues in T2, even though |T1| >= target.
TEST(ArcPolicyTest, ExhaustedT1FallsBackToT2) {
  ArcPolicy p(8);
  Store(p, {1, 2, 3, 4});
  p.Touch(Keys({3, 4}));  // T1 = [1, 2], T2 = [4, 3]
  auto v = p.Evict(3, Keys({2}));
  EXPECT_EQ(VictimKeys(v), Keys({1, 4, 3}));
  ExpectOk(p);
}

// vLLM #55461: T2 exhausted while |T1| < target falls back to T1; the snapshot fails instead.
TEST(ArcPolicyTest, ExhaustedT2FallsBackToT1ByDefault) {
  for (bool fallback : {true, false}) {
    SCOPED_TRACE(fallback ? "t1_fallback" : "snapshot");
    ArcPolicy p(8, ArcOptions{.t1_fallback = fallback});
    Store(p, {1, 2, 3});
    p.Touch(Keys({3}));  // T1 = [1, 2], T2 = [3]
    p.set_target_t1_size_for_testing(5);
    auto v = p.Evict(2, {});
    if (fallback) {
      EXPECT_EQ(VictimKeys(v), Keys({3, 1}));
      EXPECT_EQ(p.Keys(List::kB1), Keys({1}));
      EXPECT_EQ(p.Keys(List::kB2), Keys({3}));
    } else {
      EXPECT_FALSE(v.has_value());
      EXPECT_EQ(p.Keys(List::kT1), Keys({1, 2}));
      EXPECT_EQ(p.Keys(List::kT2), Keys({3}));
      EXPECT_EQ(p.ListSize(List::kB1) + p.ListSize(List::kB2), 0u);
    }
    ExpectOk(p);
  }
}

TEST(ArcPolicyTest, EvictIsAtomic) {
  ArcPolicy p(4);
  Store(p, {1, 2, 3, 4});
  p.Touch(Keys({4}));
  p.Insert(Key(5), NotReady(4));
  Pin(p, 2);
  const auto t1 = p.Keys(List::kT1);
  const auto t2 = p.Keys(List::kT2);
  EXPECT_FALSE(p.Evict(4, {}).has_value());
  EXPECT_FALSE(p.Evict(3, Keys({4})).has_value());
  EXPECT_EQ(p.Keys(List::kT1), t1);
  EXPECT_EQ(p.Keys(List::kT2), t2);
  EXPECT_EQ(p.ListSize(List::kB1) + p.ListSize(List::kB2), 0u);
  EXPECT_EQ(p.num_evictable(), 3u);
  auto v = p.Evict(0, {});
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->empty());
  ExpectOk(p);
}

TEST(ArcPolicyTest, GhostHitsAdaptTheTargetBothWays) {
  ArcPolicy p(4);
  Store(p, {1, 2, 3, 4});
  p.Touch(Keys({3, 4}));                             // T1 = [1, 2], T2 = [4, 3]
  EXPECT_EQ(VictimKeys(p.Evict(1, {})), Keys({1}));  // target 0: T1 -> B1
  p.set_target_t1_size_for_testing(3);
  EXPECT_EQ(VictimKeys(p.Evict(2, {})), Keys({4, 3}));  // |T1| 1 < 3: T2 -> B2
  p.set_target_t1_size_for_testing(0);
  // B1 = [1], B2 = [4, 3]. A B1 hit: + max(1, |B2|/|B1|) = +2.
  p.Touch(Keys({1}));
  EXPECT_DOUBLE_EQ(p.target_t1_size(), 2.0);
  // A B2 hit: - max(1, |B1|/|B2|) = -1, and the key moves to the B2 MRU end.
  p.Touch(Keys({4}));
  EXPECT_DOUBLE_EQ(p.target_t1_size(), 1.0);
  EXPECT_EQ(p.Keys(List::kB2), Keys({3, 4}));
  p.Touch(Keys({3, 4}));  // reversed: two B2 hits, clamped at 0
  EXPECT_DOUBLE_EQ(p.target_t1_size(), 0.0);
  EXPECT_EQ(p.Keys(List::kB2), Keys({4, 3}));
  // B1 hits clamp at capacity; fractional deltas accumulate.
  for (int i = 0; i < 10; ++i) p.Touch(Keys({1}));
  EXPECT_DOUBLE_EQ(p.target_t1_size(), 4.0);
  ExpectOk(p);
}

TEST(ArcPolicyTest, FractionalDeltas) {
  ArcPolicy p(8);
  Store(p, {1, 2, 3, 4, 5});
  p.Touch(Keys({5}));  // T1 = [1, 2, 3, 4], T2 = [5]
  EXPECT_EQ(VictimKeys(p.Evict(3, {})), Keys({1, 2, 3}));
  p.set_target_t1_size_for_testing(8);
  EXPECT_EQ(VictimKeys(p.Evict(1, {})), Keys({5}));
  // B1 = [1, 2, 3], B2 = [5]: a B2 hit subtracts |B1|/|B2| = 3.
  p.Touch(Keys({5}));
  EXPECT_DOUBLE_EQ(p.target_t1_size(), 5.0);
  Store(p, {6, 7});
  p.Touch(Keys({6, 7}));
  p.set_target_t1_size_for_testing(8);
  EXPECT_EQ(VictimKeys(p.Evict(2, {})), Keys({7, 6}));
  // B1 = [1, 2, 3], B2 = [5, 7, 6]: a B1 hit adds max(1, 3/3) = 1; with B2 = 3, B1 = 2 ...
  p.set_target_t1_size_for_testing(0);
  p.Insert(Key(1), NotReady(0));  // re-insert removes the ghost: B1 = [2, 3]
  EXPECT_EQ(p.Where(Key(1)), List::kT1);
  p.Touch(Keys({2}));  // + 3/2
  EXPECT_DOUBLE_EQ(p.target_t1_size(), 1.5);
  ExpectOk(p);
}

// vLLM test_adaptive_target at the policy level (capacity 2).
TEST(ArcPolicyTest, VllmAdaptiveTarget) {
  ArcPolicy p(2);
  Store(p, {1, 2});
  const double initial = p.target_t1_size();
  EXPECT_EQ(VictimKeys(p.Evict(1, Keys({3}))), Keys({1}));
  Store(p, {3});
  EXPECT_EQ(p.Where(Key(1)), List::kB1);
  p.Touch(Keys({1}));
  EXPECT_GT(p.target_t1_size(), initial);
}

TEST(ArcPolicyTest, GhostListsAreTrimmedToCapacity) {
  ArcPolicy p(2);
  Store(p, {1, 2});
  for (int i = 3; i < 20; ++i) {
    auto v = p.Evict(1, Keys({i}));
    ASSERT_TRUE(v.has_value());
    Store(p, {i});
    EXPECT_LE(p.ListSize(List::kB1), 2u);
    EXPECT_LE(p.ListSize(List::kB2), 2u);
    ExpectOk(p);
  }
  EXPECT_EQ(p.Keys(List::kB1), Keys({16, 17}));  // the LRU ghosts went first
  // Both lists, in one eviction: T1 victims to B1, T2 victims to B2, then each trimmed.
  p.Touch(Keys({19}));
  p.set_target_t1_size_for_testing(2);
  EXPECT_EQ(VictimKeys(p.Evict(2, {})), Keys({19, 18}));
  EXPECT_EQ(p.Keys(List::kB1), Keys({17, 18}));
  EXPECT_EQ(p.Keys(List::kB2), Keys({19}));
  ExpectOk(p);
}

TEST(ArcPolicyTest, ZeroCapacityKeepsNoGhosts) {
  ArcPolicy p(0);
  Store(p, {1, 2});
  EXPECT_EQ(VictimKeys(p.Evict(2, {})), Keys({1, 2}));
  EXPECT_EQ(p.ListSize(List::kB1), 0u);
  EXPECT_EQ(p.Where(Key(1)), std::nullopt);
  ExpectOk(p);
}

TEST(ArcPolicyTest, InsertRemovesTheKeyFromTheGhostLists) {
  ArcPolicy p(4);
  Store(p, {1, 2});
  p.Touch(Keys({2}));
  p.set_target_t1_size_for_testing(0);
  EXPECT_EQ(VictimKeys(p.Evict(2, {})), Keys({1, 2}));
  EXPECT_EQ(p.Where(Key(1)), List::kB1);
  EXPECT_EQ(p.Where(Key(2)), List::kB2);
  p.Insert(Key(1), NotReady(7));
  p.Insert(Key(2), Ready(8));
  EXPECT_EQ(p.Keys(List::kT1), Keys({1, 2}));
  EXPECT_EQ(p.ListSize(List::kB1) + p.ListSize(List::kB2), 0u);
  EXPECT_EQ(p.Get(Key(1))->slot, 7);
  EXPECT_EQ(p.num_evictable(), 1u);
  ExpectOk(p);
}

// vLLM test_failed_store: removal leaves ghosts alone.
TEST(ArcPolicyTest, RemoveLeavesGhostsAlone) {
  ArcPolicy p(4);
  Store(p, {1, 2, 3, 4});
  auto v = p.Evict(1, Keys({5}));
  EXPECT_EQ(VictimKeys(v), Keys({1}));
  p.Insert(Key(5), NotReady(0));
  p.Remove(Key(5));  // the failed store
  p.Remove(Key(1));  // a ghost: untouched
  p.Remove(Key(9));  // absent
  EXPECT_EQ(p.Get(Key(5)), nullptr);
  EXPECT_EQ(p.Where(Key(5)), std::nullopt);
  EXPECT_EQ(p.Where(Key(1)), List::kB1);
  EXPECT_EQ(p.size(), 3u);
  ExpectOk(p);
}

TEST(ArcPolicyTest, MarkEvictableDoesNotReorder) {
  ArcPolicy p(4);
  Store(p, {1, 2, 3});
  p.Touch(Keys({3}));
  Pin(p, 1);
  Unpin(p, 1);
  EXPECT_EQ(p.Keys(List::kT1), Keys({1, 2}));
  EXPECT_EQ(p.num_evictable(), 3u);
  EXPECT_EQ(VictimKeys(p.Evict(1, {})), Keys({1}));
  ExpectOk(p);
}

TEST(ArcPolicyTest, ClearResetsEverythingIncludingTheTarget) {
  ArcPolicy p(4);
  Store(p, {1, 2, 3});
  EXPECT_TRUE(p.Evict(1, {}).has_value());
  p.Touch(Keys({1}));
  EXPECT_GT(p.target_t1_size(), 0.0);
  p.Clear();
  EXPECT_EQ(p.size(), 0u);
  EXPECT_EQ(p.num_evictable(), 0u);
  EXPECT_EQ(p.target_t1_size(), 0.0);
  for (List l : {List::kT1, List::kT2, List::kB1, List::kB2}) EXPECT_EQ(p.ListSize(l), 0u);
  EXPECT_EQ(p.Where(Key(1)), std::nullopt);
  ExpectOk(p);
}

// vLLM test_full_scenario at the policy level.
TEST(ArcPolicyTest, VllmFullScenario) {
  ArcPolicy p(4);
  Store(p, {1, 2});
  EXPECT_EQ(VictimKeys(p.Evict(1, Keys({3, 4, 5}))), Keys({1}));
  Store(p, {3, 4, 5});
  p.Touch(Keys({2, 3}));
  EXPECT_EQ(p.Keys(List::kT1), Keys({4, 5}));
  EXPECT_EQ(p.Keys(List::kT2), Keys({3, 2}));
  EXPECT_EQ(VictimKeys(p.Evict(1, Keys({6}))), Keys({4}));
  Store(p, {6});
  EXPECT_NE(p.Get(Key(2)), nullptr);
  EXPECT_NE(p.Get(Key(3)), nullptr);
  ExpectOk(p);
}

TEST(ArcPolicyTest, CheckInvariantsCatchesAnUnreportedTransition) {
  ArcPolicy p(4);
  p.Insert(Key(1), NotReady(0));
  p.Get(Key(1))->ref_cnt = 0;
  EXPECT_FALSE(p.CheckInvariants().ok());
  p.MarkEvictable(Key(1));
  ExpectOk(p);
}

// Ghosts push the table past its sizing hint: it grows, and Get pointers stay put.
TEST(ArcPolicyTest, GrowsWithGhostsWithStablePointers) {
  ArcPolicy p(3000);
  std::vector<BlockStatus*> ptrs;
  for (int i = 0; i < 3000; ++i) {
    p.Insert(policy_test::VariedKey(i), Ready(i));
    ptrs.push_back(p.Get(policy_test::VariedKey(i)));
  }
  p.Touch(std::vector<OffloadKey>{policy_test::VariedKey(0), policy_test::VariedKey(1)});
  for (int i = 3000; i < 9000; ++i) {
    auto v = p.Evict(1, {});
    ASSERT_TRUE(v.has_value());
    p.Insert(policy_test::VariedKey(i), Ready(i));
  }
  EXPECT_EQ(p.ListSize(List::kB1), 3000u);
  EXPECT_EQ(p.Get(policy_test::VariedKey(0)), ptrs[0]);
  EXPECT_EQ(p.Get(policy_test::VariedKey(1)), ptrs[1]);
  ExpectOk(p);
}

// A straightforward model of vLLM's arc.py: OrderedDicts as std::list + a status map.
struct ArcModel {
  size_t capacity = 0;
  bool t1_fallback = true;
  double target = 0;
  std::list<int> t1, t2, b1, b2;
  std::map<int, BlockStatus> status;  // T1 and T2 members
  // Coverage counters: what the random run exercised.
  struct Counts {
    int b1_hits = 0, b2_hits = 0, t2_victims = 0, fallbacks = 0, failures = 0, fractional = 0;
    int trims = 0, promotions = 0, unready_touches = 0;
  } counts;

  static bool In(const std::list<int>& l, int id) {
    return std::find(l.begin(), l.end(), id) != l.end();
  }
  static void ToEnd(std::list<int>& l, int id) {
    l.remove(id);
    l.push_back(id);
  }
  bool Cached(int id) const { return In(t1, id) || In(t2, id); }
  BlockStatus* Get(int id) { return Cached(id) ? &status[id] : nullptr; }
  void Insert(int id, BlockStatus b) {
    t1.push_back(id);
    status[id] = b;
    b1.remove(id);
    b2.remove(id);
  }
  void Remove(int id) {
    if (In(t1, id)) {
      t1.remove(id);
      status.erase(id);
    } else if (In(t2, id)) {
      t2.remove(id);
      status.erase(id);
    }
  }
  void Touch(const std::vector<int>& ids) {
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
      const int id = *it;
      if (In(t1, id)) {
        t1.remove(id);
        (status[id].ready() ? t2 : t1).push_back(id);
        ++(status[id].ready() ? counts.promotions : counts.unready_touches);
      } else if (In(t2, id)) {
        ToEnd(t2, id);
      } else if (In(b1, id)) {
        const double delta = std::max(1.0, double(b2.size()) / double(b1.size()));
        target = std::min(target + delta, double(capacity));
        ToEnd(b1, id);
        ++counts.b1_hits;
        if (target != static_cast<long>(target)) ++counts.fractional;
      } else if (In(b2, id)) {
        const double delta = std::max(1.0, double(b1.size()) / double(b2.size()));
        target = std::max(target - delta, 0.0);
        ToEnd(b2, id);
        ++counts.b2_hits;
        if (target != static_cast<long>(target)) ++counts.fractional;
      }
    }
  }
  std::optional<std::vector<std::pair<int, BlockStatus>>> Evict(size_t n,
                                                                const std::set<int>& prot) {
    std::vector<std::pair<int, BlockStatus>> out;
    if (n == 0) return out;
    std::vector<std::pair<int, bool>> chosen;
    auto i1 = t1.begin();
    auto i2 = t2.begin();
    auto next = [&](std::list<int>::iterator& it, const std::list<int>& l) -> std::optional<int> {
      for (; it != l.end(); ++it) {
        if (status[*it].ref_cnt == 0 && !prot.contains(*it)) return *it++;
      }
      return std::nullopt;
    };
    long virtual_t1 = static_cast<long>(t1.size());
    for (size_t k = 0; k < n; ++k) {
      std::optional<std::pair<int, bool>> c;
      if (virtual_t1 >= static_cast<long>(target)) {
        if (auto e = next(i1, t1)) {
          c = std::make_pair(*e, true);
          --virtual_t1;
        }
      }
      if (!c) {
        if (auto e = next(i2, t2)) c = std::make_pair(*e, false);
      }
      if (!c) {
        if (!t1_fallback) {
          ++counts.failures;
          return std::nullopt;
        }
        auto e = next(i1, t1);
        if (!e) {
          ++counts.failures;
          return std::nullopt;
        }
        c = std::make_pair(*e, true);
        --virtual_t1;
        ++counts.fallbacks;
      }
      chosen.push_back(*c);
    }
    for (const auto& [id, from_t1] : chosen) {
      out.emplace_back(id, status[id]);
      status.erase(id);
      if (from_t1) {
        t1.remove(id);
        b1.push_back(id);
      } else {
        t2.remove(id);
        b2.push_back(id);
        ++counts.t2_victims;
      }
    }
    counts.trims += static_cast<int>(b1.size() > capacity) + static_cast<int>(b2.size() > capacity);
    while (b1.size() > capacity) b1.pop_front();
    while (b2.size() > capacity) b2.pop_front();
    return out;
  }
  void Clear() {
    t1.clear();
    t2.clear();
    b1.clear();
    b2.clear();
    status.clear();
    target = 0;
  }
  void MarkEvictable(int) {}
  void MarkNonEvictable(int) {}
  size_t size() const { return t1.size() + t2.size(); }
  size_t num_evictable() const {
    size_t n = 0;
    for (const auto& [id, b] : status) n += b.ref_cnt == 0;
    return n;
  }
};

struct Totals {
  ArcModel::Counts c;
  void Add(const ArcModel::Counts& x) {
    c.b1_hits += x.b1_hits;
    c.b2_hits += x.b2_hits;
    c.t2_victims += x.t2_victims;
    c.fallbacks += x.fallbacks;
    c.failures += x.failures;
    c.fractional += x.fractional;
    c.trims += x.trims;
    c.promotions += x.promotions;
    c.unready_touches += x.unready_touches;
  }
  // The runs must have exercised every rule.
  void Expect(bool fallback) const {
    std::printf(
        "  %s: B1 hits %d, B2 hits %d, fractional targets %d, T2 victims %d, fallbacks %d, "
        "failed evictions %d, ghost trims %d, promotions %d, unready touches %d\n",
        fallback ? "t1_fallback" : "snapshot", c.b1_hits, c.b2_hits, c.fractional, c.t2_victims,
        c.fallbacks, c.failures, c.trims, c.promotions, c.unready_touches);
    EXPECT_GT(c.b1_hits, 0);
    EXPECT_GT(c.b2_hits, 0);
    EXPECT_GT(c.fractional, 0);
    EXPECT_GT(c.t2_victims, 0);
    if (fallback) {
      EXPECT_GT(c.fallbacks, 0);
    }
    EXPECT_GT(c.failures, 0);
    EXPECT_GT(c.trims, 0);
    EXPECT_GT(c.promotions, 0);
    EXPECT_GT(c.unready_touches, 0);
  }
};

void RunAgainstModel(unsigned seed, size_t capacity, bool fallback, int universe, int steps,
                     int check_every, Totals* totals) {
  SCOPED_TRACE("capacity " + std::to_string(capacity) + (fallback ? ", t1_fallback" : "") +
               ", seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ArcPolicy policy(capacity, ArcOptions{.t1_fallback = fallback});
  ArcModel model;
  model.capacity = capacity;
  model.t1_fallback = fallback;
  auto compare = [&](const std::vector<OffloadKey>& keys) {
    auto ids_to_keys = [&](const std::list<int>& ids) {
      std::vector<OffloadKey> out;
      for (int id : ids) out.push_back(keys[id]);
      return out;
    };
    ASSERT_EQ(policy.Keys(List::kT1), ids_to_keys(model.t1));
    ASSERT_EQ(policy.Keys(List::kT2), ids_to_keys(model.t2));
    ASSERT_EQ(policy.Keys(List::kB1), ids_to_keys(model.b1));
    ASSERT_EQ(policy.Keys(List::kB2), ids_to_keys(model.b2));
    ASSERT_EQ(policy.target_t1_size(), model.target);
  };
  policy_test::RunRandomOps(policy, model, universe, steps, rng, compare, check_every);
  totals->Add(model.counts);
}

TEST(ArcPolicyPropertyTest, MatchesTheReferenceModel) {
  const unsigned seed = testing::TestSeed();
  for (bool fallback : {true, false}) {
    Totals totals;
    for (size_t capacity : {0, 1, 2, 3, 5, 8, 16, 64}) {
      RunAgainstModel(seed + static_cast<unsigned>(capacity), capacity, fallback,
                      static_cast<int>(3 * capacity + 6), 4000, 1, &totals);
      if (HasFatalFailure()) return;
    }
    totals.Expect(fallback);
  }
}

TEST(ArcPolicyPropertyTest, MatchesTheReferenceModelAtScale) {
  Totals totals;
  RunAgainstModel(testing::TestSeed(), 300, true, 1200, 40000, 500, &totals);
  totals.Expect(true);
}

}  // namespace
}  // namespace kvo
