// ChildProcess, the harness every daemon test runs kvo through: Drain and DrainWhile must read a
// chatty child's pipes, or the child blocks in write() and (kvo's logger holding its console
// mutex) every thread of a daemon that logs stops with it.
#include "tests/testing/child_process.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <string>

#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace kvo::testing {
namespace {

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Drain reads what the pipes hold now. It once pumped with a deadline 1 ms away, which rounding
// to whole milliseconds made "already passed": it read nothing.
TEST(ChildProcessTest, DrainReadsWhatThePipesHold) {
  TempDir dir;
  const std::string mark = dir.path() + "/written";
  ChildProcess child(
      {"/bin/sh", "-c", "head -c 50000 /dev/zero >&2 && : > '" + mark + "' && exec sleep 60"});
  ASSERT_TRUE(child.started());
  ASSERT_TRUE(Eventually([&] { return Exists(mark); }));  // all 50,000 bytes are in the pipe
  child.Drain();
  EXPECT_EQ(child.err().size(), 50000U);
}

// A child that writes far more than a pipe holds finishes only while DrainWhile's call runs.
TEST(ChildProcessTest, DrainWhileKeepsAChildThatWritesMoreThanAPipeHoldsGoing) {
  TempDir dir;
  const std::string mark = dir.path() + "/written";
  ChildProcess child(
      {"/bin/sh", "-c", "head -c 2000000 /dev/zero >&2 && : > '" + mark + "' && exec sleep 60"});
  ASSERT_TRUE(child.started());
  const bool finished = child.DrainWhile([&] { return Eventually([&] { return Exists(mark); }); });
  EXPECT_TRUE(finished) << "the child stayed blocked writing stderr; read " << child.err().size();
  EXPECT_EQ(child.err().size(), 2000000U);
}

}  // namespace
}  // namespace kvo::testing
