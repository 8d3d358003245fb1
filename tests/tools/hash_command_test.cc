// `kvo hash` contract: the A.7 vectors in text and JSON form, extra keys, all four vLLM hash
// algorithms against the Python reference (tests/events/hash_reference.py) on random inputs,
// vLLM's NONE_HASH seed rule, and exit code 2 with a message naming the bad value. Runs the real
// binary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "events/block_hash.h"
#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"

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
                  std::to_string(BlockDigest::Low64((*want)[i])) + "\n";
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
      {with({"--tokens", "1", "--algo", "xxh3"}), "'xxh3'"},
      {with({"--tokens", "1", "--algo", "sha256_msgpack"}), "xxhash_cbor"},
      {with({"--tokens", "1", "--extra-keys", "[[1,"}), "invalid JSON"},
      {with({"--tokens", "1", "--extra-keys", "{\"a\":1}"}), "expected array"},
      {with({"--tokens", "1", "--extra-keys", "[[1.5]]"}), "1.5"},
      {with({"--tokens", "1", "--extra-keys", "[[true]]"}), "true"},
      {with({"--tokens", "1", "--extra-keys", "[\"salt\"]"}), "--extra-keys[0]"},
      {with({"--tokens", "1", "--extra-keys", "[[{\"bytes\":\"0g\"}]]"}), "'0g'"},
      {{"--algo", "xxhash", "--block-size", "4", "--tokens", "1"}, "PYTHONHASHSEED"},
      {{"--algo", "xxhash_cbor", "--block-size", "4", "--tokens", "1"}, "--seed"},
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

// Current vLLM (#51875): PYTHONHASHSEED unset means the seed "vllm-none-hash" for the sha256
// variants; --seed still overrides.
TEST(HashCommandTest, UnsetSeedIsVllmsFixedDefault) {
  struct Want {
    const char* algo;
    const char* none_hash;
    uint64_t wire0;
  };
  for (const Want& w :
       {Want{"sha256", "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198",
             1882140585328457242ull},
        Want{"sha256_cbor", "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
             9561501211280363793ull}}) {
    const RunResult unset =
        RunKvo({"--algo", w.algo, "--block-size", "4", "--tokens", "1,2,3,4"}, false);
    ASSERT_EQ(unset.exit_code, 0) << unset.output;
    const std::vector<std::string> lines = Lines(unset.output);
    ASSERT_EQ(lines.size(), 2u) << unset.output;
    EXPECT_EQ(lines[0], std::string("# none_hash ") + w.none_hash);
    EXPECT_EQ(lines[1].substr(lines[1].rfind(' ') + 1), std::to_string(w.wire0)) << lines[1];
    const RunResult named = RunKvo(
        {"--algo", w.algo, "--seed", "vllm-none-hash", "--block-size", "4", "--tokens", "1,2,3,4"},
        false);
    EXPECT_EQ(named.output, unset.output);
    const RunResult zero = RunKvo(
        {"--algo", w.algo, "--seed", "0", "--block-size", "4", "--tokens", "1,2,3,4"}, false);
    ASSERT_EQ(zero.exit_code, 0) << zero.output;
    EXPECT_NE(zero.output, unset.output);
  }
}

// Golden vectors (PYTHONHASHSEED=0), computed once with Debian's python3-xxhash: see
// tests/events/block_hash_test.cc XxhashVectors.
TEST(HashCommandTest, XxhashVectors) {
  const RunResult r = RunKvo(
      {"--algo", "xxhash", "--seed", "0", "--block-size", "4", "--tokens", "1,2,3,4,5,6,7,8,9"},
      false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output,
            "# none_hash 6fb31cc38bba6066183f7f2104b9c051\n"
            "0 f3856cedd7e636094750c4546e855397 5138823041740264343\n"
            "1 0c9832567b17003b126077f57e0bb670 1324190186712315504\n");
  const RunResult c = RunKvo({"--algo", "xxhash_cbor", "--seed", "0", "--block-size", "4",
                              "--tokens", "1,2,3,4,5,6,7,8", "--json"},
                             false);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const std::vector<std::string> lines = Lines(c.output);
  ASSERT_EQ(lines.size(), 2u) << c.output;
  const auto b0 = nlohmann::json::parse(lines[0]);
  const auto b1 = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(b0["parent"], "1ebe36576dcb573f26b99533a20aaeca");
  EXPECT_EQ(b0["hash"], "0a8577df5ee3430515a8cc1f6e3ac52e");
  EXPECT_EQ(b0["wire_hash"].get<uint64_t>(), 1560721706249274670ull);
  EXPECT_EQ(b1["hash"], "d152782cb4d753bde718a811a3b75e23");
  EXPECT_EQ(b1["wire_hash"].get<uint64_t>(), 16652244415917022755ull);
}

// `kvo hash` equals Python's reference (pickle / cbor2 / hashlib / xxhash, vLLM's seed rule) for
// every algorithm on random token ids, seeds (unset included), block sizes and extra keys.
TEST(HashCommandTest, MatchesPythonReferenceForAllAlgorithms) {
  constexpr char kPython[] = "/usr/bin/python3";
  ASSERT_EQ(::access(kPython, X_OK), 0) << kPython << " is missing";
  const unsigned seed = testing::TestSeed();  // printed by TestSeed
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  struct Case {
    std::string algo;
    std::optional<std::string> seed;
    int64_t block_size = 1;
    std::vector<int64_t> tokens;
    nlohmann::json extra_keys = nlohmann::json::array();
  };
  std::vector<Case> cases;
  constexpr int kPerAlgo = 8;
  for (HashAlgo algo : kAllHashAlgos) {
    for (int i = 0; i < kPerAlgo; ++i) {
      Case c;
      c.algo = HashAlgoName(algo);
      // Unset only where vLLM has a default (the sha256 variants).
      switch (uniform(0, IsCryptographic(algo) ? 3 : 2)) {
        case 0:
          c.seed = std::to_string(uniform(0, 4294967295));
          break;
        case 1:
          c.seed = "0";
          break;
        case 2: {
          std::string s;  // a random per-process seed like vLLM's os.urandom(32).hex()
          for (int k = 0; k < 64; ++k) s += kvo::kHexDigits[static_cast<size_t>(uniform(0, 15))];
          c.seed = s;
          break;
        }
        default:
          break;
      }
      c.block_size = uniform(1, 32);
      const int64_t n = c.block_size * uniform(0, 4) + uniform(0, c.block_size - 1);
      for (int64_t t = 0; t < n; ++t) {
        switch (uniform(0, 3)) {
          case 0:
            c.tokens.push_back(uniform(0, 255));
            break;
          case 1:
            c.tokens.push_back(uniform(0, 200000));
            break;
          case 2:
            c.tokens.push_back(uniform(-(int64_t{1} << 40), int64_t{1} << 40));
            break;
          default:
            c.tokens.push_back(static_cast<int64_t>(rng()));
            break;
        }
      }
      if (uniform(0, 1) == 1) {
        for (int64_t b = 0; b < n / c.block_size; ++b) {
          if (uniform(0, 2) == 0) {
            c.extra_keys.push_back(nullptr);
          } else {
            c.extra_keys.push_back(nlohmann::json::array(
                {"lora-" + std::to_string(uniform(0, 9)),
                 nlohmann::json::array({"mm-" + std::to_string(uniform(0, 99)), uniform(0, 64)}),
                 nlohmann::json{{"bytes", "00ff"}}}));
          }
        }
      }
      cases.push_back(std::move(c));
    }
  }

  testing::TempDir dir;
  const std::string path = dir.path() + "/cases.json";
  {
    nlohmann::json doc;
    doc["cases"] = nlohmann::json::array();
    for (const Case& c : cases) {
      nlohmann::json j;
      j["algo"] = c.algo;
      j["seed"] = c.seed ? nlohmann::json(*c.seed) : nlohmann::json(nullptr);
      j["block_size"] = c.block_size;
      j["tokens"] = c.tokens;
      j["extra_keys"] = c.extra_keys;
      doc["cases"].push_back(std::move(j));
    }
    std::ofstream(path) << doc.dump();
  }
  const char* root_env = std::getenv("KVO_SOURCE_ROOT");
  const std::string root = root_env != nullptr ? root_env : ".";
  const testing::CommandResult py =
      testing::RunCommand({kPython, root + "/tests/events/hash_reference.py", path});
  ASSERT_EQ(py.code, 0) << py.err
                        << "\nneeds Debian's python3-cbor2 and python3-xxhash (scripts/deps.sh)";
  const std::vector<std::string> want = Lines(py.out);
  ASSERT_EQ(want.size(), cases.size()) << py.out;

  size_t blocks = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::string tokens;
    for (size_t t = 0; t < c.tokens.size(); ++t) {
      tokens += (t ? "," : "") + std::to_string(c.tokens[t]);
    }
    std::vector<std::string> args = {
        "--algo", c.algo, "--block-size", std::to_string(c.block_size), "--tokens", tokens};
    if (c.seed) args.insert(args.end(), {"--seed", *c.seed});
    if (!c.extra_keys.empty()) args.insert(args.end(), {"--extra-keys", c.extra_keys.dump()});
    const RunResult r = RunKvo(args, false);
    ASSERT_EQ(r.exit_code, 0) << "case " << i << " " << c.algo << ": " << r.output;
    // Python: "<none_hash> <h0> <h1> ..."; kvo: "# none_hash X" then "<i> <hex> <wire>" lines.
    std::string got;
    for (const std::string& line : Lines(r.output)) {
      if (line.rfind("# none_hash ", 0) == 0) {
        got += line.substr(12);
      } else {
        const size_t a = line.find(' ');
        const size_t b = line.rfind(' ');
        got += " " + line.substr(a + 1, b - a - 1);
        const std::string hex = line.substr(a + 1, b - a - 1);
        EXPECT_EQ(line.substr(b + 1), std::to_string(BlockDigest::Low64(*ParseHex(hex)))) << line;
        ++blocks;
      }
    }
    EXPECT_EQ(got, want[i]) << "case " << i << " algo " << c.algo << " seed "
                            << c.seed.value_or("(unset)") << " block_size " << c.block_size
                            << "; replay with KVO_TEST_SEED=" << seed;
  }
  EXPECT_GT(blocks, 0u);
  std::printf("[ python ] %zu kvo hash runs (%d per algorithm), %zu blocks equal, seed %u\n",
              cases.size(), kPerAlgo, blocks, seed);
}

}  // namespace
}  // namespace kvo
