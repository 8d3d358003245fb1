// `kvo fs scan|verify|du` contract over a real tier directory. Runs the real binary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/testing/temp_dir.h"
#include "transfer/fs_block_store.h"

namespace kvo {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string output;
};

RunResult Kvo(const std::string& args) {
  std::string cmd = std::string("'") + KVO_BINARY + "' " + args + " 2>&1";
  RunResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(FsCommandTest, ScanVerifyDu) {
  testing::TempDir dir;
  const uint64_t row = 8192;
  uint8_t* mem = static_cast<uint8_t*>(std::aligned_alloc(4096, 4 * row));
  for (uint64_t i = 0; i < 4 * row; ++i) mem[i] = static_cast<uint8_t>(i * 7);
  std::string rank_dir;
  {
    FsBlockStoreOptions o;
    o.root_dir = dir.path();
    o.fields.model_name = "test-model";
    o.n_read_threads = o.n_write_threads = 1;
    auto tier = FsBlockStore::Open(o, HostRegion{reinterpret_cast<uintptr_t>(mem), 4, row});
    ASSERT_TRUE(tier.ok());
    auto id = (*tier)->SubmitStore({{"0001020304050607", 0},
                                    {"0001020304050608", 1},
                                    {"00aa020304050608", 1},
                                    {"ff01020304050607", 2}},
                                   {0, 1, 2, 3});
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE((*tier)->Wait(*id).ok());
    rank_dir = (*tier)->rank_dir();
  }
  std::free(mem);
  const std::string root = "--root-dir '" + dir.path() + "'";

  RunResult scan = Kvo("fs scan --json --blocks " + root);
  ASSERT_EQ(scan.exit_code, 0) << scan.output;
  auto j = nlohmann::json::parse(scan.output);
  EXPECT_EQ(j["blocks"], 4);
  EXPECT_EQ(j["bytes"], 4 * row);
  EXPECT_EQ(j["namespaces"][0]["name"], "test-model_de3bba26cf36");
  EXPECT_EQ(j["namespaces"][0]["digest_matches"], true);
  EXPECT_EQ(j["namespaces"][0]["ranks"][0]["block_list"].size(), 4u);

  RunResult verify = Kvo("fs verify --json " + root);
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_EQ(nlohmann::json::parse(verify.output)["namespaces"][0]["ranks"][0]["verified"], 4);

  // Flip a bit: verify fails (exit 1) and names the block; --remove-corrupt deletes it.
  const std::string victim = rank_dir + "/000/10_g0/0001020304050607.bin";
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x01');
  }
  verify = Kvo("fs verify " + root);
  EXPECT_EQ(verify.exit_code, 1);
  EXPECT_NE(verify.output.find("0001020304050607.bin: corrupt (checksum mismatch)"),
            std::string::npos)
      << verify.output;
  EXPECT_TRUE(std::filesystem::exists(victim));
  verify = Kvo("fs verify --remove-corrupt " + root);
  EXPECT_EQ(verify.exit_code, 1);
  EXPECT_FALSE(std::filesystem::exists(victim));
  EXPECT_EQ(Kvo("fs verify " + root).exit_code, 0);

  RunResult du = Kvo("fs du --json " + root);
  ASSERT_EQ(du.exit_code, 0) << du.output;
  auto d = nlohmann::json::parse(du.output);
  EXPECT_EQ(d["bytes"], 3 * row);
  EXPECT_GE(d["disk_bytes"].get<uint64_t>(), 3 * row);
  EXPECT_EQ(d["dirs"][0]["dir"], "test-model_de3bba26cf36_r0");

  RunResult missing = Kvo("fs scan --root-dir '" + dir.path() + "/nope'");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("does not exist"), std::string::npos);
}

}  // namespace
}  // namespace kvo
