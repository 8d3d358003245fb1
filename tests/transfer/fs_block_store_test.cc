#include "transfer/fs_block_store.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <set>
#include <sstream>

#include "tests/testing/seeded_rows.h"
#include "tests/testing/temp_dir.h"
#include "transfer/fs_file.h"

namespace kvo {
namespace {

namespace stdfs = std::filesystem;

constexpr uint64_t kRow = 8192;

struct Rows : kvo::testing::SeededRows {
  explicit Rows(uint64_t n, uint64_t row = kRow) : SeededRows(n, row) {}
};

FsRunFields Fields() {
  FsRunFields f;
  f.model_name = "test-model";
  return f;
}

FsBlockStoreOptions Options(const std::string& root) {
  FsBlockStoreOptions o;
  o.root_dir = root;
  o.fields = Fields();
  o.n_read_threads = 2;
  o.n_write_threads = 2;
  return o;
}

FsBlockKey Key(uint64_t i, uint32_t group = 0) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(i * 0x9E3779B97F4A7C15ull));
  return FsBlockKey{buf, group};
}

std::string BlockPath(const FsBlockStore& tier, const std::string& root, const FsBlockKey& k) {
  return root + "/" + FsBlockRelativePath(tier.namespace_name(), 0, k);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

FsJobResult RunJob(FsBlockStore& tier, bool store, std::vector<FsBlockKey> keys,
                   std::vector<int64_t> slots) {
  auto id = store ? tier.SubmitStore(std::move(keys), std::move(slots))
                  : tier.SubmitLoad(std::move(keys), std::move(slots));
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  if (!id.ok()) return {};
  EXPECT_TRUE(tier.Wait(*id).ok());
  std::vector<FsJobResult> out;
  tier.TakeFinished(&out);
  EXPECT_EQ(out.size(), 1u);
  if (out.empty()) return {};
  EXPECT_EQ(out[0].job_id, *id);
  return std::move(out[0]);
}

class FsBlockStoreTest : public ::testing::TestWithParam<bool> {
 protected:
  FsBlockStoreOptions Opts() {
    FsBlockStoreOptions o = Options(dir_.path());
    o.force_sidecar_records = GetParam();
    return o;
  }
  testing::TempDir dir_;
};

TEST_P(FsBlockStoreTest, StoresAndLoadsVllmLayoutByteExact) {
  Rows rows(8);
  auto tier = FsBlockStore::Open(Opts(), rows.region());
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  FsBlockStore& t = **tier;
  for (uint64_t i = 0; i < 4; ++i) rows.Fill(i, 100 + i);
  std::vector<FsBlockKey> keys = {Key(0), Key(1, 1), Key(2), Key(3, 7)};
  FsJobResult st = RunJob(t, true, keys, {0, 1, 2, 3});
  EXPECT_TRUE(st.success);
  EXPECT_TRUE(st.is_store);
  EXPECT_EQ(st.bytes, 4 * kRow);
  for (const auto& b : st.blocks) EXPECT_EQ(b.outcome, FsBlockOutcome::kOk);

  // vLLM's layout: the .bin at its path is exactly the row; config.json beside it.
  for (uint64_t i = 0; i < 4; ++i) {
    const std::string p = BlockPath(t, dir_.path(), keys[i]);
    std::string body = Slurp(p);
    ASSERT_EQ(body.size(), kRow) << p;
    EXPECT_EQ(0, std::memcmp(body.data(), rows.row(i), kRow));
    struct stat s {};
    ASSERT_EQ(::stat(p.c_str(), &s), 0);
    EXPECT_EQ(s.st_mode & 0777, 0600u);
    ASSERT_EQ(::stat(stdfs::path(p).parent_path().c_str(), &s), 0);
    EXPECT_EQ(s.st_mode & 0777, 0700u);
    EXPECT_TRUE(t.Exists(keys[i]));
  }
  EXPECT_EQ(Slurp(dir_.path() + "/test-model_de3bba26cf36/config.json"),
            *FsFieldsConfigJson(Fields()));
  EXPECT_EQ(t.xattr_records(), !GetParam());

  FsJobResult ld = RunJob(t, false, keys, {4, 5, 6, 7});
  EXPECT_TRUE(ld.success);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ld.blocks[i].outcome, FsBlockOutcome::kOk);
    EXPECT_TRUE(ld.blocks[i].verified);
    EXPECT_TRUE(rows.Matches(4 + i, 100 + i)) << i;
  }
  // A second store of a block that exists is skipped (vLLM), not rewritten.
  rows.Fill(0, 999);
  FsJobResult again = RunJob(t, true, {keys[0]}, {0});
  EXPECT_TRUE(again.success);
  EXPECT_EQ(again.blocks[0].outcome, FsBlockOutcome::kSkipped);
  FsJobResult miss = RunJob(t, false, {Key(42)}, {0});
  EXPECT_FALSE(miss.success);
  EXPECT_EQ(miss.blocks[0].outcome, FsBlockOutcome::kMiss);
}

// The job contract's per-block fields (transfer/job.h): a block's bytes are the row when it moved
// and 0 when it did not (skipped store, missing load); the job's bytes are their sum; no block
// took longer than its job.
TEST_P(FsBlockStoreTest, BlockResultsCarryBytesAndSecondsOfTheJobContract) {
  Rows rows(4);
  auto tier = FsBlockStore::Open(Opts(), rows.region());
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  FsBlockStore& t = **tier;
  for (uint64_t i = 0; i < 3; ++i) rows.Fill(i, 500 + i);
  ASSERT_TRUE(RunJob(t, true, {Key(50)}, {0}).success);
  FsJobResult st = RunJob(t, true, {Key(50), Key(51), Key(52)}, {0, 1, 2});
  ASSERT_EQ(st.blocks.size(), 3u);
  EXPECT_EQ(st.blocks[0].outcome, FsBlockOutcome::kSkipped);
  EXPECT_EQ(st.blocks[0].bytes, 0u);
  FsJobResult ld = RunJob(t, false, {Key(51), Key(53)}, {3, 0});
  ASSERT_EQ(ld.blocks.size(), 2u);
  EXPECT_EQ(ld.blocks[1].outcome, FsBlockOutcome::kMiss);
  EXPECT_EQ(ld.blocks[1].bytes, 0u);
  EXPECT_TRUE(rows.Matches(3, 501));
  for (const FsJobResult* r : {&st, &ld}) {
    uint64_t sum = 0;
    for (const FsBlockResult& b : r->blocks) {
      sum += b.bytes;
      EXPECT_EQ(b.bytes, b.outcome == FsBlockOutcome::kOk ? kRow : 0u);
      EXPECT_GE(b.seconds, 0.0);
      EXPECT_LE(b.seconds, r->seconds);
    }
    EXPECT_EQ(sum, r->bytes);
  }
  EXPECT_EQ(st.bytes, 2 * kRow);
  EXPECT_EQ(ld.bytes, kRow);
}

TEST_P(FsBlockStoreTest, CorruptFilesAreMissesRemovedAndReported) {
  Rows rows(8);
  auto tier = FsBlockStore::Open(Opts(), rows.region());
  ASSERT_TRUE(tier.ok());
  FsBlockStore& t = **tier;
  for (uint64_t i = 0; i < 4; ++i) rows.Fill(i, 7 + i);
  std::vector<FsBlockKey> keys = {Key(10), Key(11), Key(12), Key(13)};
  ASSERT_TRUE(RunJob(t, true, keys, {0, 1, 2, 3}).success);

  // 10: truncated; 11: one bit flipped; 13: grown by a byte.
  ASSERT_EQ(::truncate(BlockPath(t, dir_.path(), keys[0]).c_str(), kRow - 100), 0);
  {
    std::fstream f(BlockPath(t, dir_.path(), keys[1]),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1234);
    char c = static_cast<char>(rows.row(1)[1234] ^ 0x10);
    f.write(&c, 1);
  }
  { std::ofstream(BlockPath(t, dir_.path(), keys[3]), std::ios::app | std::ios::binary) << 'x'; }
  FsJobResult ld = RunJob(t, false, keys, {4, 5, 6, 7});
  EXPECT_FALSE(ld.success);
  EXPECT_EQ(ld.blocks[0].outcome, FsBlockOutcome::kCorrupt);
  EXPECT_EQ(ld.blocks[1].outcome, FsBlockOutcome::kCorrupt);
  EXPECT_NE(ld.blocks[1].status.message().find("checksum mismatch"), std::string::npos);
  EXPECT_EQ(ld.blocks[2].outcome, FsBlockOutcome::kOk);  // other blocks unharmed
  EXPECT_TRUE(rows.Matches(6, 9));
  EXPECT_EQ(ld.blocks[3].outcome, FsBlockOutcome::kCorrupt);
  EXPECT_EQ(ld.bytes, kRow);
  for (int i : {0, 1, 3}) {
    EXPECT_FALSE(stdfs::exists(BlockPath(t, dir_.path(), keys[i]))) << i;
    EXPECT_FALSE(t.Exists(keys[i]));
  }
  // Removed blocks are misses afterwards, and can be stored again.
  EXPECT_EQ(RunJob(t, false, {keys[1]}, {5}).blocks[0].outcome, FsBlockOutcome::kMiss);
  EXPECT_EQ(RunJob(t, true, {keys[1]}, {1}).blocks[0].outcome, FsBlockOutcome::kOk);
  EXPECT_EQ(RunJob(t, false, {keys[1]}, {5}).blocks[0].outcome, FsBlockOutcome::kOk);
  EXPECT_TRUE(rows.Matches(5, 8));
}

// Issue 10 item 5: the record bound the bytes only, so a .bin renamed over another block's name
// (with its record: an xattr moves with the inode; a sidecar moved beside it) was served as that
// block. The record now names the block (namespace, rank, group, hash): misfiled = miss, removed,
// counted, never served.
TEST_P(FsBlockStoreTest, MisfiledBlocksAreMissesNeverServed) {
  Rows rows(8);
  auto tier = FsBlockStore::Open(Opts(), rows.region());
  ASSERT_TRUE(tier.ok());
  FsBlockStore& t = **tier;
  // A, B, and A's hash in group 1; later a rank-1 tier of the same namespace and another namespace.
  const FsBlockKey a = Key(40), b = Key(41), a_g1 = FsBlockKey{Key(40).hex, 1};
  for (uint64_t i = 0; i < 3; ++i) rows.Fill(i, 400 + i);
  ASSERT_TRUE(RunJob(t, true, {a, b, a_g1}, {0, 1, 2}).success);
  auto move = [&](const std::string& from, const std::string& to) {
    stdfs::create_directories(stdfs::path(to).parent_path());
    stdfs::rename(from, to);
    if (GetParam()) stdfs::rename(from + ".kvo", to + ".kvo");  // the record travels too
  };
  // A's file over B's name; A's group-1 copy over A's group-0 name.
  move(BlockPath(t, dir_.path(), a), BlockPath(t, dir_.path(), b));
  move(BlockPath(t, dir_.path(), a_g1), BlockPath(t, dir_.path(), a));
  std::memset(rows.mem, 0, rows.num * rows.stride);
  FsJobResult ld = RunJob(t, false, {b, a, a_g1}, {4, 5, 6});
  EXPECT_FALSE(ld.success);
  for (int i : {0, 1}) {
    EXPECT_EQ(ld.blocks[i].outcome, FsBlockOutcome::kCorrupt) << i;
    EXPECT_TRUE(ld.blocks[i].misfiled) << i;
    EXPECT_NE(ld.blocks[i].status.message().find("misfiled"), std::string::npos)
        << ld.blocks[i].status.ToString();
  }
  EXPECT_EQ(ld.blocks[2].outcome, FsBlockOutcome::kMiss);  // moved away
  EXPECT_FALSE(rows.Matches(4, 400));                      // A's bytes were not served as B
  EXPECT_FALSE(rows.Matches(5, 402));
  EXPECT_EQ(t.misfiled_blocks(), 2u);
  EXPECT_EQ(t.corrupt_blocks(), 0u);
  EXPECT_FALSE(t.Exists(a));
  EXPECT_FALSE(t.Exists(b));
  // The names are free again: storing the right blocks works, and they load.
  for (uint64_t i = 0; i < 2; ++i) rows.Fill(i, 400 + i);
  ASSERT_TRUE(RunJob(t, true, {a, b}, {0, 1}).success);
  ld = RunJob(t, false, {a, b}, {4, 5});
  EXPECT_TRUE(ld.success);
  EXPECT_TRUE(rows.Matches(4, 400));
  EXPECT_TRUE(rows.Matches(5, 401));

  // Another rank of the same namespace, and another namespace under the same root.
  FsBlockStoreOptions r1 = Opts();
  r1.rank = 1;
  auto tier1 = FsBlockStore::Open(r1, rows.region());
  ASSERT_TRUE(tier1.ok());
  FsBlockStoreOptions other = Opts();
  other.fields.model_name = "other-model";
  auto tier2 = FsBlockStore::Open(other, rows.region());
  ASSERT_TRUE(tier2.ok());
  const std::string path1 = dir_.path() + "/" + FsBlockRelativePath(t.namespace_name(), 1, a);
  const std::string path2 =
      dir_.path() + "/" + FsBlockRelativePath((*tier2)->namespace_name(), 0, a);
  move(BlockPath(t, dir_.path(), a), path1);
  move(BlockPath(t, dir_.path(), b), path2);
  EXPECT_TRUE((*tier1)->Exists(a));
  ld = RunJob(**tier1, false, {a}, {6});
  EXPECT_EQ(ld.blocks[0].outcome, FsBlockOutcome::kCorrupt);
  EXPECT_TRUE(ld.blocks[0].misfiled);
  ld = RunJob(**tier2, false, {a}, {6});
  EXPECT_EQ(ld.blocks[0].outcome, FsBlockOutcome::kCorrupt);
  EXPECT_TRUE(ld.blocks[0].misfiled);
  EXPECT_EQ((*tier1)->misfiled_blocks() + (*tier2)->misfiled_blocks(), 2u);
}

// schemas/fs_tier_format.md's test vector: the identity is XXH3-64 of exactly these bytes, and
// version-2 records round-trip; version 1 decodes without an identity.
TEST(FsRecordFormatTest, IdentityTestVectorAndVersions) {
  static constexpr char kBytes[] =
      "kvo.block\0test-model_de3bba26cf36\0003\0002\0000001020304050607";
  static_assert(sizeof(kBytes) - 1 == 54);
  const uint64_t want = fs_internal::Xxh3(kBytes, sizeof(kBytes) - 1);
  EXPECT_EQ(
      fs_internal::BlockIdentity("test-model_de3bba26cf36", 3, FsBlockKey{"0001020304050607", 2}),
      want);
  EXPECT_NE(
      fs_internal::BlockIdentity("test-model_de3bba26cf36", 3, FsBlockKey{"0001020304050607", 1}),
      want);
  fs_internal::IntegrityRecord r;
  r.length = 8192;
  r.xxh3 = 0x1122334455667788ull;
  r.identity = want;
  const std::string v2 = fs_internal::EncodeRecord(r);
  ASSERT_EQ(v2.size(), fs_internal::kRecordBytes);
  EXPECT_EQ(v2.substr(0, 8), std::string("kvo2\0\0\0\0", 8));
  auto back = fs_internal::DecodeRecord(v2);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->version, 2u);
  EXPECT_EQ(back->identity, want);
  EXPECT_EQ(back->length, 8192u);
  r.version = 1;
  auto v1 = fs_internal::DecodeRecord(fs_internal::EncodeRecord(r));
  ASSERT_TRUE(v1.has_value());
  EXPECT_EQ(v1->version, 1u);
  EXPECT_EQ(v1->identity, 0u);
  EXPECT_FALSE(fs_internal::DecodeRecord(v2.substr(0, 24)).has_value());  // "kvo2" of v1's size
  std::string flagged = v2;
  flagged[4] = 1;
  EXPECT_FALSE(fs_internal::DecodeRecord(flagged).has_value());
}

// Version-1 records (kvo before identities) are read as before: bytes verified, identity unknown,
// like a vLLM-written block; with require_checksum they are a miss (removed, so the next store
// writes a version-2 record).
TEST_P(FsBlockStoreTest, VersionOneRecordsAreReadAsBefore) {
  Rows rows(2);
  FsBlockStoreOptions o = Opts();
  std::string path;
  {
    auto tier = FsBlockStore::Open(o, rows.region());
    ASSERT_TRUE(tier.ok());
    path = BlockPath(**tier, dir_.path(), Key(6));
  }
  stdfs::create_directories(stdfs::path(path).parent_path());
  rows.Fill(0, 66);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<char*>(rows.row(0)), kRow);
  fs_internal::IntegrityRecord v1;
  v1.version = 1;
  v1.length = kRow;
  v1.xxh3 = fs_internal::Xxh3(rows.row(0), kRow);
  const std::string rec = fs_internal::EncodeRecord(v1);
  ASSERT_EQ(rec.size(), fs_internal::kRecordBytesV1);
  if (GetParam()) {
    std::ofstream(path + ".kvo", std::ios::binary) << rec;
  } else {
    ASSERT_EQ(::setxattr(path.c_str(), fs_internal::kXattrName, rec.data(), rec.size(), 0), 0);
  }
  {
    auto tier = FsBlockStore::Open(o, rows.region());
    ASSERT_TRUE(tier.ok());
    FsJobResult ld = RunJob(**tier, false, {Key(6)}, {1});
    EXPECT_EQ(ld.blocks[0].outcome, FsBlockOutcome::kOk);
    EXPECT_TRUE(ld.blocks[0].verified);
    EXPECT_TRUE(rows.Matches(1, 66));
  }
  o.require_checksum = true;
  auto tier = FsBlockStore::Open(o, rows.region());
  ASSERT_TRUE(tier.ok());
  FsJobResult ld = RunJob(**tier, false, {Key(6)}, {1});
  EXPECT_EQ(ld.blocks[0].outcome, FsBlockOutcome::kCorrupt);
  EXPECT_FALSE(stdfs::exists(path));
  ASSERT_TRUE(RunJob(**tier, true, {Key(6)}, {0}).success);
  ld = RunJob(**tier, false, {Key(6)}, {1});
  EXPECT_EQ(ld.blocks[0].outcome, FsBlockOutcome::kOk);
  EXPECT_TRUE(ld.blocks[0].verified);
}

// Issue 10 item 12: a FIFO under a block's name blocked a read thread in open() forever. Now a
// corrupt miss. Bounded: if the load does not finish, the FIFO is opened for writing (which
// releases the blocked reader) and the test fails.
TEST_P(FsBlockStoreTest, FifoUnderABlockNameIsCorruptNotAHang) {
  Rows rows(2);
  auto tier = FsBlockStore::Open(Opts(), rows.region());
  ASSERT_TRUE(tier.ok());
  FsBlockStore& t = **tier;
  const std::string path = BlockPath(t, dir_.path(), Key(9));
  stdfs::create_directories(stdfs::path(path).parent_path());
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto id = t.SubmitLoad({Key(9)}, {0});
  ASSERT_TRUE(id.ok());
  auto done = std::async(std::launch::async, [&] { return t.Wait(*id); });
  if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "a load of a FIFO did not finish in 20 s";
    int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);  // releases the blocked open
    if (fd >= 0) ::close(fd);
  }
  ASSERT_TRUE(done.get().ok());
  std::vector<FsJobResult> out;
  t.TakeFinished(&out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].blocks[0].outcome, FsBlockOutcome::kCorrupt);
  EXPECT_NE(out[0].blocks[0].status.message().find("not a regular file"), std::string::npos);
}

TEST_P(FsBlockStoreTest, FilesWithoutRecordAreServedUnlessRequired) {
  Rows rows(2);
  FsBlockStoreOptions o = Opts();
  std::string path;
  {
    auto tier = FsBlockStore::Open(o, rows.region());
    ASSERT_TRUE(tier.ok());
    path = BlockPath(**tier, dir_.path(), Key(5));
  }
  // A block written by vLLM: the raw row, no kvo record.
  stdfs::create_directories(stdfs::path(path).parent_path());
  rows.Fill(0, 55);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<char*>(rows.row(0)), kRow);
  {
    auto tier = FsBlockStore::Open(o, rows.region());
    ASSERT_TRUE(tier.ok());
    FsJobResult ld = RunJob(**tier, false, {Key(5)}, {1});
    EXPECT_EQ(ld.blocks[0].outcome, FsBlockOutcome::kOk);
    EXPECT_FALSE(ld.blocks[0].verified);
    EXPECT_TRUE(rows.Matches(1, 55));
  }
  o.require_checksum = true;
  auto tier = FsBlockStore::Open(o, rows.region());
  ASSERT_TRUE(tier.ok());
  FsJobResult ld = RunJob(**tier, false, {Key(5)}, {1});
  EXPECT_EQ(ld.blocks[0].outcome, FsBlockOutcome::kCorrupt);
  EXPECT_FALSE(stdfs::exists(path));
}

TEST_P(FsBlockStoreTest, NoSymlinkIsFollowed) {
  Rows rows(4);
  auto tier = FsBlockStore::Open(Opts(), rows.region());
  ASSERT_TRUE(tier.ok());
  FsBlockStore& t = **tier;
  testing::TempDir outside;
  const std::string secret = outside.path() + "/secret";
  std::ofstream(secret) << "do not touch";

  // A .bin that is a symlink to a file outside: load fails with an error (the link is not
  // followed and left in place: only integrity failures remove a file; target intact), store
  // refuses to write through it.
  const std::string p1 = BlockPath(t, dir_.path(), Key(1));
  stdfs::create_directories(stdfs::path(p1).parent_path());
  stdfs::create_symlink(secret, p1);
  FsJobResult st = RunJob(t, true, {Key(1)}, {0});
  EXPECT_EQ(st.blocks[0].outcome, FsBlockOutcome::kError);
  EXPECT_EQ(Slurp(secret), "do not touch");
  FsJobResult ld = RunJob(t, false, {Key(1)}, {1});
  EXPECT_EQ(ld.blocks[0].outcome, FsBlockOutcome::kError);
  EXPECT_EQ(Slurp(secret), "do not touch");
  EXPECT_TRUE(stdfs::is_symlink(p1));

  // A directory component that is a symlink to a directory outside: nothing lands outside.
  const std::string p2 = BlockPath(t, dir_.path(), Key(2));
  const stdfs::path leaf = stdfs::path(p2).parent_path();
  stdfs::create_directories(leaf.parent_path());
  stdfs::create_symlink(outside.path(), leaf);
  rows.Fill(0, 3);
  st = RunJob(t, true, {Key(2)}, {0});
  EXPECT_EQ(st.blocks[0].outcome, FsBlockOutcome::kError);
  EXPECT_NE(st.blocks[0].status.message().find("symlink"), std::string::npos);
  EXPECT_EQ(std::distance(stdfs::directory_iterator(outside.path()), stdfs::directory_iterator()),
            1);
  ld = RunJob(t, false, {Key(2)}, {1});
  EXPECT_EQ(ld.blocks[0].outcome, FsBlockOutcome::kCorrupt);

  // root_dir itself a symlink: refused.
  const std::string link_root = outside.path() + "/root-link";
  stdfs::create_symlink(dir_.path(), link_root);
  FsBlockStoreOptions o = Opts();
  o.root_dir = link_root;
  EXPECT_EQ(FsBlockStore::Open(o, rows.region()).status().code(), StatusCode::kFailedPrecondition);

  auto scan = t.Scan();
  ASSERT_TRUE(scan.ok());
  bool reported = false;
  for (const auto& p : scan->problems)
    reported = reported || p.find("symlink") != std::string::npos;
  EXPECT_TRUE(reported);
}

TEST_P(FsBlockStoreTest, RejectsBadJobs) {
  Rows rows(2);
  auto tier = FsBlockStore::Open(Opts(), rows.region());
  ASSERT_TRUE(tier.ok());
  FsBlockStore& t = **tier;
  auto bad = t.SubmitStore({FsBlockKey{"../../../etc/passwd", 0}}, {0});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("block hash"), std::string::npos);
  EXPECT_EQ(t.SubmitLoad({FsBlockKey{"ABCDEF01", 0}}, {0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(t.SubmitStore({Key(1)}, {2}).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(t.SubmitStore({Key(1)}, {-1}).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(t.SubmitStore({Key(1)}, {0, 1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.SubmitStore({}, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Wait(999).code(), StatusCode::kNotFound);
  EXPECT_FALSE(t.Exists(FsBlockKey{"../x", 0}));
  EXPECT_FALSE(t.Delete(FsBlockKey{"../x", 0}).ok());
  std::vector<FsJobResult> none;
  t.TakeFinished(&none);
  EXPECT_TRUE(none.empty());
}

TEST_P(FsBlockStoreTest, ScanRebuildsContentsAndValidatesNames) {
  Rows rows(4);
  std::string rank_dir;
  std::set<FsBlockKey> stored;
  {
    auto tier = FsBlockStore::Open(Opts(), rows.region());
    ASSERT_TRUE(tier.ok());
    std::vector<FsBlockKey> keys;
    std::vector<int64_t> slots;
    for (uint64_t i = 0; i < 20; ++i) {
      keys.push_back(Key(i, static_cast<uint32_t>(i % 3)));
      slots.push_back(static_cast<int64_t>(i % 4));
      stored.insert(keys.back());
    }
    ASSERT_TRUE(RunJob(**tier, true, keys, slots).success);
    rank_dir = (*tier)->rank_dir();
  }
  // Debris: a crash's temp file, a foreign file, a misplaced hash, a wrong-size block, bad dirs.
  const FsBlockKey k0 = Key(0, 0);
  const std::string leaf = rank_dir + "/" + k0.hex.substr(0, 3) + "/" + k0.hex.substr(3, 2) + "_g0";
  std::ofstream(leaf + "/" + k0.hex + ".bin_123.tmp") << "partial";
  std::ofstream(leaf + "/README") << "x";
  std::ofstream(leaf + "/ffffffffffffffff.bin") << std::string(kRow, 'x');
  stdfs::create_directories(rank_dir + "/ABC");
  stdfs::create_directories(rank_dir + "/abc/zz_g1");
  const FsBlockKey wrong{"abcde00000000000", 4};
  stdfs::create_directories(rank_dir + "/abc/de_g4");
  std::ofstream(rank_dir + "/abc/de_g4/abcde00000000000.bin") << "short";

  auto tier = FsBlockStore::Open(Opts(), rows.region());
  ASSERT_TRUE(tier.ok());
  auto scan = (*tier)->Scan(0);  // no other writer here: every temp file is stale
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  std::set<FsBlockKey> found(scan->blocks.begin(), scan->blocks.end());
  EXPECT_EQ(found, stored);
  EXPECT_EQ(scan->temp_files_removed, 1u);
  EXPECT_EQ(scan->wrong_size_removed, 1u);
  EXPECT_FALSE(stdfs::exists(rank_dir + "/abc/de_g4/abcde00000000000.bin"));
  EXPECT_EQ(scan->problems.size(), 5u);  // README, misplaced, ABC, zz_g1, wrong size
  for (const auto& p : scan->problems) std::printf("problem: %s\n", p.c_str());
  // Every listed block loads and verifies.
  for (const FsBlockKey& k : scan->blocks) {
    EXPECT_EQ(RunJob(**tier, false, {k}, {0}).blocks[0].outcome, FsBlockOutcome::kOk);
  }
  ASSERT_TRUE((*tier)->Delete(k0).ok());
  EXPECT_FALSE((*tier)->Exists(k0));
  EXPECT_TRUE((*tier)->Delete(k0).ok());  // absent is fine
}

// A sidecar record whose .bin is gone (a crash between the record and the link) is removed by the
// scan once it is as old as a stale temp file; a fresh one (another writer's store in flight) and
// one whose .bin exists stay.
TEST_P(FsBlockStoreTest, ScanRemovesOldOrphanSidecars) {
  Rows rows(2);
  auto tier = FsBlockStore::Open(Opts(), rows.region());
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  rows.Fill(0, 1);
  ASSERT_TRUE(RunJob(**tier, true, {Key(1)}, {0}).success);
  const auto sidecar = [&](uint64_t i) { return BlockPath(**tier, dir_.path(), Key(i)) + ".kvo"; };
  const auto age = [](const std::string& path) {
    timespec times[2];
    times[0].tv_sec = times[1].tv_sec = ::time(nullptr) - 2 * 3600;
    times[0].tv_nsec = times[1].tv_nsec = 0;
    return ::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0;
  };
  for (uint64_t i : {2, 3}) stdfs::create_directories(stdfs::path(sidecar(i)).parent_path());
  if (!stdfs::exists(sidecar(1))) std::ofstream(sidecar(1)) << "record";  // xattr records
  std::ofstream(sidecar(2)) << "record";
  std::ofstream(sidecar(3)) << "record";
  ASSERT_TRUE(age(sidecar(1)));  // old, but its .bin is there
  ASSERT_TRUE(age(sidecar(2)));  // old orphan
  auto scan = (*tier)->Scan();   // sidecar(3): a fresh orphan
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  EXPECT_EQ(scan->orphan_sidecars_removed, 1u);
  EXPECT_TRUE(stdfs::exists(sidecar(1)));
  EXPECT_FALSE(stdfs::exists(sidecar(2)));
  EXPECT_TRUE(stdfs::exists(sidecar(3)));
  std::memset(rows.mem, 0, rows.num * rows.stride);
  EXPECT_EQ(RunJob(**tier, false, {Key(1)}, {1}).blocks[0].outcome, FsBlockOutcome::kOk);
  EXPECT_TRUE(rows.Matches(1, 1));
}

INSTANTIATE_TEST_SUITE_P(Records, FsBlockStoreTest, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "sidecar" : "xattr"; });

TEST(FsBlockStoreOpenTest, BadRootDirIsAClearError) {
  Rows rows(1);
  testing::TempDir dir;
  FsBlockStoreOptions o = Options(dir.path() + "/missing");
  auto t = FsBlockStore::Open(o, rows.region());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("does not exist"), std::string::npos);
  std::ofstream(dir.path() + "/file") << "x";
  o.root_dir = dir.path() + "/file";
  EXPECT_EQ(FsBlockStore::Open(o, rows.region()).status().code(), StatusCode::kFailedPrecondition);
  o.root_dir = "";
  EXPECT_FALSE(FsBlockStore::Open(o, rows.region()).ok());
  o.root_dir = dir.path();
  o.fields.model_name = "";
  EXPECT_EQ(FsBlockStore::Open(o, rows.region()).status().code(), StatusCode::kInvalidArgument);
  o.fields.model_name = "m";
  // Thread counts: either pool may be empty (the other takes its queue), not both, none past
  // the cap or negative.
  o.n_read_threads = 0;
  o.n_write_threads = 0;
  EXPECT_EQ(FsBlockStore::Open(o, rows.region()).status().code(), StatusCode::kInvalidArgument);
  o.n_write_threads = kFsMaxThreadsPerPool + 1;
  auto many = FsBlockStore::Open(o, rows.region());
  EXPECT_NE(many.status().message().find("n_write_threads must be 0..1024, got 1025"),
            std::string::npos)
      << many.status().ToString();
  o.n_write_threads = -1;
  EXPECT_EQ(FsBlockStore::Open(o, rows.region()).status().code(), StatusCode::kInvalidArgument);
  o.n_write_threads = 1;
  EXPECT_TRUE(FsBlockStore::Open(o, rows.region()).ok());  // no reader: the writer loads too
  o.n_read_threads = 1;
  EXPECT_FALSE(FsBlockStore::Open(o, HostRegion{}).ok());
}

// Mounting needs privileges; these tests skip cleanly without them.
class MountedDir {
 public:
  MountedDir(const std::string& path, const char* opts, unsigned long flags) : path_(path) {
    mounted_ = ::mount("tmpfs", path.c_str(), "tmpfs", flags, opts) == 0;
  }
  ~MountedDir() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }

 private:
  std::string path_;
  bool mounted_ = false;
};

TEST(FsBlockStoreOpenTest, ReadOnlyRootDirIsAClearError) {
  testing::TempDir dir;
  MountedDir m(dir.path(), "size=1m", MS_RDONLY);
  if (!m.mounted()) GTEST_SKIP() << "cannot mount a read-only tmpfs here: " << std::strerror(errno);
  Rows rows(1);
  auto t = FsBlockStore::Open(Options(dir.path()), rows.region());
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(t.status().message().find("not writable"), std::string::npos) << t.status().ToString();
}

// Stores one block under `root`, makes its leaf directory unreadable (mode 0) and loads it.
// Returns the load's outcome (FsBlockOutcome as an int, >= 0), or a negative step that failed;
// -4: the .bin is gone afterwards.
int LoadThroughUnreadableLeaf(const std::string& root) {
  Rows rows(2);
  auto tier = FsBlockStore::Open(Options(root), rows.region());
  if (!tier.ok()) return -1;
  rows.Fill(0, 7);
  if (!RunJob(**tier, true, {Key(7)}, {0}).success) return -2;
  const std::string bin = BlockPath(**tier, root, Key(7));
  const std::string leaf = stdfs::path(bin).parent_path().string();
  if (::chmod(leaf.c_str(), 0) != 0) return -3;
  FsJobResult ld = RunJob(**tier, false, {Key(7)}, {1});
  ::chmod(leaf.c_str(), 0700);
  if (!stdfs::exists(bin)) return -4;
  if (ld.blocks.size() != 1) return -5;
  return static_cast<int>(ld.blocks[0].outcome);
}

// EACCES on a block directory is an I/O error (kError), not a corrupt block: the file stays, so
// the manager must keep its key (a kCorrupt would make it drop the key and announce a removal of
// a file still on disk). Root ignores mode bits: as root the load runs in a child that drops to
// uid/gid 65534.
TEST(FsBlockStoreOpenTest, AnUnreadableBlockDirectoryIsAnErrorNotCorrupt) {
  testing::TempDir dir;
  int outcome = 0;
  if (::geteuid() != 0) {
    outcome = LoadThroughUnreadableLeaf(dir.path());
  } else {
    ASSERT_EQ(::chmod(dir.path().c_str(), 0777), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
          ::setresuid(65534, 65534, 65534) != 0) {
        ::_exit(99);
      }
      ::_exit(LoadThroughUnreadableLeaf(dir.path()) + 10);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "child status " << status;
    if (WEXITSTATUS(status) == 99) GTEST_SKIP() << "cannot drop privileges to uid 65534 here";
    outcome = WEXITSTATUS(status) - 10;
  }
  ASSERT_GE(outcome, 0) << "step " << outcome << " failed";
  EXPECT_EQ(static_cast<FsBlockOutcome>(outcome), FsBlockOutcome::kError)
      << FsBlockOutcomeName(static_cast<FsBlockOutcome>(outcome));
}

TEST(FsBlockStoreOpenTest, DiskFullIsReportedPerBlockAndHarmsNothing) {
  testing::TempDir dir;
  MountedDir m(dir.path(), "size=256k", 0);
  if (!m.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  Rows rows(64);
  auto tier = FsBlockStore::Open(Options(dir.path()), rows.region());
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  std::vector<FsBlockKey> keys;
  std::vector<int64_t> slots;
  for (uint64_t i = 0; i < 64; ++i) {
    rows.Fill(i, 1000 + i);
    keys.push_back(Key(i));
    slots.push_back(static_cast<int64_t>(i));
  }
  FsJobResult st = RunJob(**tier, true, keys, slots);
  EXPECT_FALSE(st.success);
  size_t ok = 0, full = 0;
  for (const auto& b : st.blocks) {
    if (b.outcome == FsBlockOutcome::kOk) ++ok;
    if (b.outcome == FsBlockOutcome::kError && b.status.code() == StatusCode::kOutOfSpace) ++full;
  }
  EXPECT_GT(ok, 0u);
  EXPECT_GT(full, 0u);
  EXPECT_EQ(ok + full, keys.size());
  // Every block that was stored loads back intact; no temp file is left behind.
  std::memset(rows.mem, 0, rows.num * rows.stride);
  std::vector<int64_t> back;
  for (uint64_t i = 0; i < 64; ++i) back.push_back(static_cast<int64_t>(i));
  FsJobResult ld = RunJob(**tier, false, keys, back);
  for (uint64_t i = 0; i < 64; ++i) {
    if (st.blocks[i].outcome == FsBlockOutcome::kOk) {
      EXPECT_EQ(ld.blocks[i].outcome, FsBlockOutcome::kOk) << i;
      EXPECT_TRUE(rows.Matches(i, 1000 + i)) << i;
    } else {
      EXPECT_EQ(ld.blocks[i].outcome, FsBlockOutcome::kMiss) << i;
    }
  }
  auto scan = (*tier)->Scan(1e9);  // nothing old enough: counts only
  ASSERT_TRUE(scan.ok());
  EXPECT_EQ(scan->temp_files_removed, 0u);
  for (const auto& e : stdfs::recursive_directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
}

// Property: whatever happens to a stored .bin or its record (truncation, growth, bit flips,
// random or foreign records, a removed record), a load either serves exactly the bytes that were
// stored or reports a miss/corruption. Seeded (KVO_TEST_SEED).
TEST(FsBlockStorePropertyTest, MutatedFilesAreNeverServedWrong) {
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  testing::TempDir dir;
  Rows rows(2);
  auto tier = FsBlockStore::Open(Options(dir.path()), rows.region());
  ASSERT_TRUE(tier.ok());
  FsBlockStore& t = **tier;
  ASSERT_TRUE(t.xattr_records());
  const FsBlockKey key = Key(77);
  const std::string path = BlockPath(t, dir.path(), key);
  int served_wrong = 0, served = 0, refused = 0;
  for (int iter = 0; iter < 300; ++iter) {
    const uint64_t content = seed + static_cast<uint64_t>(iter);
    rows.Fill(0, content);
    t.Delete(key).IgnoreError();
    ASSERT_EQ(RunJob(t, true, {key}, {0}).blocks[0].outcome, FsBlockOutcome::kOk);
    const int kind = static_cast<int>(rng() % 6);
    switch (kind) {
      case 0:  // truncate
        ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(rng() % kRow)), 0);
        break;
      case 1:  // grow
        ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(kRow + 1 + rng() % 100)), 0);
        break;
      case 2: {  // flip one bit
        std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
        const auto off = static_cast<std::streamoff>(rng() % kRow);
        f.seekg(off);
        char c = 0;
        f.get(c);
        f.seekp(off);
        f.put(static_cast<char>(c ^ (1 << (rng() % 8))));
        break;
      }
      case 3: {  // random record bytes (random length)
        std::string junk(rng() % 40, '\0');
        for (auto& ch : junk) ch = static_cast<char>(rng());
        if (rng() % 2 && junk.size() >= 4) junk.replace(0, 4, "kvo1");
        ASSERT_EQ(::setxattr(path.c_str(), "user.kvo.xxh3", junk.data(), junk.size(), 0), 0);
        break;
      }
      case 4: {  // the record of another block's content
        char other[fs_internal::kRecordBytes];
        rows.Fill(1, content + 1000);
        auto id = t.SubmitStore({Key(1000 + static_cast<uint64_t>(iter))}, {1});
        ASSERT_TRUE(id.ok());
        ASSERT_TRUE(t.Wait(*id).ok());
        std::vector<FsJobResult> ignore;
        t.TakeFinished(&ignore);
        const std::string p2 = BlockPath(t, dir.path(), Key(1000 + static_cast<uint64_t>(iter)));
        ASSERT_EQ(::getxattr(p2.c_str(), "user.kvo.xxh3", other, sizeof(other)),
                  static_cast<ssize_t>(sizeof(other)));
        ASSERT_EQ(::setxattr(path.c_str(), "user.kvo.xxh3", other, sizeof(other), 0), 0);
        break;
      }
      case 5:  // record removed (a vLLM-written file): served unverified, bytes intact
        ASSERT_EQ(::removexattr(path.c_str(), "user.kvo.xxh3"), 0);
        break;
    }
    std::memset(rows.row(1), 0, kRow);
    FsJobResult ld = RunJob(t, false, {key}, {1});
    if (ld.blocks[0].outcome == FsBlockOutcome::kOk) {
      ++served;
      if (!rows.Matches(1, content)) ++served_wrong;
      EXPECT_EQ(kind, 5) << "mutation " << kind << " served at iteration " << iter;
    } else {
      ++refused;
      EXPECT_EQ(ld.blocks[0].outcome, FsBlockOutcome::kCorrupt) << "iteration " << iter;
      EXPECT_FALSE(stdfs::exists(path));
    }
  }
  EXPECT_EQ(served_wrong, 0);
  std::printf("served %d (record removed), refused %d\n", served, refused);
}

// kill -9 while a child process stores continuously: a restarted tier never serves a torn block,
// and every block the child reported complete is there.
TEST(FsBlockStoreCrashTest, KillDuringWriteNeverServesTornBlocks) {
  const unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  testing::TempDir dir;
  const uint64_t row = 64 * 1024;
  const int kill_after = 20 + static_cast<int>(rng() % 200);
  std::printf("killing the writer after %d reported blocks\n", kill_after);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    Rows rows(16, row);
    auto tier = FsBlockStore::Open(Options(dir.path()), rows.region());
    if (!tier.ok()) ::_exit(2);
    for (uint32_t i = 0;; i += 4) {
      std::vector<FsBlockKey> keys;
      std::vector<int64_t> slots;
      for (uint32_t j = 0; j < 4; ++j) {
        rows.Fill(j, i + j);
        keys.push_back(Key(i + j));
        slots.push_back(j);
      }
      auto id = (*tier)->SubmitStore(keys, slots);
      if (!id.ok() || !(*tier)->Wait(*id).ok()) ::_exit(3);
      std::vector<FsJobResult> done;
      (*tier)->TakeFinished(&done);
      for (uint32_t j = 0; j < 4; ++j) {
        if (done[0].blocks[j].outcome != FsBlockOutcome::kOk) ::_exit(4);
        uint32_t n = i + j;
        if (::write(fds[1], &n, sizeof(n)) != sizeof(n)) ::_exit(5);
      }
    }
  }
  ::close(fds[1]);
  std::vector<uint32_t> reported;
  while (static_cast<int>(reported.size()) < kill_after) {
    uint32_t n;
    ASSERT_EQ(::read(fds[0], &n, sizeof(n)), static_cast<ssize_t>(sizeof(n)));
    reported.push_back(n);
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "writer exited with " << WEXITSTATUS(status);
  uint32_t n;
  while (::read(fds[0], &n, sizeof(n)) == static_cast<ssize_t>(sizeof(n))) reported.push_back(n);
  ::close(fds[0]);

  Rows rows(1, row);
  auto tier = FsBlockStore::Open(Options(dir.path()), rows.region());
  ASSERT_TRUE(tier.ok());
  auto scan = (*tier)->Scan();
  ASSERT_TRUE(scan.ok());
  std::set<FsBlockKey> found(scan->blocks.begin(), scan->blocks.end());
  for (uint32_t r : reported) EXPECT_TRUE(found.count(Key(r))) << "reported block " << r;
  // Every block the restarted tier serves is whole and verified.
  uint32_t max_written = reported.empty() ? 0 : *std::max_element(reported.begin(), reported.end());
  for (uint32_t i = 0; i <= max_written + 8; ++i) {
    if (!found.count(Key(i))) continue;
    FsJobResult ld = RunJob(**tier, false, {Key(i)}, {0});
    ASSERT_EQ(ld.blocks[0].outcome, FsBlockOutcome::kOk) << i;
    EXPECT_TRUE(ld.blocks[0].verified);
    EXPECT_TRUE(rows.Matches(0, i)) << "block " << i << " served torn";
  }
  std::printf("reported %zu, found %zu, temp files removed %llu\n", reported.size(), found.size(),
              static_cast<unsigned long long>(scan->temp_files_removed));
}

}  // namespace
}  // namespace kvo
