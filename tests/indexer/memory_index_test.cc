// MemoryIndex's walks (TieredScore, Score) against the plain rule: each block's node looked up in
// the hash tables, its holders read one by one. The walks take shortcuts (chain hints checked
// against the key, lookups pipelined ahead, phase masks in registers); none may change an answer,
// whatever the hints say.
#include "indexer/internal/memory_index.h"

#include <algorithm>
#include <array>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/testing/temp_dir.h"

namespace kvo::indexer_internal {
namespace {

using Tiers = std::array<int64_t, 3>;

// The plain rule, block by block: per instance, its GPU prefix, then the blocks held on a medium
// of tier <= 1 from there, then tier <= 2; the walk stops at the first block the index does not
// know (by_engine: NodeByEngine, else NodeByContent, the tables alone).
std::vector<Tiers> PlainTiers(const MemoryIndex& mem, const std::vector<uint64_t>& keys,
                              bool by_engine, const std::vector<uint8_t>& tier_of_medium) {
  const size_t n_inst = mem.instance_count();
  std::vector<Tiers> out(n_inst, Tiers{0, 0, 0});
  std::vector<int> phase(n_inst, 0);
  for (size_t inst = 0; inst < n_inst; ++inst) phase[inst] = mem.Hidden(inst) ? 3 : 0;
  size_t walked = 0;
  for (; walked < keys.size(); ++walked) {
    const uint32_t node =
        by_engine ? mem.NodeByEngine(keys[walked]) : mem.NodeByContent(keys[walked]);
    if (node == kNoNode) break;
    std::vector<int> best(n_inst, 3);  // the lowest tier each instance holds the block on
    for (const HolderInfo& h : mem.Holders(node)) {
      const int t = h.medium < tier_of_medium.size() ? tier_of_medium[h.medium] : 3;
      best[h.instance] = std::min(best[h.instance], t);
    }
    bool any = false;
    for (size_t inst = 0; inst < n_inst; ++inst) {
      while (phase[inst] < 3 && best[inst] > phase[inst]) {
        out[inst][phase[inst]] = static_cast<int64_t>(walked);
        ++phase[inst];
      }
      any |= phase[inst] < 3;
    }
    if (!any) break;
  }
  for (size_t inst = 0; inst < n_inst; ++inst) {
    for (int t = phase[inst]; t < 3; ++t) out[inst][t] = static_cast<int64_t>(walked);
  }
  return out;
}

// Score's depth, per-medium presence and best medium (the heaviest-weighted medium holding the
// block; ties by medium id) by the same plain lookups.
struct PlainCounts {
  int64_t depth = 0;
  std::vector<int64_t> present;
  std::vector<int64_t> best;
};
std::vector<PlainCounts> PlainScore(const MemoryIndex& mem, const std::vector<uint64_t>& keys,
                                    bool by_engine, const std::vector<double>& weights) {
  const size_t n_inst = mem.instance_count();
  std::vector<PlainCounts> out(n_inst);
  std::vector<bool> alive(n_inst);
  for (size_t inst = 0; inst < n_inst; ++inst) {
    out[inst].present.assign(mem.medium_count(), 0);
    out[inst].best.assign(mem.medium_count(), 0);
    alive[inst] = !mem.Hidden(inst);
  }
  for (uint64_t key : keys) {
    const uint32_t node = by_engine ? mem.NodeByEngine(key) : mem.NodeByContent(key);
    if (node == kNoNode) break;
    std::vector<std::vector<bool>> on(n_inst, std::vector<bool>(mem.medium_count(), false));
    std::vector<bool> holds(n_inst, false);
    for (const HolderInfo& h : mem.Holders(node)) {
      on[h.instance][h.medium] = true;
      holds[h.instance] = true;
    }
    bool any = false;
    for (size_t inst = 0; inst < n_inst; ++inst) {
      alive[inst] = alive[inst] && holds[inst];
      if (!alive[inst]) continue;
      any = true;
      ++out[inst].depth;
      size_t top = mem.medium_count();
      for (size_t m = 0; m < mem.medium_count(); ++m) {
        out[inst].present[m] += on[inst][m];
        if (on[inst][m] && (top == mem.medium_count() || weights[m] > weights[top])) top = m;
      }
      ++out[inst].best[top];
    }
    if (!any) break;
  }
  return out;
}

// A random index: 20-140 instances (one to three bit words), chains stored with their parents
// (hints set as ingest sets them), branches off them, removals that free nodes (their ids
// reused by later stores), evictions, content keys shared by two engine hashes (only one node
// owns the key), and hints pointed at arbitrary nodes. Queries follow the chain, a branch or
// random keys, by engine hash and by content key, twice (the first walk rewrites the hints it
// found wrong). Seed printed.
TEST(MemoryIndexWalkTest, ChainHintsNeverChangeAWalk) {
  const unsigned seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Engine hashes 0 .. kKeys - 1 (0 is a valid hash, and a freed node's fields are zeros).
  constexpr uint64_t kKeys = 600;
  // Content key of engine hash e: engine hashes e and e + 300 share one.
  auto content_of = [](uint64_t e) { return 1'000'000 + (e % 300); };
  int checked = 0, hinted_differently = 0, scored = 0;
  for (int round = 0; round < 6; ++round) {
    MemoryIndex mem;
    // One, two and three bit words (the walks' fixed-word and general code).
    const size_t n_inst = round == 0   ? 130 + rng() % 11
                          : round == 1 ? 20 + rng() % 45
                                       : 70 + rng() % 71;
    for (size_t i = 0; i < n_inst; ++i) ASSERT_EQ(mem.InstanceId(static_cast<uint32_t>(i), 0), i);
    const uint32_t kvcr = mem.MediumId("CPU\x1fkvcr");
    std::vector<uint32_t> media = {0, 1, 2, kvcr};
    std::vector<uint8_t> tiers = {0, 1, 2, static_cast<uint8_t>(rng() % 4)};
    uint64_t seq = 0;
    auto store_chain = [&](const std::vector<uint64_t>& hashes, uint32_t parent) {
      const uint32_t inst = static_cast<uint32_t>(rng() % n_inst);
      const uint32_t medium = media[rng() % media.size()];
      uint32_t prev = parent;
      for (uint64_t h : hashes) {
        bool conflict = false;
        uint32_t node = kNoNode;
        mem.Store(inst, medium, 0, h, rng() % 8 == 0 ? 0 : content_of(h), 16, ++seq, 1, &conflict,
                  &node);
        ASSERT_NE(node, kNoNode);
        if (prev != kNoNode) mem.Link(prev, node);
        prev = node;
      }
    };
    for (int step = 0; step < 400; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 5) {  // a run of the main chain 1, 2, 3, ... from its parent
        const uint64_t first = rng() % kKeys;
        const uint64_t n = std::min<uint64_t>(kKeys - first, 1 + rng() % 120);
        std::vector<uint64_t> hs;
        for (uint64_t i = first; i < first + n; ++i) hs.push_back(i);
        store_chain(hs, first > 0 ? mem.NodeByEngine(first - 1) : kNoNode);
      } else if (op < 7) {  // a branch: random keys after a chain block
        const uint64_t at = rng() % kKeys;
        std::vector<uint64_t> hs;
        for (int i = static_cast<int>(rng() % 20); i >= 0; --i) hs.push_back(rng() % kKeys);
        store_chain(hs, mem.NodeByEngine(at));
      } else if (op < 9) {  // removals, freeing nodes
        for (int i = static_cast<int>(rng() % 40); i >= 0; --i) {
          mem.Remove(static_cast<uint32_t>(rng() % n_inst), media[rng() % media.size()], 0,
                     rng() % kKeys);
        }
      } else if (rng() % 3 == 0) {
        mem.EvictTo(mem.BudgetBytes() / 10 * 9);
      } else {  // hints pointed anywhere
        for (int i = 0; i < 50; ++i) {
          const uint32_t a = mem.NodeByEngine(rng() % kKeys);
          const uint32_t b = mem.NodeByEngine(rng() % kKeys);
          if (a != kNoNode && b != kNoNode) mem.Link(a, b);
        }
      }
      if (rng() % 4 == 0) mem.SetHidden(static_cast<uint32_t>(rng() % n_inst), rng() % 2 == 0);
      if (step % 20 != 19) continue;
      for (int q = 0; q < 6; ++q) {
        std::vector<uint64_t> hashes;
        const int shape = static_cast<int>(rng() % 3);
        const uint64_t first = rng() % 40;
        const size_t len = rng() % kKeys;
        for (size_t i = 0; i < len; ++i) {
          hashes.push_back(shape == 0   ? first + i
                           : shape == 1 ? (i < len / 2 ? first + i : rng() % kKeys)
                                        : rng() % kKeys);
        }
        for (bool by_engine : {true, false}) {
          std::vector<uint64_t> keys = hashes;
          if (!by_engine) {
            for (uint64_t& k : keys) k = content_of(k);
          }
          std::vector<uint64_t> filter((n_inst + 63) / 64, ~uint64_t{0});
          const std::vector<Tiers> want = PlainTiers(mem, keys, by_engine, tiers);
          std::vector<double> weights(mem.medium_count());
          for (double& w : weights) w = static_cast<double>(rng() % 3);  // ties too
          const std::vector<PlainCounts> want_counts = PlainScore(mem, keys, by_engine, weights);
          for (int pass = 0; pass < 2; ++pass) {
            BlockKeys given = BlockKeys::Given(keys);
            const std::vector<Tiers> got = mem.TieredScore(given, by_engine, filter, tiers);
            ASSERT_EQ(got.size(), n_inst);
            for (size_t inst = 0; inst < n_inst; ++inst) {
              ASSERT_EQ(got[inst], want[inst])
                  << "round " << round << " step " << step << " instance " << inst << " by_engine "
                  << by_engine << " pass " << pass << " shape " << shape;
            }
            BlockKeys given2 = BlockKeys::Given(keys);
            int64_t first_bs = 0;
            const std::vector<ScoreCounts> counts =
                mem.Score(given2, by_engine, filter, weights, 1, &first_bs);
            for (const ScoreCounts& c : counts) {
              ASSERT_EQ(c.depth, want_counts[c.instance].depth)
                  << "instance " << c.instance << " by_engine " << by_engine << " pass " << pass;
              ASSERT_EQ(c.present, want_counts[c.instance].present) << "instance " << c.instance;
              ASSERT_EQ(c.best, want_counts[c.instance].best) << "instance " << c.instance;
              ++scored;
            }
            ++checked;
          }
          hinted_differently += shape != 0;
        }
      }
    }
  }
  EXPECT_GT(checked, 2000);
  EXPECT_GT(scored, 20000);  // instance answers of Score checked
  EXPECT_GT(hinted_differently, 100);
}

// A freed node's fields are zeros, and 0 is a valid engine hash: a hint that still names a
// freed node must not answer for hash 0 (here held by another node).
TEST(MemoryIndexWalkTest, AHintToAFreedNodeIsNotFollowed) {
  MemoryIndex mem;
  const uint32_t inst = mem.InstanceId(0, 0);
  bool conflict = false;
  uint32_t n7 = kNoNode, n8 = kNoNode;
  mem.Store(inst, 0, 0, /*engine_hash=*/0, 0, 16, 1, 1, &conflict);
  mem.Store(inst, 0, 0, 7, 0, 16, 2, 1, &conflict, &n7);
  mem.Store(inst, 0, 0, 8, 0, 16, 3, 1, &conflict, &n8);
  mem.Link(n7, n8);
  ASSERT_TRUE(mem.Remove(inst, 0, 0, 8));  // n8 freed; n7's hint still names it
  ASSERT_EQ(mem.NodeByEngine(8), kNoNode);
  const std::vector<uint64_t> keys = {7, 0};
  BlockKeys given = BlockKeys::Given(keys);
  const std::vector<Tiers> got = mem.TieredScore(given, true, {~uint64_t{0}}, {0, 1, 2});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], (Tiers{2, 2, 2}));
}

// Two nodes with one content key (the same tokens under two engine hashes: two engines with
// different hash settings). When the node that owns the key in the content table is freed, the
// other takes the key over: token queries used to stop finding the content at all (the indexer's
// by-hash answer still had it), and a reopen, which rebuilds the table, answered differently.
TEST(MemoryIndexTest, AFreedContentOwnerHandsItsKeyToANodeWithTheSameContent) {
  MemoryIndex mem;
  const uint32_t a = mem.InstanceId(0, 0);
  const uint32_t b = mem.InstanceId(1, 0);
  bool conflict = false;
  uint32_t n100 = kNoNode, n200 = kNoNode, n300 = kNoNode;
  constexpr uint64_t kKey = 0xC0FFEE;
  mem.Store(a, 0, 0, /*engine_hash=*/100, kKey, 16, 1, 1, &conflict, &n100);
  mem.Store(b, 0, 0, 200, kKey, 16, 1, 1, &conflict, &n200);
  mem.Store(b, 0, 0, 300, kKey, 16, 2, 1, &conflict, &n300);
  ASSERT_FALSE(conflict);
  ASSERT_EQ(mem.NodeByContent(kKey), n100);
  ASSERT_TRUE(mem.Remove(a, 0, 0, 100));  // the owner is freed
  const uint32_t heir = mem.NodeByContent(kKey);
  ASSERT_TRUE(heir == n200 || heir == n300) << heir;
  const std::vector<uint64_t> keys = {kKey};
  BlockKeys given = BlockKeys::Given(keys);
  std::vector<Tiers> got = mem.TieredScore(given, false, {~uint64_t{0}}, {0, 1, 2});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[b], (Tiers{1, 1, 1}));
  // The heir freed too: the last sharer owns the key; then none is left.
  ASSERT_TRUE(mem.Remove(b, 0, 0, heir == n200 ? 200 : 300));
  const uint32_t last = heir == n200 ? n300 : n200;
  EXPECT_EQ(mem.NodeByContent(kKey), last);
  ASSERT_TRUE(mem.Remove(b, 0, 0, heir == n200 ? 300 : 200));
  EXPECT_EQ(mem.NodeByContent(kKey), kNoNode);
  // A freed sharer (not the owner) leaves the owner in place.
  mem.Store(a, 0, 0, 400, kKey, 16, 3, 1, &conflict, &n100);
  mem.Store(b, 0, 0, 500, kKey, 16, 3, 1, &conflict, &n200);
  ASSERT_TRUE(mem.Remove(b, 0, 0, 500));
  EXPECT_EQ(mem.NodeByContent(kKey), n100);
  ASSERT_TRUE(mem.Remove(a, 0, 0, 400));
  EXPECT_EQ(mem.NodeByContent(kKey), kNoNode);
}

// The walks count how they found each block: through the previous block's hint or the table
// (kvo_indexer_walk_blocks). A wrong hint costs one lookup, and the walk that found it wrong
// mends it.
TEST(MemoryIndexWalkTest, WalksCountHowTheyFoundEachBlock) {
  MemoryIndex mem;
  const uint32_t inst = mem.InstanceId(0, 0);
  std::vector<uint64_t> keys;
  std::vector<uint32_t> nodes;
  uint32_t prev = kNoNode;
  for (uint64_t h = 1; h <= 100; ++h) {  // a chain stored as ingest stores it
    bool conflict = false;
    uint32_t node = kNoNode;
    mem.Store(inst, 0, 0, h, 0, 16, h, 1, &conflict, &node);
    if (prev != kNoNode) mem.Link(prev, node);
    prev = node;
    keys.push_back(h);
    nodes.push_back(node);
  }
  auto walk = [&](bool tiered) {
    const uint64_t hinted = mem.walk_blocks_hinted(), looked_up = mem.walk_blocks_looked_up();
    BlockKeys given = BlockKeys::Given(keys);
    if (tiered) {
      EXPECT_EQ(mem.TieredScore(given, true, {~uint64_t{0}}, {0, 1, 2})[0], (Tiers{100, 100, 100}));
    } else {
      int64_t bs = 0;
      EXPECT_EQ(mem.Score(given, true, {~uint64_t{0}}, {1, 1, 1}, 1, &bs)[0].depth, 100);
    }
    return std::pair(mem.walk_blocks_hinted() - hinted, mem.walk_blocks_looked_up() - looked_up);
  };
  for (const bool tiered : {true, false}) {
    SCOPED_TRACE(tiered ? "TieredScore" : "Score");
    EXPECT_EQ(walk(tiered), std::pair(uint64_t{99}, uint64_t{1}));  // the first block: the table
    mem.Link(nodes[49], nodes[10]);                                 // block 50's hint: wrong
    EXPECT_EQ(walk(tiered), std::pair(uint64_t{98}, uint64_t{2}));
    EXPECT_EQ(walk(tiered), std::pair(uint64_t{99}, uint64_t{1}));  // mended by the last walk
  }
}

// Walks on several threads at once, each rewriting the hints it finds wrong (relaxed atomics,
// under the index's reader lock in the service), give the single-threaded answer. Run under TSan.
TEST(MemoryIndexWalkTest, ConcurrentWalksRewritingHintsAgree) {
  const unsigned seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  MemoryIndex mem;
  constexpr size_t kInst = 100;
  constexpr uint64_t kBlocks = 3000;
  for (size_t i = 0; i < kInst; ++i) mem.InstanceId(static_cast<uint32_t>(i), 0);
  uint64_t seq = 0;
  for (size_t inst = 0; inst < kInst; ++inst) {
    const uint64_t depth = rng() % kBlocks;
    for (uint64_t b = 0; b < depth; ++b) {
      bool conflict = false;
      mem.Store(static_cast<uint32_t>(inst), static_cast<uint32_t>(rng() % 3), 0, b + 1, 0, 16,
                ++seq, 1, &conflict);
    }
  }
  // Two query chains sharing their first half: each walk of one rewrites the hints of the other
  // at the branch.
  std::vector<uint64_t> a, b;
  for (uint64_t i = 1; i <= kBlocks; ++i) a.push_back(i);
  b = a;
  std::shuffle(b.begin() + kBlocks / 2, b.end(), rng);
  const std::vector<uint8_t> tiers = {0, 1, 2};
  const std::vector<uint64_t> filter(2, ~uint64_t{0});
  const std::vector<Tiers> want_a = PlainTiers(mem, a, true, tiers);
  const std::vector<Tiers> want_b = PlainTiers(mem, b, true, tiers);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const bool use_a = (i + t) % 2 == 0;
        BlockKeys keys = BlockKeys::Given(use_a ? a : b);
        if (mem.TieredScore(keys, true, filter, tiers) != (use_a ? want_a : want_b)) ++wrong;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace kvo::indexer_internal
