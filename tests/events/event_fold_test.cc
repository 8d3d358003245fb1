// KvEventFold: the Semantics section of schemas/kv_events.md, rule by rule.
#include "events/event_fold.h"

#include <gtest/gtest.h>

namespace kvo {
namespace {

BlockStored Stored(std::vector<uint64_t> hashes, std::optional<std::string> medium,
                   int64_t group = 0, std::optional<std::string> locality = std::nullopt) {
  BlockStored s;
  for (uint64_t h : hashes) s.block_hashes.push_back(BlockHash::Uint(h));
  s.medium = std::move(medium);
  s.group_idx = group;
  s.locality = std::move(locality);
  return s;
}

BlockRemoved Removed(std::vector<uint64_t> hashes, std::optional<std::string> medium,
                     int64_t group = 0, std::optional<std::string> locality = std::nullopt) {
  BlockRemoved r;
  for (uint64_t h : hashes) r.block_hashes.push_back(BlockHash::Uint(h));
  r.medium = std::move(medium);
  r.group_idx = group;
  r.locality = std::move(locality);
  return r;
}

const EventStream kA{"a", 0};
const EventStream kB{"a", 1};

TEST(KvEventFoldTest, StoresAndRemovalsAreReferenceCounted) {
  KvEventFold f;
  f.Apply(kA, Stored({1, 2}, "GPU"));
  f.Apply(kA, Stored({1}, "GPU"));  // a duplicate (two physical blocks, one content)
  EXPECT_EQ(f.Count(kA, "GPU", 0, 1, std::nullopt), 2);
  f.Apply(kA, Removed({1}, "GPU"));
  EXPECT_EQ(f.Count(kA, "GPU", 0, 1, std::nullopt), 1);
  f.Apply(kA, Removed({1, 1, 2}, "GPU"));  // listed twice: two removals, the second unknown
  EXPECT_EQ(f.size(), 0u);
  EXPECT_EQ(f.unknown_removals(), 1u);
}

TEST(KvEventFoldTest, AMissingMediumIsGpuAndAMissingGroupIsZero) {
  KvEventFold f;
  BlockStored s = Stored({7}, std::nullopt);
  s.group_idx.reset();
  f.Apply(kA, s);
  EXPECT_EQ(f.Count(kA, "GPU", 0, 7, std::nullopt), 1);
}

TEST(KvEventFoldTest, AllBlocksClearedDropsOnlyTheStreamsGpuEntries) {
  KvEventFold f;
  f.Apply(kA, Stored({1}, "GPU", 0));
  f.Apply(kA, Stored({1}, "GPU", 1));
  f.Apply(kA, Stored({2}, "CPU"));
  f.Apply(kA, Stored({3}, "STORAGE", 0, "LOCAL"));
  f.Apply(kB, Stored({1}, "GPU"));
  f.Apply(kA, AllBlocksCleared{});
  EXPECT_EQ(f.Count(kA, "GPU", 0, 1, std::nullopt), 0);
  EXPECT_EQ(f.Count(kA, "GPU", 1, 1, std::nullopt), 0);
  EXPECT_EQ(f.Count(kA, "CPU", 0, 2, std::nullopt), 1);
  EXPECT_EQ(f.Count(kA, "STORAGE", 0, 3, "LOCAL"), 1);
  EXPECT_EQ(f.Count(kB, "GPU", 0, 1, std::nullopt), 1);
}

TEST(KvEventFoldTest, ResidencyIsPartOfTheEntry) {
  KvEventFold f;
  f.Apply(kA, Stored({5}, "STORAGE", 0, "LOCAL"));
  f.Apply(kA, Stored({5}, "STORAGE", 0, "REMOTE"));
  f.Apply(kA, Removed({5}, "STORAGE", 0, "REMOTE"));
  EXPECT_EQ(f.Count(kA, "STORAGE", 0, 5, "LOCAL"), 1);
  EXPECT_EQ(f.Count(kA, "STORAGE", 0, 5, "REMOTE"), 0);
  // A removal naming a residency the stream does not hold the block in is unknown.
  f.Apply(kA, Removed({5}, "STORAGE", 0, std::nullopt));
  EXPECT_EQ(f.Count(kA, "STORAGE", 0, 5, "LOCAL"), 1);
  EXPECT_EQ(f.unknown_removals(), 1u);
  // Summed over residency for consumers that ignore locality.
  f.Apply(kA, Stored({5}, "STORAGE", 0, std::nullopt));
  const BlockCounts by = f.ByBlock(kMediumStorage);
  ASSERT_EQ(by.size(), 1u);
  EXPECT_EQ(by.begin()->second, 2);
}

// A secondary tier's own copy (`ownership`, vLLM's KVCR tier: "kvcr") is its own residency: a
// removal of the framework's copy does not touch it, and AllBlocksCleared (the framework's
// reset_prefix_cache) leaves it, as kvo's indexer does. The fold used to ignore ownership: it
// decremented the tier's copy on the framework's removal and cleared it on a reset.
TEST(KvEventFoldTest, OwnershipIsItsOwnResidencyAndSurvivesAClear) {
  KvEventFold f;
  BlockStored tier = Stored({7}, "GPU");
  tier.ownership = "kvcr";
  f.Apply(kA, tier);
  f.Apply(kA, Stored({8}, "GPU"));
  BlockStored empty_owner = Stored({9}, "GPU");
  empty_owner.ownership = "";  // the same as unset: the framework's
  f.Apply(kA, empty_owner);
  f.Apply(kA, Removed({7}, "GPU"));  // the framework never held 7
  EXPECT_EQ(f.unknown_removals(), 1u);
  ASSERT_EQ(f.size(), 3u);
  f.Apply(kA, AllBlocksCleared{});
  const std::vector<FoldEntry> left = f.Entries();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].hash, 7u);
  EXPECT_EQ(left[0].ownership, "kvcr");
  BlockRemoved rm = Removed({7}, "GPU");
  rm.ownership = "kvcr";
  f.Apply(kA, rm);
  EXPECT_EQ(f.size(), 0u);
  EXPECT_EQ(f.unknown_removals(), 1u);
}

TEST(KvEventFoldTest, EntriesAreSortedAndStreamsClearIndependently) {
  KvEventFold f;
  f.Apply(kB, Stored({2}, "CPU"));
  f.Apply(kA, Stored({9, 3}, "GPU"));
  f.Apply(EventStream{"b", 0}, Stored({1}, "GPU"));
  std::vector<FoldEntry> e = f.Entries();
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].stream, kA);
  EXPECT_EQ(e[0].hash, 3u);
  EXPECT_EQ(e[1].hash, 9u);
  EXPECT_EQ(e[2].stream, kB);
  f.ClearStream(kA);
  EXPECT_EQ(f.size(), 2u);
  f.ClearSource("a");
  EXPECT_EQ(f.size(), 1u);
}

TEST(KvEventFoldTest, DigestDistinguishesCounts) {
  KvEventFold f, g;
  f.Apply(kA, Stored({1, 2}, "CPU"));
  g.Apply(kA, Stored({2, 1}, "CPU"));
  EXPECT_EQ(DigestOf(f.ByBlock()), DigestOf(g.ByBlock()));
  g.Apply(kA, Stored({1}, "CPU"));
  EXPECT_NE(DigestOf(f.ByBlock()), DigestOf(g.ByBlock()));
  EXPECT_NE(DigestOf(f.ByBlock()), DigestOf(BlockCounts{}));
}

}  // namespace
}  // namespace kvo
