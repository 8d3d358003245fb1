// `kvo hash` contract: the A.7 vectors in text and JSON form, extra keys, and exit code 2 with a
// message naming the bad value. Runs the real binary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "events/block_hash.h"
#include "tests/testing/child_process.h"

namespace kvo {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string output;
};

// Runs `kvo hash <args>`; stdout only, or stdout then stderr when `merge_stderr`.
RunResult RunKvo(const std::vector<std::string>& args, bool merge_stderr) {
  std::vector<std::string> argv = {KVO_BINARY, "hash"};
  argv.insert(argv.end(), args.begin(), args.end());
  const testing::CommandResult c = testing::RunCommand(argv);
  return {c.code, merge_stderr ? c.out + c.err : c.out};
}

std::vector<std::string> Lines(const std::string& s) { return testing::SplitLines(s); }

TEST(HashCommandTest, Sha256VectorsAsText) {
  const RunResult r = RunKvo(
      {"--algo", "sha256", "--seed", "0", "--block-size", "4", "--tokens", "1,2,3,4,5,6,7,8,9"},
      false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output,
            "# none_hash 1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c\n"
            "0 762b2e7e1520febd3a0aedb7358e8602facf3924440e18538fce057e23bae91d "
            "10362225831949560093\n"
            "1 9e62b5a7ec298f33cb4c7d9e00b659874bb2432d23ad6879ad1746592a2b036b "
            "12472515041799373675\n");
}

TEST(HashCommandTest, CborVectorsAsJson) {
  const RunResult r = RunKvo({"--algo", "sha256_cbor", "--seed", "0", "--block-size", "4",
                              "--tokens", "1, 2, 3, 4, 5, 6, 7, 8", "--json"},
                             false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> lines = Lines(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  const auto b0 = nlohmann::json::parse(lines[0]);
  const auto b1 = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(b0["block"], 0);
  EXPECT_EQ(b0["parent"], "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e");
  EXPECT_EQ(b0["hash"].get<std::string>().substr(0, 8), "c9d58ba6");
  EXPECT_EQ(b0["wire_hash"].get<uint64_t>(), 2164874634404590027ull);
  EXPECT_EQ(b1["block"], 1);
  EXPECT_EQ(b1["parent"], b0["hash"]);
  EXPECT_EQ(b1["hash"].get<std::string>().substr(56), "154ab2d6");
  EXPECT_EQ(b1["wire_hash"].get<uint64_t>(), 17270480062156288726ull);
  // Field order is part of the contract.
  EXPECT_EQ(lines[0].rfind("{\"block\":0,\"hash\":\"", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("\",\"wire_hash\":2164874634404590027,\"parent\":\""), std::string::npos)
      << lines[0];
}

TEST(HashCommandTest, ExtraKeysMatchTheLibrary) {
  for (const char* algo : {"sha256", "sha256_cbor"}) {
    const RunResult r =
        RunKvo({"--algo", algo, "--seed", "42", "--block-size", "2", "--tokens",
                "-1,2147483648,9223372036854775807,4", "--extra-keys",
                R"([["lora", ["mm-1", 3], {"bytes": "00ff"}, 18446744073709551615], null])"},
               false);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    BlockHashOptions options;
    options.algo = *ParseHashAlgo(algo);
    options.none_hash = NoneHash(options.algo, "42");
    options.block_size = 2;
    options.extra_keys = {
        Value{ValueArray{Value{std::string("lora")},
                         Value{ValueArray{Value{std::string("mm-1")}, Value{int64_t{3}}}},
                         Value{Binary{std::string("\x00\xff", 2)}},
                         Value{uint64_t{18446744073709551615ull}}}},
        Value{}};
    const std::vector<int64_t> tokens = {-1, 2147483648LL, 9223372036854775807LL, 4};
    auto want = HashBlocks(tokens, options);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    std::string expected = "# none_hash " + ToHex(options.none_hash) + "\n";
    for (size_t i = 0; i < want->size(); ++i) {
      expected += std::to_string(i) + " " + ToHex((*want)[i]) + " " +
                  std::to_string(WireHash((*want)[i])) + "\n";
    }
    EXPECT_EQ(r.output, expected) << algo;
  }
}

TEST(HashCommandTest, NoFullBlockPrintsOnlyNoneHash) {
  const RunResult r =
      RunKvo({"--algo", "sha256", "--seed", "0", "--block-size", "16", "--tokens", "1,2,3"}, false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output,
            "# none_hash 1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c\n");
}

TEST(HashCommandTest, BadInputExitsTwoNamingTheValue) {
  struct Bad {
    std::vector<std::string> args;
    std::string needle;
  };
  const std::vector<std::string> ok = {"--seed", "0", "--block-size", "4"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = ok;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const std::vector<Bad> cases = {
      {with({"--tokens", "1,x7,3"}), "'x7'"},
      {with({"--tokens", "1,,3"}), "token 1"},
      {with({"--tokens", "1,99999999999999999999"}), "'99999999999999999999'"},
      {{"--seed", "0", "--block-size", "0", "--tokens", "1"}, "'0'"},
      {{"--seed", "0", "--block-size", "four", "--tokens", "1"}, "'four'"},
      {with({"--tokens", "1", "--algo", "xxhash"}), "'xxhash'"},
      {with({"--tokens", "1", "--extra-keys", "[[1,"}), "invalid JSON"},
      {with({"--tokens", "1", "--extra-keys", "{\"a\":1}"}), "expected array"},
      {with({"--tokens", "1", "--extra-keys", "[[1.5]]"}), "1.5"},
      {with({"--tokens", "1", "--extra-keys", "[[true]]"}), "true"},
      {with({"--tokens", "1", "--extra-keys", "[\"salt\"]"}), "--extra-keys[0]"},
      {with({"--tokens", "1", "--extra-keys", "[[{\"bytes\":\"0g\"}]]"}), "'0g'"},
      {{"--block-size", "4", "--tokens", "1"}, "--seed"},
  };
  for (const Bad& b : cases) {
    const RunResult r = RunKvo(b.args, true);
    std::string joined;
    for (const auto& a : b.args) joined += a + " ";
    EXPECT_EQ(r.exit_code, 2) << joined << "\n" << r.output;
    EXPECT_NE(r.output.find(b.needle), std::string::npos) << joined << "\n" << r.output;
    EXPECT_EQ(r.output.find("none_hash"), std::string::npos) << joined << "\n" << r.output;
  }
}

}  // namespace
}  // namespace kvo
