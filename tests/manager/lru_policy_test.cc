// LruPolicy: vLLM's lru.py behaviours (B.7), the manager-level LRU trace of vLLM's
// test_cpu_manager replayed at the policy level, and random operation sequences against a plain
// std::list / std::map model of the same rules.
#include "manager/lru_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
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
using policy_test::Unpin;
using policy_test::VictimKeys;

TEST(LruPolicyTest, NotReadyBlocksAreNotEvictable) {
  LruPolicy p(4);
  p.Insert(Key(1), NotReady(0));
  EXPECT_EQ(p.size(), 1u);
  EXPECT_EQ(p.num_evictable(), 0u);
  ASSERT_NE(p.Get(Key(1)), nullptr);
  EXPECT_EQ(p.Get(Key(1))->ref_cnt, -1);
  EXPECT_EQ(p.Get(Key(1))->slot, 0);
  EXPECT_EQ(p.Get(Key(2)), nullptr);
  EXPECT_FALSE(p.Evict(1, {}).has_value());
  EXPECT_EQ(p.size(), 1u);
  ExpectOk(p);
}

TEST(LruPolicyTest, ReadyInsertIsEvictableAtMru) {
  LruPolicy p(4);
  p.Insert(Key(1), Ready(0));
  p.Insert(Key(2), NotReady(1));
  p.Insert(Key(3), Ready(2));
  EXPECT_EQ(p.EvictableKeys(), Keys({1, 3}));
  CompleteStore(p, {2});
  EXPECT_EQ(p.EvictableKeys(), Keys({1, 3, 2}));
  ExpectOk(p);
}

TEST(LruPolicyTest, TouchLeavesTheFirstKeyMostRecent) {
  LruPolicy p(8);
  for (int i = 1; i <= 4; ++i) p.Insert(Key(i), Ready(i));
  p.Touch(Keys({1, 2}));  // reversed: 2 to MRU, then 1
  EXPECT_EQ(p.EvictableKeys(), Keys({3, 4, 2, 1}));
  p.Touch(Keys({4, 9, 3}));  // absent keys are ignored
  EXPECT_EQ(p.EvictableKeys(), Keys({2, 1, 3, 4}));
  auto v = p.Evict(4, {});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(VictimKeys(v), Keys({2, 1, 3, 4}));
  EXPECT_EQ(p.size(), 0u);
  ExpectOk(p);
}

TEST(LruPolicyTest, TouchDoesNotReorderPinnedOrUnreadyBlocks) {
  LruPolicy p(8);
  p.Insert(Key(1), Ready(0));
  p.Insert(Key(2), Ready(1));
  p.Insert(Key(3), NotReady(2));
  Pin(p, 1);
  p.Touch(Keys({1, 3, 2}));
  EXPECT_EQ(p.EvictableKeys(), Keys({2}));
  // A pinned block re-enters at MRU when it becomes evictable; so does a completed store.
  p.Insert(Key(4), Ready(3));
  Unpin(p, 1);
  CompleteStore(p, {3});
  EXPECT_EQ(p.EvictableKeys(), Keys({2, 4, 1, 3}));
  ExpectOk(p);
}

TEST(LruPolicyTest, MarkEvictableAndNonEvictable) {
  LruPolicy p(8);
  p.Insert(Key(1), Ready(0));
  p.Insert(Key(2), Ready(1));
  // Already evictable: no move (OrderedDict assignment keeps the position).
  p.MarkEvictable(Key(1));
  EXPECT_EQ(p.EvictableKeys(), Keys({1, 2}));
  // Absent keys: no-ops.
  p.MarkEvictable(Key(7));
  p.MarkNonEvictable(Key(7));
  EXPECT_EQ(p.size(), 2u);
  Pin(p, 1);
  EXPECT_EQ(p.EvictableKeys(), Keys({2}));
  p.MarkNonEvictable(Key(1));  // not in the list: no-op
  EXPECT_EQ(p.num_evictable(), 1u);
  ExpectOk(p);
}

TEST(LruPolicyTest, ProtectedKeysAreNeverEvicted) {
  LruPolicy p(8);
  for (int i = 1; i <= 5; ++i) p.Insert(Key(i), Ready(i));
  auto v = p.Evict(2, Keys({1, 3, 42}));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(VictimKeys(v), Keys({2, 4}));
  EXPECT_EQ((*v)[0].second.slot, 2);
  EXPECT_EQ((*v)[1].second.slot, 4);
  EXPECT_EQ(p.EvictableKeys(), Keys({1, 3, 5}));
  ExpectOk(p);
}

TEST(LruPolicyTest, ManyProtectedKeysUseTheHashedSet) {
  LruPolicy p(64);
  std::vector<OffloadKey> prot;
  for (int i = 0; i < 40; ++i) {
    p.Insert(Key(i), Ready(i));
    if (i % 3 != 2) prot.push_back(Key(i));
  }
  prot.push_back(Key(1000));
  auto v = p.Evict(5, prot);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(VictimKeys(v), Keys({2, 5, 8, 11, 14}));
  // Only 13 unprotected blocks: 14 is impossible and changes nothing.
  EXPECT_FALSE(p.Evict(9, prot).has_value());
  EXPECT_EQ(p.size(), 35u);
  ExpectOk(p);
}

TEST(LruPolicyTest, EvictIsAtomic) {
  LruPolicy p(8);
  for (int i = 1; i <= 4; ++i) p.Insert(Key(i), Ready(i));
  p.Insert(Key(5), NotReady(5));
  Pin(p, 2);
  const auto before = p.EvictableKeys();
  EXPECT_FALSE(p.Evict(4, {}).has_value());         // only 3 evictable
  EXPECT_FALSE(p.Evict(3, Keys({4})).has_value());  // 2 once 4 is protected
  EXPECT_EQ(p.EvictableKeys(), before);
  EXPECT_EQ(p.size(), 5u);
  ASSERT_NE(p.Get(Key(4)), nullptr);
  ExpectOk(p);
}

TEST(LruPolicyTest, EvictZeroIsAnEmptyListNotAFailure) {
  LruPolicy p(0);
  auto v = p.Evict(0, {});
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->empty());
}

TEST(LruPolicyTest, RemoveDropsTheBlockAndItsEvictableEntry) {
  LruPolicy p(4);
  p.Insert(Key(1), Ready(0));
  p.Insert(Key(2), NotReady(1));
  p.Remove(Key(1));
  p.Remove(Key(2));
  p.Remove(Key(3));  // absent: no-op
  EXPECT_EQ(p.size(), 0u);
  EXPECT_EQ(p.num_evictable(), 0u);
  EXPECT_EQ(p.Get(Key(1)), nullptr);
  p.Insert(Key(1), NotReady(5));  // and can come back
  EXPECT_EQ(p.Get(Key(1))->slot, 5);
  ExpectOk(p);
}

TEST(LruPolicyTest, ClearForgetsEverything) {
  LruPolicy p(4);
  for (int i = 0; i < 10; ++i) p.Insert(Key(i), i % 2 ? Ready(i) : NotReady(i));
  p.Clear();
  EXPECT_EQ(p.size(), 0u);
  EXPECT_EQ(p.num_evictable(), 0u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(p.Get(Key(i)), nullptr);
  ExpectOk(p);
  p.Insert(Key(3), Ready(1));
  EXPECT_EQ(p.EvictableKeys(), Keys({3}));
  ExpectOk(p);
}

// vLLM test_cpu_manager's LRU trace (B.6), with the manager's steps spelt out.
TEST(LruPolicyTest, VllmCpuManagerTrace) {
  LruPolicy p(4);
  p.Insert(Key(1), NotReady(0));
  p.Insert(Key(2), NotReady(1));
  CompleteStore(p, {1, 2});
  // prepare_store [2, 3, 4, 5]: one eviction, every input key protected.
  auto v = p.Evict(1, Keys({2, 3, 4, 5}));
  EXPECT_EQ(VictimKeys(v), Keys({1}));
  p.Insert(Key(3), NotReady(2));
  p.Insert(Key(4), NotReady(3));
  p.Insert(Key(5), NotReady(0));
  CompleteStore(p, {2, 3, 4, 5});
  // prepare_load [2, 3]; a store of three then cannot evict enough.
  Pin(p, 2);
  Pin(p, 3);
  EXPECT_EQ(p.num_evictable(), 2u);
  EXPECT_FALSE(p.Evict(3, Keys({6, 7, 8})).has_value());
  // complete_load: 2 and 3 re-enter at MRU, so the oldest are 4, 5, 2.
  Unpin(p, 2);
  Unpin(p, 3);
  v = p.Evict(3, Keys({6, 7, 8}));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(VictimKeys(v), Keys({4, 5, 2}));
  EXPECT_EQ((*v)[0].second.slot, 3);
  EXPECT_EQ((*v)[1].second.slot, 0);
  EXPECT_EQ((*v)[2].second.slot, 1);
  p.Insert(Key(6), NotReady(1));
  p.Insert(Key(7), NotReady(0));
  p.Insert(Key(8), NotReady(3));
  CompleteStore(p, {6, 7, 8});
  p.Touch(Keys({3, 6, 7}));
  EXPECT_EQ(p.EvictableKeys(), Keys({8, 7, 6, 3}));
  v = p.Evict(1, Keys({9}));
  EXPECT_EQ(VictimKeys(v), Keys({8}));
  EXPECT_EQ((*v)[0].second.slot, 3);
  ExpectOk(p);
}

// vLLM: an already-stored input key is never evicted by prepare_store (it is protected).
TEST(LruPolicyTest, AlreadyStoredInputKeyIsNotEvicted) {
  LruPolicy p(4);
  p.Insert(Key(1), Ready(0));
  p.Insert(Key(2), Ready(1));
  p.Touch(Keys({1}));  // 2 is now the LRU block
  auto v = p.Evict(1, Keys({2, 3, 4, 5}));
  EXPECT_EQ(VictimKeys(v), Keys({1}));
  EXPECT_NE(p.Get(Key(2)), nullptr);
}

TEST(LruPolicyTest, KeysDifferingOnlyInGroupOrLengthAreDistinct) {
  LruPolicy p(4);
  const OffloadKey a = OffloadKey::FromDigest("abc", 0);
  const OffloadKey b = OffloadKey::FromDigest("abc", 1);
  const OffloadKey c = OffloadKey::FromDigest(std::string("abc\0", 4), 0);
  const OffloadKey d = OffloadKey::FromDigest("", 0);
  p.Insert(a, Ready(1));
  p.Insert(b, Ready(2));
  p.Insert(c, Ready(3));
  p.Insert(d, Ready(4));
  EXPECT_EQ(p.Get(a)->slot, 1);
  EXPECT_EQ(p.Get(b)->slot, 2);
  EXPECT_EQ(p.Get(c)->slot, 3);
  EXPECT_EQ(p.Get(d)->slot, 4);
  auto v = p.Evict(4, {});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(VictimKeys(v), (std::vector<OffloadKey>{a, b, c, d}));
}

// Far past the sizing hint: the slab and index grow, and Get pointers stay put.
TEST(LruPolicyTest, GrowsPastCapacityWithStablePointers) {
  LruPolicy p(16);
  std::vector<BlockStatus*> ptrs;
  for (int i = 0; i < 20000; ++i) {
    p.Insert(policy_test::VariedKey(i), i % 3 ? Ready(i) : NotReady(i));
    ptrs.push_back(p.Get(policy_test::VariedKey(i)));
  }
  ExpectOk(p);
  for (int i = 0; i < 20000; ++i) {
    ASSERT_EQ(p.Get(policy_test::VariedKey(i)), ptrs[i]) << i;
    ASSERT_EQ(ptrs[i]->slot, i);
  }
  for (int i = 0; i < 20000; i += 2) p.Remove(policy_test::VariedKey(i));
  ExpectOk(p);
  for (int i = 1; i < 20000; i += 2) ASSERT_EQ(p.Get(policy_test::VariedKey(i)), ptrs[i]) << i;
  EXPECT_EQ(p.size(), 10000u);
}

// Keys whose hashes are identical (crafted against the table's hash: group and digest cancel)
// make one long probe run with saturated distances; everything must stay correct.
TEST(LruPolicyTest, IdenticalHashesStayCorrect) {
  std::vector<OffloadKey> keys;
  for (uint32_t g = 0; g < 200; ++g) {
    const uint64_t w = 0x0123'4567'89ab'cdefULL ^ (uint64_t{g} << 8);
    std::string d(8, '\0');
    std::memcpy(d.data(), &w, 8);
    keys.push_back(OffloadKey::FromDigest(d, g));
  }
  for (const OffloadKey& k : keys) {
    ASSERT_EQ(policy_internal::HashKey(k), policy_internal::HashKey(keys[0]))
        << "the crafted keys no longer collide under policy_table.h's hash; re-derive them";
  }
  LruPolicy p(64);
  std::mt19937_64 rng(testing::TestSeed());
  std::set<size_t> present;
  for (int step = 0; step < 3000; ++step) {
    const size_t i = rng() % keys.size();
    if (present.contains(i)) {
      ASSERT_NE(p.Get(keys[i]), nullptr);
      ASSERT_EQ(p.Get(keys[i])->slot, static_cast<int>(i));
      if (rng() % 2) {
        p.Remove(keys[i]);
        present.erase(i);
      }
    } else {
      ASSERT_EQ(p.Get(keys[i]), nullptr);
      p.Insert(keys[i], Ready(static_cast<int>(i)));
      present.insert(i);
    }
    if (step % 50 == 0) {
      ExpectOk(p);
      auto v = p.Evict(1, keys);  // every key protected: nothing to evict
      EXPECT_FALSE(v.has_value());
    }
  }
  EXPECT_EQ(p.size(), present.size());
  ExpectOk(p);
  auto v = p.Evict(p.size(), {});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(p.size(), 0u);
  ExpectOk(p);
}

// Large enough that the slab and index come from the 2 MiB-aligned, huge-page path.
TEST(LruPolicyTest, LargeCapacity) {
  constexpr int kBlocks = 200000;
  LruPolicy p(kBlocks);
  for (int i = 0; i < kBlocks; ++i) p.Insert(policy_test::VariedKey(i), Ready(i));
  for (int i = 0; i < kBlocks; i += 7) ASSERT_EQ(p.Get(policy_test::VariedKey(i))->slot, i);
  ExpectOk(p);
  auto v = p.Evict(kBlocks / 2, {});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ((*v)[0].first, policy_test::VariedKey(0));
  EXPECT_EQ(p.size(), static_cast<size_t>(kBlocks / 2));
  ExpectOk(p);
}

TEST(LruPolicyTest, CheckInvariantsCatchesAnUnreportedTransition) {
  LruPolicy p(4);
  p.Insert(Key(1), NotReady(0));
  p.Get(Key(1))->ref_cnt = 0;  // no MarkEvictable
  EXPECT_FALSE(p.CheckInvariants().ok());
  p.MarkEvictable(Key(1));
  ExpectOk(p);
}

// A straightforward model of vLLM's lru.py.
struct LruModel {
  std::map<int, BlockStatus> blocks;
  std::list<int> evictable;  // LRU -> MRU

  bool InList(int id) const {
    return std::find(evictable.begin(), evictable.end(), id) != evictable.end();
  }
  bool Cached(int id) const { return blocks.contains(id); }
  BlockStatus* Get(int id) {
    auto it = blocks.find(id);
    return it == blocks.end() ? nullptr : &it->second;
  }
  void Insert(int id, BlockStatus b) {
    blocks[id] = b;
    if (b.ref_cnt == 0 && !InList(id)) evictable.push_back(id);
  }
  void Remove(int id) {
    blocks.erase(id);
    evictable.remove(id);
  }
  void Touch(const std::vector<int>& ids) {
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
      if (InList(*it)) {
        evictable.remove(*it);
        evictable.push_back(*it);
      }
    }
  }
  std::optional<std::vector<std::pair<int, BlockStatus>>> Evict(size_t n,
                                                                const std::set<int>& prot) {
    std::vector<std::pair<int, BlockStatus>> out;
    if (n == 0) return out;
    for (int id : evictable) {
      if (prot.contains(id)) continue;
      out.emplace_back(id, blocks[id]);
      if (out.size() == n) break;
    }
    if (out.size() < n) return std::nullopt;
    for (const auto& [id, b] : out) Remove(id);
    return out;
  }
  void Clear() {
    blocks.clear();
    evictable.clear();
  }
  void MarkEvictable(int id) {
    if (Cached(id) && !InList(id)) evictable.push_back(id);
  }
  void MarkNonEvictable(int id) { evictable.remove(id); }
  size_t size() const { return blocks.size(); }
  size_t num_evictable() const { return evictable.size(); }
};

void RunAgainstModel(unsigned seed, size_t capacity, int universe, int steps, int check_every) {
  SCOPED_TRACE("capacity " + std::to_string(capacity) + ", seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  LruPolicy policy(capacity);
  LruModel model;
  auto compare = [&](const std::vector<OffloadKey>& keys) {
    std::vector<OffloadKey> want;
    for (int id : model.evictable) want.push_back(keys[id]);
    ASSERT_EQ(policy.EvictableKeys(), want);
  };
  policy_test::RunRandomOps(policy, model, universe, steps, rng, compare, check_every);
}

TEST(LruPolicyPropertyTest, MatchesTheReferenceModel) {
  const unsigned seed = testing::TestSeed();
  for (size_t capacity : {0, 1, 2, 3, 5, 8, 16, 64}) {
    RunAgainstModel(seed + static_cast<unsigned>(capacity), capacity,
                    static_cast<int>(2 * capacity + 6), 4000, 1);
    if (HasFatalFailure()) return;
  }
}

TEST(LruPolicyPropertyTest, MatchesTheReferenceModelAtScale) {
  RunAgainstModel(testing::TestSeed(), 1000, 2500, 40000, 500);
}

}  // namespace
}  // namespace kvo
