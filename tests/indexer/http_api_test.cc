// The /v1/score request contract: what is accepted, and a 400 naming the problem for the rest.
#include "indexer/service/http_api.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>

#include "indexer/service/sources_config.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

const std::set<std::string, std::less<>> kSources = {"a", "b"};

Result<ScoreQuery> Parse(const std::string& body, int64_t max_tokens = 1000) {
  ScoreRequestLimits limits;
  limits.max_query_tokens = max_tokens;
  return ParseScoreRequest(body, limits, kSources);
}

TEST(HttpApiTest, AcceptsTokenQueriesWithEveryOption) {
  auto q = Parse(R"({"token_ids": [1, 2, 3, 4, 5], "block_size": 4, "lora_name": "sql",
                     "weights": {"GPU": 1.0, "CPU": 0.5, "STORAGE": 0, "NVME": 2},
                     "sources": ["b"]})");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->token_ids, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(q->block_size, 4);
  EXPECT_EQ(q->lora_name, "sql");
  EXPECT_EQ(q->weights.at("CPU"), 0.5);
  EXPECT_EQ(q->weights.at("NVME"), 2.0);
  EXPECT_EQ(q->sources, std::vector<std::string>{"b"});
  EXPECT_TRUE(q->block_hashes.empty());
}

TEST(HttpApiTest, AcceptsHashQueriesAsU64OrHexDigests) {
  // vllm-compat A.7: sha256 seed "0", tokens [1,2,3,4]: the u64 wire form is the digest's last 8
  // bytes, so a hex digest and its u64 ask for the same block.
  auto q = Parse(R"({"block_hashes": [10362225831949560093, "00000000000000008fcd2d4ae9eb7ab5",
                                      18446744073709551615, -1]})");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_EQ(q->block_hashes.size(), 4u);
  EXPECT_EQ(q->block_hashes[0], 10362225831949560093ull);
  EXPECT_EQ(q->block_hashes[1], 0x8fcd2d4ae9eb7ab5ull);
  EXPECT_EQ(q->block_hashes[2], UINT64_MAX);
  EXPECT_EQ(q->block_hashes[3], UINT64_MAX);  // a negative Python hash(): its 64-bit pattern
}

TEST(HttpApiTest, RejectsBadRequestsNamingTheProblem) {
  struct Case {
    std::string body;
    const char* needle;
  } cases[] = {
      {"{\"token_ids\": [1,", "invalid JSON"},
      {"[1, 2]", "must be a JSON object"},
      {"{}", "one of 'token_ids' or 'block_hashes' is required"},
      {R"({"token_ids": [1], "block_hashes": [2]})", "not both"},
      {R"({"token_ids": "1,2,3"})", "'token_ids' must be an array"},
      {R"({"token_ids": [1, "2"]})", "'token_ids[1]' must be an integer"},
      {R"({"token_ids": [1, 2.5]})", "'token_ids[1]' must be an integer"},
      {R"({"token_ids": [1, true]})", "'token_ids[1]' must be an integer"},
      {R"({"token_ids": []})", "'token_ids' is empty"},
      {R"({"block_hashes": [1.5]})", "'block_hashes[0]'"},
      {R"({"block_hashes": ["xyz"]})", "'block_hashes[0]'"},
      {R"({"token_ids": [1], "block_size": 0})", "'block_size' must be in"},
      {R"({"token_ids": [1], "block_size": "16"})", "'block_size' must be a positive integer"},
      {R"({"token_ids": [1], "lora_name": 3})", "'lora_name' must be a string"},
      {R"({"token_ids": [1], "weights": [1]})", "'weights' must be an object"},
      {R"({"token_ids": [1], "weights": {"GPU": -1}})", "'weights.GPU' must be a finite number"},
      {R"({"token_ids": [1], "weights": {"GPU": "high"}})", "'weights.GPU'"},
      {R"({"token_ids": [1], "sources": "a"})", "'sources' must be an array"},
      {R"({"token_ids": [1], "sources": ["a", "zz"]})", "unknown source 'zz'"},
      {R"({"token_ids": [1], "sources": [1]})", "'sources[0]' must be a string"},
      {R"({"token_ids": [1], "tokens": [1]})", "unknown key 'tokens'"},
  };
  for (const Case& c : cases) {
    auto q = Parse(c.body);
    ASSERT_FALSE(q.ok()) << c.body;
    EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(q.status().message().find(c.needle), std::string::npos)
        << c.body << " -> " << q.status().message();
  }
}

// Found by tests/fuzz/http_api_fuzz: an unknown key, medium or source name, or a long token in
// invalid JSON, was echoed whole into the 400 body (ARCHITECTURE.md §6: never echo unbounded
// input).
TEST(HttpApiTest, ErrorMessagesDoNotEchoLongInput) {
  const std::set<std::string, std::less<>> sources = {"a"};
  const std::string big(5000, 'x');
  for (const std::string& body : {
           R"({"token_ids":[1],")" + big + R"(":1})",
           R"({"token_ids":[1],"weights":{")" + big + R"(":-1}})",
           R"({"token_ids":[1],"sources":[")" + big + R"("]})",
           R"({"token_ids":[1)" + std::string(5000, '1') + "x]}",
           R"({"token_ids":")" + big,
       }) {
    auto r = ParseScoreRequest(body, ScoreRequestLimits{}, sources);
    ASSERT_FALSE(r.ok());
    EXPECT_LT(r.status().message().size(), 1024u) << r.status().message().substr(0, 200);
  }
  auto response = ParseScoreResponse(R"({"block_size":")" + big);
  ASSERT_FALSE(response.ok());
  EXPECT_LT(response.status().message().size(), 1024u);
}

TEST(HttpApiTest, EnforcesTheTokenLimit) {
  std::string body = R"({"token_ids": [)";
  for (int i = 0; i < 11; ++i) body += (i ? "," : "") + std::to_string(i);
  body += "]}";
  EXPECT_TRUE(Parse(body, 11).ok());
  auto q = Parse(body, 10);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("11 tokens, more than the maximum 10"), std::string::npos)
      << q.status().message();
}

// Issue 10 item 1: a value nested 10^5 deep in any key the error message echoes crashed the
// daemon (dump() recursed once per level). Refused before parsing, in a bounded message.
TEST(HttpApiTest, RefusesDeeplyNestedValuesInEveryKey) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string bodies[] = {
      R"({"token_ids": [1], "block_size": )" + deep + "}",
      R"({"token_ids": [1], "lora_name": )" + deep + "}",
      R"({"token_ids": [1], "weights": {"GPU": )" + deep + "}}",
      R"({"token_ids": [1], "sources": [)" + deep + "]}",
      R"({"token_ids": [1, )" + deep + "]}",
      R"({"block_hashes": [)" + deep + "]}",
      R"({"token_ids": [1], "extra": )" + deep + "}",
      deep,
  };
  for (const std::string& body : bodies) {
    auto q = Parse(body);
    ASSERT_FALSE(q.ok()) << body.substr(0, 60);
    EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(q.status().message().find("nested deeper than 64"), std::string::npos)
        << q.status().message();
    EXPECT_LT(q.status().message().size(), 200u);
  }
  // Shallow but long values are described, not echoed.
  std::string names = "\"x\"";
  for (int i = 0; i < 50000; ++i) names += ",\"x\"";
  auto long_name = Parse(R"({"token_ids": [1], "lora_name": [)" + names + "]}", 100000);
  ASSERT_FALSE(long_name.ok());
  EXPECT_LT(long_name.status().message().size(), 200u) << long_name.status().message();
}

// Issue 10 item 6: the token limit is checked on the text, before a DOM of every token is built.
TEST(HttpApiTest, RefusesLongArraysBeforeBuildingThem) {
  std::string body = R"({"token_ids": [1)";
  for (int i = 0; i < 100000; ++i) body += ",1";
  body += "]}";
  auto q = Parse(body, 1000);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("more than the maximum 1000"), std::string::npos)
      << q.status().message();
}

TEST(HttpApiTest, RequestAndResponseRoundTrip) {
  ScoreQuery q;
  q.token_ids = {5, 6, 7};
  q.block_size = 2;
  q.lora_name = "x";
  q.weights = {{"GPU", 1.0}, {"CPU", 0.25}};
  q.sources = {"a"};
  auto back = Parse(RenderScoreRequest(q));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->token_ids, q.token_ids);
  EXPECT_EQ(back->block_size, q.block_size);
  EXPECT_EQ(back->lora_name, q.lora_name);
  EXPECT_EQ(back->weights, q.weights);
  EXPECT_EQ(back->sources, q.sources);

  ScoreResult r;
  r.block_size = 16;
  r.query_blocks = 3;
  InstanceScore s;
  s.source = "a";
  s.dp_rank = 1;
  s.prefix_blocks = 2;
  s.prefix_tokens = 32;
  s.blocks_per_medium = {{"CPU", 1}, {"GPU", 2}};
  s.score = 1.8;
  r.instances.push_back(s);
  std::string body = RenderScoreResponse(r, 50);
  auto doc = nlohmann::json::parse(body);
  EXPECT_EQ(doc["query_tokens"], 50);
  EXPECT_EQ(doc["instances"][0]["blocks_per_medium"]["GPU"], 2);
  auto parsed = ParseScoreResponse(body);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->instances.size(), 1u);
  EXPECT_EQ(parsed->instances[0].source, "a");
  EXPECT_EQ(parsed->instances[0].dp_rank, 1);
  EXPECT_EQ(parsed->instances[0].prefix_tokens, 32);
  EXPECT_EQ(parsed->instances[0].blocks_per_medium, s.blocks_per_medium);
  EXPECT_DOUBLE_EQ(parsed->instances[0].score, 1.8);
  EXPECT_EQ(ParseErrorMessage(RenderError("bad \"x\"")), "bad \"x\"");
}

// Mutated bodies and configs (byte flips, truncations, splices of valid ones) never crash the
// parsers: each answer is a value or InvalidArgument with a message. (ASan/UBSan runs make this a
// small fuzzer.)
// The explain answer's exact bytes (a golden: the field tables keep the hand-written order; a
// holder's `ownership` appears only where a secondary tier owns the residency).
TEST(HttpApiTest, ExplainAnswerBytes) {
  ExplainResult r;
  r.score.block_size = 16;
  r.score.query_blocks = 2;
  ExplainBlock b0;
  b0.index = 0;
  b0.content_key = 7;
  b0.engine_hash = 9;
  b0.known = true;
  b0.holders.push_back({"a", 0, "GPU", "", 0, 1, 5});
  b0.holders.push_back({"b", 1, "CPU", "kvcr", 0, 1, 6});
  ExplainBlock b1;
  b1.index = 1;
  r.blocks = {b0, b1};
  r.instances.push_back({"a", 0, 1, "end of prompt"});
  EXPECT_EQ(RenderExplainResponse(r, 32),
            R"({"score":{"block_size":16,"query_blocks":2,"query_tokens":32,"instances":[]},)"
            R"("blocks":[{"index":0,"content_key":7,"engine_hash":9,"known":true,"holders":[)"
            R"({"source":"a","dp_rank":0,"medium":"GPU","group":0,"refcount":1,"since_seq":5},)"
            R"({"source":"b","dp_rank":1,"medium":"CPU","ownership":"kvcr","group":0,)"
            R"("refcount":1,"since_seq":6}]},)"
            R"({"index":1,"content_key":0,"engine_hash":0,"known":false,"holders":[]}],)"
            R"("instances":[{"source":"a","dp_rank":0,"prefix_blocks":1,)"
            R"("break_reason":"end of prompt"}]})");
}

TEST(HttpApiTest, MutatedInputsAreRejectedCleanly) {
  std::mt19937_64 rng(testing::TestSeed());
  const std::vector<std::string> seeds = {
      R"({"token_ids": [1, 2, 3], "block_size": 4, "weights": {"GPU": 1, "CPU": 0.8}})",
      R"({"block_hashes": [18446744073709551615, "00ff", -3], "sources": ["a", "b"]})",
      R"({"token_ids": [9223372036854775807, -9223372036854775808], "lora_name": null})",
  };
  const std::vector<std::string> configs = {
      R"({"sources": [{"name": "a", "endpoint": "tcp://h:5557", "dp_ranks": 2,
          "hash": {"algo": "sha256_cbor", "seed": "0", "block_size": 16}}], "http": "127.0.0.1:0"})",
  };
  const std::string alphabet = "{}[]\",:0123456789-.eE truefalsnul\\\x00\xff";
  auto mutate = [&](std::string s) {
    int n = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n && !s.empty(); ++i) {
      size_t pos = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s[pos] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          s.erase(pos, 1 + rng() % 8);
          break;
        case 2:
          s.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
        default:
          s.resize(pos);
          break;
      }
    }
    return s;
  };
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string body = mutate(seeds[rng() % seeds.size()]);
    auto q = Parse(body);
    if (q.ok()) {
      ++accepted;
      EXPECT_NE(q->token_ids.empty(), q->block_hashes.empty()) << body;
    } else {
      EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument) << body;
      EXPECT_FALSE(q.status().message().empty());
    }
    std::string cfg = mutate(configs[0]);
    auto c = ParseIndexerConfig(cfg, "fuzz.json");
    if (!c.ok()) {
      EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << cfg;
    }
    std::string flag = mutate("a=tcp://h:1,replay=tcp://h:2,dp_ranks=2,hash_seed=0,block_size=4");
    auto f = ParseSourceFlag(flag);
    if (!f.ok()) {
      EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << flag;
    }
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace kvo
