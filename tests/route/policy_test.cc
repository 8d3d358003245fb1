// The router's pure functions: the four policies, the kv score, flag parsing, the indexer's /query
// answer and the engines' delivered-hit reports.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "route/route.h"

namespace kvo::route {
namespace {

Candidate C(int64_t gpu, int64_t cpu, int64_t disk, int64_t in_flight = 0, bool available = true) {
  Candidate c;
  c.match.gpu = gpu;
  c.match.cpu = cpu;
  c.match.disk = disk;
  c.match.longest = std::max({gpu, cpu, disk});
  c.in_flight = in_flight;
  c.available = available;
  return c;
}

PolicyConfig Kv(double penalty = 1.0) {
  PolicyConfig p;
  p.policy = Policy::kKv;
  p.block_size = 16;
  p.load_penalty = penalty;
  return p;
}

TEST(KvScoreTest, WeighsEachMediumsShareOfThePrefix) {
  // 64 GPU tokens, CPU boundary at 96 (32 from CPU), DISK boundary at 160 (64 from disk).
  Candidate c = C(64, 96, 160, 2);
  EXPECT_EQ(c.match.GpuTokens(), 64);
  EXPECT_EQ(c.match.CpuTokens(), 32);
  EXPECT_EQ(c.match.DiskTokens(), 64);
  EXPECT_DOUBLE_EQ(KvScore(Kv(), c), (64 * 1.0 + 32 * 0.8 + 64 * 0.5) / 16 - 2);
  // Mooncake's "0 when the medium adds nothing": CPU 0 and DISK 0 after a GPU prefix.
  Candidate g = C(48, 0, 0);
  EXPECT_EQ(g.match.CpuTokens(), 0);
  EXPECT_EQ(g.match.DiskTokens(), 0);
  EXPECT_DOUBLE_EQ(KvScore(Kv(), g), 3.0);
  // Disk only (no GPU, no CPU contribution).
  Candidate d = C(0, 0, 32);
  EXPECT_EQ(d.match.DiskTokens(), 32);
  EXPECT_DOUBLE_EQ(KvScore(Kv(), d), 1.0);
}

TEST(PickTest, KvPrefersTheLongerWeightedPrefixUntilLoadOutweighsIt) {
  std::vector<Candidate> c = {C(0, 0, 0), C(64, 0, 0), C(0, 64, 0)};
  Choice ch = Pick(Kv(), c, 0, 0);
  EXPECT_EQ(ch.index, 1);
  EXPECT_EQ(ch.predicted_hit_tokens, 64);
  EXPECT_DOUBLE_EQ(ch.score, 4.0);
  c[1].in_flight = 1;  // 4 - 1 = 3 < 3.2 (CPU: 64 * 0.8 / 16)
  EXPECT_EQ(Pick(Kv(), c, 0, 0).index, 2);
  c[1].in_flight = 5;
  c[2].in_flight = 5;  // both negative, the empty engine wins
  EXPECT_EQ(Pick(Kv(), c, 0, 0).index, 0);
  EXPECT_EQ(Pick(Kv(), c, 0, 0).predicted_hit_tokens, 0);
  c[1].available = false;
  c[1].in_flight = 0;
  EXPECT_NE(Pick(Kv(), c, 0, 0).index, 1);  // never an unavailable one
}

TEST(PickTest, KvTiesGoToFewerInFlightThenRotate) {
  std::vector<Candidate> c = {C(0, 0, 0), C(0, 0, 0), C(0, 0, 0)};
  PolicyConfig p = Kv(0.0);  // no penalty: every score is 0
  c[0].in_flight = 1;
  EXPECT_EQ(Pick(p, c, 0, 0).index, 1);
  c[0].in_flight = 0;
  for (uint64_t turn = 0; turn < 6; ++turn) {
    EXPECT_EQ(Pick(p, c, turn, 0).index, static_cast<int>(turn % 3)) << "turn " << turn;
  }
}

TEST(PickTest, RoundRobinSkipsUnavailable) {
  PolicyConfig p;
  p.policy = Policy::kRoundRobin;
  std::vector<Candidate> c = {C(0, 0, 0), C(0, 0, 0, 0, false), C(0, 0, 0)};
  std::vector<int> got;
  for (uint64_t t = 0; t < 6; ++t) got.push_back(Pick(p, c, t, 0).index);
  EXPECT_EQ(got, (std::vector<int>{0, 2, 2, 0, 2, 2}));
  EXPECT_EQ(Pick(p, c, 7, 0).score, 0);
}

TEST(PickTest, LeastLoadedAndRandom) {
  PolicyConfig ll;
  ll.policy = Policy::kLeastLoaded;
  std::vector<Candidate> c = {C(0, 0, 0, 3), C(0, 0, 0, 1), C(0, 0, 0, 1)};
  EXPECT_EQ(Pick(ll, c, 0, 0).index, 1);
  EXPECT_EQ(Pick(ll, c, 2, 0).index, 2);  // tie broken by rotation from turn
  PolicyConfig rnd;
  rnd.policy = Policy::kRandom;
  c[1].available = false;
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::map<int, int> counts;
  for (int i = 0; i < 2000; ++i) counts[Pick(rnd, c, 0, rng()).index]++;
  EXPECT_EQ(counts.count(1), 0u);
  EXPECT_GT(counts[0], 800);
  EXPECT_GT(counts[2], 800);
}

TEST(PickTest, NothingAvailableIsMinusOne) {
  for (Policy policy : {Policy::kKv, Policy::kRoundRobin, Policy::kRandom, Policy::kLeastLoaded}) {
    PolicyConfig p;
    p.policy = policy;
    std::vector<Candidate> none = {C(16, 0, 0, 0, false), C(0, 0, 0, 0, false)};
    EXPECT_EQ(Pick(p, none, 1, 1).index, -1) << PolicyName(policy);
    EXPECT_EQ(Pick(p, std::vector<Candidate>{}, 1, 1).index, -1) << PolicyName(policy);
  }
}

TEST(FlagsTest, PolicyAndTierWeights) {
  for (auto name : {"kv", "round-robin", "random", "least-loaded"}) {
    auto p = ParsePolicy(name);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(PolicyName(*p), name);
  }
  auto bad = ParsePolicy("fastest");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'fastest'"), std::string::npos);

  auto w = ParseTierWeights("CPU=0.5, gpu=2,STORAGE=0");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->gpu, 2);
  EXPECT_EQ(w->cpu, 0.5);
  EXPECT_EQ(w->disk, 0);
  for (const char* text : {"", "GPU", "GPU=x", "GPU=-1", "GPU=inf", "HBM=1", "GPU=1,"}) {
    auto r = ParseTierWeights(text);
    EXPECT_FALSE(r.ok()) << text;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("--tier-weights"), std::string::npos) << text;
    }
  }
}

TEST(QueryTest, RendersTheBodyAndParsesTheTieredAnswer) {
  std::vector<int64_t> ids = {1, 2, 300000, 4};
  EXPECT_EQ(RenderQueryRequest("m\"x", 2, ids),
            R"({"model":"m\"x","block_size":2,"token_ids":[1,2,300000,4]})");
  auto r = ParseQueryResponse(
      R"({"default":{"a":{"longest_matched":64,"GPU":32,"DP":{"0":64},"CPU":64,"DISK":0},)"
      R"("b":{"longest_matched":0,"GPU":0,"CPU":0,"DISK":0}},"other":{"c":{"GPU":16}}})",
      "default");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ(r->at("a").gpu, 32);
  EXPECT_EQ(r->at("a").CpuTokens(), 32);
  EXPECT_EQ(r->at("a").PrefixTokens(), 64);
  EXPECT_TRUE(ParseQueryResponse("{}", "default")->empty());
  EXPECT_FALSE(ParseQueryResponse("[1]", "default").ok());
  EXPECT_FALSE(ParseQueryResponse(R"({"default":{"a":{"GPU":"x"}}})", "default").ok());
  EXPECT_FALSE(ParseQueryResponse("{", "default").ok());
}

TEST(DeliveredTest, KvoObjectThenUsage) {
  EXPECT_EQ(DeliveredHitTokens(R"({"kvo":{"hit_tokens":{"GPU":16,"CPU":32,"DISK":0}}})"), 48);
  EXPECT_EQ(DeliveredHitTokens(R"({"usage":{"prompt_tokens_details":{"cached_tokens":7}}})"), 7);
  EXPECT_EQ(DeliveredHitTokens(R"({"usage":{"prompt_tokens":7}})"), std::nullopt);
  EXPECT_EQ(DeliveredHitTokens("not json"), std::nullopt);
}

}  // namespace
}  // namespace kvo::route
