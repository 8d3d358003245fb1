// Discovery of vLLM engines (`--discover`, indexer/service/discovery.h): the /kv_event_sources
// parser (wildcard hosts rewritten, garbage refused naming the field), the bounded backoff schedule
// under a manual clock against a real HTTP server process that is down, then answers garbage, then
// answers; and the daemon following a two-rank engine whose publishers are real kvo publishers
// bound the vLLM way (tcp://*:P), including rank 1 restarting on a new port (old stream cleared,
// new one followed), the server answering garbage (other sources unaffected) and a restart of the
// indexer with the server down (registrations resume from the file). The HTTP server is a Python
// process (http.server) reading its answer from a file the test rewrites.
#include "indexer/service/discovery.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <functional>
#include <thread>

#include "events/zmq_publisher.h"
#include "indexer/service/service.h"
#include "tests/indexer/service_test_util.h"
#include "tests/testing/child_process.h"
#include "tests/testing/log_capture.h"
#include "tests/testing/manual_clock.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace kvo {
namespace {

using Json = nlohmann::json;
using namespace std::chrono_literals;

constexpr int64_t kBs = 16;

using testing::Eventually;
using testing::FreePort;

void WriteFile(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
  }
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
}

// A vLLM API server stand-in: GET /kv_event_sources answers the file's bytes as they are (so the
// test can make it answer garbage), GET /v1/models one model. Prints "ready" once it listens.
constexpr const char* kServerPy = R"PY(
import http.server, sys
port, answer = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/kv_event_sources":
            body = open(answer, "rb").read()
        elif self.path == "/v1/models":
            body = b'{"object": "list", "data": [{"id": "deepseek", "object": "model"}]}'
        else:
            self.send_response(404); self.end_headers(); return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer.allow_reuse_address = True
s = http.server.HTTPServer(("127.0.0.1", port), H)
print("ready", flush=True)
s.serve_forever()
)PY";

class ApiServer {
 public:
  ApiServer(const std::string& dir, int port) : port_(port), answer_(dir + "/answer.json") {
    script_ = dir + "/vllm_api_server.py";
    WriteFile(script_, kServerPy);
    if (!std::ifstream(answer_).good()) WriteFile(answer_, R"({"sources": []})");
  }
  void Start() {
    child_ = std::make_unique<testing::ChildProcess>(
        std::vector<std::string>{"/usr/bin/python3", script_, std::to_string(port_), answer_});
    auto line = child_->ReadStdoutLine(testing::SteadyClock::now() + 30s);
    ASSERT_TRUE(line && *line == "ready") << child_->err();
  }
  void Kill() {
    if (!child_) return;
    child_->Signal(SIGKILL);
    child_->Wait(testing::SteadyClock::now() + 30s);
    child_.reset();
  }
  void Answer(const std::string& body) { WriteFile(answer_, body); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int port_;
  std::string answer_;
  std::string script_;
  std::unique_ptr<testing::ChildProcess> child_;
};

TEST(KvEventSourcesTest, WildcardHostsAreRewrittenAndGarbageIsNamed) {
  auto s = ParseKvEventSources(
      R"({"sources": [
        {"data_parallel_rank": 1, "endpoint": "tcp://0.0.0.0:41236", "replay_endpoint": null,
         "topic": "kv"},
        {"data_parallel_rank": 0, "endpoint": "tcp://*:41234", "replay_endpoint": "tcp://*:41235",
         "topic": ""},
        {"data_parallel_rank": 2, "endpoint": "tcp://10.0.0.7:5557", "future_key": 1}]})",
      "10.1.2.3");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->size(), 3u);
  EXPECT_EQ((*s)[0].dp_rank, 0);
  EXPECT_EQ((*s)[0].endpoint, "tcp://10.1.2.3:41234");
  EXPECT_EQ((*s)[0].replay_endpoint, "tcp://10.1.2.3:41235");
  EXPECT_EQ((*s)[1].endpoint, "tcp://10.1.2.3:41236");
  EXPECT_FALSE((*s)[1].replay_endpoint.has_value());
  EXPECT_EQ((*s)[1].topic, "kv");
  EXPECT_EQ((*s)[2].endpoint, "tcp://10.0.0.7:5557");  // a named host is kept
  EXPECT_EQ(RewriteWildcardHost("tcp://[::]:9", "::1"), "tcp://[::1]:9");
  EXPECT_EQ(RewriteWildcardHost("ipc:///tmp/x", "h"), "ipc:///tmp/x");
  EXPECT_TRUE(EndpointOnHost("tcp://[::1]:9", "::1"));
  EXPECT_FALSE(EndpointOnHost("tcp://10.0.0.8:9", "10.0.0.7"));

  struct Case {
    const char* body;
    const char* names;
  };
  const Case cases[] = {
      {"<html>502 Bad Gateway</html>", "invalid JSON"},
      {"[]", "JSON object"},
      {R"({"data": []})", "'sources' is missing"},
      {R"({"sources": {}})", "'sources' must be an array"},
      {R"({"sources": [7]})", "'sources[0]' must be an object"},
      {R"({"sources": [{"data_parallel_rank": 0}]})", "'sources[0].endpoint'"},
      {R"({"sources": [{"data_parallel_rank": -1, "endpoint": "tcp://*:1"}]})",
       "'sources[0].data_parallel_rank'"},
      {R"({"sources": [{"data_parallel_rank": "0", "endpoint": "tcp://*:1"}]})",
       "'sources[0].data_parallel_rank'"},
      {R"({"sources": [{"endpoint": "tcp://*:1", "replay_endpoint": 5}]})",
       "'sources[0].replay_endpoint'"},
      {R"({"sources": [{"endpoint": "tcp://*:1"}, {"endpoint": "tcp://*:2"}]})",
       "'sources[1]': data_parallel_rank 0 is listed twice"},
  };
  for (const Case& c : cases) {
    auto r = ParseKvEventSources(c.body, "127.0.0.1");
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_NE(r.status().message().find(c.names), std::string::npos)
        << c.body << " -> " << r.status().ToString();
  }
  std::string many = R"({"sources": [)";
  for (int i = 0; i < 1025; ++i) many += std::string(i ? "," : "") + "{}";
  EXPECT_FALSE(ParseKvEventSources(many + "]}", "h").ok());
}

TEST(DiscoverFlagTest, ParsesAndRefuses) {
  auto t = ParseDiscoverFlag("http://10.0.0.5:8000/,model=deepseek,block_size=64,tenant_id=t1");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->url, "http://10.0.0.5:8000");
  EXPECT_EQ(t->address.host, "10.0.0.5");
  EXPECT_EQ(t->address.port, 8000);
  EXPECT_EQ(t->instance_id, "10.0.0.5:8000");
  EXPECT_EQ(t->model, "deepseek");
  EXPECT_EQ(t->block_size, 64);
  EXPECT_EQ(t->tenant_id, "t1");
  for (const char* bad :
       {"https://h:1", "http://h", "http://h:0", "http://h:1/v1", "h:1", "http://h:1,block_size=0",
        "http://h:1,colour=red", "http://h:1,x", "http://h:1,instance_id=a@b"}) {
    EXPECT_FALSE(ParseDiscoverFlag(bad).ok()) << bad;
  }
  auto cfg = ParseIndexerConfig(
      R"({"db": "x", "discover": ["http://127.0.0.1:8000",
           {"url": "http://127.0.0.1:8001", "instance_id": "e1", "block_size": 32}]})",
      "cfg");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  ASSERT_EQ(cfg->discover.size(), 2u);
  EXPECT_EQ(cfg->discover[1].instance_id, "e1");
  EXPECT_EQ(cfg->discover[1].block_size, 32);
  auto dup = ParseIndexerConfig(
      R"({"db": "x", "discover": ["http://127.0.0.1:8000", "http://127.0.0.1:8000/"]})", "cfg");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("given twice"), std::string::npos);
}

TEST(DiscoveryBackoffTest, DoublesUpToTheBound) {
  EXPECT_EQ(DiscoveryBackoffMs(1, 500, 30'000), 500);
  EXPECT_EQ(DiscoveryBackoffMs(2, 500, 30'000), 1'000);
  EXPECT_EQ(DiscoveryBackoffMs(7, 500, 30'000), 30'000);
  EXPECT_EQ(DiscoveryBackoffMs(1'000'000, 500, 30'000), 30'000);  // bounded, no overflow
}

// The schedule under a manual clock: down -> failures at 20, 40, 80, 80 ms; garbage -> a failure
// naming the field; then answers -> applied, next poll one interval later.
TEST(DiscovererTest, BackoffScheduleIsDeterministicOnTheClock) {
  testing::TempDir dir;
  const int port = FreePort();
  ApiServer server(dir.path(), port);
  auto target = ParseDiscoverFlag("http://127.0.0.1:" + std::to_string(port) + ",model=m");
  ASSERT_TRUE(target.ok());
  testing::ManualClock clock;
  DiscoveryOptions o;
  o.interval_ms = 1'000;
  o.retry_initial_ms = 20;
  o.retry_max_ms = 80;
  o.timeout_ms = 2'000;
  std::vector<std::vector<DiscoveredSource>> applied;
  Discoverer d(*target, o, &clock,
               [&](const DiscoverTarget&, const std::string& model,
                   const std::vector<DiscoveredSource>& list) {
                 EXPECT_EQ(model, "m");
                 applied.push_back(list);
                 return Status::Ok();
               });
  const int64_t expected_delays[] = {20, 40, 80, 80};
  for (int64_t delay : expected_delays) {
    ASSERT_TRUE(d.PollIfDue());  // due
    DiscoveryStatus st = d.status();
    EXPECT_EQ(st.state, DiscoveryPhase::kFailing);
    EXPECT_EQ(st.next_delay_ms, delay);
    EXPECT_NE(st.last_error.find("/kv_event_sources"), std::string::npos) << st.last_error;
    clock.AdvanceMicros(delay * 1000 - 1);
    EXPECT_FALSE(d.PollIfDue()) << "polled before its backoff of " << delay << " ms ended";
    clock.AdvanceMicros(1);
  }
  EXPECT_EQ(d.status().consecutive_failures, 4);
  server.Start();
  server.Answer("{\"sources\": [{\"data_parallel_rank\": 0, \"endpoint\": ");  // cut short
  ASSERT_TRUE(d.PollIfDue());
  EXPECT_EQ(d.status().consecutive_failures, 5);
  EXPECT_NE(d.status().last_error.find("invalid JSON"), std::string::npos) << d.status().last_error;
  EXPECT_TRUE(applied.empty());
  server.Answer(R"({"sources": [{"data_parallel_rank": 0, "endpoint": "tcp://*:5557",
                                 "replay_endpoint": "tcp://*:5558", "topic": ""}]})");
  clock.AdvanceMicros(80'000);
  ASSERT_TRUE(d.PollIfDue());
  DiscoveryStatus st = d.status();
  EXPECT_EQ(st.state, DiscoveryPhase::kOk);
  EXPECT_EQ(st.consecutive_failures, 0);
  EXPECT_EQ(st.failures, 5);
  EXPECT_EQ(st.next_delay_ms, 1'000);
  ASSERT_EQ(applied.size(), 1u);
  ASSERT_EQ(applied[0].size(), 1u);
  EXPECT_EQ(applied[0][0].endpoint, "tcp://127.0.0.1:5557");
  EXPECT_EQ(applied[0][0].replay_endpoint, "tcp://127.0.0.1:5558");
  clock.AdvanceMicros(999'999);
  EXPECT_FALSE(d.PollIfDue());
  server.Kill();
}

struct Publisher {
  std::unique_ptr<EventPublisher> pub;
  int port = 0;
  int replay = 0;
};

// A kvo publisher bound the vLLM way (every interface, its own ports), no journal.
Publisher MakePublisher() {
  Publisher p;
  p.port = FreePort();
  p.replay = FreePort();
  KvEventsConfig c;
  c.enable_kv_cache_events = true;
  c.publisher = "zmq";
  c.endpoint = "tcp://*:" + std::to_string(p.port);
  c.replay_endpoint = "tcp://*:" + std::to_string(p.replay);
  auto made = CreateEventPublisher(c, 0);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  if (made.ok()) p.pub = std::move(made).value();
  return p;
}

EventBatch Store(int64_t first_hash, int64_t blocks, int64_t rank) {
  BlockStored s;
  for (int64_t i = 0; i < blocks; ++i) s.block_hashes.push_back(BlockHash::Uint(first_hash + i));
  s.block_size = kBs;
  s.medium = kMediumGpu;
  return EventBatch{1700000000.0, {s}, rank};
}

std::string SourceEntry(int rank, const std::string& host, const Publisher& p) {
  return R"({"data_parallel_rank": )" + std::to_string(rank) + R"(, "endpoint": "tcp://)" + host +
         ":" + std::to_string(p.port) + R"(", "replay_endpoint": "tcp://)" + host + ":" +
         std::to_string(p.replay) + R"(", "topic": ""})";
}

class DiscoveryServiceTest : public ::testing::Test {
 protected:
  IndexerConfig Config(const std::string& url) {
    IndexerConfig c = service_test::FastConfig(dir_.path());
    c.discover_interval_ms = 50;
    c.discover_retry_initial_ms = 20;
    c.discover_retry_max_ms = 100;
    auto t = ParseDiscoverFlag(url + ",instance_id=engine-a");
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    c.discover.push_back(*t);
    return c;
  }
  std::unique_ptr<IndexerService> Start(const std::string& url) {
    ServiceOptions o;
    o.start_http = false;
    auto svc = IndexerService::Start(Config(url), o);
    EXPECT_TRUE(svc.ok()) << svc.status().ToString();
    return svc.ok() ? std::move(svc).value() : nullptr;
  }
  static Json Get(IndexerService& svc, const std::string& path, const std::string& body = "") {
    HttpRequest r;
    r.method = body.empty() ? "GET" : "POST";
    r.path = path;
    r.body = body;
    HttpResponse resp = svc.Handle(r);
    EXPECT_EQ(resp.status, 200) << path << ": " << resp.body;
    return Json::parse(resp.body);
  }
  // {rank: matched tokens} of engine-a for hashes first..first+n-1.
  static Json Dp(IndexerService& svc, int64_t first, int64_t n) {
    Json q = {{"model", "deepseek"}, {"block_size", kBs}, {"seq_hashes", Json::array()}};
    for (int64_t i = 0; i < n; ++i) q["seq_hashes"].push_back(first + i);
    HttpRequest r{"POST", "/query_by_hash", q.dump()};
    HttpResponse resp = svc.Handle(r);
    if (resp.status != 200) return Json(resp.body);
    Json j = Json::parse(resp.body);
    return j["default"].contains("engine-a") ? j["default"]["engine-a"]["DP"] : Json();
  }
  testing::TempDir dir_;
};

TEST_F(DiscoveryServiceTest, FollowsRanksRestartsOnNewPortsGarbageAndIndexerRestart) {
  Publisher r0 = MakePublisher();
  Publisher r1 = MakePublisher();
  ASSERT_TRUE(r0.pub && r1.pub);
  ApiServer server(dir_.path(), FreePort());
  // vLLM reports what it bound: rank 0 as tcp://*:P, rank 1 as tcp://0.0.0.0:P.
  server.Answer(R"({"sources": [)" + SourceEntry(0, "*", r0) + "," + SourceEntry(1, "0.0.0.0", r1) +
                "]}");
  server.Start();
  ASSERT_TRUE(r0.pub->Publish(Store(100, 4, 0)).ok());
  ASSERT_TRUE(r1.pub->Publish(Store(100, 2, 1)).ok());
  r0.pub->Flush();
  r1.pub->Flush();

  auto svc = Start(server.url());
  ASSERT_NE(svc, nullptr);
  // The model came from GET /v1/models; both ranks followed from the rewritten endpoints.
  const Json both = {{"0", 4 * kBs}, {"1", 2 * kBs}};
  ASSERT_TRUE(Eventually([&] { return Dp(*svc, 100, 6) == both; })) << Dp(*svc, 100, 6);
  Json workers = Get(*svc, "/workers");
  ASSERT_EQ(workers["workers"].size(), 2u);
  EXPECT_EQ(workers["workers"][0]["endpoint"], "tcp://127.0.0.1:" + std::to_string(r0.port));
  EXPECT_EQ(workers["workers"][1]["endpoint"], "tcp://127.0.0.1:" + std::to_string(r1.port));
  EXPECT_EQ(workers["workers"][0]["model_name"], "deepseek");

  // Rank 1's engine restarts on new ports (no journal: its sequence starts again at 0) with other
  // blocks: the old stream is cleared, the new one followed.
  r1.pub->Shutdown();
  r1.pub.reset();
  Publisher r1b = MakePublisher();
  ASSERT_TRUE(r1b.pub);
  ASSERT_TRUE(r1b.pub->Publish(Store(100, 1, 1)).ok());
  r1b.pub->Flush();
  server.Answer(R"({"sources": [)" + SourceEntry(0, "*", r0) + "," +
                SourceEntry(1, "0.0.0.0", r1b) + "]}");
  const Json moved = {{"0", 4 * kBs}, {"1", kBs}};
  ASSERT_TRUE(Eventually([&] { return Dp(*svc, 100, 6) == moved; })) << Dp(*svc, 100, 6);
  workers = Get(*svc, "/workers");
  ASSERT_EQ(workers["workers"].size(), 2u);
  EXPECT_EQ(workers["workers"][1]["endpoint"], "tcp://127.0.0.1:" + std::to_string(r1b.port));

  // The server answers garbage: logged and retried with backoff; the ranks keep being followed.
  server.Answer("{\"sources\": [{\"endpoint\": 5}]}");
  ASSERT_TRUE(Eventually([&] {
    Json d = Get(*svc, "/v1/discovery")["targets"][0];
    return d["state"] == "failing" && d["consecutive_failures"].get<int64_t>() >= 2;
  })) << Get(*svc, "/v1/discovery");
  Json d = Get(*svc, "/v1/discovery")["targets"][0];
  EXPECT_NE(d["last_error"].get<std::string>().find("'sources[0].endpoint'"), std::string::npos)
      << d;
  EXPECT_LE(d["next_delay_ms"].get<int64_t>(), 100);
  ASSERT_TRUE(r0.pub->Publish(Store(100, 5, 0)).ok());
  r0.pub->Flush();
  const Json grown = {{"0", 5 * kBs}, {"1", kBs}};
  ASSERT_TRUE(Eventually([&] { return Dp(*svc, 100, 6) == grown; })) << Dp(*svc, 100, 6);

  // The indexer restarts while the API server is down: the discovered ranks resume from the file.
  svc->Stop();
  svc.reset();
  server.Kill();
  svc = Start(server.url());
  ASSERT_NE(svc, nullptr);
  EXPECT_EQ(Get(*svc, "/workers")["workers"].size(), 2u);
  EXPECT_EQ(Dp(*svc, 100, 6), grown);
  ASSERT_TRUE(
      Eventually([&] { return Get(*svc, "/v1/discovery")["targets"][0]["state"] == "failing"; }));
  // The server comes back listing rank 0 only: rank 1 is unregistered, its entries cleared.
  server.Answer(R"({"sources": [)" + SourceEntry(0, "*", r0) + "]}");
  server.Start();
  const Json only0 = {{"0", 5 * kBs}};
  ASSERT_TRUE(Eventually([&] {
    return Dp(*svc, 100, 6) == only0 && !svc->index().LastSequence("engine-a@default@1", 1).ok();
  })) << Dp(*svc, 100, 6);
  svc->Stop();
  server.Kill();
  r0.pub->Shutdown();
  r1b.pub->Shutdown();
}

// A rank a router registered and discovery later lists, and a rank discovery registered that a
// router registers again with the same body: the same subscription either way. Discovery used to
// compare who registered it too: it "moved" the router's rank (cleared its entries and registered
// it again), and the router's repeated /register got 409 naming 'discovered_from'.
TEST_F(DiscoveryServiceTest, ARankRegisteredByARouterAndByDiscoveryIsOneSubscription) {
  Publisher r0 = MakePublisher();
  Publisher r1 = MakePublisher();
  ASSERT_TRUE(r0.pub && r1.pub);
  ASSERT_TRUE(r0.pub->Publish(Store(100, 4, 0)).ok());
  ASSERT_TRUE(r1.pub->Publish(Store(100, 2, 1)).ok());
  r0.pub->Flush();
  r1.pub->Flush();
  ApiServer server(dir_.path(), FreePort());
  server.Answer(R"({"sources": [)" + SourceEntry(1, "*", r1) + "]}");  // rank 1 only, at first
  server.Start();
  testing::LogCapture log;
  auto svc = Start(server.url());
  ASSERT_NE(svc, nullptr);
  const Json rank1 = {{"1", 2 * kBs}};
  ASSERT_TRUE(Eventually([&] { return Dp(*svc, 100, 6) == rank1; })) << Dp(*svc, 100, 6);
  // The router registers rank 0 itself, and rank 1 again with the body discovery's entry implies.
  Json workers = Get(*svc, "/workers")["workers"];
  ASSERT_EQ(workers.size(), 1u);
  Json body = {{"endpoint", "tcp://127.0.0.1:" + std::to_string(r0.port)},
               {"replay_endpoint", "tcp://127.0.0.1:" + std::to_string(r0.replay)},
               {"type", workers[0]["type"]},
               {"modelname", workers[0]["model_name"]},
               {"instance_id", "engine-a"},
               {"block_size", workers[0]["block_size"]},
               {"dp_rank", 0}};
  EXPECT_EQ(Get(*svc, "/register", body.dump())["status"], "registered successfully");
  Json again = body;
  again["endpoint"] = workers[0]["endpoint"];
  again["replay_endpoint"] = workers[0]["replay_endpoint"];
  again["dp_rank"] = 1;
  EXPECT_EQ(Get(*svc, "/register", again.dump())["status"], "registered successfully");
  const Json both = {{"0", 4 * kBs}, {"1", 2 * kBs}};
  ASSERT_TRUE(Eventually([&] { return Dp(*svc, 100, 6) == both; })) << Dp(*svc, 100, 6);
  // Now discovery lists rank 0 too: it is left as the router registered it.
  server.Answer(R"({"sources": [)" + SourceEntry(0, "*", r0) + "," + SourceEntry(1, "*", r1) +
                "]}");
  const int64_t polls = Get(*svc, "/v1/discovery")["targets"][0]["polls"].get<int64_t>();
  ASSERT_TRUE(Eventually([&] {
    Json d = Get(*svc, "/v1/discovery")["targets"][0];
    return d["polls"].get<int64_t>() >= polls + 3 && d["sources"] == 2;
  })) << Get(*svc, "/v1/discovery");
  EXPECT_EQ(Dp(*svc, 100, 6), both);
  svc->Stop();
  svc.reset();
  EXPECT_TRUE(log.Matching({"moved from"}).empty()) << log.Matching({"moved from"})[0];
  for (const std::string& cleared : log.Matching({"clear"})) ADD_FAILURE() << cleared;
  server.Kill();
  r0.pub->Shutdown();
  r1.pub->Shutdown();
}

}  // namespace
}  // namespace kvo
