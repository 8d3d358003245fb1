// The manager as a vLLM user configures it: a `--kv-transfer-config` JSON with
// TieringOffloadingSpec and an fs secondary tier, parsed, sized by the geometry and assembled over
// real CPU rows and a real directory. Checks what the config promises: the CPU tier's size, the
// cascade to files in vLLM's layout, vLLM's asynchronous secondary lookup (RETRY, then a
// promotion), the tier's locality and events under the global flag, kvo's max_bytes bound, the CPU
// spec ignoring secondary_tiers, and errors that name the problem.
#include "manager/offload_stack.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "manager/event_fold.h"
#include "manager/secondary_tier.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

constexpr uint64_t kRow = 4096;

OffloadKey K(int i) { return OffloadKey::FromDigest("stack-block-" + std::to_string(i), 0); }

RequestContext Ctx() {
  RequestContext c;
  c.req_id = "r";
  return c;
}

size_t FilesUnder(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().extension() == ".bin") ++n;
  }
  return n;
}

class OffloadStackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mem_ = static_cast<uint8_t*>(std::aligned_alloc(4096, 8 * kRow));
    std::memset(mem_, 0, 8 * kRow);
    disk_ = dir_.path() + "/disk";
    std::filesystem::create_directory(disk_);  // the file tier never creates its root
  }
  void TearDown() override { std::free(mem_); }

  // 4 CPU blocks of one 4 KiB row; a file tier bounded to `disk_blocks` rows.
  std::string Json(const std::string& spec, int disk_blocks, const std::string& root) const {
    return R"({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": ")" +
           spec + R"(", "cpu_bytes_to_use": 16384, "eviction_policy": "arc",
        "secondary_tiers": [{"type": "fs", "root_dir": ")" +
           root + R"(", "n_read_threads": 2, "n_write_threads": 2, "enable_kv_events": true,
          "locality": "LOCAL", "max_bytes": )" +
           std::to_string(disk_blocks * kRow) + "}]}}";
  }

  Result<OffloadStackOptions> Options(const std::string& json, bool global_events = true,
                                      uint64_t rows = 4) {
    KvGeometry kv;
    kv.worker_kv_bytes_per_block = kRow;
    KVO_ASSIGN_OR_RETURN(OffloadConfig config, ParseOffloadConfig(json, kv));
    KVO_ASSIGN_OR_RETURN(OffloadGeometry geometry, ComputeOffloadGeometry(config, kv));
    OffloadStackOptions o;
    o.config = std::move(config);
    o.geometry = geometry;
    o.cpu_rows = HostRegion{reinterpret_cast<uintptr_t>(mem_), rows, kRow};
    o.run.model_name = "stack-test-model";
    o.enable_kv_cache_events = global_events;
    o.manager.journal = journal_.get();
    return o;
  }

  void OpenJournal() {
    JournalOptions jo;
    jo.dir = dir_.path() + "/journal";
    auto j = Journal::Open(jo);
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    journal_ = std::move(j).value();
  }

  void Store(OffloadManager& m, int i) {
    const OffloadKey k = K(i);
    auto out = m.PrepareStore(std::span<const OffloadKey>(&k, 1), Ctx());
    ASSERT_TRUE(out.ok() && out->has_value()) << i;
    for (int32_t slot : (*out)->slots) std::memset(mem_ + slot * kRow, i, kRow);
    ASSERT_TRUE(m.CompleteStore(std::span<const OffloadKey>(&k, 1), Ctx(), true).ok());
    Step(m);
  }
  // One scheduler step with the disk I/O it started waited for.
  static void Step(OffloadManager& m) {
    m.OnScheduleEnd();
    for (size_t t = 0; t < m.num_secondary_tiers(); ++t) m.secondary_tier(t).Drain();
    m.OnScheduleEnd();
    ASSERT_TRUE(m.PublishEvents().ok());
  }

  testing::TempDir dir_;
  std::string disk_;
  uint8_t* mem_ = nullptr;
  std::unique_ptr<Journal> journal_;
};

TEST_F(OffloadStackTest, TieringConfigBuildsTheCpuTierAndABoundedAsyncFileTier) {
  OpenJournal();
  auto o = Options(Json("TieringOffloadingSpec", 2, disk_));
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->geometry.num_blocks, 4u);
  auto m = BuildOffloadManager(*o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ((*m)->num_secondary_tiers(), 1u);
  EXPECT_EQ((*m)->secondary_tier(0).name(), "fs");
  EXPECT_EQ((*m)->secondary_tier(0).locality(), std::optional<std::string>("LOCAL"));
  for (int i = 0; i < 3; ++i) Store(**m, i);
  EXPECT_EQ(FilesUnder(disk_), 2u);  // max_bytes holds two rows: the tier evicted one file

  // Consumers saw CPU and STORAGE announcements (the tier's events under the global flag).
  auto fold = ReplayJournal(*journal_);
  ASSERT_TRUE(fold.ok()) << fold.status().ToString();
  EXPECT_EQ(fold->Hashes(kMediumCpu).size(), 3u);
  EXPECT_EQ(fold->Hashes(kMediumStorage).size(), 2u);

  // A second engine over the same directory finds the files; its lookups are vLLM's async ones.
  m->reset();
  std::memset(mem_, 0, 8 * kRow);
  auto fresh = BuildOffloadManager(*o);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  const OffloadKey k2 = K(2);
  EXPECT_EQ((*fresh)->Lookup(k2, Ctx()), LookupResult::kRetry);  // the check starts
  (*fresh)->OnScheduleEnd();
  EXPECT_EQ((*fresh)->Lookup(k2, Ctx()), LookupResult::kHitPending);  // verdict: promote
  Step(**fresh);
  ASSERT_EQ((*fresh)->Lookup(k2, Ctx()), LookupResult::kHit);
  auto slots = (*fresh)->PrepareLoad(std::span<const OffloadKey>(&k2, 1), Ctx());
  ASSERT_TRUE(slots.ok());
  EXPECT_EQ(mem_[(*slots)[0] * kRow + 100], 2);  // the bytes came back from the file
}

TEST_F(OffloadStackTest, CpuSpecIgnoresSecondaryTiersAsVllmDoes) {
  auto o = Options(Json("CPUOffloadingSpec", 2, disk_));
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  auto m = BuildOffloadManager(*o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->num_secondary_tiers(), 0u);
  EXPECT_TRUE(std::filesystem::is_empty(disk_));
}

TEST_F(OffloadStackTest, GlobalEventsOffSilencesTheTier) {
  OpenJournal();
  auto o = Options(Json("TieringOffloadingSpec", 4, disk_), /*global_events=*/false);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  auto m = BuildOffloadManager(*o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Store(**m, 1);
  EXPECT_EQ(FilesUnder(disk_), 1u);  // the data still cascades
  auto fold = ReplayJournal(*journal_);
  ASSERT_TRUE(fold.ok());
  EXPECT_TRUE(fold->Hashes(kMediumCpu).empty());
  EXPECT_TRUE(fold->Hashes(kMediumStorage).empty());
}

TEST_F(OffloadStackTest, RecoverReconcilesWithTheDirectory) {
  OpenJournal();
  auto o = Options(Json("TieringOffloadingSpec", 4, disk_));
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  {
    auto m = BuildOffloadManager(*o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    for (int i = 0; i < 2; ++i) Store(**m, i);
  }
  auto r = RecoverOffloadManager(*o, *journal_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto fold = ReplayJournal(*journal_);
  ASSERT_TRUE(fold.ok());
  EXPECT_TRUE(fold->Hashes(kMediumCpu).empty());       // volatile: announced removed
  EXPECT_EQ(fold->Hashes(kMediumStorage).size(), 2u);  // the files survived
}

// A fresh start (no journal history, as kvo.OffloadManager with an empty journal and `kvo sim`
// start) over a directory an earlier run filled: the blocks on disk are announced once, so the fold
// of the events is what the manager holds, and their later eviction removes announced blocks.
TEST_F(OffloadStackTest, AFreshStartAnnouncesTheBlocksAlreadyOnDisk) {
  auto o = Options(Json("TieringOffloadingSpec", 3, disk_));
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  {
    auto earlier = BuildOffloadManager(*o);  // an earlier run, its events gone with it
    ASSERT_TRUE(earlier.ok()) << earlier.status().ToString();
    for (int i = 0; i < 3; ++i) Store(**earlier, i);
  }
  ASSERT_EQ(FilesUnder(disk_), 3u);
  OpenJournal();
  o->manager.journal = journal_.get();
  o->manager.track_blocks = true;
  auto m = BuildOffloadManager(*o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE((*m)->PublishEvents().ok());
  auto check = [&](const char* when) {
    auto fold = ReplayJournal(*journal_);
    ASSERT_TRUE(fold.ok()) << fold.status().ToString();
    auto snap = (*m)->Snapshot();
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    EXPECT_EQ(fold->Hashes(kMediumStorage), snap->storage_hashes) << when;
    EXPECT_EQ(fold->Hashes(kMediumCpu), snap->cpu_hashes) << when;
    EXPECT_EQ(fold->fold().unknown_removals(), 0u) << when;
  };
  check("at start");
  EXPECT_EQ(ReplayJournal(*journal_)->Hashes(kMediumStorage).size(), 3u);
  for (int i = 10; i < 12; ++i) Store(**m, i);  // the disk tier evicts two earlier blocks
  ASSERT_EQ(FilesUnder(disk_), 3u);
  check("after evictions");
}

// The parser accepts a pool of 0 threads (the sum must be >= 1: the other pool takes its queue
// too); the stack builds it and the tier stores and loads. Counts past the cap are refused by name
// before the narrowing cast (2^32 used to become 0).
TEST_F(OffloadStackTest, ThreadCountsTheParserAcceptsBuildAndOthersAreNamed) {
  for (const auto& [rd, wr] : {std::pair<int, int>{0, 1}, {1, 0}}) {
    std::string json = Json("TieringOffloadingSpec", 4, disk_);
    const std::string from = R"("n_read_threads": 2, "n_write_threads": 2)";
    json.replace(json.find(from), from.size(),
                 "\"n_read_threads\": " + std::to_string(rd) +
                     ", \"n_write_threads\": " + std::to_string(wr));
    auto o = Options(json);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    auto m = BuildOffloadManager(*o);
    ASSERT_TRUE(m.ok()) << rd << "/" << wr << ": " << m.status().ToString();
    Store(**m, rd);
    EXPECT_EQ(FilesUnder(disk_), 1u) << rd << "/" << wr;
    m->reset();
    std::filesystem::remove_all(disk_);
    std::filesystem::create_directory(disk_);
  }
  auto o = Options(Json("TieringOffloadingSpec", 4, disk_));
  ASSERT_TRUE(o.ok());
  FsTierConfig fs = o->config.secondary_tiers[0].fs;
  fs.n_write_threads = int64_t{1} << 32;
  auto t = BuildFsTier(fs, o->run, 0, o->geometry, o->cpu_rows, false, "secondary_tiers[0]");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("secondary_tiers[0].n_write_threads must be 0..1024, got "
                                      "4294967296"),
            std::string::npos)
      << t.status().ToString();
}

TEST_F(OffloadStackTest, ErrorsNameWhatDoesNotFit) {
  auto small = Options(Json("TieringOffloadingSpec", 2, disk_), true, /*rows=*/2);
  ASSERT_TRUE(small.ok());
  auto m = BuildOffloadManager(*small);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("CPU rows (2 of 4096 bytes)"), std::string::npos)
      << m.status().ToString();

  const std::string file = dir_.path() + "/not-a-dir";
  std::ofstream(file) << "x";
  auto bad = Options(Json("TieringOffloadingSpec", 2, file));
  ASSERT_TRUE(bad.ok());
  auto m2 = BuildOffloadManager(*bad);
  ASSERT_FALSE(m2.ok());
  EXPECT_NE(m2.status().message().find("secondary_tiers[0] (root_dir '" + file + "')"),
            std::string::npos)
      << m2.status().ToString();
}

}  // namespace
}  // namespace kvo
