// The Mooncake/Dynamo indexer API (router-api.md §1-2) on the daemon: the reference's exact
// request bodies, exact response shapes, the tiered match, scoping, durable registrations across a
// restart of the indexer, unregister, and bad input. Real publishers (kvo's, journaled, over
// loopback TCP), a real SQLite file; synchronisation by polling with a deadline.
#include "indexer/service/router_api.h"

#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include <sqlite3.h>

#include "events/zmq_publisher.h"
#include "events/zmq_subscriber.h"
#include "indexer/service/service.h"
#include "tests/indexer/service_test_util.h"
#include "tests/testing/raw_http.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace kvo {
namespace {

using Json = nlohmann::json;
using namespace std::chrono_literals;

constexpr int64_t kBs = 128;  // the reference registration's block_size

using testing::Eventually;
using testing::FreePort;
using testing::FreePortPair;

std::vector<int64_t> Tokens(int64_t blocks) {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < blocks * kBs; ++i) t.push_back(1000 + i);
  return t;
}

// A store of the first `blocks` blocks (hashes 11, 12, ...) on `medium`, LoRA "sql-adapter".
EventBatch Store(int64_t blocks, const char* medium, int64_t rank) {
  BlockStored s;
  for (int64_t i = 0; i < blocks; ++i) s.block_hashes.push_back(BlockHash::Uint(11 + i));
  s.token_ids = Tokens(blocks);
  s.block_size = kBs;
  s.medium = medium;
  s.lora_name = "sql-adapter";
  return EventBatch{1700000000.0, {s}, rank};
}

struct Publisher {
  KvEventsConfig config;
  std::unique_ptr<EventPublisher> pub;
  std::string endpoint, replay;
};

Publisher MakePublisher(const std::string& journal_dir) {
  Publisher p;
  int port = FreePort();
  int replay = FreePort();
  p.config.enable_kv_cache_events = true;
  p.config.publisher = "zmq";
  p.config.endpoint = "tcp://*:" + std::to_string(port);
  p.config.replay_endpoint = "tcp://*:" + std::to_string(replay);
  p.config.journal_dir = journal_dir;
  auto made = CreateEventPublisher(p.config, 0);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  if (made.ok()) p.pub = std::move(made).value();
  p.endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  p.replay = "tcp://127.0.0.1:" + std::to_string(replay);
  return p;
}

class RouterApiTest : public ::testing::Test {
 protected:
  IndexerConfig Config() {
    IndexerConfig c = service_test::FastConfig(dir_.path());
    c.max_query_tokens = 100'000;
    c.max_sources = max_sources_;
    if (silent_after_ms_ > 0) c.silent_after_ms = silent_after_ms_;
    return c;
  }
  std::unique_ptr<IndexerService> Start() {
    ServiceOptions o;
    o.start_http = false;
    auto svc = IndexerService::Start(Config(), o);
    EXPECT_TRUE(svc.ok()) << svc.status().ToString();
    return svc.ok() ? std::move(svc).value() : nullptr;
  }
  static HttpResponse Call(IndexerService& svc, const std::string& method, const std::string& path,
                           const std::string& body = "") {
    HttpRequest r;
    r.method = method;
    r.path = path;
    r.body = body;
    return svc.Handle(r);
  }
  static Json Ok(const HttpResponse& r) {
    EXPECT_EQ(r.status, 200) << r.body;
    return Json::parse(r.body);
  }
  // The value of one series on /metrics (`name` or `name{labels}`); -1 when it is absent.
  static double Metric(IndexerService& svc, const std::string& series) {
    const std::string metrics = Call(svc, "GET", "/metrics").body;
    const std::string line = "\n" + series + " ";
    const size_t at = metrics.find(line);
    EXPECT_NE(at, std::string::npos) << series << " not in:\n" << metrics.substr(0, 2000);
    return at == std::string::npos ? -1.0 : std::atof(metrics.c_str() + at + line.size());
  }
  static std::string Error(const HttpResponse& r, int status = 400) {
    EXPECT_EQ(r.status, status) << r.body;
    Json j = Json::parse(r.body);
    EXPECT_TRUE(j.contains("error")) << r.body;
    return j.value("error", "");
  }
  // The body of the LargeQueriesArrivingOverHttp tests, with both helpers' patience
  // (ServiceOptions:: list_helper_patience_ns, key_helper_patience_ns) set to `patience`, or the
  // defaults (-1).
  void LargeQueriesArrivingOverHttp(int64_t patience);

  testing::TempDir dir_;
  int64_t max_sources_ = 4096;
  int64_t silent_after_ms_ = 0;  // > 0: instead of FastConfig's
  double takeovers_ = 0;         // helper work the handler took back (LargeQueriesArrivingOverHttp)
};

// The reference's register body, with the given endpoints and rank.
std::string RegisterBody(const std::string& endpoint, const std::string& replay, int rank) {
  return R"({"endpoint": ")" + endpoint + R"(", "replay_endpoint": ")" + replay +
         R"(", "type": "vLLM",
 "modelname": "deepseek", "lora_name": "sql-adapter", "tenant_id": "default",
 "instance_id": "vllm-prefill-node1", "block_size": 128, "dp_rank": )" +
         std::to_string(rank) + R"(, "additionalsalt": "w8a8"})";
}

std::string QueryBody(int64_t blocks) {
  Json q = Json::parse(R"({"model": "deepseek", "lora_name": "sql-adapter", "token_ids": [],
 "tenant_id": "default", "instance_id": "vllm-prefill-node1", "block_size": 128,
 "cache_salt": "w8a8"})");
  q["token_ids"] = Tokens(blocks);
  return q.dump();
}

Json Expected(int64_t longest, int64_t gpu, int64_t cpu, int64_t disk, Json dp) {
  Json e;
  e["default"]["vllm-prefill-node1"] = {
      {"longest_matched", longest}, {"GPU", gpu}, {"DP", dp}, {"CPU", cpu}, {"DISK", disk}};
  return e;
}

// An endpoint is one stream's, in one role: a PUB endpoint that is another stream's replay
// endpoint (or the reverse) is 409, and a dp_ranks request whose rank offsets put a PUB port on
// another rank's replay port is 400 (the SUB would dial a ROUTER and hear nothing). Ids that
// pass one by one but make a source name over the limit are refused naming them, before
// anything is stored.
TEST_F(RouterApiTest, EndpointsAreNotSharedAcrossRolesAndLongIdsAreRefusedFirst) {
  auto svc = Start();
  ASSERT_NE(svc, nullptr);
  auto body = [](const std::string& instance, int pub, int replay, int ranks = 1) {
    Json b = {{"endpoint", "tcp://127.0.0.1:" + std::to_string(pub)},
              {"replay_endpoint", "tcp://127.0.0.1:" + std::to_string(replay)},
              {"type", "vLLM"},
              {"modelname", "m"},
              {"instance_id", instance},
              {"block_size", 16},
              {"dp_rank", 0},
              {"dp_ranks", ranks}};
    return b.dump();
  };
  ASSERT_EQ(Call(*svc, "POST", "/register", body("a", 25557, 25558)).status, 200);
  std::string err = Error(Call(*svc, "POST", "/register", body("b", 25558, 25600)), 409);
  EXPECT_NE(err.find("'endpoint' 'tcp://127.0.0.1:25558'"), std::string::npos) << err;
  EXPECT_NE(err.find("'a@default@0'"), std::string::npos) << err;
  err = Error(Call(*svc, "POST", "/register", body("c", 25601, 25557)), 409);
  EXPECT_NE(err.find("'replay_endpoint' 'tcp://127.0.0.1:25557'"), std::string::npos) << err;
  err = Error(Call(*svc, "POST", "/register", body("d", 26557, 26558, 2)), 400);
  EXPECT_NE(err.find("rank 1's 'endpoint' 'tcp://127.0.0.1:26558' is also rank 0's "
                     "'replay_endpoint'"),
            std::string::npos)
      << err;
  Json long_ids = Json::parse(body(std::string(100, 'i'), 27557, 27600));
  long_ids["tenant_id"] = std::string(40, 't');
  err = Error(Call(*svc, "POST", "/register", long_ids.dump()), 400);
  EXPECT_NE(err.find("'instance_id' and 'tenant_id' are too long together (100 + 40"),
            std::string::npos)
      << err;
  EXPECT_LT(err.size(), 300u) << err;
  Json workers = Ok(Call(*svc, "GET", "/workers"))["workers"];
  ASSERT_EQ(workers.size(), 1u) << workers.dump();  // only "a": nothing refused was kept
  EXPECT_EQ(workers[0]["instance_id"], "a");
  // The longest ids that fit still register: 100 + 25 + "@@0" = 128 characters.
  long_ids["tenant_id"] = std::string(25, 't');
  EXPECT_EQ(Call(*svc, "POST", "/register", long_ids.dump()).status, 200);
}

TEST_F(RouterApiTest, ReferenceBodiesTieredMatchRestartAndUnregister) {
  Publisher r0 = MakePublisher(dir_.path() + "/j0");
  Publisher r1 = MakePublisher(dir_.path() + "/j1");
  ASSERT_TRUE(r0.pub && r1.pub);
  // Rank 0: blocks 0-1 on GPU, 0-2 on CPU, 0-3 on disk (STORAGE). Rank 1: block 0 on GPU.
  ASSERT_TRUE(r0.pub->Publish(Store(2, kMediumGpu, 0)).ok());
  ASSERT_TRUE(r0.pub->Publish(Store(3, kMediumCpu, 0)).ok());
  ASSERT_TRUE(r0.pub->Publish(Store(4, "STORAGE", 0)).ok());
  ASSERT_TRUE(r1.pub->Publish(Store(1, kMediumGpu, 1)).ok());
  r0.pub->Flush();
  r1.pub->Flush();

  auto svc = Start();  // no --source: registrations only
  ASSERT_NE(svc, nullptr);
  EXPECT_EQ(Ok(Call(*svc, "GET", "/health")), Json::parse(R"({"status": "ok"})"));
  // The reference's body verbatim names a host off loopback: refused without --allow-remote.
  std::string err = Error(Call(
      *svc, "POST", "/register",
      R"({"endpoint": "tcp://1.1.1.1:5557", "replay_endpoint": "tcp://1.1.1.1:5558", "type": "vLLM",
 "modelname": "deepseek", "lora_name": "sql-adapter", "tenant_id": "default",
 "instance_id": "vllm-prefill-node1", "block_size": 128, "dp_rank": 0, "additionalsalt": "w8a8"})"));
  EXPECT_NE(err.find("'endpoint'"), std::string::npos) << err;
  EXPECT_NE(err.find("--allow-remote"), std::string::npos) << err;

  EXPECT_EQ(
      Ok(Call(*svc, "POST", "/register", RegisterBody(r0.endpoint, r0.replay, 0))),
      Json::parse(R"({"status": "registered successfully", "instance_id": "vllm-prefill-node1"})"));
  EXPECT_EQ(Ok(Call(*svc, "POST", "/register", RegisterBody(r1.endpoint, r1.replay, 1)))["status"],
            "registered successfully");
  // Again, identical: idempotent. Another endpoint under the same name: 409.
  EXPECT_EQ(Call(*svc, "POST", "/register", RegisterBody(r0.endpoint, r0.replay, 0)).status, 200);
  err = Error(Call(*svc, "POST", "/register", RegisterBody(r1.endpoint, r0.replay, 0)), 409);
  EXPECT_NE(err.find("'endpoint'"), std::string::npos) << err;

  const Json full = Expected(4 * kBs, 2 * kBs, 3 * kBs, 4 * kBs, {{"0", 4 * kBs}, {"1", kBs}});
  ASSERT_TRUE(Eventually([&] {
    return Json::parse(Call(*svc, "POST", "/query", QueryBody(6)).body) == full;
  })) << Call(*svc, "POST", "/query", QueryBody(6)).body;

  // The reference's /query body verbatim: 5 tokens, no complete block of 64: nothing matched.
  EXPECT_EQ(
      Ok(Call(
          *svc, "POST", "/query",
          R"({"model": "deepseek", "lora_name": "sql-adapter", "token_ids": [101, 15, 100, 55, 89],
 "tenant_id": "default", "instance_id": "vllm-prefill-node1", "block_size": 64, "cache_salt": "w8a8"})")),
      Expected(0, 0, 0, 0, {{"0", 0}, {"1", 0}}));
  // By hash (both spellings); the instance omitted: every instance of the tenant.
  const std::string by_hash =
      R"({"model": "deepseek", "lora_name": "sql-adapter", "seq_hashes": [11, 12, 13, 14, 99],
 "tenant_id": "default", "block_size": 128, "cache_salt": "w8a8"})";
  EXPECT_EQ(Ok(Call(*svc, "POST", "/query_by_hash", by_hash)), full);
  std::string old_spelling = by_hash;
  old_spelling.replace(old_spelling.find("seq_hashes"), 10, "block_hash");
  EXPECT_EQ(Ok(Call(*svc, "POST", "/query_by_hash", old_spelling)), full);
  // Scoping: another LoRA or salt matches no registration (the tenant's answer is empty).
  Json other_lora = Json::parse(QueryBody(4));
  other_lora["lora_name"] = nullptr;
  EXPECT_EQ(Ok(Call(*svc, "POST", "/query", other_lora.dump())), Json::parse(R"({"default": {}})"));
  Json workers = Ok(Call(*svc, "GET", "/workers"));
  ASSERT_EQ(workers["workers"].size(), 2u);
  EXPECT_EQ(workers["workers"][0]["instance_id"], "vllm-prefill-node1");
  EXPECT_EQ(workers["workers"][0]["model_name"], "deepseek");
  // Both streams have delivered batches: /workers says so, as /v1/sources does (it said
  // "connecting" for as long as a stream lived).
  for (const Json& w : workers["workers"]) EXPECT_EQ(w["state"], "following") << w.dump();

  // Restart of the indexer between register and query: no flags, the registrations resume from
  // their checkpoints (the stream is not replayed from scratch).
  svc->Stop();
  svc.reset();
  ASSERT_TRUE(r0.pub->Publish(Store(5, "STORAGE", 0)).ok());  // while the indexer is down
  r0.pub->Flush();
  svc = Start();
  ASSERT_NE(svc, nullptr);
  const Json after = Expected(5 * kBs, 2 * kBs, 3 * kBs, 5 * kBs, {{"0", 5 * kBs}, {"1", kBs}});
  ASSERT_TRUE(Eventually([&] {
    return Json::parse(Call(*svc, "POST", "/query", QueryBody(6)).body) == after;
  })) << Call(*svc, "POST", "/query", QueryBody(6)).body;
  for (const SourceStatus& s : svc->Sources()) {
    ASSERT_EQ(s.streams.size(), 1u);
    // This process applied only what was published while the indexer was down.
    EXPECT_EQ(s.streams[0].batches_applied, s.name.ends_with("@0") ? 1u : 0u) << s.name;
  }

  // Unregister rank 1 (the reference's body names rank 0: use it for rank 0 afterwards). Its
  // series leave /metrics with it (they stayed, frozen, for the process's life).
  const std::string rank1 = R"({source="vllm-prefill-node1@default@1",dp_rank="1"})";
  EXPECT_GE(Metric(*svc, "kvo_indexer_connected" + rank1), 0.0);  // present
  EXPECT_EQ(

      Ok(Call(
          *svc, "POST", "/unregister",
          R"({"type": "vLLM", "modelname": "deepseek", "lora_name": "sql-adapter", "tenant_id": "default",
 "instance_id": "vllm-prefill-node1", "block_size": 128, "dp_rank": 1})")),
      Json::parse(
          R"({"status": "unregistered successfully", "removed_instances": ["vllm-prefill-node1|default|1"]})"));
  EXPECT_EQ(Ok(Call(*svc, "POST", "/query", QueryBody(6))),
            Expected(5 * kBs, 2 * kBs, 3 * kBs, 5 * kBs, {{"0", 5 * kBs}}));
  EXPECT_FALSE(svc->index().LastSequence("vllm-prefill-node1@default@1", 1).ok());
  const std::string metrics = Call(*svc, "GET", "/metrics").body;
  EXPECT_EQ(metrics.find("vllm-prefill-node1@default@1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("vllm-prefill-node1@default@0"), std::string::npos);
  EXPECT_EQ(
      Ok(Call(
          *svc, "POST", "/unregister",
          R"({"type": "vLLM", "modelname": "deepseek", "lora_name": "sql-adapter", "tenant_id": "default",
 "instance_id": "vllm-prefill-node1", "block_size": 128, "dp_rank": 0})"))["removed_instances"],
      Json::parse(R"(["vllm-prefill-node1|default|0"])"));
  err = Error(Call(*svc, "POST", "/query", QueryBody(6)));
  EXPECT_NE(err.find("'tenant_id'"), std::string::npos) << err;
  EXPECT_EQ(Ok(Call(*svc, "GET", "/workers"))["workers"].size(), 0u);
  // Unregistered stays unregistered after a restart.
  svc->Stop();
  svc.reset();
  svc = Start();
  ASSERT_NE(svc, nullptr);
  EXPECT_EQ(Ok(Call(*svc, "GET", "/workers"))["workers"].size(), 0u);
  svc->Stop();
  r0.pub->Shutdown();
  r1.pub->Shutdown();
}

// /query's answer plans are cached per scope: a registration added or removed after a scope was
// queried shows in the next answer (a plan kept across either would list the old instances).
TEST_F(RouterApiTest, QueryPlansFollowRegistrations) {
  Publisher r0 = MakePublisher(dir_.path() + "/j0");
  Publisher r1 = MakePublisher(dir_.path() + "/j1");
  ASSERT_TRUE(r0.pub && r1.pub);
  auto svc = Start();
  ASSERT_NE(svc, nullptr);
  auto register_as = [&](const Publisher& p, const std::string& instance) {
    std::string body = RegisterBody(p.endpoint, p.replay, 0);
    body.replace(body.find("vllm-prefill-node1"), 18, instance);
    return Call(*svc, "POST", "/register", body).status;
  };
  Json q = Json::parse(QueryBody(2));
  q.erase("instance_id");  // every instance of the tenant
  const std::string query = q.dump();
  auto instances = [&] {
    const Json answer = Ok(Call(*svc, "POST", "/query", query));
    std::vector<std::string> out;
    for (const auto& [id, m] : answer["default"].items()) out.push_back(id);
    return out;
  };
  ASSERT_EQ(register_as(r0, "node-a"), 200);
  EXPECT_EQ(instances(), std::vector<std::string>({"node-a"}));
  ASSERT_EQ(register_as(r1, "node-b"), 200);
  EXPECT_EQ(instances(), std::vector<std::string>({"node-a", "node-b"}));
  ASSERT_EQ(Call(*svc, "POST", "/unregister", R"({"instance_id": "node-a"})").status, 200);
  EXPECT_EQ(instances(), std::vector<std::string>({"node-b"}));
  EXPECT_EQ(Metric(*svc, "kvo_indexer_query_plans"), 1.0);
  ASSERT_EQ(Call(*svc, "POST", "/unregister", R"({"instance_id": "node-b"})").status, 200);
  EXPECT_NE(Error(Call(*svc, "POST", "/query", query)).find("'tenant_id'"), std::string::npos);
  // The refused query found the plans stale and dropped them: the gauge says so.
  EXPECT_EQ(Metric(*svc, "kvo_indexer_query_plans"), 0.0);
  ASSERT_EQ(register_as(r0, "node-c"), 200);
  EXPECT_EQ(instances(), std::vector<std::string>({"node-c"}));
  svc->Stop();
  r0.pub->Shutdown();
  r1.pub->Shutdown();
}

// The plan cache is bounded: a scope named in over 1 KiB is planned on every query and never
// held (a client varying a long salt cannot fill memory with plans), a repeated scope is planned
// once, and distinct scopes never hold more than 256 plans.
TEST_F(RouterApiTest, QueryPlansAreBoundedAndLongScopesNotHeld) {
  Publisher r0 = MakePublisher(dir_.path() + "/j0");
  ASSERT_TRUE(r0.pub);
  auto svc = Start();
  ASSERT_NE(svc, nullptr);
  ASSERT_EQ(Call(*svc, "POST", "/register", RegisterBody(r0.endpoint, r0.replay, 0)).status, 200);
  auto metric = [&](const std::string& series) { return Metric(*svc, series); };
  auto query_with_salt = [&](const std::string& salt) {
    Json q = Json::parse(QueryBody(2));
    q["cache_salt"] = salt;
    return Call(*svc, "POST", "/query", q.dump());
  };
  ASSERT_EQ(query_with_salt("w8a8").status, 200);
  ASSERT_EQ(query_with_salt("w8a8").status, 200);
  EXPECT_EQ(metric("kvo_indexer_query_plans_built_total"), 1);
  EXPECT_EQ(metric("kvo_indexer_query_plans"), 1);
  const std::string long_salt(2000, 's');
  for (int i = 0; i < 3; ++i) {
    const HttpResponse r = query_with_salt(long_salt);
    ASSERT_EQ(r.status, 200) << r.body.substr(0, 200);
    // Nothing registered under that salt: the tenant's answer names no instance.
    EXPECT_EQ(Json::parse(r.body), Json::parse(R"({"default": {}})")) << r.body.substr(0, 200);
  }
  EXPECT_EQ(metric("kvo_indexer_query_plans_built_total"), 4);
  EXPECT_EQ(metric("kvo_indexer_query_plans"), 1) << "a scope over 1 KiB was held";
  double most = 0;
  for (int i = 0; i < 300; ++i) {
    ASSERT_EQ(query_with_salt("salt-" + std::to_string(i)).status, 200);
    most = std::max(most, metric("kvo_indexer_query_plans"));
  }
  EXPECT_EQ(most, 256);
  EXPECT_EQ(metric("kvo_indexer_query_plans_built_total"), 304);
  // The registered scope still answers with its instance after the cache was cleared.
  const Json answer = Ok(query_with_salt("w8a8"));
  EXPECT_TRUE(answer["default"].contains("vllm-prefill-node1")) << answer.dump();
  svc->Stop();
  r0.pub->Shutdown();
}

TEST_F(RouterApiTest, BadInputIsA400NamingTheFieldAndLosesNothing) {
  auto svc = Start();
  ASSERT_NE(svc, nullptr);
  const std::string ok =
      RegisterBody("ipc://" + dir_.path() + "/a", "ipc://" + dir_.path() + "/b", 0);
  ASSERT_EQ(Call(*svc, "POST", "/register", ok).status, 200);
  struct Case {
    const char* path;
    std::string body;
    const char* names;
  };
  const std::vector<Case> cases = {
      {"/register", "not json", "invalid JSON"},
      {"/register", "[1]", "JSON object"},
      {"/register",
       R"({"endpoint": "ipc:///x", "type": "vLLM", "modelname": "m", "block_size": 16, "dp_rank": 0})",
       "'instance_id'"},
      {"/register",
       R"({"endpoint": "http://127.0.0.1:1", "type": "vLLM", "modelname": "m", "instance_id": "i", "block_size": 16, "dp_rank": 0})",
       "'endpoint'"},
      {"/register",
       R"({"endpoint": "tcp://127.0.0.1:5", "type": "vLLM", "modelname": "m", "instance_id": "i", "block_size": "16", "dp_rank": 0})",
       "'block_size'"},
      {"/register",
       R"({"endpoint": "tcp://127.0.0.1:5", "type": "TRT", "modelname": "m", "instance_id": "i", "block_size": 16, "dp_rank": 0})",
       "'type'"},
      {"/register",
       R"({"endpoint": "tcp://10.0.0.1:5", "type": "vLLM", "modelname": "m", "instance_id": "i", "block_size": 16, "dp_rank": 0})",
       "--allow-remote"},
      {"/unregister", R"({"instance_id": "nobody"})", "'instance_id'"},
      {"/query", R"({"model": "deepseek", "block_size": 128})", "'token_ids'"},
      {"/query", R"({"model": "deepseek", "token_ids": [1, "x"], "block_size": 128})",
       "'token_ids[1]'"},
      {"/query", R"({"token_ids": [1], "block_size": 128})", "'model'"},
      {"/query", R"({"model": "deepseek", "token_ids": [1], "block_size": 0})", "'block_size'"},
      {"/query", R"({"model": "other", "token_ids": [1], "block_size": 128})", "'model'"},
      {"/query", R"({"model": "deepseek", "token_ids": [1], "block_size": 128, "tenant_id": "t2"})",
       "'tenant_id'"},
      {"/query",
       R"({"model": "deepseek", "token_ids": [1], "block_size": 128, "instance_id": "x"})",
       "'instance_id'"},
      {"/query",
       R"({"model": "deepseek", "token_ids": [1], "block_size": 128, "lora_name": "a", "lora_id": 3})",
       "'lora_id'"},
      {"/query_by_hash", R"({"model": "deepseek", "block_size": 128})", "'seq_hashes'"},
      {"/query_by_hash", R"({"model": "deepseek", "block_size": 128, "seq_hashes": [1.5]})",
       "'seq_hashes[0]'"},
  };
  for (const Case& c : cases) {
    std::string e = Error(Call(*svc, "POST", c.path, c.body));
    EXPECT_NE(e.find(c.names), std::string::npos) << c.path << " " << c.body << " -> " << e;
  }
  // Over the token limit: refused before the DOM is built, naming the list.
  Json big = Json::parse(QueryBody(1));
  std::vector<int64_t> many(static_cast<size_t>(Config().max_query_tokens) + 1, 7);
  big["token_ids"] = many;
  std::string e = Error(Call(*svc, "POST", "/query", big.dump()));
  EXPECT_NE(e.find("'token_ids'"), std::string::npos) << e;
  EXPECT_EQ(Call(*svc, "GET", "/query").status, 405);
  // Nothing registered was lost.
  EXPECT_EQ(Ok(Call(*svc, "GET", "/workers"))["workers"].size(), 1u);
  svc->Stop();
}

// Large /query bodies over real HTTP, where the handler parses the token list while the body
// arrives (ServiceOptions::parse_arriving_queries): sent in random pieces, with the members in
// random order (block_size and lora_name before or after the list), compact or spaced lists, and
// now and then a bad field after the list; each answer equals the handler's on the whole body
// (the lists of 192 kB or more read in chunks by the handler and the list helper's thread).
// Then a client that goes away mid-body, and the next query still answered. Seed printed.
// With a patience of 0 for both helpers the handler takes back every chunk and every key job the
// helpers have not finished when it needs them (what a stalled helper costs), and the leases are
// dropped only once each answer is out (HttpResponse::after_sent).
TEST_F(RouterApiTest, LargeQueriesArrivingOverHttpAnswerAsTheWholeBody) {
  LargeQueriesArrivingOverHttp(-1);
}
TEST_F(RouterApiTest, LargeQueriesArrivingOverHttpAnswerAsTheWholeBodyWhenHelpersAreTakenOver) {
  LargeQueriesArrivingOverHttp(0);
  EXPECT_GT(takeovers_, 0) << "no helper's work was taken back";
}

void RouterApiTest::LargeQueriesArrivingOverHttp(int64_t patience) {
  Publisher r0 = MakePublisher(dir_.path() + "/j0");
  ASSERT_TRUE(r0.pub);
  ASSERT_TRUE(r0.pub->Publish(Store(2, kMediumGpu, 0)).ok());
  ASSERT_TRUE(r0.pub->Publish(Store(3, kMediumCpu, 0)).ok());
  ASSERT_TRUE(r0.pub->Publish(Store(4, "STORAGE", 0)).ok());
  r0.pub->Flush();
  ServiceOptions o;
  o.parse_arriving_queries = true;
  o.list_helper_min_cpus = 1;  // the long lists in chunks, with the list helper, on any machine
  if (patience >= 0) o.list_helper_patience_ns = o.key_helper_patience_ns = patience;
  auto started = IndexerService::Start(Config(), o);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  IndexerService& svc = **started;
  ASSERT_EQ(Call(svc, "POST", "/register", RegisterBody(r0.endpoint, r0.replay, 0)).status, 200);
  ASSERT_TRUE(Eventually([&] {
    return Ok(Call(svc, "POST", "/query",
                   QueryBody(6)))["default"]["vllm-prefill-node1"]["longest_matched"] == 4 * kBs;
  }));
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  testing::RawHttpConn c(svc.http_port());
  int matched = 0;
  for (int round = 0; round < 30; ++round) {
    // The stored prefix, then random tokens: 20-90k tokens, 100-600 kB of text.
    std::vector<int64_t> tokens = Tokens(static_cast<int64_t>(rng() % 6));
    const size_t n = 20000 + rng() % 70000;
    while (tokens.size() < n) tokens.push_back(static_cast<int64_t>(rng() % 150000));
    const bool spaced = rng() % 4 == 0;
    std::string list = "[";
    for (size_t i = 0; i < tokens.size(); ++i) {
      list += (i == 0 ? "" : spaced ? ", " : ",") + std::to_string(tokens[i]);
    }
    list += "]";
    std::vector<std::string> members = {
        R"("model": "deepseek")",
        R"("token_ids": )" + list,
        R"("block_size": 128)",
        R"("lora_name": "sql-adapter")",
        R"("cache_salt": "w8a8")",
        rng() % 8 == 0 ? R"("instance_id": 5)" : R"("tenant_id": "default")"};
    std::shuffle(members.begin(), members.end(), rng);
    std::string body = "{";
    for (size_t i = 0; i < members.size(); ++i) body += (i ? ", " : "") + members[i];
    body += "}";
    const HttpResponse want = Call(svc, "POST", "/query", body);
    ASSERT_TRUE(c.Send("POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n"));
    for (size_t off = 0; off < body.size();) {
      const size_t piece = std::min<size_t>(body.size() - off, 1 + rng() % (96u << 10));
      ASSERT_TRUE(c.Send(body.substr(off, piece)));
      off += piece;
    }
    const auto got = c.Read(10000);
    ASSERT_EQ(got.status, want.status) << "round " << round << ": " << got.body.substr(0, 200);
    ASSERT_EQ(Json::parse(got.body), Json::parse(want.body)) << "round " << round;
    if (want.status == 200) {
      matched += Json::parse(want.body)["default"]["vllm-prefill-node1"]["longest_matched"] > 0;
    }
  }
  EXPECT_GT(matched, 0);
  EXPECT_GT(Metric(svc, R"(kvo_indexer_query_parses_total{when="arriving"})"), 0)
      << "no body was parsed as it arrived: the arriving path went untested";
  EXPECT_GT(Metric(svc, "kvo_indexer_query_list_chunks_on_helper_total"), 0)
      << "no list was read in chunks with the list helper";
  // The stored prefix is walked query after query: past its first block, through the hints
  // (the random blocks after it are looked up, and are not in the index).
  EXPECT_GT(Metric(svc, R"(kvo_indexer_walk_blocks{via="hint"})"), 0);
  EXPECT_GT(Metric(svc, R"(kvo_indexer_walk_blocks{via="table"})"), 0);
  takeovers_ = Metric(svc, R"(kvo_indexer_query_helper_takeovers_total{helper="list"})") +
               Metric(svc, R"(kvo_indexer_query_helper_takeovers_total{helper="keys"})");
  // A key job given up is counted where the keys were finished: by the handler, not the helper.
  EXPECT_EQ(Metric(svc, R"(kvo_indexer_query_keys_total{by="taken_back"})"),
            Metric(svc, R"(kvo_indexer_query_helper_takeovers_total{helper="keys"})"));
  std::printf("patience %lld ns: helper work taken back by the handler: %.0f (key jobs %.0f)\n",
              static_cast<long long>(patience), takeovers_,
              Metric(svc, R"(kvo_indexer_query_keys_total{by="taken_back"})"));
  // Gone mid-body, then the next query on a new connection.
  {
    testing::RawHttpConn gone(svc.http_port());
    ASSERT_TRUE(
        gone.Send("POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n" +
                  std::string(R"({"model": "deepseek", "block_size": 128, "token_ids": [1)") +
                  std::string(200000, '1')));
  }
  testing::RawHttpConn next(svc.http_port());
  ASSERT_TRUE(next.Send(testing::RawPost("/query", QueryBody(6))));
  const auto r = next.Read(10000);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["default"]["vllm-prefill-node1"]["longest_matched"], 4 * kBs);
  svc.Stop();
}

// Several routers at once: clients on their own connections send large /query bodies in random
// pieces while another holds a body half sent. One body at a time is followed as it arrives and
// one query at a time holds the key helper; the others are read whole and hash on their own
// thread. Each answer must be its own body's (bodies differ in their matched prefix, so an answer
// crossed between queries, or keys hashed from another query's tokens, shows).
TEST_F(RouterApiTest, ConcurrentLargeQueriesEachGetTheirOwnAnswer) {
  Publisher r0 = MakePublisher(dir_.path() + "/j0");
  ASSERT_TRUE(r0.pub);
  ASSERT_TRUE(r0.pub->Publish(Store(6, kMediumGpu, 0)).ok());
  r0.pub->Flush();
  auto started = IndexerService::Start(Config(), ServiceOptions{});
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  IndexerService& svc = **started;
  ASSERT_EQ(Call(svc, "POST", "/register", RegisterBody(r0.endpoint, r0.replay, 0)).status, 200);
  ASSERT_TRUE(Eventually([&] {
    return Ok(Call(svc, "POST", "/query",
                   QueryBody(6)))["default"]["vllm-prefill-node1"]["longest_matched"] == 6 * kBs;
  }));
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  // Body k: the stored prefix's first k blocks, then a token no stored block has, then random
  // tokens (30-80k in all), compact or as Python writes it.
  constexpr int kBodies = 7;
  std::vector<std::string> bodies;
  for (int k = 0; k < kBodies; ++k) {
    std::vector<int64_t> tokens = Tokens(k);
    tokens.push_back(999'999);
    const size_t n = 30000 + rng() % 50000;
    while (tokens.size() < n) tokens.push_back(static_cast<int64_t>(rng() % 150000));
    Json q = Json::parse(QueryBody(0));
    q["token_ids"] = tokens;
    bodies.push_back(q.dump());
    if (k % 2 == 1) {  // ", " after every comma, as json.dumps writes them
      std::string spaced;
      for (char ch : bodies.back()) spaced += ch == ',' ? std::string(", ") : std::string(1, ch);
      bodies.back() = std::move(spaced);
    }
    const Json want = Ok(Call(svc, "POST", "/query", bodies.back()));
    ASSERT_EQ(want["default"]["vllm-prefill-node1"]["longest_matched"], k * kBs) << "body " << k;
  }
  // A sender that stops halfway through a large body (the one body followed as it arrives, when
  // it is taken first) until client 0 is halfway through its rounds, which then finishes it.
  testing::RawHttpConn stalled(svc.http_port());
  ASSERT_TRUE(stalled.Send(
      "POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(bodies[0].size()) +
      "\r\n\r\n" + bodies[0].substr(0, bodies[0].size() / 2)));
  constexpr int kClients = 4;
  constexpr int kRounds = 6;
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 local(seed + 1 + static_cast<uint32_t>(c));
      testing::RawHttpConn conn(svc.http_port());
      auto fail = [&](int round, int k, const std::string& why) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back("client " + std::to_string(c) + " round " + std::to_string(round) +
                           " body " + std::to_string(k) + ": " + why);
      };
      for (int round = 0; round < kRounds; ++round) {
        if (c == 0 && round == kRounds / 2) {
          const auto got = stalled.Send(bodies[0].substr(bodies[0].size() / 2))
                               ? stalled.Read(30000)
                               : testing::RawHttpConn::Response{};
          if (got.status != 200 ||
              Json::parse(got.body)["default"]["vllm-prefill-node1"]["longest_matched"] != 0) {
            fail(round, 0,
                 "the stalled body answered " + std::to_string(got.status) + " " +
                     got.body.substr(0, 200));
          }
        }
        const int k = static_cast<int>(local() % kBodies);
        const std::string& body = bodies[static_cast<size_t>(k)];
        bool sent = conn.Send("POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n");
        for (size_t off = 0; sent && off < body.size();) {
          const size_t piece = std::min<size_t>(body.size() - off, 1 + local() % (160u << 10));
          sent = conn.Send(body.substr(off, piece));
          off += piece;
        }
        const auto got = sent ? conn.Read(30000) : testing::RawHttpConn::Response{};
        std::string why;
        if (got.status != 200) {
          why = "status " + std::to_string(got.status) + ": " + got.body.substr(0, 200);
        } else {
          const Json j = Json::parse(got.body, nullptr, false);
          if (j.is_discarded() ||
              j["default"]["vllm-prefill-node1"]["longest_matched"] != k * kBs) {
            why = "answered " + got.body.substr(0, 200);
          }
        }
        if (!why.empty()) {
          fail(round, k, why);
          return;
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed; first: " << failures.front();
  svc.Stop();
}

// The index's word-parallel tiered walk (Indexer::Tiered, what /query uses) equals the plain
// block-by-block rule (MatchTiers over Explain's holders) on random tier layouts, prefixes and
// removals of 70 streams (two bit words).
TEST_F(RouterApiTest, TieredWalkEqualsThePlainRule) {
  IndexerOptions o;
  o.background_thread = false;
  auto idx = Indexer::Open(dir_.path() + "/tiered.sqlite", o);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  std::mt19937_64 rng(12345);
  const char* media[] = {kMediumGpu, kMediumCpu, "STORAGE", "kvcr"};
  std::map<std::pair<std::string, int64_t>, uint64_t> seq;
  for (int step = 0; step < 600; ++step) {
    const std::string src = "s" + std::to_string(rng() % 35);
    const int64_t rank = static_cast<int64_t>(rng() % 2);
    EventBatch b;
    if (rng() % 5 == 0) {
      BlockRemoved r;
      r.block_hashes = {BlockHash::Uint(11 + rng() % 10)};
      r.medium = media[rng() % 4];
      b.events.push_back(r);
    } else {
      b = Store(1 + static_cast<int64_t>(rng() % 10), media[rng() % 4], rank);
    }
    ASSERT_TRUE((*idx)->ApplyBatch(src, rank, seq[{src, rank}]++, b).ok());
  }
  int nontrivial = 0;  // streams where CPU and disk both extend the GPU prefix
  for (int64_t n : {1, 4, 10, 12}) {
    for (bool by_hash : {false, true}) {
      ScoreQuery q;
      if (by_hash) {
        for (int64_t i = 0; i < n; ++i) q.block_hashes.push_back(static_cast<uint64_t>(11 + i));
      } else {
        q.token_ids = Tokens(n);
        q.block_size = kBs;
        q.lora_name = "sql-adapter";
      }
      auto tiered = (*idx)->Tiered(q);
      auto explain = (*idx)->Explain(q);
      ASSERT_TRUE(tiered.ok() && explain.ok());
      ASSERT_EQ(tiered->size(), seq.size());
      for (const Indexer::TieredMatch& t : *tiered) {
        TierBoundaries want = MatchTiers(explain->blocks, t.source, t.dp_rank);
        EXPECT_EQ(t.gpu, want.gpu) << t.source << "/" << t.dp_rank << " n " << n;
        EXPECT_EQ(t.cpu, want.cpu) << t.source << "/" << t.dp_rank << " n " << n;
        EXPECT_EQ(t.disk, want.disk) << t.source << "/" << t.dp_rank << " n " << n;
        nontrivial += t.gpu < t.cpu && t.cpu < t.disk ? 1 : 0;
      }
    }
  }
  EXPECT_GT(nontrivial, 0);
}

// The software-pipelined walk (slots prefetched 16 blocks ahead, nodes resolved 8 ahead, an
// early exit when every stream has left or a block is unknown) equals the plain block-by-block
// rule on random indexes: 70-140 streams (two or three bit words), prefixes of 0-300 blocks
// with holes, runs on every tier, random removals, queries longer and shorter than what is
// held, by hash and by tokens. Seed printed.
TEST_F(RouterApiTest, PipelinedTieredWalkEqualsThePlainRuleOnRandomIndexes) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  IndexerOptions o;
  o.background_thread = false;
  const char* media[] = {kMediumGpu, kMediumCpu, "STORAGE", "kvcr"};
  constexpr int64_t kBlocks = 300;
  constexpr int64_t kTokBs = 4;
  std::vector<int64_t> tokens(kBlocks * kTokBs);
  for (auto& t : tokens) t = static_cast<int64_t>(rng() % 50000);
  int checked = 0;
  for (int round = 0; round < 3; ++round) {
    auto idx = Indexer::Open(dir_.path() + "/pipelined" + std::to_string(round) + ".sqlite", o);
    ASSERT_TRUE(idx.ok()) << idx.status().ToString();
    const int streams = 70 + static_cast<int>(rng() % 71);
    for (int st = 0; st < streams; ++st) {
      const std::string src = "p" + std::to_string(st);
      uint64_t seq = 0;
      // A few stores of runs [first, first + n) on a random medium (holes between them).
      for (int k = 1 + static_cast<int>(rng() % 6); k > 0; --k) {
        const int64_t first = static_cast<int64_t>(rng() % kBlocks);
        const int64_t n = std::min<int64_t>(kBlocks - first, 1 + static_cast<int64_t>(rng() % 200));
        BlockStored s;
        for (int64_t i = first; i < first + n; ++i) {
          s.block_hashes.push_back(BlockHash::Uint(5000 + static_cast<uint64_t>(i)));
        }
        if (first > 0)
          s.parent_block_hash = BlockHash::Uint(5000 + static_cast<uint64_t>(first) - 1);
        s.token_ids.assign(tokens.begin() + first * kTokBs, tokens.begin() + (first + n) * kTokBs);
        s.block_size = kTokBs;
        s.medium = media[rng() % 4];
        ASSERT_TRUE((*idx)->ApplyBatch(src, 0, seq++, EventBatch{1.0, {s}, 0}).ok());
      }
      if (rng() % 3 == 0) {
        BlockRemoved r;
        r.block_hashes = {BlockHash::Uint(5000 + rng() % kBlocks)};
        r.medium = media[rng() % 4];
        ASSERT_TRUE((*idx)->ApplyBatch(src, 0, seq++, EventBatch{1.0, {r}, 0}).ok());
      }
    }
    for (int q_round = 0; q_round < 12; ++q_round) {
      const int64_t n = static_cast<int64_t>(rng() % (kBlocks + 20));
      ScoreQuery q;
      const bool by_hash = rng() % 2 == 0;
      if (by_hash) {
        for (int64_t i = 0; i < n; ++i) {
          // Past the held range (i >= kBlocks): hashes the index never saw.
          q.block_hashes.push_back(5000 + static_cast<uint64_t>(i));
        }
        if (n == 0) q.block_hashes.push_back(1);
      } else {
        q.token_ids.assign(tokens.begin(), tokens.begin() + std::min(n, kBlocks) * kTokBs);
        if (q.token_ids.empty()) q.token_ids = {1};
        q.block_size = kTokBs;
      }
      if (rng() % 4 == 0) {
        for (int k = 0; k < 5; ++k) q.sources.push_back("p" + std::to_string(rng() % streams));
      }
      auto tiered = (*idx)->Tiered(q);
      auto explain = (*idx)->Explain(q);
      ASSERT_TRUE(tiered.ok() && explain.ok());
      // Explain lists the blocks up to one past the deepest prefix on any medium: every block a
      // tier walk can reach.
      for (const Indexer::TieredMatch& t : *tiered) {
        const TierBoundaries want = MatchTiers(explain->blocks, t.source, t.dp_rank);
        ASSERT_EQ(t.gpu, want.gpu) << t.source << " n " << n << " by_hash " << by_hash;
        ASSERT_EQ(t.cpu, want.cpu) << t.source << " n " << n << " by_hash " << by_hash;
        ASSERT_EQ(t.disk, want.disk) << t.source << " n " << n << " by_hash " << by_hash;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 500);
}

// The query parser reads the big list by hand (the fast path) and the rest through the JSON DOM;
// on random bodies (key order, whitespace, nested extra keys holding brackets, quotes and escapes,
// boundary integers) it answers exactly what the JSON itself says, and bodies the fast path must
// not accept (floats, a key twice, a value out of range, escaped keys) get the DOM's verdict.
// Seed printed.
// The list scanner reads digits eight at a time and checks overflow only at the 20th: every
// number shape (1..22 digits, leading zeros, a sign, a fraction, an exponent, junk) gives the
// reference parser's answer, and an error names the same element.
// The /query answer is written directly; it must equal the JSON tree's dump byte for byte,
// whatever the tenant and instance names hold (quotes, backslashes, control bytes, UTF-8).
TEST(RouterQueryParseTest, RenderedResponseEqualsTheJsonTree) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::vector<std::string> pieces = {"a",        "engine-7",
                                           "\"",       "\\",
                                           "\n",       "\t",
                                           "\b",       "\f",
                                           "\r",       std::string(1, '\0'),
                                           "\x01",     "\x1f",
                                           "\x7f",     "/",
                                           "\xc3\xa9", "\xe2\x82\xac",
                                           " ",        "{}"};
  auto name = [&] {
    std::string n;
    for (int i = static_cast<int>(rng() % 5); i >= 0; --i) n += pieces[rng() % pieces.size()];
    return n;
  };
  for (int round = 0; round < 500; ++round) {
    std::map<std::string, InstanceMatch> instances;
    for (int i = static_cast<int>(rng() % 6); i > 0; --i) {
      InstanceMatch& m = instances[name()];
      m.longest_matched = static_cast<int64_t>(rng() % 200000);
      m.gpu = static_cast<int64_t>(rng() % 3) - 1;
      m.cpu = round % 2 ? INT64_MAX : INT64_MIN;
      m.disk = static_cast<int64_t>(rng());
      for (int r = static_cast<int>(rng() % 4); r > 0; --r) {
        m.dp[static_cast<int64_t>(rng() % 9) - 2] = static_cast<int64_t>(rng() % 1000);
      }
    }
    const std::string tenant = name();
    const std::string direct = RenderRouterQueryResponse(tenant, instances);
    ASSERT_EQ(direct, RenderRouterQueryResponseTree(tenant, instances));
    EXPECT_TRUE(Json::accept(direct)) << direct;
  }
}

// The planned answer (PlanRouterAnswer + FoldStream + RenderRouterAnswer, what /query uses)
// equals the map fold it replaced (AddRank per stream in scope, its match looked up by (source,
// rank), RenderRouterQueryResponse) on random scopes: instances with several ranks, sources with
// several streams, a (source, rank) listed twice, walk results for streams out of scope, in any
// order, with repeats.
TEST(RouterQueryParseTest, PlannedAnswerEqualsTheMapFold) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int round = 0; round < 2000; ++round) {
    std::vector<ScopedStream> scoped;
    const int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      const std::string source = "src-" + std::to_string(rng() % 6);
      // A source is one instance's (its registration's; a config source's is its name); an
      // instance may have several sources (one per DP rank, or one of each kind).
      const std::string instance = rng() % 3 == 0 ? source : "inst-" + std::to_string(rng() % 3);
      scoped.push_back({instance, source, static_cast<int64_t>(rng() % 4)});
    }
    if (n > 0 && rng() % 4 == 0) scoped.push_back(scoped[rng() % scoped.size()]);
    // Keep one instance per source (as the registry does), whichever came first.
    std::map<std::string, std::string> instance_of;
    for (ScopedStream& s : scoped)
      s.instance_id = instance_of.emplace(s.source, s.instance_id).first->second;
    std::vector<Indexer::TieredMatch> walked;
    for (int i = static_cast<int>(rng() % 14); i > 0; --i) {
      Indexer::TieredMatch t;
      t.source = "src-" + std::to_string(rng() % 8);  // 6, 7: never in scope
      t.dp_rank = static_cast<int64_t>(rng() % 5);
      t.gpu = static_cast<int64_t>(rng() % 5);
      t.cpu = t.gpu + static_cast<int64_t>(rng() % 3);
      t.disk = t.cpu + static_cast<int64_t>(rng() % 3);
      const bool repeat = std::any_of(walked.begin(), walked.end(), [&](const auto& w) {
        return w.source == t.source && w.dp_rank == t.dp_rank;
      });
      if (!repeat) walked.push_back(t);  // the index answers each stream once
    }
    const int64_t block_size = 1 + static_cast<int64_t>(rng() % 64);
    // The map fold.
    std::map<std::string, InstanceMatch> matches;
    for (const ScopedStream& s : scoped) matches[s.instance_id].dp[s.dp_rank];
    for (const ScopedStream& s : scoped) {
      TierBoundaries b;
      for (const auto& w : walked) {
        if (w.source == s.source && w.dp_rank == s.dp_rank) b = {w.gpu, w.cpu, w.disk};
      }
      AddRank(b, s.dp_rank, block_size, &matches[s.instance_id]);
    }
    // The plan.
    const RouterAnswerPlan plan = PlanRouterAnswer(scoped);
    RouterAnswer answer(plan);
    for (const auto& w : walked) {
      FoldStream(plan, w.source, w.dp_rank, {w.gpu, w.cpu, w.disk}, block_size, &answer);
    }
    ASSERT_EQ(RenderRouterAnswer("default", plan, answer),
              RenderRouterQueryResponse("default", matches))
        << "round " << round;
  }
}

TEST(RouterQueryParseTest, ScannerAgreesWithTheReferenceOnEveryNumberShape) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto digits = [&](int n) {
    std::string d;
    for (int i = 0; i < n; ++i) d += static_cast<char>('0' + rng() % 10);
    return d;
  };
  auto element = [&]() -> std::string {
    const int len = 1 + static_cast<int>(rng() % 22);
    std::string d = digits(len);
    switch (rng() % 12) {
      case 0:
        return "-" + d;
      case 1:
        return d + ".5";
      case 2:
        return d + "e1";
      case 3:
        return "+" + d;
      case 4:
        return "18446744073709551615";  // UINT64_MAX
      case 5:
        return "18446744073709551616";  // UINT64_MAX + 1
      case 6:
        return "-9223372036854775808";  // INT64_MIN
      case 7:
        return "-9223372036854775809";
      case 8:
        return std::string(rng() % 2 ? "0" : "") + "9223372036854775807";
      default:
        if (d.size() > 1 && d[0] == '0') d[0] = '1';
        return d;
    }
  };
  int accepted = 0;
  for (int round = 0; round < 2000; ++round) {
    const bool by_hash = rng() % 2 == 0;
    const int n = static_cast<int>(rng() % 6);
    std::string list = "[";
    for (int i = 0; i < n; ++i) list += (i ? "," : "") + element();
    list += "]";
    const std::string body = R"({"model": "m", "block_size": 16, ")" +
                             std::string(by_hash ? "seq_hashes" : "token_ids") + R"(": )" + list +
                             "}";
    auto fast = ParseRouterQuery(body, by_hash, 100);
    auto ref = ParseRouterQueryReference(body, by_hash, 100);
    ASSERT_EQ(fast.ok(), ref.ok())
        << body << " -> " << fast.status().ToString() << " / " << ref.status().ToString();
    if (fast.ok()) {
      ++accepted;
      ASSERT_EQ(fast->hashes, ref->hashes) << body;
      ASSERT_EQ(fast->token_ids, ref->token_ids) << body;
    } else {
      ASSERT_EQ(fast.status().message(), ref.status().message()) << body;
      const std::string_view m = fast.status().message();
      if (m.find("invalid JSON") == std::string_view::npos) {  // a syntax error names the byte
        ASSERT_NE(m.find(by_hash ? "'seq_hashes[" : "'token_ids["), std::string_view::npos)
            << body << " -> " << fast.status().ToString();
      }
    }
  }
  EXPECT_GT(accepted, 100);  // the shapes exercise the accepting path too
}

// Long compact token lists take the 64-byte block scanner (FastIntRun); every interruption it
// hands back to the per-element loop (whitespace, a sign, 8+ digits, a leading zero, a fraction,
// the item limit, a list ending near a block's edge) gives the reference parser's answer.
TEST(RouterQueryParseTest, LongTokenListsAgreeWithTheReference) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto element = [&]() -> std::string {
    const int kind = static_cast<int>(rng() % 60);
    std::string d = std::to_string(rng() % 10'000'000);  // 1..7 digits: the block scanner's
    switch (kind) {
      case 0:
        return " " + d;
      case 1:
        return d + "\n";
      case 2:
        return "-" + d;
      case 3:
        return std::to_string(10'000'000 + rng() % 4'000'000'000u);  // 8..10 digits
      case 4:
        return "0" + d;  // a leading zero: refused
      case 5:
        return d + ".0";  // a fraction: refused
      case 6:
        return "0";
      default:
        return d;
    }
  };
  int accepted = 0;
  int refused = 0;
  for (int round = 0; round < 400; ++round) {
    const int n = static_cast<int>(rng() % 700);
    const bool clean = rng() % 2 == 0;  // no interruptions at all in half the lists
    std::string list = "[";
    for (int i = 0; i < n; ++i) {
      list += (i ? "," : "") + (clean ? std::to_string(rng() % 200'000) : element());
    }
    list += "]";
    const int64_t max_items = rng() % 4 == 0 ? static_cast<int64_t>(rng() % 700) : 1000;
    std::string body = R"({"model": "m", "block_size": 16, "token_ids": )" + list;
    body += std::string(rng() % 70, ' ') + "}";  // the list's end at any distance from the body's
    auto fast = ParseRouterQuery(body, false, max_items);
    auto ref = ParseRouterQueryReference(body, false, max_items);
    ASSERT_EQ(fast.ok(), ref.ok()) << body.substr(0, 300) << " -> " << fast.status().ToString()
                                   << " / " << ref.status().ToString();
    if (fast.ok()) {
      ++accepted;
      ASSERT_EQ(fast->token_ids, ref->token_ids) << body.substr(0, 300);
    } else {
      ++refused;
      ASSERT_EQ(fast.status().message(), ref.status().message()) << body.substr(0, 300);
    }
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 20);
}

// `digits` random decimal digits, the first not 0.
template <typename Rng>
std::string RandomDigits(Rng& rng, int digits) {
  std::string d = std::to_string(1 + rng() % 9);
  while (static_cast<int>(d.size()) < digits) d += static_cast<char>('0' + rng() % 10);
  return d;
}

// A body whose list under `key` holds `elems` in the compact form, with one of `defects` inserted
// in an element or between two when `defect`, the closing ']' missing one time in 20, whitespace
// around; and an item limit just below, at or above the count one time in 3 (else 1000).
template <typename Rng>
std::pair<std::string, int64_t> CompactListBody(Rng& rng, std::vector<std::string> elems,
                                                const std::vector<std::string>& defects,
                                                bool defect, const char* key,
                                                const std::string& sep = ",") {
  if (defect) {
    std::string& e = elems[rng() % elems.size()];
    const std::string& d = defects[rng() % defects.size()];
    e.insert(rng() % (e.size() + 1), d);
  }
  std::string list = "[";
  for (size_t i = 0; i < elems.size(); ++i) list += (i ? sep : "") + elems[i];
  if (rng() % 20 != 0) list += "]";
  const auto n = static_cast<int64_t>(elems.size());
  const int64_t max_items = rng() % 3 == 0 ? n - 1 + static_cast<int64_t>(rng() % 3) : 1000;
  std::string body = std::string(rng() % 9, ' ') + R"({"model":"m","block_size":16,")" + key +
                     R"(":)" + list + std::string(rng() % 70, ' ') + "}";
  return {body, max_items};
}

// Every token-scan level up to `best` parses `body` as the reference parser does (the same list,
// or the same error). *accepted: the reference accepted it.
void ExpectEveryScanLevelAgrees(const std::string& body, bool by_hash, int64_t max_items,
                                TokenScan best, bool* accepted) {
  auto ref = ParseRouterQueryReference(body, by_hash, max_items);
  *accepted = ref.ok();
  for (int level = 0; level <= static_cast<int>(best); ++level) {
    SetTokenScan(static_cast<TokenScan>(level));
    auto fast = ParseRouterQuery(body, by_hash, max_items);
    ASSERT_EQ(fast.ok(), ref.ok()) << "level " << level << " " << body.substr(0, 400) << " -> "
                                   << fast.status().ToString() << " / " << ref.status().ToString();
    if (fast.ok()) {
      ASSERT_EQ(fast->token_ids, ref->token_ids) << "level " << level << " " << body.substr(0, 400);
      ASSERT_EQ(fast->hashes, ref->hashes) << "level " << level << " " << body.substr(0, 400);
    } else {
      ASSERT_EQ(fast.status().message(), ref.status().message()) << body.substr(0, 400);
    }
  }
}

// The scanner takes a 64-byte window of compact token ids whole when its masks say every element
// in it is 1-7 digits with a ',' after it: long compact lists with one defect each (a sign, a
// space, a leading zero, 8, 24 or 60 digits, an empty element, a fraction, a letter, an early
// ']', a missing ']') at every offset, and item limits just below, at and above the count, answer
// exactly what the reference parser answers, with the portable conversion, AVX2's, AVX-512's
// element-aligned windows and its fixed stride (each the CPU has).
// Seed printed.
TEST(RouterQueryParseTest, WholeWindowsAgreeWithTheReferenceAroundEveryDefect) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TokenScan best = SetTokenScan(TokenScan::kAvx512Stride);
  std::printf(
      "token scan: best on this CPU %d (0 portable, 1 AVX2, 2 AVX-512 VBMI2, 3 its fixed stride); "
      "each level up to it checked\n",
      static_cast<int>(best));
  std::mt19937 rng(seed);
  // (24 and 60 digits: a number that runs past the fixed stride's 8 bytes of look-back, and one
  // with no separator in a whole stride.)
  std::vector<std::string> defects = {"-",  " ",  "0",   "12345678", ",", ".5", "x",  "]",
                                      "\n", "\"", "1e3", "99999999", "",  "00", "-0", "\t"};
  defects.push_back("123456789012345678901234");
  defects.push_back(std::string(60, '7'));
  int accepted = 0;
  int refused = 0;
  for (int round = 0; round < 600; ++round) {
    const int n = 1 + static_cast<int>(rng() % 400);
    std::vector<std::string> elems;
    for (int i = 0; i < n; ++i) {
      const int digits = 1 + static_cast<int>(rng() % 7);
      std::string d = RandomDigits(rng, digits);
      elems.push_back(d);
    }
    // The portable conversion, AVX2's and AVX-512's (where the CPU has them): each the
    // reference's answer.
    const auto [body, max_items] =
        CompactListBody(rng, elems, defects, rng() % 4 != 0, "token_ids");
    bool ok = false;
    ASSERT_NO_FATAL_FAILURE(ExpectEveryScanLevelAgrees(body, false, max_items, best, &ok));
    ++(ok ? accepted : refused);
  }
  SetTokenScan(TokenScan::kAvx512Stride);
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 50);
}

// Lists as Python's json.dumps writes them (", " between elements) take the spaced window plan:
// with one defect each at every offset (a second space, a space before the comma or inside a
// number, a tab, a sign, ...) and item limits around the count, token ids and hashes: each scan
// level answers exactly what the reference parser answers. Seed printed.
TEST(RouterQueryParseTest, SpacedWindowsAgreeWithTheReferenceAroundEveryDefect) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TokenScan best = SetTokenScan(TokenScan::kAvx512Stride);
  std::mt19937 rng(seed);
  const std::vector<std::string> defects = {" ", "  ",       ", ", " ,", "\t", "\n", "-",
                                            "0", "12345678", ".5", "]",  "",   ",",  "x"};
  int accepted = 0;
  int refused = 0;
  for (int round = 0; round < 600; ++round) {
    const bool by_hash = round % 3 == 0;
    const int n = 1 + static_cast<int>(rng() % 300);
    std::vector<std::string> elems;
    for (int i = 0; i < n; ++i) {
      elems.push_back(RandomDigits(rng, 1 + static_cast<int>(rng() % (by_hash ? 19 : 7))));
    }
    const auto [body, max_items] = CompactListBody(rng, elems, defects, rng() % 3 != 0,
                                                   by_hash ? "seq_hashes" : "token_ids", ", ");
    bool ok = false;
    ASSERT_NO_FATAL_FAILURE(ExpectEveryScanLevelAgrees(body, by_hash, max_items, best, &ok));
    ++(ok ? accepted : refused);
  }
  SetTokenScan(TokenScan::kAvx512Stride);
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 50);
}

// The same for /query_by_hash: whole windows of compact 1-20-digit hashes (AVX-512, where the CPU
// has it), with one defect each at every offset — 21 digits, values just past UINT64_MAX
// (18446744073709551616, 18450000000000000000, 99999999999999999999) beside the largest one and
// others with the same first four digits, 25-28 digits whose last 24 alone would be a valid value,
// a sign, a leading zero, whitespace — and item limits
// around the count: each level the CPU has answers exactly what the reference parser answers.
// Seed printed.
TEST(RouterQueryParseTest, HashWindowsAgreeWithTheReferenceAroundEveryDefect) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TokenScan best = SetTokenScan(TokenScan::kAvx512Stride);
  std::mt19937_64 rng(seed);
  const std::vector<std::string> edges = {
      "18446744073709551615", "18446744073709551616", "18446744073709551999",
      "18440000000000000000", "18450000000000000000", "99999999999999999999",
      "18446744073709551614", "10000000000000000000", "0", "9223372036854775808",
      // 25 and 28 digits whose last 24 alone would read as a valid value
      "9000018440000000000000000", "1000000000000000000000000005"};
  const std::vector<std::string> defects = {
      "-",  " ",  "0", "123456789012345678901", ",", ".5", "x", "]", "\n", "e3", "00",
      "-0", "\t", "1"};
  int accepted = 0;
  int refused = 0;
  for (int round = 0; round < 600; ++round) {
    const int n = 1 + static_cast<int>(rng() % 200);
    std::vector<std::string> elems;
    for (int i = 0; i < n; ++i) {
      if (round % 2 == 0 && rng() % 64 == 0) {  // an edge value in every other list
        elems.push_back(edges[rng() % edges.size()]);
        continue;
      }
      // Mostly 17-20 digits (hashes), some short.
      const int digits =
          rng() % 4 == 0 ? 1 + static_cast<int>(rng() % 20) : 17 + static_cast<int>(rng() % 4);
      std::string d = RandomDigits(rng, digits);
      if (digits == 20 && d > "18446744073709551615") d[0] = '1', d[1] = '0';
      elems.push_back(d);
    }
    const auto [body, max_items] =
        CompactListBody(rng, elems, defects, rng() % 3 != 0, "seq_hashes");
    bool ok = false;
    ASSERT_NO_FATAL_FAILURE(ExpectEveryScanLevelAgrees(body, true, max_items, best, &ok));
    ++(ok ? accepted : refused);
  }
  SetTokenScan(TokenScan::kAvx512Stride);
  EXPECT_GT(accepted, 60);
  EXPECT_GT(refused, 50);
}

TEST(RouterQueryParseTest, FastListPathAgreesWithTheJson) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto ws = [&] {
    static const char* kWs[] = {"", " ", "\n  ", "\t", "\r\n"};
    return std::string(kWs[rng() % 5]);
  };
  const std::vector<std::string> extras = {R"("note": "a ] } [ { \" \\ string")",
                                           R"("nested": {"a": [1, [2, {"b": "]"}]], "c": null})",
                                           R"("flag": true)",
                                           R"("n": -1.5e3)",
                                           R"("lora_name": null)",
                                           R"("cache_salt": "")"};
  for (int round = 0; round < 300; ++round) {
    const bool by_hash = rng() % 2 == 0;
    const std::string key = by_hash ? (rng() % 2 ? "seq_hashes" : "block_hash") : "token_ids";
    std::string list = "[" + ws();
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      int64_t v;
      switch (rng() % 5) {
        case 0:
          v = INT64_MAX;
          break;
        case 1:
          v = INT64_MIN;
          break;
        case 2:
          v = -static_cast<int64_t>(rng() % 1000);
          break;
        default:
          v = static_cast<int64_t>(rng() % 200000);
      }
      list += (i ? "," + ws() : "") + std::to_string(v) + ws();
    }
    if (by_hash && rng() % 4 == 0) list += std::string(n ? "," : "") + "18446744073709551615";
    list += "]";
    std::vector<std::string> parts = {R"("model")" + ws() + ":" + ws() + R"("m")",
                                      R"("block_size": 16)", "\"" + key + "\":" + ws() + list};
    for (const std::string& e : extras) {
      if (rng() % 2) parts.push_back(e);
    }
    std::shuffle(parts.begin(), parts.end(), rng);
    std::string body = "{" + ws();
    for (size_t i = 0; i < parts.size(); ++i) body += (i ? "," + ws() : "") + parts[i] + ws();
    body += "}";
    auto q = ParseRouterQuery(body, by_hash, 1000);
    ASSERT_TRUE(q.ok()) << body << " -> " << q.status().ToString();
    Json truth = Json::parse(body)[key];
    if (by_hash) {
      ASSERT_EQ(q->hashes.size(), truth.size()) << body;
      for (size_t i = 0; i < truth.size(); ++i) {
        const uint64_t want = truth[i].is_number_unsigned()
                                  ? truth[i].get<uint64_t>()
                                  : static_cast<uint64_t>(truth[i].get<int64_t>());
        ASSERT_EQ(q->hashes[i], want) << body;
      }
    } else {
      ASSERT_EQ(q->token_ids, truth.get<std::vector<int64_t>>()) << body;
    }
  }
  struct Case {
    const char* body;
    bool ok;
    const char* names;
  };
  const Case cases[] = {
      {R"({"model": "m", "block_size": 16, "token_ids": [1, 2.5]})", false, "'token_ids[1]'"},
      {R"({"model": "m", "block_size": 16, "token_ids": [1], "token_ids": [2, 3]})", true, ""},
      {R"({"model": "m", "block_size": 16, "token_ids": [9223372036854775808]})", false,
       "'token_ids[0]'"},
      {R"({"model": "m", "block_size": 16, "token_ids": [01]})", false, "invalid JSON"},
      {R"({"model": "m", "block_size": 16, "tok\u0065n_ids": [7]})", true, ""},
      {R"({"model": "m", "block_size": 16, "token_ids": [1, 2, 3, 4, 5, 6]})", false,
       "longer than 5"},
      {R"({"model": "m", "block_size": 16, "token_ids": [1,]})", false, "invalid JSON"},
      {R"({"model": "m", "block_size": 16, "token_ids": [1] )", false, "invalid JSON"},
  };
  for (const Case& c : cases) {
    auto q = ParseRouterQuery(c.body, false, 5);
    EXPECT_EQ(q.ok(), c.ok) << c.body << " -> " << q.status().ToString();
    if (!c.ok && !q.ok()) {
      EXPECT_NE(q.status().message().find(c.names), std::string::npos)
          << c.body << " -> " << q.status().ToString();
    }
    if (c.ok && q.ok()) {
      EXPECT_EQ(q->token_ids, Json::parse(c.body)["token_ids"].get<std::vector<int64_t>>())
          << c.body;
    }
  }
}

// "dp_ranks": 2 registers ranks dp_rank and dp_rank + 1, the second on the offset ports (vLLM's
// rule, the same the publishers bind with); each rank is its own registration.
// /unregister stops a stream thread that waits in Subscriber::Next for its poll slice; the
// stream's wake descriptor (SubscriberOptions::wake_fd) ends that wait at once. A subscriber to a
// publisher that never sends, Next with a 10 s timeout on another thread, the eventfd written:
// Next returns nothing long before its timeout, and returns at once on every later call.
TEST(RouterStreamWakeTest, WakeFdEndsTheSubscribersWaitAtOnce) {
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ASSERT_GE(wake, 0);
  SubscriberOptions o;
  o.endpoint = "tcp://127.0.0.1:" + std::to_string(FreePort());
  o.wake_fd = wake;
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  const auto start = std::chrono::steady_clock::now();
  std::optional<bool> got_batch;
  std::thread waiter([&] {
    auto next = (*sub)->Next(std::chrono::seconds(10));
    got_batch = next.ok() && next->has_value();
  });
  const uint64_t one = 1;
  ASSERT_EQ(write(wake, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  waiter.join();
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(got_batch.has_value());
  EXPECT_FALSE(*got_batch);
  EXPECT_LT(waited, std::chrono::seconds(5)) << "Next waited out its timeout: the wake was lost";
  // Not drained: a later call returns at once too.
  const auto again = std::chrono::steady_clock::now();
  auto next = (*sub)->Next(std::chrono::seconds(10));
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - again, std::chrono::seconds(5));
  close(wake);
}

// An idle stream waits up to a second for a batch (a quarter of silent_after_ms, at most 1 s: an
// idle source no longer wakes 40 times a second), and a stream whose replay endpoint does not
// answer waits up to the replay timeout; /unregister must wait out neither: the stream's eventfd
// ends both waits. Ten registered sources whose publishers never send (five with a replay endpoint
// that never answers, five without one), idle for a while, unregistered one by one: each answer
// within 250 ms (a lost wake costs a source a wait spread over 0-1 s, so all ten under 250 ms by
// chance is far below 0.1 %).
TEST_F(RouterApiTest, UnregisterWakesAnIdleStreamsLongWait) {
  silent_after_ms_ = 10'000;
  auto svc = Start();
  ASSERT_NE(svc, nullptr);
  const int n = 10;
  for (int i = 0; i < n; ++i) {
    Json body = Json::parse(RegisterBody("tcp://127.0.0.1:" + std::to_string(FreePort()),
                                         "tcp://127.0.0.1:" + std::to_string(FreePort()), 0));
    body["instance_id"] = "idle-" + std::to_string(i);
    if (i % 2 == 1) body.erase("replay_endpoint");  // the live wait, not the replay's
    Ok(Call(*svc, "POST", "/register", body.dump()));
  }
  // The scenario: sources that have been idle (their threads in the long wait), not a sync.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int i = 0; i < n; ++i) {
    const auto start = std::chrono::steady_clock::now();
    Json r = Ok(Call(*svc, "POST", "/unregister",
                     R"({"instance_id": "idle-)" + std::to_string(i) + R"("})"));
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(r["removed_instances"].size(), 1u) << r.dump();
    EXPECT_LT(took, std::chrono::milliseconds(250))
        << "source " << i << (i % 2 == 1 ? " (live wait)" : " (replay wait)")
        << ": /unregister waited out the stream's wait (the wake was lost)";
  }
}

TEST_F(RouterApiTest, DpRanksRegistersEveryRankOnOffsetPorts) {
  const int port = FreePortPair();
  const int replay = FreePortPair();
  ASSERT_GT(port, 0);
  ASSERT_GT(replay, 0);
  KvEventsConfig c;
  c.enable_kv_cache_events = true;
  c.publisher = "zmq";
  c.endpoint = "tcp://*:" + std::to_string(port);
  c.replay_endpoint = "tcp://*:" + std::to_string(replay);
  auto p0 = CreateEventPublisher(c, 0);
  auto p1 = CreateEventPublisher(c, 1);
  ASSERT_TRUE(p0.ok() && p1.ok());
  ASSERT_TRUE((*p0)->Publish(Store(3, kMediumGpu, 0)).ok());
  ASSERT_TRUE((*p1)->Publish(Store(1, kMediumCpu, 1)).ok());
  (*p0)->Flush();
  (*p1)->Flush();
  auto svc = Start();
  ASSERT_NE(svc, nullptr);
  Json body = Json::parse(RegisterBody("tcp://127.0.0.1:" + std::to_string(port),
                                       "tcp://127.0.0.1:" + std::to_string(replay), 0));
  body["dp_ranks"] = 0;
  std::string err = Error(Call(*svc, "POST", "/register", body.dump()));
  EXPECT_NE(err.find("'dp_ranks'"), std::string::npos) << err;
  Json overflow = body;
  overflow["endpoint"] = "tcp://127.0.0.1:65535";
  overflow["dp_ranks"] = 2;
  err = Error(Call(*svc, "POST", "/register", overflow.dump()));
  EXPECT_NE(err.find("rank 1"), std::string::npos) << err;
  EXPECT_EQ(Ok(Call(*svc, "GET", "/workers"))["workers"].size(), 0u);  // nothing half-registered
  body["dp_ranks"] = 2;
  EXPECT_EQ(Ok(Call(*svc, "POST", "/register", body.dump()))["status"], "registered successfully");
  Json workers = Ok(Call(*svc, "GET", "/workers"))["workers"];
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[1]["dp_rank"], 1);
  EXPECT_EQ(workers[1]["endpoint"], "tcp://127.0.0.1:" + std::to_string(port + 1));
  EXPECT_EQ(workers[1]["replay_endpoint"], "tcp://127.0.0.1:" + std::to_string(replay + 1));
  const Json want = Expected(3 * kBs, 3 * kBs, kBs, 0, {{"0", 3 * kBs}, {"1", kBs}});
  ASSERT_TRUE(Eventually([&] {
    return Json::parse(Call(*svc, "POST", "/query", QueryBody(4)).body) == want;
  })) << Call(*svc, "POST", "/query", QueryBody(4)).body;
  // The same request again is idempotent; unregister without dp_rank removes every rank.
  EXPECT_EQ(Call(*svc, "POST", "/register", body.dump()).status, 200);
  EXPECT_EQ(
      Ok(Call(
          *svc, "POST", "/unregister",
          R"({"instance_id": "vllm-prefill-node1", "tenant_id": "default"})"))["removed_instances"],
      Json::parse(R"(["vllm-prefill-node1|default|0", "vllm-prefill-node1|default|1"])"));
  svc->Stop();
  (*p0)->Shutdown();
  (*p1)->Shutdown();
}

// vLLM's KVCR tier stores with "ownership": "kvcr": its copy is a residency of its own beside the
// framework's copy of the same block on the same medium, and a removal matches the residency it
// names (one naming kvcr never drops the framework's copy, nor the reverse). Held in memory, in
// SQLite after compaction, and after a reopen; the tiered match counts either copy as CPU.
EventBatch Owned(bool remove, const std::vector<uint64_t>& hashes, const char* ownership) {
  std::vector<BlockHash> hs;
  for (uint64_t h : hashes) hs.push_back(BlockHash::Uint(h));
  EventBatch b{1700000000.0, {}, 0};
  if (remove) {
    BlockRemoved r;
    r.block_hashes = hs;
    r.medium = kMediumCpu;
    if (ownership != nullptr) r.ownership = ownership;
    b.events.push_back(r);
  } else {
    BlockStored st;
    st.block_hashes = hs;
    st.block_size = kBs;
    st.medium = kMediumCpu;
    if (ownership != nullptr) st.ownership = ownership;
    b.events.push_back(st);
  }
  return b;
}

std::vector<std::string> HoldersOf(Indexer& idx, uint64_t hash) {
  ScoreQuery q;
  q.block_hashes = {hash};
  auto ex = idx.Explain(q);
  EXPECT_TRUE(ex.ok()) << ex.status().ToString();
  std::vector<std::string> out;
  if (!ex.ok()) return out;
  for (const ExplainHolder& h : ex->blocks[0].holders) {
    out.push_back(h.medium + (h.ownership.empty() ? "" : "/" + h.ownership) + " x" +
                  std::to_string(h.refcount));
  }
  return out;
}

// SQL that turns a version-3 file back into the version-2 layout (blocks keyed without
// ownership, event_log without it), as a file written by an older kvo has it.
constexpr const char* kV2Layout =
    "BEGIN; DROP VIEW block_entries; DROP INDEX blocks_keyless;"
    "ALTER TABLE event_log DROP COLUMN ownership;"
    "CREATE TABLE b2 (source_id INTEGER NOT NULL, dp_rank INTEGER NOT NULL, medium TEXT NOT "
    "NULL, group_idx INTEGER NOT NULL, engine_hash INTEGER NOT NULL, refcount INTEGER NOT NULL,"
    " parent_hash INTEGER, content_key INTEGER, block_size INTEGER NOT NULL, token_count "
    "INTEGER NOT NULL, token_width INTEGER NOT NULL DEFAULT 0, token_ids BLOB, lora_name TEXT,"
    " first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, first_seen REAL NOT NULL, "
    "last_seen REAL NOT NULL, PRIMARY KEY (source_id, dp_rank, medium, group_idx, engine_hash))"
    " WITHOUT ROWID;"
    "INSERT INTO b2 SELECT source_id, dp_rank, medium, group_idx, engine_hash, refcount, "
    "parent_hash, content_key, block_size, token_count, token_width, token_ids, lora_name, "
    "first_seq, last_seq, first_seen, last_seen FROM blocks;"
    "DROP TABLE blocks; ALTER TABLE b2 RENAME TO blocks;"
    "CREATE INDEX blocks_keyless ON blocks (engine_hash) WHERE content_key IS NULL;"
    "CREATE VIEW block_entries AS SELECT * FROM blocks;";

TEST_F(RouterApiTest, OwnedCopiesAreTheirOwnResidency) {
  const std::string path = dir_.path() + "/own.sqlite";
  using V = std::vector<std::string>;
  {
    IndexerOptions o;
    o.background_thread = false;
    auto opened = Indexer::Open(path, o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    Indexer& idx = **opened;
    ASSERT_TRUE(idx.ApplyBatch("s", 0, 1, Owned(false, {1, 2, 3}, nullptr)).ok());
    ASSERT_TRUE(idx.ApplyBatch("s", 0, 2, Owned(false, {1, 2}, "kvcr")).ok());
    EXPECT_EQ(HoldersOf(idx, 1), (V{"CPU x1", "CPU/kvcr x1"}));
    // KVCR drops block 3, which only the framework holds: an unknown removal, nothing changes.
    auto out = idx.ApplyBatch("s", 0, 3, Owned(true, {3}, "kvcr"));
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(out->unknown_removals, 1);
    EXPECT_EQ(HoldersOf(idx, 3), (V{"CPU x1"}));
    // The framework drops block 1: KVCR's copy stays.
    ASSERT_TRUE(idx.ApplyBatch("s", 0, 4, Owned(true, {1}, nullptr)).ok());
    EXPECT_EQ(HoldersOf(idx, 1), (V{"CPU/kvcr x1"}));
    ASSERT_TRUE(idx.Flush().ok());
    ASSERT_TRUE(idx.Compact().ok());  // into `blocks`, keyed with ownership
    ASSERT_TRUE(idx.ApplyBatch("s", 0, 5, Owned(true, {2}, "kvcr")).ok());  // stays in the log
    ASSERT_TRUE(idx.Flush().ok());
    EXPECT_EQ(HoldersOf(idx, 2), (V{"CPU x1"}));
    bool saw_owned = false;
    for (const MediumStats& m : idx.Stats().per_medium) saw_owned |= m.medium == "CPU/kvcr";
    EXPECT_TRUE(saw_owned);
  }
  IndexerOptions o;
  o.background_thread = false;
  auto reopened = Indexer::Open(path, o);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  Indexer& idx = **reopened;
  EXPECT_EQ(HoldersOf(idx, 1), (V{"CPU/kvcr x1"}));
  EXPECT_EQ(HoldersOf(idx, 2), (V{"CPU x1"}));
  EXPECT_EQ(HoldersOf(idx, 3), (V{"CPU x1"}));
  // The router API's tiers: an owned CPU copy is CPU.
  ScoreQuery q;
  q.block_hashes = {1, 2, 3};
  auto tiered = idx.Tiered(q);
  ASSERT_TRUE(tiered.ok());
  ASSERT_EQ(tiered->size(), 1u);
  EXPECT_EQ((*tiered)[0].cpu, 3);
}

// A version-2 file (before ownership) is migrated at open: its entries keep their place as the
// framework's copies (ownership ''), log rows not yet folded too, and owned copies then work.
TEST_F(RouterApiTest, Version2FileIsMigrated) {
  const std::string path = dir_.path() + "/v2.sqlite";
  {
    IndexerOptions o;
    o.background_thread = false;
    auto idx = Indexer::Open(path, o);
    ASSERT_TRUE(idx.ok()) << idx.status().ToString();
    ASSERT_TRUE((*idx)->ApplyBatch("s", 0, 1, Owned(false, {1, 2}, nullptr)).ok());
    ASSERT_TRUE((*idx)->Flush().ok());
    ASSERT_TRUE((*idx)->Compact().ok());
    ASSERT_TRUE((*idx)->ApplyBatch("s", 0, 2, Owned(false, {3}, nullptr)).ok());  // log only
    ASSERT_TRUE((*idx)->Flush().ok());
  }
  // Back to the version-2 layout: blocks keyed without ownership, event_log without it.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  const int rc =
      sqlite3_exec(db, (std::string(kV2Layout) + "PRAGMA user_version = 2; COMMIT;").c_str(),
                   nullptr, nullptr, &err);
  ASSERT_EQ(rc, SQLITE_OK) << (err ? err : "");
  sqlite3_close(db);
  using V = std::vector<std::string>;
  {
    IndexerOptions o;
    o.read_only = true;  // a read-only open reads a version-2 file as it is
    auto ro = Indexer::Open(path, o);
    ASSERT_TRUE(ro.ok()) << ro.status().ToString();
    EXPECT_EQ(HoldersOf(**ro, 3), (V{"CPU x1"}));
  }
  IndexerOptions o;
  o.background_thread = false;
  auto idx = Indexer::Open(path, o);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  EXPECT_EQ((*idx)->Stats().schema_version, 3);
  EXPECT_EQ(*(*idx)->LastSequence("s", 0), 2u);
  for (uint64_t h : {1, 2, 3}) EXPECT_EQ(HoldersOf(**idx, h), (V{"CPU x1"})) << h;
  ASSERT_TRUE((*idx)->ApplyBatch("s", 0, 3, Owned(false, {1}, "kvcr")).ok());
  ASSERT_TRUE((*idx)->ApplyBatch("s", 0, 4, Owned(true, {1}, nullptr)).ok());
  ASSERT_TRUE((*idx)->Flush().ok());
  ASSERT_TRUE((*idx)->Compact().ok());
  EXPECT_EQ(HoldersOf(**idx, 1), (V{"CPU/kvcr x1"}));
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db,
                               "SELECT ownership FROM block_entries WHERE engine_hash_hex = "
                               "'0000000000000001'",
                               -1, &q, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(q, 0)), "kvcr");
  sqlite3_finalize(q);
  sqlite3_close(db);
}

// A version-1 file (before registrations) gains the table at open, keeping its content.
TEST_F(RouterApiTest, Version1FileIsMigrated) {
  const std::string path = dir_.path() + "/v1.sqlite";
  {
    IndexerOptions o;
    o.background_thread = false;
    auto idx = Indexer::Open(path, o);
    ASSERT_TRUE(idx.ok()) << idx.status().ToString();
    ASSERT_TRUE((*idx)->ApplyBatch("s", 0, 5, Store(2, kMediumGpu, 0)).ok());
    ASSERT_TRUE((*idx)->Flush().ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         (std::string(kV2Layout) +
                          "DROP TABLE registrations; PRAGMA user_version = 1; COMMIT;")
                             .c_str(),
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  IndexerOptions o;
  o.background_thread = false;
  auto idx = Indexer::Open(path, o);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  EXPECT_EQ(*(*idx)->LastSequence("s", 0), 5u);
  auto regs = (*idx)->Registrations();
  ASSERT_TRUE(regs.ok()) << regs.status().ToString();
  EXPECT_TRUE(regs->empty());
  ASSERT_TRUE((*idx)->PutRegistration("a@default@0", "{}").ok());
  regs = (*idx)->Registrations();
  ASSERT_TRUE(regs.ok());
  ASSERT_EQ(regs->size(), 1u);
  EXPECT_EQ((*regs)[0].name, "a@default@0");
  EXPECT_EQ((*idx)->Stats().schema_version, Indexer::kSchemaVersion);
}

// A register loop cannot exhaust the daemon: beyond max_sources followed streams a registration
// is a 429 naming the limit, a multi-rank one that would cross it registers no rank, unregister
// makes room, and a restart under a lower limit still resumes every stored registration.
TEST_F(RouterApiTest, RegistrationsBeyondMaxSourcesAreRefusedAndNothingStoredIsLost) {
  max_sources_ = 3;
  auto svc = Start();
  ASSERT_NE(svc, nullptr);
  auto body = [&](const std::string& id, int ranks = 1) {
    // Several ranks need TCP (vLLM's port offsets); nothing listens there, which is fine.
    const int port = ranks > 1 ? FreePortPair() : 0;
    Json b =
        Json::parse(ranks > 1 ? RegisterBody("tcp://127.0.0.1:" + std::to_string(port), "", 0)
                              : RegisterBody("ipc://" + dir_.path() + "/" + id,
                                             "ipc://" + dir_.path() + "/" + id + "-replay", 0));
    b["instance_id"] = id;
    if (ranks > 1) {
      b["dp_ranks"] = ranks;
      b.erase("replay_endpoint");
    }
    return b.dump();
  };
  for (const char* id : {"a", "b"})
    ASSERT_EQ(Call(*svc, "POST", "/register", body(id)).status, 200);
  // Two ranks with one place left: refused whole.
  std::string err = Error(Call(*svc, "POST", "/register", body("c", 2)), 429);
  EXPECT_NE(err.find("--max-sources"), std::string::npos) << err;
  EXPECT_NE(err.find("limit is 3"), std::string::npos) << err;
  EXPECT_EQ(Ok(Call(*svc, "GET", "/workers"))["workers"].size(), 2u);
  ASSERT_EQ(Call(*svc, "POST", "/register", body("c")).status, 200);
  err = Error(Call(*svc, "POST", "/register", body("d")), 429);
  EXPECT_NE(err.find("3 streams are followed"), std::string::npos) << err;
  // Registering an already registered instance again stays idempotent at the limit.
  EXPECT_EQ(Call(*svc, "POST", "/register", body("a")).status, 200);
  Json unreg = Json::parse(body("b"));
  EXPECT_EQ(Ok(Call(*svc, "POST", "/unregister", unreg.dump()))["removed_instances"].size(), 1u);
  EXPECT_EQ(Call(*svc, "POST", "/register", body("d")).status, 200);
  EXPECT_EQ(Ok(Call(*svc, "GET", "/workers"))["workers"].size(), 3u);

  // A lower limit after a restart: every stored registration resumes; new ones are refused.
  svc->Stop();
  svc.reset();
  max_sources_ = 1;
  svc = Start();
  ASSERT_NE(svc, nullptr);
  EXPECT_EQ(Ok(Call(*svc, "GET", "/workers"))["workers"].size(), 3u);
  Error(Call(*svc, "POST", "/register", body("e")), 429);
  svc->Stop();
}

}  // namespace
}  // namespace kvo
