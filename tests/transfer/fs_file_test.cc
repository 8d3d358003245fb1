// The file tier's short syscall paths (issue 11): the leaf directory opened in one openat2
// (RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH), the block file read through one openat2 of
// "<hhh>/<hh>_g<group>/<hash>.bin", and blocks written as a nameless O_TMPFILE linked under their
// name. Attacked here: symlinks at every level (never followed, classified as the per-level walk
// classifies them), racing writers of one name (linkat never replaces: one writer wins whole,
// the others see kExisted), and no temp name ever left behind. Real files in a temp directory.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/testing/temp_dir.h"
#include "transfer/fs_file.h"

namespace kvo::fs_internal {
namespace {

namespace stdfs = std::filesystem;

Dir Open(const std::string& path) {
  auto d = OpenRootDir(path);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(d).value() : Dir();
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : stdfs::recursive_directory_iterator(dir)) {
    out.push_back(e.path().lexically_relative(dir).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FsFastPathTest, OpenBlockDirCreatesOpensAndRefusesSymlinks) {
  testing::TempDir tmp;
  const std::string root = tmp.path();
  Dir base = Open(root);
  auto missing = OpenBlockDir(base, "abc", "de_g0", false, 0700, "block directory");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  EXPECT_NE(missing.status().message().find("abc/de_g0"), std::string::npos);
  auto made = OpenBlockDir(base, "abc", "de_g0", true, 0700, "block directory");
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_TRUE(stdfs::is_directory(root + "/abc/de_g0"));
  auto again = OpenBlockDir(base, "abc", "de_g0", false, 0700, "block directory");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  // A second leaf under the existing first level.
  ASSERT_TRUE(OpenBlockDir(base, "abc", "df_g1", true, 0700, "block directory").ok());

  // Symlinks at either level point outside: never followed, created through, nor opened.
  const std::string outside = root + "/outside";
  stdfs::create_directories(outside + "/de_g0");
  stdfs::create_directory_symlink(outside, root + "/fff");
  stdfs::create_directories(root + "/eee");
  stdfs::create_directory_symlink(outside + "/de_g0", root + "/eee/de_g0");
  for (bool create : {false, true}) {
    auto via1 = OpenBlockDir(base, "fff", "de_g0", create, 0700, "block directory");
    EXPECT_EQ(via1.status().code(), StatusCode::kFailedPrecondition) << via1.status().ToString();
    EXPECT_NE(via1.status().message().find("'fff' is a symlink"), std::string::npos)
        << via1.status().ToString();
    auto via2 = OpenBlockDir(base, "eee", "de_g0", create, 0700, "block directory");
    EXPECT_EQ(via2.status().code(), StatusCode::kFailedPrecondition) << via2.status().ToString();
    auto new2 = OpenBlockDir(base, "fff", "aa_g0", create, 0700, "block directory");
    EXPECT_FALSE(new2.ok());
  }
  EXPECT_FALSE(stdfs::exists(outside + "/aa_g0"));
  // A regular file where a directory belongs.
  std::ofstream(root + "/ddd") << "x";
  auto file = OpenBlockDir(base, "ddd", "de_g0", true, 0700, "block directory");
  EXPECT_EQ(file.status().code(), StatusCode::kFailedPrecondition) << file.status().ToString();
}

// Both write paths: O_TMPFILE + linkat, and the named temp file + rename fallback.
class FsWritePathTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { ForceNamedTempFilesForTest(GetParam()); }
  void TearDown() override { ForceNamedTempFilesForTest(false); }
};

TEST_P(FsWritePathTest, WritesLeaveNoTempNameAndNeverReplace) {
  const bool named = GetParam();
  testing::TempDir tmp;
  Dir dir = Open(tmp.path());
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<char> a(65536), b(65536);
  for (auto& c : a) c = static_cast<char>(rng());
  for (auto& c : b) c = static_cast<char>(rng());
  WriteOptions wo;
  wo.identity = 42;
  auto w = WriteFileAtomic(dir, "x.bin", a.data(), a.size(), wo);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(*w, WriteOutcome::kWritten);
  auto again = WriteFileAtomic(dir, "x.bin", b.data(), b.size(), wo);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, WriteOutcome::kExisted);
  EXPECT_EQ(Names(tmp.path()), std::vector<std::string>{"x.bin"});

  std::vector<char> back(a.size());
  ReadOptions ro;
  ro.identity = 42;
  ro.require_checksum = true;
  auto rd = ReadFileVerified(dir, "x.bin", back.data(), back.size(), ro);
  ASSERT_TRUE(rd.ok()) << rd.status().ToString();
  EXPECT_EQ(rd->outcome, ReadOutcome::kOk);
  EXPECT_TRUE(rd->verified);
  EXPECT_EQ(back, a);  // the first writer's bytes, not replaced

  // Racing writers of one name, different bytes each (bounded: 5 rounds of 8 threads): the file
  // whole and one writer's, verified by its record. linkat never replaces, so exactly one
  // writer reports kWritten; rename (the fallback) replaces, so several may.
  for (int round = 0; round < 5; ++round) {
    const std::string name = "race" + std::to_string(round) + ".bin";
    constexpr int kThreads = 8;
    std::vector<std::vector<char>> bodies(kThreads, std::vector<char>(16384));
    for (auto& body : bodies) {
      for (auto& c : body) c = static_cast<char>(rng());
    }
    std::atomic<int> written{0}, existed{0}, failed{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) {
      ts.emplace_back([&, t] {
        while (!go.load()) {
        }
        auto r = WriteFileAtomic(dir, name, bodies[t].data(), bodies[t].size(), wo);
        if (!r.ok()) {
          ++failed;
        } else if (*r == WriteOutcome::kWritten) {
          ++written;
        } else {
          ++existed;
        }
      });
    }
    go = true;
    for (auto& t : ts) t.join();
    EXPECT_EQ(failed.load(), 0);
    EXPECT_EQ(written.load() + existed.load(), kThreads);
    if (named) {
      EXPECT_GE(written.load(), 1) << "round " << round;
    } else {
      EXPECT_EQ(written.load(), 1) << "round " << round;
    }
    std::vector<char> got(16384);
    auto r = ReadFileVerified(dir, name, got.data(), got.size(), ro);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->outcome, ReadOutcome::kOk) << r->detail;
    EXPECT_TRUE(std::find(bodies.begin(), bodies.end(), got) != bodies.end());
  }
  // Sidecar records (file systems without user xattrs): the sidecar first, then the .bin.
  WriteOptions so = wo;
  so.checksum = ChecksumStore::kSidecar;
  auto sw = WriteFileAtomic(dir, "s.bin", a.data(), a.size(), so);
  ASSERT_TRUE(sw.ok()) << sw.status().ToString();
  EXPECT_EQ(*sw, WriteOutcome::kWritten);
  ReadOptions sro = ro;
  sro.checksum = ChecksumStore::kSidecar;
  auto sr = ReadFileVerified(dir, "s.bin", back.data(), back.size(), sro);
  ASSERT_TRUE(sr.ok()) << sr.status().ToString();
  EXPECT_EQ(sr->outcome, ReadOutcome::kOk) << sr->detail;
  EXPECT_TRUE(sr->verified);
  EXPECT_EQ(back, a);
  EXPECT_TRUE(stdfs::exists(tmp.path() + "/s.bin.kvo"));
  for (const std::string& n : Names(tmp.path())) {
    EXPECT_EQ(n.find(".tmp"), std::string::npos) << n;
  }
}

INSTANTIATE_TEST_SUITE_P(LinkAndRename, FsWritePathTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("NamedTempRename")
                                          : std::string("TmpFileLink");
                         });

TEST(FsFastPathTest, OneOpenReadClassifiesAsThePerLevelWalk) {
  testing::TempDir tmp;
  const std::string root = tmp.path();
  Dir base = Open(root);
  std::vector<char> body(8192, 'k'), got(8192);
  WriteOptions wo;
  wo.identity = 7;
  ReadOptions ro;
  ro.identity = 7;
  {
    auto leaf = OpenBlockDir(base, "aaa", "bb_g0", true, 0700, "block directory");
    ASSERT_TRUE(leaf.ok());
    ASSERT_TRUE(WriteFileAtomic(*leaf, "aaabb.bin", body.data(), body.size(), wo).ok());
  }
  auto ok = ReadBlockFileVerified(base, "aaa", "bb_g0", "aaabb.bin", got.data(), got.size(), ro);
  ASSERT_TRUE(ok.ok() && ok->has_value());
  EXPECT_EQ((*ok)->outcome, ReadOutcome::kOk);
  EXPECT_TRUE((*ok)->verified);
  EXPECT_EQ(got, body);
  // Missing at any level: a miss, decided in one call.
  for (auto [d1, d2, n] : {std::tuple{"aaa", "bb_g0", "nope.bin"},
                           {"aaa", "zz_g0", "x.bin"},
                           std::tuple{"zzz", "bb_g0", "x.bin"}}) {
    auto m = ReadBlockFileVerified(base, d1, d2, n, got.data(), got.size(), ro);
    ASSERT_TRUE(m.ok() && m->has_value()) << d1 << "/" << d2 << "/" << n;
    EXPECT_EQ((*m)->outcome, ReadOutcome::kMissing);
  }
  // A symlinked .bin, leaf directory or first-level directory: not decided here (nullopt: the
  // per-level walk classifies it), and nothing behind the link is read.
  stdfs::create_directories(root + "/outside/bb_g0");
  std::ofstream(root + "/outside/bb_g0/aaabb.bin") << std::string(8192, 'X');
  stdfs::create_symlink(root + "/aaa/aaabb.bin", root + "/aaa/bb_g0/link.bin");
  stdfs::create_directory_symlink(root + "/outside/bb_g0", root + "/aaa/cc_g0");
  stdfs::create_directory_symlink(root + "/outside", root + "/sss");
  for (auto [d1, d2, n] : {std::tuple{"aaa", "bb_g0", "link.bin"},
                           {"aaa", "cc_g0", "aaabb.bin"},
                           std::tuple{"sss", "bb_g0", "aaabb.bin"}}) {
    std::fill(got.begin(), got.end(), 0);
    auto s = ReadBlockFileVerified(base, d1, d2, n, got.data(), got.size(), ro);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_FALSE(s->has_value()) << d1 << "/" << d2 << "/" << n;
    EXPECT_EQ(got, std::vector<char>(8192, 0));
  }
  // A corrupt file found through the one call is removed (the directory opened for it).
  {
    std::fstream f(root + "/aaa/bb_g0/aaabb.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('!');
  }
  auto bad = ReadBlockFileVerified(base, "aaa", "bb_g0", "aaabb.bin", got.data(), got.size(), ro);
  ASSERT_TRUE(bad.ok() && bad->has_value());
  EXPECT_EQ((*bad)->outcome, ReadOutcome::kCorrupt);
  EXPECT_EQ((*bad)->detail, "checksum mismatch");
  EXPECT_FALSE(stdfs::exists(root + "/aaa/bb_g0/aaabb.bin"));
  // Sidecar records: not this path's (nullopt).
  ReadOptions side = ro;
  side.checksum = ChecksumStore::kSidecar;
  auto sc = ReadBlockFileVerified(base, "aaa", "bb_g0", "x.bin", got.data(), got.size(), side);
  ASSERT_TRUE(sc.ok());
  EXPECT_FALSE(sc->has_value());
}

}  // namespace
}  // namespace kvo::fs_internal
