#include "planner/planner.h"

#include <gtest/gtest.h>

#include <fstream>

#include "events/events.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

std::string WriteFile(const testing::TempDir& dir, const std::string& name,
                      const std::string& text) {
  std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TraceRequest Req(int64_t input, std::vector<uint64_t> ids) {
  TraceRequest r;
  r.input_length = input;
  r.hash_ids = std::move(ids);
  return r;
}

TEST(TraceReaderTest, ReadsMooncakeLinesAndReportsBadOnesByLineNumber) {
  testing::TempDir dir;
  std::string path = WriteFile(dir, "t.jsonl",
                               "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, "
                               "\"hash_ids\": [0, 1]}\n"
                               "{\"timestamp\": 1, \"input_length\": 10\n"
                               "\n"
                               "{\"timestamp\": 2, \"input_length\": 600, \"hash_ids\": [0, -3]}\n"
                               "{\"timestamp\": 3, \"input_length\": 512, \"hash_ids\": [7]}\n");
  TraceReadReport report;
  auto trace = ReadMooncakeTrace(path, false, &report);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  ASSERT_EQ(trace->size(), 2u);
  EXPECT_EQ((*trace)[0].hash_ids, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ((*trace)[1].input_length, 512);
  EXPECT_EQ(report.skipped, 2u);
  ASSERT_EQ(report.errors.size(), 2u);
  EXPECT_NE(report.errors[0].find("line 2: invalid JSON"), std::string::npos) << report.errors[0];
  EXPECT_NE(report.errors[1].find("line 4: 'hash_ids' holds -3"), std::string::npos);

  TraceReadReport strict_report;
  auto strict = ReadMooncakeTrace(path, true, &strict_report);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("line 2"), std::string::npos);
  EXPECT_FALSE(ReadMooncakeTrace(dir.path() + "/missing", false, &report).ok());
}

TEST(TraceReaderTest, AJournalsGpuStoresAreTheRequestsAsTheEventsMeanThem) {
  // The medium rule of schemas/kv_events.md (Semantics): a store without a medium (vLLM before
  // #19737) is a GPU store, so it is a request; offload stores are not.
  kvo::testing::TempDir dir;
  {
    JournalOptions jo;
    jo.dir = dir.path();
    auto journal = Journal::Open(jo);
    ASSERT_TRUE(journal.ok()) << journal.status().ToString();
    auto store = [](std::optional<std::string> medium, uint64_t h) {
      BlockStored s;
      s.block_hashes = {BlockHash::Uint(h)};
      s.token_ids = {1, 2, 3, 4};
      s.block_size = 4;
      s.medium = std::move(medium);
      return s;
    };
    EventBatch b;
    b.ts = 1.0;
    b.events = {store(std::nullopt, 11), store(std::string(kMediumGpu), 12),
                store(std::string(kMediumCpu), 13)};
    ASSERT_TRUE((*journal)->Append(0, EncodeBatch(b)).ok());
  }
  TraceReadReport report;
  auto requests = ReadJournalWorkload(dir.path(), &report);
  ASSERT_TRUE(requests.ok()) << requests.status().ToString();
  ASSERT_EQ(requests->size(), 2u);
  EXPECT_EQ((*requests)[0].hash_ids, std::vector<uint64_t>{11});
  EXPECT_EQ((*requests)[1].hash_ids, std::vector<uint64_t>{12});
  EXPECT_EQ((*requests)[0].input_length, 4);
}

TEST(PlannerTest, TheoreticalMaximumByHand) {
  // Blocks of 4 tokens. r0 misses; r1 shares [1,2] -> 8 tokens; r2 shares [1] then diverges.
  std::vector<TraceRequest> trace = {Req(10, {1, 2, 3}), Req(9, {1, 2, 4}), Req(6, {1, 5})};
  PlanPoint max = TheoreticalMaximum(trace, 4);
  EXPECT_EQ(max.input_tokens, 25u);
  EXPECT_EQ(max.hit_tokens, 8u + 4u);
  EXPECT_EQ(max.capacity_blocks, 5u);
  // A partial last block caps the hit at the input length.
  PlanPoint capped = TheoreticalMaximum({Req(5, {9, 8}), Req(5, {9, 8})}, 4);
  EXPECT_EQ(capped.hit_tokens, 5u);
}

TEST(PlannerTest, ManagerWithRoomForEverythingReachesTheMaximum) {
  std::vector<TraceRequest> trace;
  for (uint64_t i = 0; i < 200; ++i) trace.push_back(Req(40, {i % 7, 100 + i % 13, 1000 + i}));
  PlanPoint max = TheoreticalMaximum(trace, 16);
  for (const char* policy : {"lru", "arc"}) {
    auto p = SimulateCapacity(trace, policy, max.capacity_blocks, 16);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->hit_tokens, max.hit_tokens) << policy;
    EXPECT_EQ(p->blocks_evicted, 0u);
  }
}

// Issue 10 item 12: `kvo plan --capacity-tokens 3e14 --block-tokens 1` aborted on a CHECK (a
// manager of 3e14 blocks). A capacity above the trace's distinct blocks is the unbounded answer.
TEST(PlannerTest, HugeCapacityIsTheUnboundedAnswerNotACrash) {
  std::vector<TraceRequest> trace;
  for (uint64_t i = 0; i < 100; ++i) trace.push_back(Req(3, {i % 5, 50 + i % 9, 1000 + i}));
  PlanPoint max = TheoreticalMaximum(trace, 1);
  for (const char* policy : {"lru", "arc"}) {
    for (uint64_t blocks :
         {uint64_t{300'000'000'000'000}, uint64_t{3'000'000'000}, max.capacity_blocks + 1}) {
      auto p = SimulateCapacity(trace, policy, blocks, 1);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      EXPECT_EQ(p->hit_tokens, max.hit_tokens) << policy << " " << blocks;
      EXPECT_EQ(p->blocks_evicted, 0u);
      EXPECT_EQ(p->capacity_blocks, blocks);  // reported as asked
    }
  }
}

TEST(PlannerTest, LruAtSmallCapacityByHand) {
  // Capacity 2 blocks of 1 token. r0 stores 1 then 2 (LRU order 1,2); r1 hits 1 and its touch
  // makes 1 most recent (2,1); r2 stores 3 evicting 2; r3 hits 1; r4 misses 2.
  std::vector<TraceRequest> trace = {Req(2, {1, 2}), Req(1, {1}), Req(1, {3}), Req(1, {1}),
                                     Req(1, {2})};
  auto p = SimulateCapacity(trace, "lru", 2, 1);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->hit_tokens, 2u);
  EXPECT_EQ(p->input_tokens, 6u);
  EXPECT_EQ(p->blocks_evicted, 2u);
  // A request longer than the whole cache cannot be stored at all (vLLM: "cannot store").
  auto big = SimulateCapacity({Req(3, {7, 8, 9}), Req(3, {7, 8, 9})}, "lru", 2, 1);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->hit_tokens, 0u);
  EXPECT_EQ(big->stores_rejected, 2u);
  EXPECT_FALSE(SimulateCapacity(trace, "fifo", 2, 1).ok());
}

TEST(PlannerTest, SvgHasOneLinePerPolicyAndTheMaximum) {
  std::vector<PlanPoint> points(4);
  const char* names[] = {"lru", "lru", "arc", "arc"};
  for (int i = 0; i < 4; ++i) {
    points[i].policy = names[i];
    points[i].capacity_tokens = i % 2 ? 1000000 : 10000000;
    points[i].input_tokens = 100;
    points[i].hit_tokens = 10 * (i + 1);
  }
  PlanPoint max;
  max.input_tokens = 100;
  max.hit_tokens = 60;
  std::string svg = RenderPlanSvg(points, max, "a <title>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  size_t lines = 0;
  for (size_t pos = 0; (pos = svg.find("<polyline", pos)) != std::string::npos; ++pos) ++lines;
  EXPECT_EQ(lines, 2u);
  EXPECT_NE(svg.find("max 60.0%"), std::string::npos);
  EXPECT_NE(svg.find("a &lt;title&gt;"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace kvo
