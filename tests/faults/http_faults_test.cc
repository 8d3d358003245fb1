// HTTP faults against a real `kvo index serve` (issue 10, "What to build" 3; items 1, 2, 6, 8):
// deep JSON on every route, huge, chunked and form-encoded bodies, slow and idle connections, 200
// concurrent clients and four concurrent 57 MB bodies — while a probe asks GET /healthz on a fresh
// connection every 20 ms. The API must answer every probe, within 100 ms at p99; the daemon's
// peak RSS after the 57 MB bodies is reported.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/child_process.h"
#include "tests/testing/fault_report.h"
#include "tests/testing/raw_http.h"
#include "tests/testing/temp_dir.h"

namespace kvo {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
using testing::SteadyClock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

using Conn = testing::RawHttpConn;
using testing::RawPost;

const char kHealthz[] = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

// Every ~20 ms a fresh connection asks GET /healthz; latencies of the answered, count of the rest.
class HealthProbe {
 public:
  explicit HealthProbe(int port) : thread_([this, port] { Run(port); }) {}
  ~HealthProbe() { Finish(); }
  void Finish() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::vector<double> latencies_ms;
  int64_t failures = 0;

 private:
  void Run(int port) {
    while (!done_) {
      const auto start = Clock::now();
      Conn c(port);
      Conn::Response r;
      if (c.ok() && c.Send(kHealthz)) r = c.Read(5000);
      const double ms = Ms(Clock::now() - start);
      if (r.status == 200 && r.body.find("\"ok\"") != std::string::npos) {
        latencies_ms.push_back(ms);
      } else {
        ++failures;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // pacing, not synchronisation
    }
  }
  std::atomic<bool> done_{false};
  std::thread thread_;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

int64_t PeakRssMb(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10) / 1024;
  }
  return -1;
}

// Progress on stderr, so a hang names its phase.
void Phase(const char* what) {
  static const auto start = Clock::now();
  std::fprintf(stderr, "[ http faults %6.1f s ] %s\n", Ms(Clock::now() - start) / 1000, what);
}

class HttpFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<testing::ChildProcess>(std::vector<std::string>{
        KVO_BINARY, "index", "serve", "--db", dir_.path() + "/index.sqlite", "--source",
        "s0=tcp://127.0.0.1:1", "--http", "127.0.0.1:0"});
    auto line = daemon_->ReadStdoutLine(SteadyClock::now() + std::chrono::seconds(60));
    ASSERT_TRUE(line) << "no listening line; stderr:\n" << daemon_->err();
    port_ = Json::parse(*line).at("port").get<int>();
  }
  void ExpectAlive(const std::string& after) {
    Conn c(port_);
    ASSERT_TRUE(c.ok() && c.Send(kHealthz)) << "daemon gone after " << after;
    EXPECT_EQ(c.Read(5000).status, 200) << "after " << after << "; stderr:\n"
                                        << daemon_->err().substr(0, 4000);
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::ChildProcess> daemon_;
  int port_ = 0;
  double concurrent_p99_ms_ = 0;
  int64_t concurrent_failed_ = 0;
  int64_t peak_rss_mb_ = 0;
};

TEST_F(HttpFaultsTest, HostileClientsDoNotStopHealthz) {
  const uint64_t seed = kvo::testing::TestSeed();
  std::mt19937_64 rng(seed);
  const int rounds = testing::FaultTrials(1, 5);
  // Built before the probe starts: building it would compete with the probe for this process's
  // CPU, not the daemon's.
  std::string big_body = "{\"token_ids\":[1";
  big_body.reserve(57u << 20);
  while (big_body.size() < 57'000'000) big_body += ",1";
  big_body = RawPost("/v1/score", big_body + "]}");
  HealthProbe probe(port_);
  int64_t checked = 0;
  int64_t failed = 0;
  auto check = [&](bool ok, const std::string& what) {
    ++checked;
    if (!ok) {
      ++failed;
      ADD_FAILURE() << what;
    }
  };

  for (int round = 0; round < rounds; ++round) {
    Phase("1. Deep nesting");
    // 1. Deep nesting (10^5 levels, 200 KB) in every echoed key, on both query routes, and as
    // the body of every other route.
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    const std::vector<std::string> bodies = {
        R"({"token_ids": [1], "block_size": )" + deep + "}",
        R"({"token_ids": [1], "lora_name": )" + deep + "}",
        R"({"token_ids": [1], "weights": {"GPU": )" + deep + "}}",
        R"({"token_ids": [1], "sources": [)" + deep + "]}",
        R"({"token_ids": [1, )" + deep + "]}",
    };
    for (const char* route : {"/v1/score", "/v1/explain"}) {
      for (const std::string& body : bodies) {
        Conn c(port_);
        Conn::Response r;
        if (c.ok() && c.Send(RawPost(route, body))) r = c.Read(10000);
        check(r.status == 400 && r.body.find("nested deeper") != std::string::npos &&
                  r.body.size() < 512,
              std::string(route) + " deep: " + std::to_string(r.status) + " " + r.body);
      }
    }
    for (const char* route : {"/v1/sources", "/metrics", "/healthz", "/nope"}) {
      Conn c(port_);
      Conn::Response r;
      if (c.ok() && c.Send(RawPost(route, deep))) r = c.Read(10000);
      check(r.status == 405 || r.status == 404, std::string(route) + ": " + r.body);
    }
    ExpectAlive("deep JSON");

    Phase("2. A huge declared body");
    // 2. A huge declared body: refused from its header (413, JSON), never read.
    {
      Conn c(port_);
      c.Send("POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n");
      Conn::Response r = c.Read(10000);
      check(r.status == 413 && r.body.find("\"error\"") != std::string::npos,
            "huge body: " + std::to_string(r.status) + " " + r.body);
    }
    Phase("3. A chunked body");
    // 3. A chunked body past the 64 MiB limit (issue: 300 MiB accepted): 413 before 80 MiB.
    {
      Conn c(port_);
      c.Send("POST /v1/score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
      const std::string chunk = "100000\r\n" + std::string(1 << 20, ' ') + "\r\n";
      int sent_mb = 0;
      while (sent_mb < 300 && !c.Readable() && c.Send(chunk)) ++sent_mb;
      Conn::Response r = c.Read(10000);
      check(sent_mb <= 80 && r.status == 413,
            "chunked: " + std::to_string(sent_mb) + " MiB sent, " + std::to_string(r.status));
    }
    Phase("4. The README");
    // 4. The README's curl -d: form-encoded, Expect: 100-continue, 20 000 tokens (issue: 413 with
    // an empty body over ~1 500 tokens).
    {
      std::string body = R"({"token_ids":[)";
      for (int i = 0; i < 20000; ++i) body += (i ? "," : "") + std::to_string(rng() % 50000);
      body += R"(],"block_size":16,"weights":{"GPU":1,"CPU":0.8,"STORAGE":0.5}})";
      Conn c(port_);
      c.Send(
          "POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: "
          "application/x-www-form-urlencoded\r\nExpect: 100-continue\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\n\r\n");
      Conn::Response cont = c.Read(2000);  // "100 Continue" has no body
      c.Send(body);
      Conn::Response r = c.Read(10000);
      check(cont.status == 100 && r.status == 200 &&
                r.body.find("\"instances\"") != std::string::npos,
            "form-encoded: " + std::to_string(cont.status) + "/" + std::to_string(r.status) + " " +
                r.body.substr(0, 200));
    }
    ExpectAlive("bodies");

    Phase("5. Slow");
    // 5. Slow (one header byte per second) and idle connections, 8 of each: closed by the
    // header deadline (5 s); meanwhile the probe keeps running.
    {
      std::vector<std::unique_ptr<Conn>> slow, idle;
      for (int i = 0; i < 8; ++i) {
        slow.push_back(std::make_unique<Conn>(port_));
        idle.push_back(std::make_unique<Conn>(port_));
      }
      const std::string header = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
      const auto start = Clock::now();
      bool all_closed = false;
      for (size_t b = 0; b < header.size() && Ms(Clock::now() - start) < 9000; ++b) {
        bool any_open = false;
        for (auto& s : slow) any_open = s->Send(std::string(1, header[b])) || any_open;
        if (!any_open) {
          all_closed = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::seconds(1));  // the attack's pacing
      }
      for (auto& s : slow) all_closed = s->ClosedWithin(3000) && all_closed;
      bool idle_closed = true;
      for (auto& s : idle) idle_closed = s->ClosedWithin(3000) && idle_closed;
      check(all_closed && idle_closed, "slow/idle connections were not closed by the deadline");
    }

    Phase("6. 200 concurrent");
    // 6. 200 concurrent clients, each with 5 queries on one keep-alive connection.
    {
      std::mutex mu;
      std::vector<double> lat;
      std::atomic<int> bad{0};
      std::vector<std::thread> clients;
      for (int i = 0; i < 200; ++i) {
        clients.emplace_back([&, i] {
          Conn c(port_);
          for (int k = 0; k < 5; ++k) {
            const auto t0 = Clock::now();
            Conn::Response r;
            if (c.ok() && c.Send(RawPost("/v1/score", "{\"token_ids\":[" + std::to_string(i) +
                                                          ",2,3,4,5,6,7,8]}")))
              r = c.Read(10000);
            if (r.status != 200) ++bad;
            std::lock_guard<std::mutex> lock(mu);
            lat.push_back(Ms(Clock::now() - t0));
          }
        });
      }
      for (auto& t : clients) t.join();
      // A query fails here only by running past its 10 s read: a latency promise (LatencyAsserted).
      if (testing::LatencyAsserted()) {
        check(bad == 0, std::to_string(bad.load()) + " of 1000 concurrent queries failed");
      }
      concurrent_failed_ += bad.load();
      concurrent_p99_ms_ = std::max(concurrent_p99_ms_, Percentile(lat, 0.99));
    }

    Phase("7. Four concurrent");
    // 7. Four concurrent 57 MB bodies of tokens (issue: 4.1 GB RSS): refused before a DOM.
    {
      std::vector<std::thread> senders;
      std::atomic<int> refused{0};
      for (int i = 0; i < 4; ++i) {
        senders.emplace_back([&] {
          Conn c(port_);
          Conn::Response r;
          if (c.ok() && c.Send(big_body)) r = c.Read(60000);
          if ((r.status == 400 && r.body.find("max_query_tokens") != std::string::npos) ||
              r.status == 503)
            ++refused;
        });
      }
      for (auto& t : senders) t.join();
      check(refused == 4, std::to_string(refused.load()) + " of 4 57 MB bodies refused");
      peak_rss_mb_ = PeakRssMb(daemon_->pid());
    }
    ExpectAlive("round " + std::to_string(round));
  }
  probe.Finish();

  const double p50 = Percentile(probe.latencies_ms, 0.5);
  const double p99 = Percentile(probe.latencies_ms, 0.99);
  const double max = Percentile(probe.latencies_ms, 1.0);
  const auto over_100ms = std::count_if(probe.latencies_ms.begin(), probe.latencies_ms.end(),
                                        [](double ms) { return ms >= 100.0; });
  if (testing::LatencyAsserted()) {
    EXPECT_EQ(probe.failures, 0) << "healthz probes unanswered within 5 s";
    EXPECT_LT(p99, 100.0) << "healthz p99";
  }
  EXPECT_LT(peak_rss_mb_, 1500) << "peak RSS after 4 x 57 MB bodies";
  char figures[640];
  std::snprintf(
      figures, sizeof figures,
      "healthz p50 %.1f ms, p99 %.1f ms, max %.1f ms over %zu probes (%lld over 100 ms, %lld "
      "unanswered); "
      "200 clients p99 %.1f ms (%lld of 1000 past 10 s); peak RSS after 4 x 57 MB bodies %lld "
      "MB%s",
      p50, p99, max, probe.latencies_ms.size(), static_cast<long long>(over_100ms),
      static_cast<long long>(probe.failures), concurrent_p99_ms_,
      static_cast<long long>(concurrent_failed_), static_cast<long long>(peak_rss_mb_),
      testing::LatencyAsserted() ? "" : " (ThreadSanitizer: latencies reported, not asserted)");
  testing::ReportFault({"http",
                        "deep JSON on every route, huge/chunked/form-encoded bodies, slow and idle "
                        "connections, 200 concurrent clients, 4 x 57 MB bodies",
                        rounds, "every attack answered as specified; /healthz answered throughout",
                        failed + (testing::LatencyAsserted() ? probe.failures : 0), seed, figures});
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace kvo
