// GET /v1/instances/{id}/blocks over a real Indexer (SQLite file): per-medium block sets of one
// instance (a --source name or every stream registered under an instance_id), STORAGE named
// DISK, duplicates and groups folded, removals and clears followed, and the digest's definition.
#include "indexer/service/instance_blocks_api.h"

#include <gtest/gtest.h>

#include <random>

#include "common/json.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

IndexerOptions TestOptions() {
  IndexerOptions o;
  o.background_thread = false;
  return o;
}

BlockStored Store(std::vector<uint64_t> hashes, const std::string& medium, int64_t group = 0) {
  BlockStored s;
  for (uint64_t h : hashes) s.block_hashes.push_back(BlockHash::Uint(h));
  s.medium = medium;
  s.group_idx = group;
  return s;
}

BlockRemoved Remove(std::vector<uint64_t> hashes, const std::string& medium) {
  BlockRemoved r;
  for (uint64_t h : hashes) r.block_hashes.push_back(BlockHash::Uint(h));
  r.medium = medium;
  return r;
}

EventBatch Batch(std::vector<KvEvent> events) {
  EventBatch b;
  b.ts = 1700000000.0;
  b.events = std::move(events);
  return b;
}

nlohmann::json Get(const Indexer& idx, const std::string& path, int want_status = 200) {
  HttpResponse r;
  EXPECT_TRUE(ServeInstanceBlocks(HttpRequest{"GET", path, ""}, idx, &r)) << path;
  EXPECT_EQ(r.status, want_status) << r.body;
  auto j = ParseJson(r.body);
  EXPECT_TRUE(j.ok()) << r.body;
  return j.ok() ? *j : nlohmann::json();
}

std::vector<std::string> Hexes(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end());
  std::vector<std::string> out;
  for (uint64_t h : v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    out.push_back(buf);
  }
  return out;
}

TEST(InstanceBlocksTest, PerMediumSetsOfOneInstance) {
  testing::TempDir dir;
  auto idx = Indexer::Open(dir.path() + "/i.sqlite", TestOptions());
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  Indexer& ix = **idx;
  // sim-0 registered on two DP ranks (service naming "<id>@<tenant>@<rank>"), sim-1 elsewhere.
  ASSERT_TRUE(
      ix.ApplyBatch("sim-0@default@0", 0, 1,
                    Batch({Store({1, 2, 3}, "GPU"), Store({2}, "GPU", 1), Store({2}, "GPU"),
                           Store({1, 0xffffffffffffffffULL}, "CPU"), Store({7}, "STORAGE")}))
          .ok());
  ASSERT_TRUE(ix.ApplyBatch("sim-0@default@1", 1, 1, Batch({Store({9}, "GPU")})).ok());
  ASSERT_TRUE(ix.ApplyBatch("sim-1", 0, 1, Batch({Store({4}, "GPU")})).ok());
  ASSERT_TRUE(ix.ApplyBatch("sim-0@default@0", 0, 2, Batch({Remove({3}, "GPU")})).ok());

  nlohmann::json j = Get(ix, "/v1/instances/sim-0/blocks");
  EXPECT_EQ(j["instance"], "sim-0");
  EXPECT_EQ(j["sources"], nlohmann::json({"sim-0@default@0", "sim-0@default@1"}));
  EXPECT_EQ(j["blocks"]["GPU"], nlohmann::json(Hexes({1, 2, 9})));
  EXPECT_EQ(j["blocks"]["CPU"], nlohmann::json(Hexes({1, 0xffffffffffffffffULL})));
  EXPECT_EQ(j["blocks"]["DISK"], nlohmann::json(Hexes({7})));
  EXPECT_EQ(j["count"]["GPU"], 3);
  EXPECT_EQ(j["digest"]["GPU"], BlockSetDigest({9, 2, 1, 2}));
  EXPECT_EQ(j["digest"]["DISK"], BlockSetDigest({7}));

  // Registered, nothing published yet: known and empty.
  ASSERT_TRUE(ix.PutRegistration("sim-2@default@0", "{}").ok());
  nlohmann::json idle = Get(ix, "/v1/instances/sim-2/blocks");
  EXPECT_EQ(idle["sources"], nlohmann::json({"sim-2@default@0"}));
  EXPECT_EQ(idle["blocks"]["GPU"], nlohmann::json::array());

  nlohmann::json one = Get(ix, "/v1/instances/sim-1/blocks");
  EXPECT_EQ(one["blocks"]["GPU"], nlohmann::json(Hexes({4})));
  EXPECT_EQ(one["blocks"]["CPU"], nlohmann::json::array());
  EXPECT_EQ(one["digest"]["CPU"], "0000000000000000");

  // AllBlocksCleared drops the stream's GPU entries, not the offloaded ones.
  ASSERT_TRUE(ix.ApplyBatch("sim-0@default@0", 0, 3, Batch({AllBlocksCleared{}})).ok());
  j = Get(ix, "/v1/instances/sim-0/blocks");
  EXPECT_EQ(j["blocks"]["GPU"], nlohmann::json(Hexes({9})));
  EXPECT_EQ(j["blocks"]["CPU"].size(), 2u);
}

TEST(InstanceBlocksTest, UnknownInstanceMethodAndOtherPaths) {
  testing::TempDir dir;
  auto idx = Indexer::Open(dir.path() + "/i.sqlite", TestOptions());
  ASSERT_TRUE(idx.ok());
  nlohmann::json e = Get(**idx, "/v1/instances/nobody/blocks", 404);
  EXPECT_NE(e["error"].get<std::string>().find("nobody"), std::string::npos);
  HttpResponse r;
  EXPECT_TRUE(ServeInstanceBlocks(HttpRequest{"POST", "/v1/instances/x/blocks", ""}, **idx, &r));
  EXPECT_EQ(r.status, 405);
  for (const char* p : {"/v1/instances//blocks", "/v1/instances/a/b/blocks", "/v1/sources",
                        "/v1/instances/a", "/v1/instances/a/blocksx"}) {
    HttpResponse untouched;
    EXPECT_FALSE(ServeInstanceBlocks(HttpRequest{"GET", p, ""}, **idx, &untouched)) << p;
  }
}

// The digest is a function of the set: any order, any duplicates; and it tells sets apart.
TEST(InstanceBlocksTest, DigestIsOrderIndependentAndSeparatesSets) {
  std::mt19937_64 rng(12345);
  std::printf("seed 12345\n");
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint64_t> v(1 + rng() % 50);
    for (uint64_t& x : v) x = rng();
    std::vector<uint64_t> w = v;
    std::shuffle(w.begin(), w.end(), rng);
    w.push_back(v[0]);
    EXPECT_EQ(BlockSetDigest(v), BlockSetDigest(w));
    w.push_back(rng());
    EXPECT_NE(BlockSetDigest(v), BlockSetDigest(w));
  }
  EXPECT_EQ(BlockSetDigest({}), "0000000000000000");
}

}  // namespace
}  // namespace kvo
