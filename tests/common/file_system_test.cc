#include "common/file_system.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

mode_t Mode(const std::string& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 0777;
}

TEST(FileSystemTest, WritesReadsListsWithPrivateModes) {
  testing::TempDir tmp;
  FileSystem* fs = DefaultFileSystem();
  std::string dir = JoinPath(tmp.path(), "a/b/c");
  ASSERT_TRUE(fs->CreateDirs(dir, {}).ok());
  ASSERT_TRUE(fs->CreateDirs(dir, {}).ok());  // idempotent
  EXPECT_EQ(Mode(dir), 0700u);
  std::string file = JoinPath(dir, "f.bin");
  {
    auto w = fs->NewAppendableFile(file, {});
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE((*w)->Append("hello ").ok());
    ASSERT_TRUE((*w)->Append(std::string(200000, 'x')).ok());  // larger than the buffer
    EXPECT_EQ((*w)->Size(), 200006u);
    ASSERT_TRUE((*w)->Sync().ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  EXPECT_EQ(Mode(file), 0600u);
  auto all = fs->ReadFile(file);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 200006u);
  EXPECT_EQ(all->substr(0, 6), "hello ");
  auto seq = fs->NewSequentialFile(file);
  ASSERT_TRUE(seq.ok());
  std::string chunk;
  ASSERT_TRUE((*seq)->Skip(6).ok());
  ASSERT_TRUE((*seq)->Read(3, &chunk).ok());
  EXPECT_EQ(chunk, "xxx");
  ASSERT_TRUE(fs->Truncate(file, 5).ok());
  EXPECT_EQ(*fs->FileSize(file), 5u);
  // Appending to an existing file continues at its end.
  {
    auto w = fs->NewAppendableFile(file, {});
    ASSERT_TRUE(w.ok());
    EXPECT_EQ((*w)->Size(), 5u);
    ASSERT_TRUE((*w)->Append("!").ok());
  }
  EXPECT_EQ(*fs->ReadFile(file), "hello!");
  ASSERT_TRUE(fs->Rename(file, JoinPath(dir, "g.bin")).ok());
  EXPECT_EQ(*fs->ListDir(dir), std::vector<std::string>{"g.bin"});
  ASSERT_TRUE(fs->SyncDir(dir).ok());
  ASSERT_TRUE(fs->Remove(JoinPath(dir, "g.bin")).ok());
  EXPECT_FALSE(fs->Exists(JoinPath(dir, "g.bin")));
}

TEST(FileSystemTest, ErrorsNameThePathAndNeverFollowSymlinks) {
  testing::TempDir tmp;
  FileSystem* fs = DefaultFileSystem();
  auto missing = fs->ReadFile(JoinPath(tmp.path(), "nope"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
  std::string target = JoinPath(tmp.path(), "target");
  std::string link = JoinPath(tmp.path(), "link");
  ASSERT_TRUE(fs->NewAppendableFile(target, {}).ok());
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  EXPECT_FALSE(fs->NewAppendableFile(link, {}).ok());
  EXPECT_FALSE(fs->NewSequentialFile(link).ok());
  EXPECT_FALSE(fs->CreateDirs(target, {}).ok());  // exists and is not a directory
  EXPECT_EQ(JoinPath("a/", "/b"), "a/b");
}

}  // namespace
}  // namespace kvo
