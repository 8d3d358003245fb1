// The HTTP server in-process (issue 10 items 2, 6, 8): slow, idle and excess connections and slow
// handlers do not delay /healthz; body limits hold for chunked bodies; a body is delivered
// whatever its Content-Type; every refusal is a JSON {"error"}.
#include "http/http_server.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/raw_http.h"

namespace kvo {
namespace {

using Clock = std::chrono::steady_clock;
using Conn = testing::RawHttpConn;
using testing::RawPost;

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(HttpServerOptions o = {}) {
    o.address.host = "127.0.0.1";
    o.address.port = 0;
    auto s = HttpServer::Start(o, [this](const HttpRequest& r) { return Handle(r); });
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
  }
  void TearDown() override {
    Release();
    if (server_) server_->Stop();
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

  HttpResponse Handle(const HttpRequest& r) {
    if (r.path == "/slow") {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(30), [this] { return released_; });
    }
    if (r.path == "/healthz") return HttpResponse{200, "application/json", "{\"status\":\"ok\"}"};
    if (r.path == "/early" || r.path == "/late")
      return HttpResponse{200, "text/plain", Digest(r.body)};
    if (r.path == "/arriving-answer-first") {
      answered_first_.fetch_add(1);
      return HttpResponse{200, "text/plain", "first"};
    }
    if (r.path == "/after-sent") {
      // Answers at once; after_sent waits for Release, then digests the body it was given.
      const char* data = r.arriving != nullptr ? r.arriving->data() : r.body.data();
      const size_t size = r.arriving != nullptr ? r.arriving->size() : r.body.size();
      HttpResponse res{200, "text/plain", "answered"};
      res.after_sent = [this, data, size] {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::seconds(30), [this] { return released_; });
        after_digests_.push_back(Digest(std::string(data, size)));
        cv_.notify_all();
      };
      return res;
    }
    if (r.path == "/arriving" && r.arriving != nullptr) {
      // The digest of each piece as it lands (only what WaitBeyond announced is read).
      const ArrivingBody& body = *r.arriving;
      uint64_t h = kFnvBasis;
      for (size_t have = 0; have < body.size();) {
        const size_t now = body.WaitBeyond(have);
        if (now <= have) return HttpResponse{500, "text/plain", "the body never came"};
        if (now < body.size()) arriving_pieces_.fetch_add(1);
        h = Fnv(h, body.data() + have, now - have);
        have = now;
      }
      return HttpResponse{200, "text/plain", std::to_string(body.size()) + ":" + std::to_string(h)};
    }
    if (r.path == "/arriving") return HttpResponse{200, "text/plain", Digest(r.body)};
    return HttpResponse{200, "application/json",
                        "{\"method\":\"" + r.method + "\",\"path\":\"" + r.path +
                            "\",\"bytes\":" + std::to_string(r.body.size()) + "}"};
  }

  // What the body handlers answer: its size and FNV-1a, so a byte lost, doubled or moved shows.
  static constexpr uint64_t kFnvBasis = 1469598103934665603ULL;
  static uint64_t Fnv(uint64_t h, const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ULL;
    return h;
  }
  static std::string Digest(const std::string& body) {
    return std::to_string(body.size()) + ":" +
           std::to_string(Fnv(kFnvBasis, body.data(), body.size()));
  }

  // Latency of GET /healthz on a fresh connection; -1 when unanswered within 2 s.
  double HealthzMs() {
    const auto t0 = Clock::now();
    Conn c(server_->port());
    if (!c.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")) return -1;
    if (c.Read(2000).status != 200) return -1;
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }

  std::unique_ptr<HttpServer> server_;
  std::atomic<int> arriving_pieces_{0};  // pieces /arriving's handler read before the body was in
  std::atomic<int> answered_first_{0};   // /arriving-answer-first's handler has returned
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
  std::vector<std::string> after_digests_;  // what /after-sent's after_sent read, under mu_
};

// Before (cpp-httplib, 4 workers each held by a connection): every probe timed out.
TEST_F(HttpServerTest, SlowIdleConnectionsAndSlowHandlersDoNotDelayHealthz) {
  StartServer();
  const int port = server_->port();
  std::vector<std::unique_ptr<Conn>> conns;
  for (int i = 0; i < 8; ++i) conns.push_back(std::make_unique<Conn>(port));  // idle
  for (int i = 0; i < 8; ++i) {                                               // slow headers
    conns.push_back(std::make_unique<Conn>(port));
    ASSERT_TRUE(conns.back()->Send("GET /healthz HT"));
  }
  for (int i = 0; i < 4; ++i) {  // every worker busy in a slow handler
    conns.push_back(std::make_unique<Conn>(port));
    ASSERT_TRUE(conns.back()->Send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"));
  }
  // Every probe answered (the 100 ms target is measured by tests/faults/http_faults_test.cc; a
  // loaded CI machine cannot promise it here).
  std::vector<double> ms;
  for (int i = 0; i < 20; ++i) ms.push_back(HealthzMs());
  std::sort(ms.begin(), ms.end());
  EXPECT_GE(ms.front(), 0) << "a /healthz went unanswered within 2 s";
  std::printf(
      "healthz with 8 idle, 8 slow connections, 4 busy workers: median %.1f ms, max %.1f ms\n",
      ms[10], ms.back());
  // The slow handlers answer once released; an ordinary request waits for a worker, then runs.
  Conn other(port);
  ASSERT_TRUE(other.Send(RawPost("/v1/score", "{}")));
  Release();
  EXPECT_EQ(other.Read(5000).status, 200);
}

TEST_F(HttpServerTest, HeaderDeadlineClosesSlowAndIdleConnections) {
  HttpServerOptions o;
  o.header_timeout_ms = 300;
  o.keep_alive_timeout_ms = 300;
  StartServer(o);
  Conn idle(server_->port());
  Conn slow(server_->port());
  ASSERT_TRUE(slow.Send("GET /heal"));
  Conn kept(server_->port());
  ASSERT_TRUE(kept.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(kept.Read(2000).status, 200);
  EXPECT_TRUE(idle.ClosedWithin(3000));
  EXPECT_TRUE(slow.ClosedWithin(3000));
  EXPECT_TRUE(kept.ClosedWithin(3000));  // idle after its answer
}

TEST_F(HttpServerTest, BodyOfAnyContentTypeIsDelivered) {
  StartServer();
  // What curl -d sends: form-encoded, Expect: 100-continue (before: 413, empty body, > 8 KiB).
  const std::string body = "{\"token_ids\":[" + std::string(20000, '1') + "]}";
  Conn c(server_->port());
  ASSERT_TRUE(
      c.Send("POST /v1/score?x=1 HTTP/1.1\r\nHost: x\r\nContent-Type: "
             "application/x-www-form-urlencoded\r\nExpect: 100-continue\r\n"
             "Content-Length: " +
             std::to_string(body.size()) + "\r\n\r\n"));
  EXPECT_EQ(c.Read(2000).status, 100);
  ASSERT_TRUE(c.Send(body));
  auto r = c.Read(5000);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "{\"method\":\"POST\",\"path\":\"/v1/score\",\"bytes\":" +
                        std::to_string(body.size()) + "}");
  // Keep-alive: a second request on the same connection, chunked this time.
  ASSERT_TRUE(
      c.Send("POST /v1/score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
             "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
  r = c.Read(5000);
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"bytes\":5"), std::string::npos) << r.body;
}

// Before: chunked bodies ignored the limit (300 MiB accepted with a 64 MiB limit).
TEST_F(HttpServerTest, BodyLimitsHoldForChunkedBodiesAndRefusalsAreJson) {
  HttpServerOptions o;
  o.max_body_bytes = 1 << 20;
  StartServer(o);
  {
    Conn c(server_->port());
    ASSERT_TRUE(c.Send("POST /v1/score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
    const std::string chunk = "10000\r\n" + std::string(1 << 16, ' ') + "\r\n";
    int sent = 0;
    while (sent < 400 && !c.Readable() && c.Send(chunk)) ++sent;
    auto r = c.Read(5000);
    EXPECT_EQ(r.status, 413);
    EXPECT_NE(r.body.find("\"error\":\"request body larger than the limit of 1048576 bytes"),
              std::string::npos)
        << r.body;
    // 16 chunks reach the limit; socket buffers absorb a few MiB more before the answer is seen.
    EXPECT_LT(sent, 200) << "64 KiB chunks sent before the refusal";
  }
  {
    Conn c(server_->port());
    ASSERT_TRUE(c.Send("POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n"));
    auto r = c.Read(5000);
    EXPECT_EQ(r.status, 413);
    EXPECT_NE(r.body.find("\"error\""), std::string::npos);
  }
  {
    Conn c(server_->port());
    ASSERT_TRUE(c.Send("NOT HTTP AT ALL\r\n\r\n"));
    auto r = c.Read(5000);
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.body.find("\"error\":\"malformed HTTP request"), std::string::npos) << r.body;
  }
}

TEST_F(HttpServerTest, BoundsBodyBytesInFlight) {
  HttpServerOptions o;
  o.max_body_bytes_in_flight = 1 << 20;
  StartServer(o);
  Conn big(server_->port());  // claims 800 KB of the 1 MiB budget, sends none of it yet
  ASSERT_TRUE(big.Send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 800000\r\n\r\n"));
  Conn second(server_->port());
  ASSERT_TRUE(second.Send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 800000\r\n\r\n"));
  auto r = second.Read(5000);
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("request bodies in flight"), std::string::npos) << r.body;
  EXPECT_TRUE(second.ClosedWithin(5000));
}

TEST_F(HttpServerTest, BoundsConnections) {
  HttpServerOptions o;
  o.max_connections = 4;
  StartServer(o);
  Conn big(server_->port());
  std::vector<std::unique_ptr<Conn>> conns;
  for (int i = 0; i < 3; ++i) conns.push_back(std::make_unique<Conn>(server_->port()));
  // `big` and these three are the 4 allowed; wait until the server has counted them.
  ASSERT_TRUE(conns.back()->Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(conns.back()->Read(5000).status, 200);
  Conn excess(server_->port());
  auto r = excess.Read(5000);
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("too many connections"), std::string::npos) << r.body;
}

TEST_F(HttpServerTest, StopClosesOpenConnectionsPromptly) {
  StartServer();
  Conn idle(server_->port());
  Conn kept(server_->port());
  ASSERT_TRUE(kept.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(kept.Read(2000).status, 200);
  const auto t0 = Clock::now();
  server_->Stop();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  EXPECT_TRUE(idle.ClosedWithin(1000));
  EXPECT_TRUE(kept.ClosedWithin(1000));
}

// Early paths (HttpServerOptions::early_paths): a worker follows a large body while the I/O thread
// reads it and serves the request once it is complete.
class HttpEarlyBodyTest : public HttpServerTest {
 protected:
  void StartEarly(int workers, int body_timeout_ms = 30000) {
    HttpServerOptions o;
    o.worker_threads = workers;
    o.early_paths = {"/early", "/arriving", "/arriving-answer-first", "/after-sent"};
    o.arriving_paths = {"/arriving", "/arriving-answer-first", "/after-sent"};
    o.max_early_requests = 1;
    o.body_timeout_ms = body_timeout_ms;
    StartServer(o);
  }
  static std::string Body(std::mt19937_64& rng, size_t n) {
    std::string b(n, ' ');
    for (char& c : b) c = static_cast<char>('!' + rng() % 90);
    return b;
  }
  static std::string Head(const std::string& path, size_t length, bool expect = false) {
    return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(length) +
           (expect ? "\r\nExpect: 100-continue" : "") + "\r\n\r\n";
  }
  // A small request on a worker (not the priority lane): answered means a worker is free.
  bool WorkerAnswers() {
    Conn c(server_->port());
    return c.Send(RawPost("/x", "{}")) && c.Read(5000).status == 200;
  }
  // Waits (bounded) until the server has handed `n` bodies to a follower.
  bool FollowedWithin(uint64_t n, int ms) {
    const auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (server_->followed_bodies() < n) {
      if (Clock::now() > until) return false;
      std::this_thread::yield();
    }
    return true;
  }
};

// Bodies of random sizes around the 64 KiB threshold and up to 3 MiB, sent in random pieces
// (some behind Expect: 100-continue, several on one kept-alive connection), from three clients
// at once so that some are followed and some (the follower's slot taken) read first: every
// answer names the body's exact size and digest.
TEST_F(HttpEarlyBodyTest, FollowedBodiesArriveWholeAndInOrder) {
  StartEarly(4);
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::atomic<int> wrong{0};
  std::vector<std::thread> clients;
  for (int k = 0; k < 3; ++k) {
    clients.emplace_back([&, k] {
      std::mt19937_64 rng(seed + static_cast<uint64_t>(k));
      Conn c(server_->port());
      for (int i = 0; i < 8; ++i) {
        const size_t n = rng() % 4 == 0 ? (64u << 10) - 2 + rng() % 4 : 1 + rng() % (3u << 20);
        const std::string body = Body(rng, n);
        const bool expect = rng() % 4 == 0;
        static const char* kPaths[] = {"/late",     "/early",    "/early",
                                       "/arriving", "/arriving", "/arriving-answer-first"};
        const std::string path = kPaths[rng() % 6];
        bool ok = c.Send(Head(path, n, expect));
        if (ok && expect) ok = c.Read(5000).status == 100;
        for (size_t off = 0; ok && off < n;) {
          const size_t piece = std::min<size_t>(n - off, 1 + rng() % (256u << 10));
          ok = c.Send(body.substr(off, piece));
          off += piece;
          std::this_thread::yield();
        }
        const auto r = ok ? c.Read(10000) : Conn::Response{};
        const std::string want = path == "/arriving-answer-first" ? "first" : Digest(body);
        if (r.status != 200 || r.body != want) {
          ++wrong;
          ADD_FAILURE() << "client " << k << " request " << i << " (" << n << " bytes to " << path
                        << "): HTTP " << r.status << " " << r.body.substr(0, 80);
          return;
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(server_->followed_bodies(), 0u) << "no body was followed: the early path went untested";
  std::printf("pieces read by the /arriving handler before its body was complete: %d\n",
              arriving_pieces_.load());
}

// One worker, and bodies that never complete: the peer closes mid-body, resets, or stalls until
// the body deadline. Each time the follower lets go and the one worker serves the next request.
TEST_F(HttpEarlyBodyTest, AFollowerLetsGoOfBodiesThatNeverComplete) {
  StartEarly(1, 300);
  std::mt19937_64 rng(7);
  const std::string body = Body(rng, 1u << 20);
  for (int how = 0; how < 6; ++how) {
    // A worker following the body, then the handler reading it as it arrives.
    const std::string path = how < 3 ? "/early" : "/arriving";
    const uint64_t before = server_->followed_bodies();
    {
      Conn c(server_->port());
      ASSERT_TRUE(c.Send(Head(path, body.size()) + body.substr(0, 300000)));
      ASSERT_TRUE(FollowedWithin(before + 1, 5000)) << "case " << how;
      if (how % 3 == 2) {
        EXPECT_TRUE(c.ClosedWithin(5000)) << "the body deadline did not end it";
      }
      if (how % 3 == 1) c.Reset();
    }  // closes (case 0)
    EXPECT_TRUE(WorkerAnswers()) << "case " << how << ": the only worker is still held";
  }
  // And a whole body is still followed and served after all that, on both paths.
  Conn c(server_->port());
  for (const char* path : {"/early", "/arriving"}) {
    ASSERT_TRUE(c.Send(Head(path, body.size()) + body));
    const auto r = c.Read(10000);
    EXPECT_EQ(r.status, 200) << path;
    EXPECT_EQ(r.body, Digest(body)) << path;
  }
  EXPECT_EQ(server_->followed_bodies(), 8u);
}

// A handler on an arriving path that answers before reading the body (an error from its first
// bytes, say): the answer waits for the rest of the body, which is read and dropped, so the
// kept-alive connection's next request is read from the right byte.
TEST_F(HttpEarlyBodyTest, AnAnswerBeforeTheBodyWaitsForItsEnd) {
  StartEarly(1);
  std::mt19937_64 rng(13);
  const std::string body = Body(rng, 1u << 20);
  Conn c(server_->port());
  ASSERT_TRUE(c.Send(Head("/arriving-answer-first", body.size()) + body.substr(0, 1000)));
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (answered_first_.load() == 0 && Clock::now() < until) std::this_thread::yield();
  ASSERT_EQ(answered_first_.load(), 1) << "the handler did not run while the body arrived";
  // The handler has answered; for a while yet (bounded), nothing may go out.
  const auto watch = Clock::now() + std::chrono::milliseconds(100);
  while (Clock::now() < watch) ASSERT_FALSE(c.Readable()) << "answered before the body was in";
  ASSERT_TRUE(c.Send(body.substr(1000)));
  auto r = c.Read(10000);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "first");
  ASSERT_TRUE(c.Send(Head("/arriving", body.size()) + body));
  r = c.Read(10000);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, Digest(body));
}

// HttpResponse::after_sent: the answer reaches the client while after_sent still runs (blocked
// here until Release), and the body it was given stays in place until it returns, though the
// kept-alive connection meanwhile carries another large body (read into fresh storage) and is
// answered by the other worker. Both paths: a body read as it arrives, and a small one read first.
TEST_F(HttpEarlyBodyTest, AfterSentRunsOnceTheAnswerIsOutAndTheBodyOutlivesIt) {
  StartEarly(2);
  std::mt19937_64 rng(17);
  for (const size_t n : {size_t{1} << 20, size_t{3000}}) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = false;
      after_digests_.clear();
    }
    const std::string first = Body(rng, n);
    const std::string second = Body(rng, 1u << 20);
    Conn c(server_->port());
    ASSERT_TRUE(c.Send(Head("/after-sent", first.size()) + first));
    auto r = c.Read(10000);
    ASSERT_EQ(r.status, 200) << n;
    EXPECT_EQ(r.body, "answered");
    ASSERT_TRUE(c.Send(Head("/early", second.size()) + second));
    r = c.Read(10000);
    EXPECT_EQ(r.status, 200) << n;
    EXPECT_EQ(r.body, Digest(second));
    Release();
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(10), [this] {
      return !after_digests_.empty();
    })) << "after_sent did not run";
    EXPECT_EQ(after_digests_[0], Digest(first)) << n << ": the body moved or was overwritten";
  }
}

// A slow sender holds the one follower slot and one of two workers, never the server: another
// large body on the same path is read first and answered by the other worker, small requests
// too; the slow body, once complete, is answered right.
TEST_F(HttpEarlyBodyTest, ASlowSenderHoldsOneWorkerNotTheServer) {
  StartEarly(2);
  std::mt19937_64 rng(11);
  const std::string slow_body = Body(rng, 1u << 20);
  const std::string other_body = Body(rng, 200000);
  Conn slow(server_->port());
  ASSERT_TRUE(slow.Send(Head("/early", slow_body.size()) + slow_body.substr(0, 1000)));
  ASSERT_TRUE(FollowedWithin(1, 5000));
  Conn other(server_->port());
  ASSERT_TRUE(other.Send(Head("/early", other_body.size()) + other_body));
  auto r = other.Read(10000);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, Digest(other_body));
  EXPECT_EQ(server_->followed_bodies(), 1u) << "the slot was taken: this one is read first";
  EXPECT_TRUE(WorkerAnswers());
  ASSERT_TRUE(slow.Send(slow_body.substr(1000)));
  r = slow.Read(10000);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, Digest(slow_body));
}

TEST_F(HttpEarlyBodyTest, StopWhileAWorkerFollowsABody) {
  for (const char* path : {"/early", "/arriving"}) {
    StartEarly(1);
    Conn c(server_->port());
    ASSERT_TRUE(c.Send(Head(path, 1u << 20) + std::string(100000, 'x')));
    ASSERT_TRUE(FollowedWithin(1, 5000));
    const auto t0 = Clock::now();
    server_->Stop();
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2)) << path;
    EXPECT_TRUE(c.ClosedWithin(1000)) << path;
  }
}

}  // namespace
}  // namespace kvo
