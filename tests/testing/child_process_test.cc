// ChildProcess, the harness every daemon test runs kvo through. A child must never block writing
// its output because the test is busy elsewhere: a daemon blocked in write() holds kvo's logger's
// console mutex, and every thread of it that logs (the HTTP handlers among them) stops too.
#include "tests/testing/child_process.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <string>

#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace kvo::testing {
namespace {

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// `bytes` zero bytes to stdout or stderr, then a mark file, then the child stays alive.
std::vector<std::string> Writer(const char* stream, int bytes, const std::string& mark) {
  std::string redirect = std::string(stream) == "stderr" ? " >&2" : "";
  return {"/bin/sh", "-c",
          "head -c " + std::to_string(bytes) + " /dev/zero" + redirect + " && : > '" + mark +
              "' && exec sleep 60"};
}

// Stderr is a file: megabytes of it while nobody reads do not block the child, and err() has
// every byte.
TEST(ChildProcessTest, StderrNeverBlocksTheChild) {
  TempDir dir;
  const std::string mark = dir.path() + "/written";
  ChildProcess child(Writer("stderr", 2'000'000, mark));
  ASSERT_TRUE(child.started());
  EXPECT_TRUE(Eventually([&] { return Exists(mark); })) << "the child blocked writing stderr";
  EXPECT_EQ(child.err().size(), 2'000'000U);
}

// Drain reads what stdout holds now. It once pumped with a deadline 1 ms away, which rounding to
// whole milliseconds made "already passed": it read nothing.
TEST(ChildProcessTest, DrainReadsWhatStdoutHolds) {
  TempDir dir;
  const std::string mark = dir.path() + "/written";
  ChildProcess child(Writer("stdout", 50'000, mark));
  ASSERT_TRUE(child.started());
  ASSERT_TRUE(Eventually([&] { return Exists(mark); }));  // all 50,000 bytes are in the pipe
  child.Drain();
  EXPECT_EQ(child.out().size(), 50'000U);
}

// A child that prints far more than a pipe holds finishes only while DrainWhile's call runs.
TEST(ChildProcessTest, DrainWhileKeepsAChildThatPrintsMoreThanAPipeHoldsGoing) {
  TempDir dir;
  const std::string mark = dir.path() + "/written";
  ChildProcess child(Writer("stdout", 2'000'000, mark));
  ASSERT_TRUE(child.started());
  const bool finished = child.DrainWhile([&] { return Eventually([&] { return Exists(mark); }); });
  EXPECT_TRUE(finished) << "the child stayed blocked writing stdout; read " << child.out().size();
  EXPECT_EQ(child.out().size(), 2'000'000U);
}

// Wait reads stdout to its end and reaps; stderr written just before the exit is all there.
TEST(ChildProcessTest, WaitReturnsTheExitCodeWithAllOfStderr) {
  ChildProcess child({"/bin/sh", "-c", "echo out; head -c 100000 /dev/zero >&2; exit 3"});
  ASSERT_TRUE(child.started());
  EXPECT_EQ(child.Wait(SteadyClock::now() + std::chrono::seconds(30)), 3);
  EXPECT_EQ(child.out(), "out\n");
  EXPECT_EQ(child.err().size(), 100'000U);
}

}  // namespace
}  // namespace kvo::testing
