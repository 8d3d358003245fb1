// `kvo demo --tour` (the one-process tour) runs end to end: the bus tour loses nothing, and the
// pipeline part serves both engines with every loaded block verified, the indexer's hash parity
// ok for both sources, the router's answer naming the engine that holds the conversation, and
// the restarted manager's CPU blocks gone from that answer. Runs the real binary.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/testing/child_process.h"

namespace kvo {
namespace {

bool Has(const std::string& out, const std::string& what) {
  return out.find(what) != std::string::npos;
}

TEST(DemoCommandTest, RunsThePipelineEndToEnd) {
  const testing::CommandResult r = testing::RunCommand({KVO_BINARY, "demo", "--tour"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(Has(r.out, "0 lost")) << r.out;
  for (const char* engine : {"engine-a", "engine-b"}) {
    EXPECT_TRUE(Has(r.out, std::string("# ") + engine + ": 15 requests")) << r.out;
    EXPECT_TRUE(Has(r.out, std::string("indexer source ") + engine + ": hash parity ok")) << r.out;
  }
  EXPECT_TRUE(Has(r.out, "every loaded block verified")) << r.out;
  // Issue 10 item 12: the file tier's root_dir was created 0755 (umask); it is private.
  for (const char* engine : {"engine-a", "engine-b"}) {
    const size_t at = r.out.find(std::string("# ") + engine + ": file tier root_dir ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_TRUE(Has(line, "(mode 0700)")) << line;
  }
  // Conversation 0 lives on engine-a: its whole history (58 blocks), on three tiers.
  const size_t answer = r.out.find("engine-a  prefix  58 blocks");
  ASSERT_NE(answer, std::string::npos) << r.out;
  const std::string first = r.out.substr(answer, r.out.find('\n', answer) - answer);
  EXPECT_TRUE(Has(first, "CPU=")) << first;
  EXPECT_TRUE(Has(first, "STORAGE=58")) << first;
  // Of conversation 0, engine-a's GPU still holds only the shared system prompt (its GPU was
  // refilled by later conversations): the index follows GPU evictions exactly.
  EXPECT_TRUE(Has(first, "GPU=8 ")) << first;
  EXPECT_TRUE(Has(r.out, "engine-b  prefix   8 blocks")) << r.out;  // the shared system prompt
  // After the restart, engine-a's answer has no CPU blocks left.
  const size_t restart = r.out.find("restarted");
  ASSERT_NE(restart, std::string::npos) << r.out;
  const size_t after = r.out.find("engine-a  prefix", restart);
  ASSERT_NE(after, std::string::npos) << r.out;
  const std::string line = r.out.substr(after, r.out.find('\n', after) - after);
  EXPECT_FALSE(Has(line, "CPU=")) << line;
  EXPECT_TRUE(Has(line, "STORAGE=58")) << line;
}

// Issue 10 item 12: with an unusable $TMPDIR the demo said "cannot create a temp dir", naming
// neither the path nor the reason. Both the tour and the process demo.
TEST(DemoCommandTest, UnusableTmpdirIsNamedWithTheReason) {
  const std::string bad = "/proc/version";  // a file, not a directory: ENOTDIR
  for (bool tour : {true, false}) {
    std::vector<std::string> argv = {"/usr/bin/env", "TMPDIR=" + bad, KVO_BINARY, "demo"};
    if (tour) argv.push_back("--tour");
    const testing::CommandResult r = testing::RunCommand(argv);
    EXPECT_NE(r.code, 0);
    EXPECT_TRUE(Has(r.err, bad + "/kvo-demo-")) << r.err;
    EXPECT_TRUE(Has(r.err, "Not a directory")) << r.err;
  }
}

}  // namespace
}  // namespace kvo
