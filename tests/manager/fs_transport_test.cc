// The manager on a real disk: OffloadManager + IndexedTier over FsTransport (kvo's file tier with
// vLLM's layout). Stores cascade to files, the bounded tier evicts files, a restart
// (OffloadManager::Recover over the journal, the tier rebuilt from the disk scan) reconciles, and
// blocks promote back byte-exact; a corrupted file is a lost key, removed and announced.
#include "manager/fs_transport.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>

#include "events/journal.h"
#include "manager/offload_manager.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

constexpr uint64_t kRow = 4096;
constexpr size_t kCpuBlocks = 4;

OffloadKey K(int i) { return OffloadKey::FromDigest("kvo-block-" + std::to_string(i), 0); }

RequestContext Ctx() {
  RequestContext c;
  c.req_id = "r";
  return c;
}

class FsTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mem_ = static_cast<uint8_t*>(std::aligned_alloc(4096, kCpuBlocks * kRow));
    std::memset(mem_, 0, kCpuBlocks * kRow);
    JournalOptions jo;
    jo.dir = dir_.path() + "/journal";
    auto j = Journal::Open(jo);
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    journal_ = std::move(j).value();
  }
  void TearDown() override {
    manager_.reset();
    tier_.reset();
    transport_.reset();
    std::free(mem_);
  }

  ManagerOptions Build() {
    FsBlockStoreOptions fo;
    fo.root_dir = dir_.path();
    fo.fields.model_name = "test-model";
    fo.n_read_threads = fo.n_write_threads = 2;
    auto t =
        FsTransport::Create(fo, HostRegion{reinterpret_cast<uintptr_t>(mem_), kCpuBlocks, kRow});
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    transport_ = *t;
    IndexedTierOptions to;
    to.block_bytes = kRow;
    to.max_bytes = disk_blocks_ * kRow;
    auto tier = IndexedTier::Create(to, transport_);
    EXPECT_TRUE(tier.ok()) << tier.status().ToString();
    tier_ = std::shared_ptr<IndexedTier>(std::move(tier).value());
    ManagerOptions o;
    o.num_blocks = kCpuBlocks;
    o.secondary_tiers = {tier_};
    o.journal = journal_.get();
    return o;
  }

  uint8_t* Row(int32_t slot) { return mem_ + static_cast<uint64_t>(slot) * kRow; }
  static uint8_t Byte(int key, uint64_t off) { return static_cast<uint8_t>(key * 131 + off * 7); }

  // The engine's part of a store: fill the slot's row, then complete.
  void Store(int i) {
    const OffloadKey k = K(i);
    auto out = manager_->PrepareStore(std::span<const OffloadKey>(&k, 1), Ctx());
    ASSERT_TRUE(out.ok() && out->has_value());
    ASSERT_EQ((*out)->slots.size(), 1u);
    for (uint64_t b = 0; b < kRow; ++b) Row((*out)->slots[0])[b] = Byte(i, b);
    ASSERT_TRUE(manager_->CompleteStore(std::span<const OffloadKey>(&k, 1), Ctx(), true).ok());
    Step();
  }
  // One scheduler step, with the disk I/O it started waited for and collected.
  void Step() {
    manager_->OnScheduleEnd();
    manager_->secondary_tier(0).Drain();
    manager_->OnScheduleEnd();
    ASSERT_TRUE(manager_->PublishEvents().ok());
  }
  std::set<std::string> OnDisk() {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_.path())) {
      if (e.path().extension() == ".bin") out.insert(e.path().stem().string());
    }
    return out;
  }
  // Promotes key i from disk to the CPU tier and checks its bytes.
  void LoadBack(int i) {
    const OffloadKey k = K(i);
    ASSERT_EQ(manager_->Lookup(k, Ctx()), LookupResult::kHitPending) << i;
    Step();  // submits the promotion and collects it
    ASSERT_EQ(manager_->Lookup(k, Ctx()), LookupResult::kHit) << i;
    auto slots = manager_->PrepareLoad(std::span<const OffloadKey>(&k, 1), Ctx());
    ASSERT_TRUE(slots.ok());
    for (uint64_t b = 0; b < kRow; ++b) ASSERT_EQ(Row((*slots)[0])[b], Byte(i, b)) << i << "@" << b;
    ASSERT_TRUE(manager_->CompleteLoad(std::span<const OffloadKey>(&k, 1), Ctx()).ok());
  }

  testing::TempDir dir_;
  uint8_t* mem_ = nullptr;
  uint64_t disk_blocks_ = 3;  // the disk tier's budget in blocks
  std::unique_ptr<Journal> journal_;
  std::shared_ptr<FsTransport> transport_;
  std::shared_ptr<IndexedTier> tier_;
  std::unique_ptr<OffloadManager> manager_;
};

TEST_F(FsTransportTest, StoreEvictRestartAndLoadBack) {
  auto m = OffloadManager::Create(Build());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  manager_ = std::move(m).value();
  for (int i = 0; i < 6; ++i) Store(i);
  // The disk tier holds 3 blocks: 0..2 were evicted from it (files removed), 3..5 remain.
  std::set<std::string> want;
  for (int i = 3; i < 6; ++i) want.insert(K(i).Hex());
  EXPECT_EQ(OnDisk(), want);
  std::vector<OffloadKey> held;
  tier_->ListHeld(&held);
  EXPECT_EQ(held.size(), 3u);

  // Restart: in-memory state gone; the tier rebuilds from the disk, the manager from the journal.
  manager_.reset();
  tier_.reset();
  transport_.reset();
  std::memset(mem_, 0, kCpuBlocks * kRow);
  auto r = OffloadManager::Recover(Build(), *journal_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  manager_ = std::move(r).value();
  held.clear();
  tier_->ListHeld(&held);
  std::set<std::string> held_hex;
  for (const auto& k : held) held_hex.insert(k.Hex());
  EXPECT_EQ(held_hex, want);
  // The CPU tier starts empty; blocks 3..5 come back from disk byte-exact.
  for (int i = 3; i < 6; ++i) LoadBack(i);
  EXPECT_EQ(manager_->Lookup(K(0), Ctx()), LookupResult::kMiss);
}

// A promised hit (HIT_PENDING) keeps its disk block until the load is submitted: a store in the
// same step that needs room on the full disk tier evicts another block, not the promised one.
TEST_F(FsTransportTest, PromisedBlockIsNotEvictedByAStoreInTheSameStep) {
  disk_blocks_ = 5;
  auto m = OffloadManager::Create(Build());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  manager_ = std::move(m).value();
  for (int i = 0; i < 5; ++i) Store(i);  // disk: 0..4 (0 its LRU block); CPU: 1..4
  const OffloadKey k0 = K(0);
  ASSERT_EQ(manager_->Lookup(k0, Ctx()), LookupResult::kHitPending);
  // Same step: a store of 5 cascades to the full disk tier, which must make room.
  const OffloadKey k5 = K(5);
  auto out = manager_->PrepareStore(std::span<const OffloadKey>(&k5, 1), Ctx());
  ASSERT_TRUE(out.ok() && out->has_value());
  for (uint64_t b = 0; b < kRow; ++b) Row((*out)->slots[0])[b] = Byte(5, b);
  ASSERT_TRUE(manager_->CompleteStore(std::span<const OffloadKey>(&k5, 1), Ctx(), true).ok());
  Step();  // submits the promotion of 0 and collects it
  EXPECT_EQ(manager_->GetStats().promotion_job_failures, 0u);
  ASSERT_EQ(manager_->Lookup(k0, Ctx()), LookupResult::kHit);
  auto slots = manager_->PrepareLoad(std::span<const OffloadKey>(&k0, 1), Ctx());
  ASSERT_TRUE(slots.ok());
  for (uint64_t b = 0; b < kRow; ++b) ASSERT_EQ(Row((*slots)[0])[b], Byte(0, b)) << b;
  ASSERT_TRUE(manager_->CompleteLoad(std::span<const OffloadKey>(&k0, 1), Ctx()).ok());
  std::set<std::string> want;  // 1 (the unpinned LRU block) made room for 5
  for (int i : {0, 2, 3, 4, 5}) want.insert(K(i).Hex());
  EXPECT_EQ(OnDisk(), want);
  EXPECT_TRUE(tier_->index().CheckInvariants().ok());
}

// root_dir is shared (vLLM engines, other kvo engines write temp + rename there): the startup
// scan removes only temp files older than kFsStaleTempSeconds, never another writer's fresh one.
TEST_F(FsTransportTest, StartupRemovesOnlyStaleTempFiles) {
  auto m = OffloadManager::Create(Build());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  manager_ = std::move(m).value();
  Store(0);
  const std::string bin = dir_.path() + "/" +
                          FsBlockRelativePath(transport_->store().namespace_name(), 0,
                                              *FsBlockKeyFromDigest(K(0).digest(), 0));
  const std::string fresh = bin + "_111.tmp";  // another engine's write in flight
  const std::string stale = bin + "_222.tmp";  // left by a crash two hours ago
  std::ofstream(fresh) << "partial";
  std::ofstream(stale) << "partial";
  timespec times[2];
  times[0].tv_sec = times[1].tv_sec = ::time(nullptr) - 2 * 3600;
  times[0].tv_nsec = times[1].tv_nsec = 0;
  ASSERT_EQ(::utimensat(AT_FDCWD, stale.c_str(), times, 0), 0);
  manager_.reset();
  tier_.reset();
  transport_.reset();
  auto r = OffloadManager::Create(Build());  // the tier's startup scan (FsTransport::List)
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  manager_ = std::move(r).value();
  EXPECT_TRUE(std::filesystem::exists(fresh));
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(bin));
}

TEST_F(FsTransportTest, CorruptFileIsALostKeyRemovedFromDiskAndIndex) {
  disk_blocks_ = 16;
  auto m = OffloadManager::Create(Build());
  ASSERT_TRUE(m.ok());
  manager_ = std::move(m).value();
  for (int i = 0; i < 2; ++i) Store(i);
  // Flip a byte of block 1's file, then push both blocks out of the CPU tier.
  const std::string path = dir_.path() + "/" +
                           FsBlockRelativePath(transport_->store().namespace_name(), 0,
                                               *FsBlockKeyFromDigest(K(1).digest(), 0));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('\x55');
  }
  for (int i = 10; i < 14; ++i) Store(i);  // CPU holds 4: 0 and 1 evicted from CPU
  LoadBack(0);
  const OffloadKey k1 = K(1);
  EXPECT_EQ(manager_->Lookup(k1, Ctx()), LookupResult::kHitPending);
  Step();
  EXPECT_EQ(manager_->Lookup(k1, Ctx()), LookupResult::kMiss);
  EXPECT_FALSE(std::filesystem::exists(path));
  std::vector<OffloadKey> held;
  tier_->ListHeld(&held);
  for (const auto& k : held) EXPECT_FALSE(k == k1);
}

}  // namespace
}  // namespace kvo
