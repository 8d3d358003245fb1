// The indexer daemon's configuration: JSON file and --source flags, with the rejections an
// operator needs to see (naming the key and the value).
#include "indexer/service/sources_config.h"

#include <gtest/gtest.h>

namespace kvo {
namespace {

TEST(SourcesConfigTest, ParsesAFullConfig) {
  auto c = ParseIndexerConfig(R"({
    "db": "/var/lib/kvo/index.sqlite", "http": "127.0.0.1:9000", "max_query_tokens": 4096,
    "sources": [
      {"name": "engine-a", "endpoint": "tcp://10.0.0.1:5557", "replay_endpoint": "tcp://10.0.0.1:5558",
       "topic": "kv", "dp_ranks": 2, "hash": {"algo": "sha256_cbor", "seed": 42, "block_size": 32}},
      {"name": "engine-b", "endpoint": "ipc:///tmp/b.sock"}
    ]})",
                              "indexer.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->db, "/var/lib/kvo/index.sqlite");
  EXPECT_EQ(c->http, "127.0.0.1:9000");
  EXPECT_EQ(c->max_query_tokens, 4096);
  ASSERT_EQ(c->sources.size(), 2u);
  const SourceConfig& a = c->sources[0];
  EXPECT_EQ(a.name, "engine-a");
  EXPECT_EQ(a.dp_ranks, 2);
  ASSERT_TRUE(a.hash.has_value());
  EXPECT_EQ(a.hash->algo, HashAlgo::kSha256Cbor);
  EXPECT_EQ(a.hash->seed, "42");
  EXPECT_EQ(a.hash->block_size, 32);
  EXPECT_FALSE(c->sources[1].hash.has_value());
  EXPECT_FALSE(c->sources[1].replay_endpoint.has_value());

  auto streams = ExpandStreams(a);
  ASSERT_TRUE(streams.ok());
  ASSERT_EQ(streams->size(), 2u);
  EXPECT_EQ((*streams)[0].endpoint, "tcp://10.0.0.1:5557");
  EXPECT_EQ((*streams)[1].dp_rank, 1);
  EXPECT_EQ((*streams)[1].endpoint, "tcp://10.0.0.1:5558");  // vLLM's offset_endpoint_port
  EXPECT_EQ(*(*streams)[1].replay_endpoint, "tcp://10.0.0.1:5559");
}

TEST(SourcesConfigTest, DpRankStartOffsetsEveryRank) {
  auto s = ParseSourceFlag("node2=tcp://h:5557,replay=tcp://h:6557,dp_ranks=2,dp_rank_start=2");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto streams = ExpandStreams(*s);
  ASSERT_TRUE(streams.ok());
  ASSERT_EQ(streams->size(), 2u);
  EXPECT_EQ((*streams)[0].dp_rank, 2);
  EXPECT_EQ((*streams)[0].endpoint, "tcp://h:5559");
  EXPECT_EQ(*(*streams)[1].replay_endpoint, "tcp://h:6560");
}

TEST(SourcesConfigTest, RejectsBadConfigsNamingTheProblem) {
  struct Case {
    const char* json;
    const char* needle;
  } cases[] = {
      {"{", "invalid JSON"},
      {"[]", "expected a JSON object"},
      {R"({"db": "x"})", "'sources' or 'discover' is required"},
      {R"({"sources": [], "colour": 1})", "unknown key 'colour'"},
      {R"({"sources": [{"endpoint": "tcp://h:1"}]})", "sources[0].name' is required"},
      {R"({"sources": [{"name": "a"}]})", "sources[0].endpoint' is required"},
      {R"({"sources": [{"name": "a", "endpoint": "udp://h:1"}]})", "must be tcp://"},
      {R"({"sources": [{"name": "a b", "endpoint": "tcp://h:1"}]})", "source name 'a b'"},
      {R"({"sources": [{"name": "a", "endpoint": "tcp://h:1", "dp_ranks": 0}]})", "dp_ranks"},
      {R"({"sources": [{"name": "a", "endpoint": "tcp://h:1", "dp_ranks": "2"}]})",
       "must be an integer"},
      {R"({"sources": [{"name": "a", "endpoint": "ipc:///tmp/a", "dp_ranks": 2}]})",
       "must contain 'inproc' or 'tcp'"},
      {R"({"sources": [{"name": "a", "endpoint": "tcp://h:1"}, {"name": "a", "endpoint": "tcp://h:2"}]})",
       "used twice"},
      {R"({"sources": [{"name": "a", "endpoint": "tcp://h:1", "dp_ranks": 2}, {"name": "b", "endpoint": "tcp://h:2"}]})",
       "already used"},
      {R"({"sources": [{"name": "a", "endpoint": "tcp://h:1", "hash": {"algo": "md5"}}]})", "md5"},
      {R"({"sources": [{"name": "a", "endpoint": "tcp://h:1", "hash": {"salt": 1}}]})",
       "unknown key 'sources[0].hash.salt'"},
      {R"({"sources": [], "http": "localhost"})", "no port"},
      {R"({"sources": [], "max_query_tokens": 0})", "max_query_tokens"},
  };
  for (const Case& c : cases) {
    auto r = ParseIndexerConfig(c.json, "cfg.json");
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << c.json << " -> " << r.status().message();
    EXPECT_NE(r.status().message().find("cfg.json"), std::string::npos);
  }
}

TEST(SourcesConfigTest, SourceFlags) {
  auto s = ParseSourceFlag(
      "vllm-0=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558,topic=kv-events,hash_algo=sha256,"
      "hash_seed=0,block_size=16");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->name, "vllm-0");
  EXPECT_EQ(s->endpoint, "tcp://127.0.0.1:5557");
  EXPECT_EQ(*s->replay_endpoint, "tcp://127.0.0.1:5558");
  EXPECT_EQ(s->topic, "kv-events");
  ASSERT_TRUE(s->hash.has_value());
  EXPECT_EQ(s->hash->block_size, 16);

  auto plain = ParseSourceFlag("a=ipc:///tmp/a.sock");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->hash.has_value());
  EXPECT_EQ(plain->dp_ranks, 1);

  for (const char* bad : {"noequals", "=tcp://h:1", "a=tcp://h:1,dp_ranks=x", "a=tcp://h:1,zz=1",
                          "a=tcp://h:1,replay", "a=tcp://h:1,block_size=0", "a=ftp://h"}) {
    auto r = ParseSourceFlag(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
  }
}

TEST(SourcesConfigTest, HttpAddresses) {
  auto a = ParseHttpAddress("127.0.0.1:8080");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8080);
  auto v6 = ParseHttpAddress("[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 0);
  EXPECT_FALSE(ParseHttpAddress("127.0.0.1").ok());
  EXPECT_FALSE(ParseHttpAddress(":80").ok());
  EXPECT_FALSE(ParseHttpAddress("h:70000").ok());
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("10.1.2.3"));
}

// Issue 10 item 1: the error message dump()ed a 10^5-deep value and overflowed the stack.
TEST(SourcesConfigTest, RefusesDeepNestingInABoundedMessage) {
  auto c = ParseIndexerConfig(
      "{\"max_query_tokens\": " + std::string(100000, '[') + std::string(100000, ']') + "}",
      "cfg.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cfg.json: JSON nested deeper than 64"), std::string::npos)
      << c.status().message();
  // A shallow wrong value is described, not echoed.
  auto wide =
      ParseIndexerConfig("{\"max_query_tokens\": [" + std::string(100000, '7') + "0]}", "cfg.json");
  ASSERT_FALSE(wide.ok());
  EXPECT_LT(wide.status().message().size(), 300u) << wide.status().message();
}

}  // namespace
}  // namespace kvo
