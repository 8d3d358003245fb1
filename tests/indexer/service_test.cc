// The daemon in-process: DP-rank restarts, malformed messages, silent and unbindable sources,
// the HTTP routes. Real sockets (inproc/ipc/tcp) and a real SQLite file; synchronisation by
// polling the service's own status with a deadline.
#include "indexer/service/service.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "events/codec.h"
#include "events/zmq_publisher.h"
#include "tests/indexer/service_test_util.h"
#include "tests/testing/log_capture.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace kvo {
namespace {

using Json = nlohmann::json;
using namespace std::chrono_literals;

EventBatch Store(uint64_t hash, int64_t rank, const char* medium = kMediumGpu) {
  BlockStored s;
  s.block_hashes = {BlockHash::Uint(hash)};
  s.token_ids = {1, 2, 3, 4};
  s.block_size = 4;
  s.medium = medium;
  s.group_idx = 0;
  return EventBatch{1700000000.0, {s}, rank};
}

// Polls `cond` until it holds or 30 s pass (a failure guard, not a synchronisation sleep).
using testing::Eventually;
using testing::FreePortPair;

const StreamStatus* Stream(const std::vector<SourceStatus>& all, const std::string& source,
                           int64_t rank) {
  for (const SourceStatus& s : all) {
    if (s.name != source) continue;
    for (const StreamStatus& st : s.streams) {
      if (st.dp_rank == rank) return &st;
    }
  }
  return nullptr;
}

bool AtSeq(IndexerService& svc, const std::string& source, int64_t rank, uint64_t seq) {
  auto all = svc.Sources();
  const StreamStatus* st = Stream(all, source, rank);
  return st != nullptr && st->has_seq && st->last_seq == seq;
}

int64_t PrefixOf(IndexerService& svc, const std::string& source, int64_t rank, uint64_t hash) {
  ScoreQuery q;
  q.block_hashes = {hash};
  auto r = svc.index().Score(q);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return -1;
  for (const InstanceScore& s : r->instances) {
    if (s.source == source && s.dp_rank == rank) return s.prefix_blocks;
  }
  return 0;
}

class ServiceTest : public ::testing::Test {
 protected:
  IndexerConfig Config() {
    IndexerConfig c = service_test::FastConfig(dir_.path());
    return c;
  }
  testing::TempDir dir_;
};

// A restart of one DP rank clears that rank's stream only: the sibling rank keeps its entries
// and its checkpoint (nothing re-applied), the restarted rank rebuilds from what follows.
TEST_F(ServiceTest, OneRankRestartClearsOnlyThatRank) {
  // TCP: offset ports per rank, and a restarted rank can bind its port again at once.
  int port = FreePortPair();
  int replay_port = FreePortPair();
  KvEventsConfig pc;
  pc.enable_kv_cache_events = true;
  pc.publisher = "zmq";
  pc.endpoint = "tcp://*:" + std::to_string(port);
  pc.replay_endpoint = "tcp://*:" + std::to_string(replay_port);
  auto r0 = CreateEventPublisher(pc, 0);
  auto r1 = CreateEventPublisher(pc, 1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  for (uint64_t i = 0; i < 30; ++i) {
    ASSERT_TRUE((*r0)->Publish(Store(1000 + i, 0)).ok());
    ASSERT_TRUE((*r1)->Publish(Store(2000 + i, 1)).ok());
  }
  (*r0)->Flush();
  (*r1)->Flush();
  IndexerConfig c = Config();
  SourceConfig s;
  s.name = "dp";
  s.endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  s.replay_endpoint = "tcp://127.0.0.1:" + std::to_string(replay_port);
  s.dp_ranks = 2;
  c.sources = {s};
  auto svc = IndexerService::Start(c);
  ASSERT_TRUE(svc.ok()) << svc.status().ToString();
  IndexerService& service = **svc;
  ASSERT_TRUE(
      Eventually([&] { return AtSeq(service, "dp", 0, 29) && AtSeq(service, "dp", 1, 29); }));
  EXPECT_EQ(PrefixOf(service, "dp", 0, 1005), 1);
  EXPECT_EQ(PrefixOf(service, "dp", 1, 2005), 1);

  (*r1)->Shutdown();
  // Rank 1 restarts: sequence back to 0, nothing held. ZeroMQ releases the port asynchronously.
  ASSERT_TRUE(Eventually([&] {
    r1 = CreateEventPublisher(pc, 1);
    return r1.ok();
  })) << r1.status().ToString();
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE((*r1)->Publish(Store(3000 + i, 1)).ok());
  (*r1)->Flush();
  ASSERT_TRUE(Eventually([&] {
    auto all = service.Sources();
    const StreamStatus* st1 = Stream(all, "dp", 1);
    return AtSeq(service, "dp", 1, 4) && AtSeq(service, "dp", 0, 29) && st1 != nullptr &&
           st1->source_clears >= 1 && PrefixOf(service, "dp", 0, 1005) == 1;
  }));
  EXPECT_EQ(PrefixOf(service, "dp", 1, 2005), 0);  // the old rank-1 state is gone
  EXPECT_EQ(PrefixOf(service, "dp", 1, 3004), 1);
  EXPECT_EQ(PrefixOf(service, "dp", 0, 1029), 1);  // rank 0 untouched
  auto all = service.Sources();
  const StreamStatus* st0 = Stream(all, "dp", 0);
  ASSERT_NE(st0, nullptr);
  EXPECT_EQ(st0->source_clears, 0u);
  EXPECT_EQ(st0->batches_applied, 30u);  // applied once: no replay from scratch
  service.Stop();
  (*r0)->Shutdown();
  (*r1)->Shutdown();
}

// Issue 10 item 3: a vLLM-style publisher (no journal) restarts and its new sequence overtakes the
// old one at once. Before: the index became the old 300 batches plus the new ones from seq 300
// (no restart seen, no clear). Now: the stream is cleared and holds exactly the new stream.
TEST_F(ServiceTest, OvertakingRestartWithoutJournalClearsAndRebuilds) {
  KvEventsConfig pc;
  pc.enable_kv_cache_events = true;
  pc.publisher = "zmq";
  pc.endpoint = "ipc://" + dir_.path() + "/ov.pub";
  pc.replay_endpoint = "ipc://" + dir_.path() + "/ov.replay";
  IndexerConfig c = Config();
  c.idle_probe_ms = 1000;
  SourceConfig s;
  s.name = "ov";
  s.endpoint = pc.endpoint;
  s.replay_endpoint = pc.replay_endpoint;
  c.sources = {s};
  auto svc = IndexerService::Start(c);
  ASSERT_TRUE(svc.ok()) << svc.status().ToString();
  IndexerService& service = **svc;
  {
    auto old_pub = CreateEventPublisher(pc, 0);
    ASSERT_TRUE(old_pub.ok());
    for (uint64_t i = 0; i < 300; ++i) ASSERT_TRUE((*old_pub)->Publish(Store(1000 + i, 0)).ok());
    (*old_pub)->Flush();
    ASSERT_TRUE(Eventually([&] { return AtSeq(service, "ov", 0, 299); }));
    (*old_pub)->Shutdown();
  }
  auto new_pub = CreateEventPublisher(pc, 0);
  ASSERT_TRUE(new_pub.ok());
  for (uint64_t i = 0; i < 3000; ++i) ASSERT_TRUE((*new_pub)->Publish(Store(50000 + i, 0)).ok());
  (*new_pub)->Flush();
  EXPECT_TRUE(Eventually([&] {
    return AtSeq(service, "ov", 0, 2999) && PrefixOf(service, "ov", 0, 50100) == 1 &&
           PrefixOf(service, "ov", 0, 1100) == 0 && PrefixOf(service, "ov", 0, 1299) == 0;
  }));
  EXPECT_EQ(PrefixOf(service, "ov", 0, 1100), 0);  // the old stream's entries are gone
  EXPECT_EQ(PrefixOf(service, "ov", 0, 50000), 1);
  EXPECT_EQ(PrefixOf(service, "ov", 0, 52999), 1);
  auto all = service.Sources();
  const StreamStatus* st = Stream(all, "ov", 0);
  ASSERT_NE(st, nullptr);
  EXPECT_GE(st->source_clears, 1u);
  EXPECT_GE(st->restarts_seen, 1u);
  service.Stop();
  (*new_pub)->Shutdown();
}

// Frames that are not a batch are counted and skipped; the source keeps going. An XPUB socket
// tells the test when the daemon's SUB has subscribed, so nothing is sent into the void.
TEST_F(ServiceTest, MalformedMessagesAreCountedAndTheSourceKept) {
  zmq::context_t ctx;
  zmq::socket_t xpub(ctx, zmq::socket_type::xpub);
  xpub.set(zmq::sockopt::linger, 0);
  std::string ep = "ipc://" + dir_.path() + "/raw.pub";
  xpub.bind(ep);
  IndexerConfig c = Config();
  SourceConfig s;
  s.name = "raw";
  s.endpoint = ep;
  c.sources = {s};
  auto svc = IndexerService::Start(c);
  ASSERT_TRUE(svc.ok()) << svc.status().ToString();
  zmq::message_t sub;
  xpub.set(zmq::sockopt::rcvtimeo, 30000);
  ASSERT_TRUE(xpub.recv(sub));  // the subscription: the daemon is connected
  auto send = [&](std::vector<std::string> frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      xpub.send(zmq::buffer(frames[i]),
                i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  };
  auto seq = [](uint64_t v) {
    std::string b(8, '\0');
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (56 - 8 * i));
    return b;
  };
  send({"", seq(0), EncodeBatch(Store(7, 0))});
  send({"", seq(1), "\x93\xc1 not msgpack"});  // undecodable payload
  send({"", "short"});                         // wrong frame count
  send({"", seq(2), EncodeBatch(Store(8, 0))});
  ASSERT_TRUE(Eventually([&] { return AtSeq(**svc, "raw", 0, 2); }));
  auto all = (*svc)->Sources();
  const StreamStatus* st = Stream(all, "raw", 0);
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->decode_errors, 1u);
  EXPECT_EQ(st->malformed_messages, 1u);
  EXPECT_EQ(st->batches_applied, 2u);
  EXPECT_EQ(PrefixOf(**svc, "raw", 0, 8), 1);
  std::string metrics = (*svc)->Handle({"GET", "/metrics", ""}).body;
  EXPECT_NE(metrics.find("kvo_indexer_decode_errors_total{source=\"raw\",dp_rank=\"0\"} 1.0"),
            std::string::npos)
      << metrics;
}

// A publisher that never answers is reported (not connected, with the reason), and a SUB that
// cannot bind is retried with backoff until it can.
TEST_F(ServiceTest, SilentAndUnbindableSourcesAreReportedAndRetried) {
  // A TCP port held by someone else: bind=true sources cannot take it.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  int port = ntohs(a.sin_port);

  IndexerConfig c = Config();
  SourceConfig silent;
  silent.name = "silent";
  silent.endpoint = "ipc://" + dir_.path() + "/nobody.pub";
  silent.replay_endpoint = "ipc://" + dir_.path() + "/nobody.replay";
  SourceConfig busy;
  busy.name = "busy";
  busy.endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  busy.bind = true;
  c.sources = {silent, busy};
  testing::LogCapture log;
  auto svc = IndexerService::Start(c);
  ASSERT_TRUE(svc.ok()) << svc.status().ToString();
  ASSERT_TRUE(Eventually([&] {
    auto all = (*svc)->Sources();
    const StreamStatus* b = Stream(all, "busy", 0);
    const StreamStatus* q = Stream(all, "silent", 0);
    return b && q && b->state == StreamPhase::kRetrying && b->connect_failures >= 9 &&
           q->last_error.find("nothing received") != std::string::npos;
  }));
  auto all = (*svc)->Sources();
  EXPECT_FALSE(Stream(all, "silent", 0)->connected);
  EXPECT_FALSE(all[0].connected);
  HttpResponse sources = (*svc)->Handle({"GET", "/v1/sources", ""});
  Json j = Json::parse(sources.body);
  EXPECT_EQ(j["sources"][1]["streams"][0]["state"], "retrying");
  EXPECT_NE(
      j["sources"][1]["streams"][0]["last_error"].get<std::string>().find(std::to_string(port)),
      std::string::npos)
      << sources.body;
  const auto closed = std::chrono::steady_clock::now();
  ::close(fd);  // the port is free: the retry succeeds
  ASSERT_TRUE(Eventually([&] {
    auto now = (*svc)->Sources();
    return Stream(now, "busy", 0)->state != StreamPhase::kRetrying;
  }));
  // The warnings: the 1st, 2nd, 4th, 8th, ... failure of the run is logged (with the port and how
  // many were left out), then one line when the subscription succeeds. Before, every retry of
  // every stream logged a line.
  ASSERT_TRUE(Eventually([&] { return log.Matching({"'busy'", "subscribed after"}).size() == 1; }));
  const int64_t failures = Stream((*svc)->Sources(), "busy", 0)->connect_failures;
  ASSERT_GE(failures, 9);
  std::vector<std::string> warned = log.Matching({"warning", "'busy'", "cannot subscribe"});
  int64_t expected = 0;
  for (int64_t n = 1; n <= failures; n *= 2) ++expected;
  EXPECT_EQ(static_cast<int64_t>(warned.size()), expected) << failures << " failures";
  ASSERT_FALSE(warned.empty());
  EXPECT_NE(warned[0].find(std::to_string(port)), std::string::npos) << warned[0];
  EXPECT_NE(warned.back().find(" in a row, "), std::string::npos) << warned.back();
  EXPECT_EQ(
      log.Matching({"'busy'", "subscribed after " + std::to_string(failures) + " failed"}).size(),
      1U);
  // Silence counts from the subscription: nobody publishes, so the stream reports itself silent,
  // but for no longer than it has been subscribed (it used to count from the stream's start, with
  // the >= 1.3 s of failed binds).
  std::vector<std::string> quiet;
  ASSERT_TRUE(Eventually([&] {
    quiet = log.Matching({"'busy'", "nothing received for "});
    return !quiet.empty();
  }));
  const double since_close =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - closed).count();
  const size_t at = quiet[0].find("nothing received for ") + std::strlen("nothing received for ");
  const double reported = std::stod(quiet[0].substr(at));
  EXPECT_LE(reported, since_close + 0.1) << quiet[0];
}

// 404 and 405 answers name the path and method cut short, never the whole of them (a path may
// be as long as the 16 KiB header limit; the answers used to echo it whole).
TEST_F(ServiceTest, UnknownPathsAndMethodsAreNamedCutShort) {
  auto svc = IndexerService::Start(Config());
  ASSERT_TRUE(svc.ok()) << svc.status().ToString();
  const std::string long_path = "/" + std::string(10'000, 'z');
  const std::string long_method(5'000, 'M');
  struct Case {
    std::string method, path;
    int status;
  };
  for (const Case& c :
       std::vector<Case>{{"GET", long_path, 404},
                         {long_method, "/v1/score", 405},
                         {long_method, "/", 405},
                         {"POST", "/v1/instances/" + long_path.substr(1) + "/blocks", 405},
                         {"GET", "/v1/instances/" + long_path.substr(1) + "/blocks", 404}}) {
    HttpResponse r = (*svc)->Handle({c.method, c.path, ""});
    EXPECT_EQ(r.status, c.status) << c.method.substr(0, 8) << " " << c.path.substr(0, 40);
    EXPECT_LT(r.body.size(), 300U) << r.body.substr(0, 300);
    EXPECT_TRUE(Json::parse(r.body).contains("error")) << r.body.substr(0, 300);
  }
}

TEST_F(ServiceTest, HttpRoutes) {
  IndexerConfig c = Config();
  SourceConfig s;
  s.name = "a";
  s.endpoint = "ipc://" + dir_.path() + "/a.pub";
  c.sources = {s};
  auto svc = IndexerService::Start(c);
  ASSERT_TRUE(svc.ok()) << svc.status().ToString();
  ASSERT_GT((*svc)->http_port(), 0);
  HttpAddress addr{"127.0.0.1", (*svc)->http_port()};
  auto health = HttpCall(addr, "GET", "/healthz", "", 5000);
  ASSERT_TRUE(health.ok()) << health.status().ToString();
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(Json::parse(health->body)["status"], "ok");
  auto score = HttpCall(addr, "POST", "/v1/score", R"({"token_ids": [1, 2, 3, 4]})", 5000);
  ASSERT_TRUE(score.ok());
  EXPECT_EQ(score->status, 200) << score->body;
  Json answer = Json::parse(score->body);
  EXPECT_EQ(answer["block_size"], 16);
  ASSERT_EQ(answer["instances"].size(), 1u);  // configured, nothing published yet: a zero entry
  EXPECT_EQ(answer["instances"][0]["source"], "a");
  EXPECT_EQ(answer["instances"][0]["prefix_blocks"], 0);
  auto bad = HttpCall(addr, "POST", "/v1/score", R"({"token_ids": "x"})", 5000);
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(Json::parse(bad->body)["error"].get<std::string>().find("token_ids"),
            std::string::npos);
  auto missing = HttpCall(addr, "GET", "/nope", "", 5000);
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status, 404);
  (*svc)->Stop();
  (*svc)->Stop();  // idempotent
}

}  // namespace
}  // namespace kvo
