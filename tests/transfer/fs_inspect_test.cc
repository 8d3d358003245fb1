#include "transfer/fs_inspect.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/testing/temp_dir.h"
#include "transfer/fs_tier.h"

namespace kvo {
namespace {

namespace stdfs = std::filesystem;

TEST(FsInspectTest, ReportsNamespacesBlocksAndProblems) {
  testing::TempDir dir;
  const uint64_t row = 4096;
  uint8_t* mem = static_cast<uint8_t*>(std::aligned_alloc(4096, 8 * row));
  for (uint64_t i = 0; i < 8 * row; ++i) mem[i] = static_cast<uint8_t>(i * 31);
  FsTierOptions o;
  o.root_dir = dir.path();
  o.fields.model_name = "org/model";
  o.n_read_threads = o.n_write_threads = 1;
  std::string ns, rank_dir;
  {
    auto tier = FsTier::Open(o, HostRegion{reinterpret_cast<uintptr_t>(mem), 8, row});
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

}  // namespace
}  // namespace kvo
