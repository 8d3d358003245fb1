#include "transfer/fs_inspect.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

#include "tests/testing/temp_dir.h"
#include "transfer/fs_block_store.h"

namespace kvo {
namespace {

namespace stdfs = std::filesystem;

TEST(FsInspectTest, ReportsNamespacesBlocksAndProblems) {
  testing::TempDir dir;
  const uint64_t row = 4096;
  uint8_t* mem = static_cast<uint8_t*>(std::aligned_alloc(4096, 8 * row));
  for (uint64_t i = 0; i < 8 * row; ++i) mem[i] = static_cast<uint8_t>(i * 31);
  FsBlockStoreOptions o;
  o.root_dir = dir.path();
  o.fields.model_name = "org/model";
  o.n_read_threads = o.n_write_threads = 1;
  std::string ns, rank_dir;
  {
    auto tier = FsBlockStore::Open(o, HostRegion{reinterpret_cast<uintptr_t>(mem), 8, row});
    ASSERT_TRUE(tier.ok());
    std::vector<FsBlockKey> keys;
    std::vector<int64_t> slots;
    for (int i = 0; i < 6; ++i) {
      keys.push_back(
          FsBlockKey{std::string(15, 'a') + std::to_string(i), static_cast<uint32_t>(i % 2)});
      slots.push_back(i);
    }
    auto id = (*tier)->SubmitStore(keys, slots);
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE((*tier)->Wait(*id).ok());
    ns = (*tier)->namespace_name();
    rank_dir = (*tier)->rank_dir();
  }
  std::free(mem);
  // One bit flipped, one vLLM-style block without a record, debris at the root.
  const std::string flipped = rank_dir + "/aaa/aa_g0/aaaaaaaaaaaaaaa0.bin";
  {
    std::fstream f(flipped, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  stdfs::create_directories(rank_dir + "/bbb/bb_g3");
  std::ofstream(rank_dir + "/bbb/bb_g3/bbbbbbbbbbbbbbbb.bin") << std::string(row, 'v');
  stdfs::create_symlink("/etc", dir.path() + "/evil");
  stdfs::create_directories(dir.path() + "/not-a-namespace");

  FsInspectOptions io;
  io.list_blocks = true;
  auto scan = InspectFsRoot(dir.path(), io);
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  ASSERT_EQ(scan->namespaces.size(), 1u);
  const FsNamespaceReport& n = scan->namespaces[0];
  EXPECT_EQ(n.name, ns);
  EXPECT_EQ(n.model_name, "org/model");
  EXPECT_TRUE(n.has_config);
  EXPECT_TRUE(n.digest_matches);
  ASSERT_EQ(n.ranks.size(), 1u);
  EXPECT_EQ(n.ranks[0].blocks, 7u);
  EXPECT_EQ(n.ranks[0].bytes, 7 * row);
  EXPECT_EQ(n.ranks[0].blocks_per_group.at(3), 1u);
  EXPECT_EQ(n.ranks[0].blocks_list.size(), 7u);
  EXPECT_EQ(scan->problems.size(), 2u);  // the symlink and the foreign directory
  EXPECT_EQ(scan->corrupt, 0u);          // scan does not read bodies

  io.verify = true;
  auto verify = InspectFsRoot(dir.path(), io);
  ASSERT_TRUE(verify.ok());
  EXPECT_EQ(verify->corrupt, 1u);
  EXPECT_EQ(verify->namespaces[0].ranks[0].verified, 5u);
  EXPECT_EQ(verify->namespaces[0].ranks[0].unverified, 1u);
  EXPECT_TRUE(stdfs::exists(flipped));  // not removed without remove_corrupt
  io.remove_corrupt = true;
  ASSERT_TRUE(InspectFsRoot(dir.path(), io).ok());
  EXPECT_FALSE(stdfs::exists(flipped));
  EXPECT_TRUE(stdfs::exists("/etc/passwd"));
  const std::string json = FsRootReportJson(*verify, false);
  EXPECT_NE(json.find("\"corrupt\":1"), std::string::npos);

  // A config.json edited after the fact no longer hashes to its directory's name.
  std::ofstream(dir.path() + "/" + ns + "/config.json") << "{\"model_name\": \"other\"}";
  auto edited = InspectFsRoot(dir.path(), {});
  ASSERT_TRUE(edited.ok());
  EXPECT_FALSE(edited->namespaces[0].digest_matches);

  EXPECT_EQ(InspectFsRoot(dir.path() + "/missing", {}).status().code(), StatusCode::kNotFound);
}

// A tier written by vLLM (no records): the raw rows of `n` blocks of `row` bytes in group 0.
std::string WriteVllmTier(const std::string& root, uint64_t row, int n) {
  FsRunFields f;
  f.model_name = "vllm-model";
  auto ns = FsNamespaceName(f);
  auto config = FsFieldsConfigJson(f);
  EXPECT_TRUE(ns.ok() && config.ok());
  stdfs::create_directories(root + "/" + *ns);
  std::ofstream(root + "/" + *ns + "/config.json") << *config;
  for (int i = 0; i < n; ++i) {
    const FsBlockKey key{"c0ffee" + std::to_string(100000 + i) + "00", 0};
    const std::string path = root + "/" + FsBlockRelativePath(*ns, 0, key);
    stdfs::create_directories(stdfs::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << std::string(row, static_cast<char>('a' + i));
  }
  return root + "/" + *ns + "_r0";
}

// Issue 10 item 13: verify passed a vLLM-written tier with a truncated block (vLLM's own load
// rejects a short read). Each block's size is now checked against its namespace's block size.
TEST(FsInspectTest, VerifyChecksSizesOfBlocksWithoutRecords) {
  testing::TempDir dir;
  const uint64_t row = 8192;
  const std::string rank = WriteVllmTier(dir.path(), row, 4);
  const std::string victim = rank + "/c0f/fe_g0/c0ffee10000200.bin";
  ASSERT_TRUE(stdfs::exists(victim));
  stdfs::resize_file(victim, row - 1000);
  FsInspectOptions io;
  io.verify = true;
  auto v = InspectFsRoot(dir.path(), io);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_EQ(v->namespaces.size(), 1u);
  const FsRankReport& r = v->namespaces[0].ranks.at(0);
  EXPECT_EQ(r.block_bytes, row);
  EXPECT_EQ(v->corrupt, 1u);
  EXPECT_EQ(r.unverified, 3u);
  bool named = false;
  for (const auto& p : r.problems)
    named = named || p.find("c0ffee10000200.bin") != std::string::npos;
  EXPECT_TRUE(named);
  // An explicit block size wins over the inference.
  io.block_bytes = row - 1000;
  v = InspectFsRoot(dir.path(), io);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->corrupt, 3u);
  // Two blocks of two sizes: the block size cannot be inferred; verify says so.
  testing::TempDir two;
  const std::string rank2 = WriteVllmTier(two.path(), row, 2);
  stdfs::resize_file(rank2 + "/c0f/fe_g0/c0ffee10000100.bin", row / 2);
  io.block_bytes = 0;
  v = InspectFsRoot(two.path(), io);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->ambiguous);
  EXPECT_EQ(v->corrupt, 0u);
}

// Issue 10 item 12: a sparse 8 GiB .bin made verify read (and allocate) 8 GiB. A block larger than
// the namespace's block size is corrupt by its size, without reading it; a misfiled kvo block (its
// record names another block) is corrupt too.
TEST(FsInspectTest, VerifyRejectsSparseGiantsAndMisfiledBlocks) {
  testing::TempDir dir;
  const uint64_t row = 4096;
  uint8_t* mem = static_cast<uint8_t*>(std::aligned_alloc(4096, 4 * row));
  for (uint64_t i = 0; i < 4 * row; ++i) mem[i] = static_cast<uint8_t>(i * 13 + i / row);
  std::string rank_dir;
  std::vector<FsBlockKey> keys;
  {
    FsBlockStoreOptions o;
    o.root_dir = dir.path();
    o.fields.model_name = "m";
    o.n_read_threads = o.n_write_threads = 1;
    auto tier = FsBlockStore::Open(o, HostRegion{reinterpret_cast<uintptr_t>(mem), 4, row});
    ASSERT_TRUE(tier.ok());
    for (int i = 0; i < 4; ++i) keys.push_back(FsBlockKey{"abcdef0" + std::to_string(i), 0});
    auto id = (*tier)->SubmitStore(keys, {0, 1, 2, 3});
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE((*tier)->Wait(*id).ok());
    rank_dir = (*tier)->rank_dir();
  }
  std::free(mem);
  const std::string leaf = rank_dir + "/abc/de_g0/";
  // Block 0 grows into a sparse giant (its record still says 4096 bytes; then a record that says
  // 8 GiB, as an attacker would forge it: the size is wrong for the namespace either way).
  ASSERT_EQ(::truncate((leaf + keys[0].hex + ".bin").c_str(), int64_t{8} << 30), 0);
  // Block 1's file (with its record) renamed over block 2's name.
  stdfs::rename(leaf + keys[1].hex + ".bin", leaf + keys[2].hex + ".bin");
  FsInspectOptions io;
  io.verify = true;
  auto v = InspectFsRoot(dir.path(), io);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const FsRankReport& r = v->namespaces.at(0).ranks.at(0);
  EXPECT_EQ(r.block_bytes, row);
  EXPECT_EQ(r.corrupt, 2u);
  EXPECT_EQ(r.misfiled, 1u);
  EXPECT_EQ(r.verified, 1u);
  // Only one other block to compare with: the block size from the flag.
  stdfs::remove(leaf + keys[2].hex + ".bin");
  stdfs::remove(leaf + keys[3].hex + ".bin");
  io.block_bytes = row;
  v = InspectFsRoot(dir.path(), io);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->corrupt, 1u);
  io.remove_corrupt = true;
  ASSERT_TRUE(InspectFsRoot(dir.path(), io).ok());
  EXPECT_FALSE(stdfs::exists(leaf + keys[0].hex + ".bin"));
}

// Issue 10 item 12: a FIFO named config.json blocked `kvo fs scan` forever. Bounded: a scan that
// does not return in 20 s fails the test (opening the FIFO for writing releases it).
TEST(FsInspectTest, FifoConfigJsonIsAProblemNotAHang) {
  testing::TempDir dir;
  WriteVllmTier(dir.path(), 4096, 1);
  std::string config;
  for (const auto& e : stdfs::directory_iterator(dir.path())) {
    if (stdfs::exists(e.path() / "config.json")) config = (e.path() / "config.json").string();
  }
  ASSERT_FALSE(config.empty());
  stdfs::remove(config);
  ASSERT_EQ(::mkfifo(config.c_str(), 0600), 0);
  auto scan = std::async(std::launch::async, [&] { return InspectFsRoot(dir.path(), {}); });
  if (scan.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "fs scan blocked on a FIFO named config.json";
    int fd = ::open(config.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  auto report = scan.get();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  bool named = false;
  for (const auto& p : report->problems) {
    named = named || (p.find("config.json") != std::string::npos &&
                      p.find("not a regular file") != std::string::npos);
  }
  EXPECT_TRUE(named);
}

}  // namespace
}  // namespace kvo
