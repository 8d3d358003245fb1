// Helpers shared by the cache-policy tests: keys named by small ints (like vLLM's to_key), and a
// random driver that plays the manager's side of the CachePolicy contract against a policy and
// a reference model at once, comparing every result.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "manager/cache_policy.h"
#include "manager/offload_key.h"

namespace kvo {

// gtest prints keys as their group and hex digest.
inline void PrintTo(const OffloadKey& key, std::ostream* os) {
  *os << "g" << key.group() << ":" << key.Hex();
}

namespace policy_test {

// vLLM's to_key: make_offload_key(str(i).encode(), 0).
inline OffloadKey Key(int id) { return OffloadKey::FromDigest(std::to_string(id), 0); }

inline std::vector<OffloadKey> Keys(std::initializer_list<int> ids) {
  std::vector<OffloadKey> out;
  for (int id : ids) out.push_back(Key(id));
  return out;
}

// Distinct keys of every shape: 8-byte wire hashes, 32-byte digests, short digests in several
// groups, the same wire hash in other groups, and the empty digest.
inline OffloadKey VariedKey(int id) {
  switch (id % 5) {
    case 0:
      return OffloadKey::FromWireHash(static_cast<uint64_t>(id) * 0x9e3779b97f4a7c15ULL, 0);
    case 1: {
      std::string d(32, '\0');
      uint64_t x = static_cast<uint64_t>(id) + 1;
      for (size_t i = 0; i < d.size(); ++i) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        d[i] = static_cast<char>(x >> 56);
      }
      d[0] = static_cast<char>(id);  // distinct even if the generator repeated
      d[1] = static_cast<char>(id >> 8);
      return OffloadKey::FromDigest(d, 0);
    }
    case 2:
      return OffloadKey::FromDigest(std::to_string(id), static_cast<uint32_t>(id % 3));
    case 3:
      return OffloadKey::FromWireHash(static_cast<uint64_t>(id), 1 + static_cast<uint32_t>(id));
    default:
      return id == 4 ? OffloadKey::FromDigest("", 7)
                     : OffloadKey::FromDigest(std::string(1 + id % 31, static_cast<char>(id)),
                                              0xffffffffu - static_cast<uint32_t>(id));
  }
}

inline BlockStatus Ready(int slot) { return BlockStatus{0, slot}; }
inline BlockStatus NotReady(int slot) { return BlockStatus{-1, slot}; }

inline bool SameStatus(const BlockStatus& a, const BlockStatus& b) {
  return a.ref_cnt == b.ref_cnt && a.slot == b.slot;
}

// The manager's side of the policy contract, for readable scenarios: a stored block becomes ready
// (ref_cnt -1 -> 0) and evictable; pins and unpins report every transition to / from 0.
inline void ExpectOk(const CachePolicy& p) {
  Status s = p.CheckInvariants();
  EXPECT_TRUE(s.ok()) << s.ToString();
}
inline void CompleteStore(CachePolicy& p, std::initializer_list<int> ids) {
  for (int id : ids) {
    BlockStatus* b = p.Get(Key(id));
    if (b != nullptr && b->ref_cnt == -1) {
      b->ref_cnt = 0;
      p.MarkEvictable(Key(id));
    }
  }
}
// Inserts `ids` (not ready, consecutive slots from `slot`) and completes their store.
inline void Store(CachePolicy& p, std::initializer_list<int> ids, int slot = 0) {
  for (int id : ids) p.Insert(Key(id), NotReady(slot++));
  CompleteStore(p, ids);
}
inline void Pin(CachePolicy& p, int id) {
  BlockStatus* b = p.Get(Key(id));
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->ready());
  if (b->ref_cnt++ == 0) p.MarkNonEvictable(Key(id));
}
inline void Unpin(CachePolicy& p, int id) {
  BlockStatus* b = p.Get(Key(id));
  ASSERT_NE(b, nullptr);
  ASSERT_GT(b->ref_cnt, 0);
  if (--b->ref_cnt == 0) p.MarkEvictable(Key(id));
}

using Victims = std::vector<std::pair<OffloadKey, BlockStatus>>;

inline std::vector<OffloadKey> VictimKeys(const std::optional<Victims>& v) {
  std::vector<OffloadKey> out;
  if (v) {
    for (const auto& [k, b] : *v) out.push_back(k);
  }
  return out;
}

// Random operations in the manager's pattern (Insert only absent keys, ref_cnt changed through
// Get and reported through Mark*Evictable on every transition to / from 0), applied to `policy`
// and to `model` (ids instead of keys), comparing every result; `compare` checks the whole
// state after each step. Model interface:
//   BlockStatus* Get(int); bool Cached(int); void Insert(int, BlockStatus); void Remove(int);
//   void Touch(const std::vector<int>&);
//   std::optional<std::vector<std::pair<int, BlockStatus>>> Evict(size_t, const std::set<int>&);
//   void Clear(); void MarkEvictable(int); void MarkNonEvictable(int);
//   size_t size(); size_t num_evictable();
template <class Model, class Compare>
void RunRandomOps(CachePolicy& policy, Model& model, int universe, int steps, std::mt19937_64& rng,
                  Compare compare, int check_every = 1) {
  std::vector<OffloadKey> keys;
  for (int id = 0; id < universe; ++id) keys.push_back(VariedKey(id));
  auto pick = [&] { return static_cast<int>(rng() % static_cast<uint64_t>(universe)); };
  auto random_ids = [&](size_t max_len) {
    std::vector<int> ids(rng() % (max_len + 1));
    for (int& id : ids) id = pick();
    return ids;
  };
  auto to_keys = [&](const std::vector<int>& ids) {
    std::vector<OffloadKey> out;
    for (int id : ids) out.push_back(keys[id]);
    return out;
  };
  int next_slot = 0;
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int op = static_cast<int>(rng() % 1000);
    int id = pick();
    // A few tries at an id in the state the operation needs (so that transitions are frequent).
    auto pick_where = [&](auto pred) {
      for (int t = 0; t < 8 && !pred(id); ++t) id = pick();
    };
    if (op < 200) {  // prepare_store: insert an absent key, half of them not ready
      pick_where([&](int i) { return !model.Cached(i); });
      if (!model.Cached(id)) {
        BlockStatus b = rng() % 2 ? NotReady(next_slot++) : Ready(next_slot++);
        policy.Insert(keys[id], b);
        model.Insert(id, b);
      }
    } else if (op < 240) {  // remove (a failed store, or an arbitrary key)
      policy.Remove(keys[id]);
      model.Remove(id);
    } else if (op < 440) {  // touch
      std::vector<int> ids = random_ids(7);
      std::vector<OffloadKey> ks = to_keys(ids);
      policy.Touch(ks);
      model.Touch(ids);
    } else if (op < 600) {  // evict with a random protected set
      const size_t n = rng() % 5;
      std::vector<int> prot = random_ids(rng() % 4 == 0 ? 24 : 6);
      std::vector<OffloadKey> pk = to_keys(prot);
      auto got = policy.Evict(n, pk);
      auto want = model.Evict(n, std::set<int>(prot.begin(), prot.end()));
      ASSERT_EQ(got.has_value(), want.has_value()) << "evict " << n;
      if (got) {
        ASSERT_EQ(got->size(), want->size());
        for (size_t i = 0; i < got->size(); ++i) {
          ASSERT_EQ((*got)[i].first, keys[(*want)[i].first]) << "victim " << i;
          ASSERT_TRUE(SameStatus((*got)[i].second, (*want)[i].second)) << "victim " << i;
        }
      }
    } else if (op < 680) {  // get
      BlockStatus* got = policy.Get(keys[id]);
      BlockStatus* want = model.Get(id);
      ASSERT_EQ(got != nullptr, want != nullptr) << "get " << id;
      if (got) {
        ASSERT_TRUE(SameStatus(*got, *want)) << "get " << id;
      }
    } else if (op < 820) {  // complete_store: -1 -> 0
      pick_where([&](int i) { return model.Get(i) != nullptr && model.Get(i)->ref_cnt == -1; });
      BlockStatus* b = policy.Get(keys[id]);
      if (b != nullptr && b->ref_cnt == -1) {
        b->ref_cnt = 0;
        model.Get(id)->ref_cnt = 0;
        policy.MarkEvictable(keys[id]);
        model.MarkEvictable(id);
      }
    } else if (op < 880) {  // prepare_load: pin
      pick_where([&](int i) { return model.Get(i) != nullptr && model.Get(i)->ready(); });
      BlockStatus* b = policy.Get(keys[id]);
      if (b != nullptr && b->ready()) {
        if (b->ref_cnt == 0) {
          policy.MarkNonEvictable(keys[id]);
          model.MarkNonEvictable(id);
        }
        ++b->ref_cnt;
        ++model.Get(id)->ref_cnt;
      }
    } else if (op < 980) {  // complete_load: unpin
      pick_where([&](int i) { return model.Get(i) != nullptr && model.Get(i)->ref_cnt > 0; });
      BlockStatus* b = policy.Get(keys[id]);
      if (b != nullptr && b->ref_cnt > 0) {
        --b->ref_cnt;
        --model.Get(id)->ref_cnt;
        if (b->ref_cnt == 0) {
          policy.MarkEvictable(keys[id]);
          model.MarkEvictable(id);
        }
      }
    } else if (op < 998) {  // a batch of fresh ready inserts, then an eviction back to size
      for (int k = 0; k < 3; ++k) {
        const int j = pick();
        if (!model.Cached(j)) {
          policy.Insert(keys[j], Ready(next_slot));
          model.Insert(j, Ready(next_slot++));
        }
      }
      std::vector<OffloadKey> none;
      auto got = policy.Evict(2, none);
      auto want = model.Evict(2, {});
      ASSERT_EQ(got.has_value(), want.has_value());
      if (got) {
        for (size_t i = 0; i < got->size(); ++i) {
          ASSERT_EQ((*got)[i].first, keys[(*want)[i].first]);
        }
      }
    } else if (rng() % 8 == 0) {  // reset_cache (rare)
      policy.Clear();
      model.Clear();
    }
    ASSERT_EQ(policy.size(), model.size());
    ASSERT_EQ(policy.num_evictable(), model.num_evictable());
    if (step % check_every == 0 || step + 1 == steps) {
      Status s = policy.CheckInvariants();
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_NO_FATAL_FAILURE(compare(keys));
    }
  }
}

}  // namespace policy_test
}  // namespace kvo
