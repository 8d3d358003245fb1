// `kvo manager ops` contract: vLLM's LRU trace (vllm-compat.md B.6, test_cpu_manager) with its
// exact slot ids, evicted keys and events; out-of-contract calls answer {"error"} and the script
// goes on; a bad line names its line number and makes the exit status 2. Runs the real binary.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/hex.h"
#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string output;
};

// Runs `kvo manager ops <args> --ops <script>`; stdout only.
RunResult RunOps(const std::vector<std::string>& args, const std::string& script) {
  kvo::testing::TempDir dir;
  const std::string path = dir.path() + "/ops.jsonl";
  std::ofstream(path) << script;
  std::vector<std::string> argv = {KVO_BINARY, "manager", "ops"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--ops", path});
  const testing::CommandResult c = testing::RunCommand(argv);
  return {c.code, c.out};
}

std::vector<std::string> Lines(const std::string& s) { return testing::SplitLines(s); }

// vLLM's to_key(i) = make_offload_key(str(i).encode(), 0): the digest is the decimal's ASCII.
std::string H(int i) { return kvo::ToHex(std::to_string(i)); }

std::string Keys(std::initializer_list<int> ids) {
  std::string out = "[";
  for (int i : ids) out += (out.size() > 1 ? ",\"" : "\"") + H(i) + "\"";
  return out + "]";
}

std::string Op(const std::string& op, std::initializer_list<int> ids, const char* extra = "") {
  return "{\"op\":\"" + op + "\",\"keys\":" + Keys(ids) + extra + "}\n";
}

TEST(ManagerCommandTest, ReproducesVllmsLruTrace) {
  std::string script;
  std::vector<std::string> expected;
  auto step = [&](const std::string& op, const std::string& answer) {
    script += op;
    expected.push_back(answer);
  };
  step(Op("prepare_store", {1, 2}),
       "{\"keys_to_store\":" + Keys({1, 2}) + ",\"slots\":[0,1],\"evicted\":[]}");
  step(Op("lookup", {1}), "{\"result\":\"HIT_PENDING\"}");
  step(Op("take_events", {}), "{\"events\":[]}");
  step(Op("complete_store", {1, 2}), "{}");
  step(Op("take_events", {}),
       "{\"events\":[{\"keys\":" + Keys({1, 2}) + ",\"medium\":\"CPU\",\"removed\":false}]}");
  step(Op("lookup", {1, 2, 3}), "{\"results\":[\"HIT\",\"HIT\",\"MISS\"]}");
  step(Op("prepare_store", {2, 3, 4, 5}), "{\"keys_to_store\":" + Keys({3, 4, 5}) +
                                              ",\"slots\":[2,3,0],\"evicted\":" + Keys({1}) + "}");
  step(Op("take_events", {}),
       "{\"events\":[{\"keys\":" + Keys({1}) + ",\"medium\":\"CPU\",\"removed\":true}]}");
  step(Op("prepare_store", {1, 6}), "{\"result\":null}");
  step(Op("complete_store", {2, 3, 4, 5}), "{}");
  step(Op("lookup", {1, 2, 3, 4, 5, 0}),
       "{\"results\":[\"MISS\",\"HIT\",\"HIT\",\"HIT\",\"HIT\",\"MISS\"]}");
  step(Op("prepare_load", {2, 3}), "{\"slots\":[1,2]}");
  step(Op("prepare_store", {6, 7, 8}), "{\"result\":null}");
  step(Op("complete_load", {2, 3}), "{}");
  step(Op("prepare_store", {6, 7, 8}), "{\"keys_to_store\":" + Keys({6, 7, 8}) +
                                           ",\"slots\":[1,0,3],\"evicted\":" + Keys({4, 5, 2}) +
                                           "}");
  step(Op("complete_store", {6, 7, 8}), "{}");
  step(Op("touch", {3, 6, 7}), "{}");
  step(Op("prepare_store", {9}),
       "{\"keys_to_store\":" + Keys({9}) + ",\"slots\":[3],\"evicted\":" + Keys({8}) + "}");
  step(Op("complete_store", {7, 9}, ",\"success\":false"), "{}");
  step(Op("lookup", {7}), "{\"result\":\"HIT\"}");
  step(Op("lookup", {9}), "{\"result\":\"MISS\"}");
  step(Op("take_events", {}),
       "{\"events\":[{\"keys\":" + Keys({3, 4, 5}) +
           ",\"medium\":\"CPU\",\"removed\":false},{\"keys\":" + Keys({4, 5, 2}) +
           ",\"medium\":\"CPU\",\"removed\":true},{\"keys\":" + Keys({6, 7, 8}) +
           ",\"medium\":\"CPU\",\"removed\":false},{\"keys\":" + Keys({8}) +
           ",\"medium\":\"CPU\",\"removed\":true}]}");

  const RunResult r = RunOps({"--num-blocks", "4", "--policy", "lru"}, script);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Lines(r.output), expected);
}

TEST(ManagerCommandTest, OutOfContractCallsAnswerAnErrorAndTheScriptGoesOn) {
  const std::string script = Op("prepare_load", {1}) + Op("prepare_store", {1}) +
                             Op("complete_load", {1}) + Op("lookup", {1});
  const RunResult r = RunOps({"--num-blocks", "2"}, script);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> lines = Lines(r.output);
  ASSERT_EQ(lines.size(), 4u) << r.output;
  EXPECT_NE(lines[0].find("{\"error\":\"FailedPrecondition: prepare_load: block 31"),
            std::string::npos)
      << lines[0];
  EXPECT_EQ(lines[1], "{\"keys_to_store\":[\"31\"],\"slots\":[0],\"evicted\":[]}");
  EXPECT_NE(lines[2].find("\"error\""), std::string::npos);
  EXPECT_EQ(lines[3], "{\"result\":\"HIT_PENDING\"}");
}

TEST(ManagerCommandTest, CompleteStoreIgnoresKeysThatAreNotPendingAsVllmDoes) {
  // vLLM's complete_store skips keys never prepared, evicted or already stored, and completes the
  // rest: no error, and the pending key of the same call becomes a hit.
  const std::string script = Op("complete_store", {7}) + Op("prepare_store", {1}) +
                             Op("complete_store", {1, 9}) + Op("lookup", {1, 9}) +
                             Op("complete_store", {1}) + Op("take_events", {});
  const RunResult r = RunOps({"--num-blocks", "2"}, script);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> lines = Lines(r.output);
  ASSERT_EQ(lines.size(), 6u) << r.output;
  EXPECT_EQ(lines[0], "{}");
  EXPECT_EQ(lines[2], "{}");
  EXPECT_EQ(lines[3], "{\"results\":[\"HIT\",\"MISS\"]}");
  EXPECT_EQ(lines[4], "{}");  // already stored: ignored, no second event
  EXPECT_EQ(lines[5],
            "{\"events\":[{\"keys\":" + Keys({1}) + ",\"medium\":\"CPU\",\"removed\":false}]}");
}

TEST(ManagerCommandTest, BadLinesNameTheirNumberAndExit2) {
  const std::string script =
      Op("lookup", {1}) + "\n" + "{not json\n" + "{\"op\":\"evict\",\"keys\":[]}\n" +
      "{\"op\":\"lookup\",\"keys\":[\"xyz\"]}\n" +
      "{\"op\":\"complete_store\",\"keys\":[],\"success\":1}\n" + Op("lookup", {1});
  const RunResult r = RunOps({"--num-blocks", "2"}, script);
  EXPECT_EQ(r.exit_code, 2);
  const std::vector<std::string> lines = Lines(r.output);
  ASSERT_EQ(lines.size(), 6u) << r.output;
  EXPECT_EQ(lines[0], "{\"result\":\"MISS\"}");
  EXPECT_EQ(lines[1], "{\"error\":\"line 3: not valid JSON\"}");
  EXPECT_NE(lines[2].find("line 4: unknown op \\\"evict\\\""), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find("line 5: keys[0] \\\"xyz\\\""), std::string::npos) << lines[3];
  EXPECT_NE(lines[4].find("line 6: \\\"success\\\" must be true or false"), std::string::npos)
      << lines[4];
  EXPECT_EQ(lines[5], "{\"result\":\"MISS\"}");
}

TEST(ManagerCommandTest, StoreThresholdAndArc) {
  const std::string script =
      Op("prepare_store", {1}) + Op("lookup", {1}) + Op("lookup", {1}) + Op("prepare_store", {1});
  const RunResult r = RunOps(
      {"--num-blocks", "2", "--policy", "arc", "--store-threshold", "2", "--max-tracker-size", "8"},
      script);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Lines(r.output), (std::vector<std::string>{
                                 "{\"keys_to_store\":[],\"slots\":[],\"evicted\":[]}",
                                 "{\"result\":\"MISS\"}", "{\"result\":\"MISS\"}",
                                 "{\"keys_to_store\":[\"31\"],\"slots\":[0],\"evicted\":[]}"}));
}

TEST(ManagerCommandTest, BadFlagsFail) {
  EXPECT_EQ(RunOps({"--num-blocks", "2", "--policy", "fifo"}, "").exit_code, 2);
  EXPECT_NE(RunOps({"--policy", "lru"}, "").exit_code, 0);  // --num-blocks is required
}

// Issue 10 item 12: --num-blocks 3000000000 aborted on a CHECK in the policy table; now an error
// naming the flag, before anything runs.
TEST(ManagerCommandTest, TooManyBlocksIsAnErrorNamingTheFlag) {
  kvo::testing::TempDir dir;
  const std::string path = dir.path() + "/ops.jsonl";
  std::ofstream(path) << "";
  const testing::CommandResult c = testing::RunCommand(
      {KVO_BINARY, "manager", "ops", "--num-blocks", "3000000000", "--ops", path});
  EXPECT_GT(c.code, 0) << c.err;  // an exit status, not a signal
  EXPECT_NE(c.err.find("--num-blocks"), std::string::npos) << c.err;
  EXPECT_EQ(c.err.find("CHECK"), std::string::npos) << c.err;
  const testing::CommandResult ok =
      testing::RunCommand({KVO_BINARY, "manager", "ops", "--num-blocks", "1000", "--ops", path});
  EXPECT_EQ(ok.code, 0) << ok.err;
}

}  // namespace
}  // namespace kvo
