// Shared by the indexer fault and soak tests: a journaled publisher streaming a churn workload in
// this process (every batch kept, so the expected index at any sequence is the fold of the
// batches up to it), the real `kvo index serve` daemon as a child process, a minimal HTTP GET,
// and `kvo index dump` read back as (engine hash, medium) -> refcount.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "events/zmq_publisher.h"
#include "tests/testing/child_process.h"
#include "tests/testing/wait.h"

namespace kvo::faults {

using testing::ChildProcess;
using testing::SteadyClock;

// (engine hash, medium) -> reference count: what a stream holds (group 0 only here).
using Holdings = std::map<std::pair<uint64_t, std::string>, int64_t>;

// The fold of a batch into `h` (the indexer's semantics: duplicate stores count, a removal of an
// entry not held is ignored, AllBlocksCleared drops GPU entries).
inline void Fold(const EventBatch& b, Holdings* h) {
  for (const KvEvent& e : b.events) {
    if (const auto* st = std::get_if<BlockStored>(&e)) {
      for (const BlockHash& x : st->block_hashes) ++(*h)[{x.Low64(), st->medium.value_or("GPU")}];
    } else if (const auto* rm = std::get_if<BlockRemoved>(&e)) {
      for (const BlockHash& x : rm->block_hashes) {
        auto it = h->find({x.Low64(), rm->medium.value_or("GPU")});
        if (it != h->end() && --it->second == 0) h->erase(it);
      }
    } else {
      for (auto it = h->begin(); it != h->end();) {
        it = it->first.second == "GPU" ? h->erase(it) : std::next(it);
      }
    }
  }
}

// FNV-1a over the sorted entries: the digest printed and compared.
inline uint64_t Digest(const Holdings& h) {
  uint64_t d = 1469598103934665603ull;
  auto mix = [&d](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      d ^= static_cast<const unsigned char*>(p)[i];
      d *= 1099511628211ull;
    }
  };
  for (const auto& [k, ref] : h) {
    mix(&k.first, 8);
    mix(k.second.data(), k.second.size());
    mix(&ref, 8);
  }
  return d;
}

inline std::string Hex(uint64_t v) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// A free TCP port on 127.0.0.1 whose successor is free too (endpoint + replay endpoint).
inline int FreePortPair() {
  const int port = kvo::testing::FreePortPair();
  if (port == 0) ADD_FAILURE() << "no free port pair";
  return port;
}

// GET http://127.0.0.1:port/path (Connection: close). Returns the status code and body; status 0
// when the connection failed or `timeout_ms` passed.
struct GetResult {
  int status = 0;
  std::string body;
};
inline GetResult HttpGet(int port, const std::string& path, int timeout_ms = 10'000,
                         const std::string& host = "127.0.0.1") {
  GetResult r;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return r;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    ::close(fd);
    return r;
  }
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return r;
  }
  const std::string req =
      "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return r;
  }
  std::string resp;
  char buf[65536];
  for (int i = 0; i < 100000; ++i) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  int code = 0;
  if (std::sscanf(resp.c_str(), "HTTP/1.%*d %d", &code) != 1) return r;
  const size_t body = resp.find("\r\n\r\n");
  r.status = code;
  if (body != std::string::npos) r.body = resp.substr(body + 4);
  // A chunked body is left as is: callers only look for JSON objects inside it.
  return r;
}

// The journaled publisher and its churn: stores of 1-8 blocks from a pool of `pool` hashes on GPU
// or CPU, removals of held entries, now and then AllBlocksCleared. Every published batch is kept.
class ChurnPublisher {
 public:
  ChurnPublisher(int port, const std::string& journal_dir, uint64_t seed, int pool = 4000,
                 const std::string& host = "127.0.0.1")
      : rng_(seed), pool_(pool) {
    cfg_.enable_kv_cache_events = true;
    cfg_.publisher = "zmq";
    cfg_.endpoint = "tcp://" + host + ":" + std::to_string(port);
    cfg_.replay_endpoint = "tcp://" + host + ":" + std::to_string(port + 1);
    cfg_.journal_dir = journal_dir;
    Open();
  }
  ~ChurnPublisher() { Stop(); }

  // (Re)creates the publisher on the same journal: its sequence numbers continue.
  void Open() {
    auto p = CreateEventPublisher(cfg_, 0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    pub_ = std::move(*p);
    const uint64_t next = pub_->stats().next_seq.value_or(0);
    std::lock_guard<std::mutex> l(mu_);
    if (batches_.empty()) base_ = next;
    EXPECT_EQ(next, base_ + batches_.size()) << "journal lost sequence numbers";
  }

  // Publishes every `period` until Stop() (a thread).
  void Start(std::chrono::microseconds period) {
    running_ = true;
    thread_ = std::thread([this, period] {
      while (running_) {
        PublishOne();
        std::this_thread::sleep_for(period);  // the publishing rate, not a synchronisation
      }
    });
  }
  void Stop() {
    running_ = false;
    if (thread_.joinable()) thread_.join();
    if (pub_) {
      pub_->Flush();
      pub_->Shutdown();
      pub_.reset();
    }
  }
  // Stops publishing (keeps the publisher answering replay).
  void Pause() {
    running_ = false;
    if (thread_.joinable()) thread_.join();
    if (pub_) pub_->Flush();
  }

  // Publishes `b` as the next batch (folded into the expected state like the churn).
  void PublishBatch(EventBatch b) {
    Fold(b, &held_);
    {
      std::lock_guard<std::mutex> l(mu_);
      batches_.push_back(b);
    }
    ASSERT_TRUE(pub_->Publish(std::move(b)).ok());
  }

  void PublishOne() {
    EventBatch b;
    b.ts = static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count()) /
           1e6;
    const unsigned r = static_cast<unsigned>(rng_() % 100);
    if (r < 35 && !held_.empty()) {
      auto it = std::next(held_.begin(), static_cast<long>(rng_() % held_.size()));
      BlockRemoved rm;
      rm.block_hashes = {BlockHash::Uint(it->first.first)};
      rm.medium = it->first.second;
      b.events.push_back(rm);
    } else if (r == 99) {
      b.events.push_back(AllBlocksCleared{});
    } else {
      BlockStored st;
      const int n = 1 + static_cast<int>(rng_() % 8);
      for (int i = 0; i < n; ++i) {
        st.block_hashes.push_back(BlockHash::Uint(1 + rng_() % static_cast<uint64_t>(pool_)));
      }
      st.block_size = 16;
      st.medium = rng_() % 3 == 0 ? kMediumCpu : kMediumGpu;
      b.events.push_back(st);
    }
    Fold(b, &held_);
    {
      std::lock_guard<std::mutex> l(mu_);
      batches_.push_back(b);
    }
    ASSERT_TRUE(pub_->Publish(std::move(b)).ok());
  }

  // The last sequence published (nullopt: none yet).
  std::optional<uint64_t> LastSeq() const {
    std::lock_guard<std::mutex> l(mu_);
    if (batches_.empty()) return std::nullopt;
    return base_ + batches_.size() - 1;
  }
  // The fold of batches base..seq.
  Holdings Expected(uint64_t seq) const {
    std::lock_guard<std::mutex> l(mu_);
    Holdings h;
    for (uint64_t s = base_; s <= seq && s - base_ < batches_.size(); ++s)
      Fold(batches_[s - base_], &h);
    return h;
  }
  const KvEventsConfig& config() const { return cfg_; }
  std::string source_flag(const std::string& name) const {
    return name + "=" + cfg_.endpoint + ",replay=" + *cfg_.replay_endpoint;
  }

 private:
  KvEventsConfig cfg_;
  std::unique_ptr<EventPublisher> pub_;
  std::mt19937_64 rng_;
  int pool_;
  Holdings held_;  // publisher thread only
  mutable std::mutex mu_;
  std::vector<EventBatch> batches_;  // guarded by mu_
  uint64_t base_ = 0;                // guarded by mu_
  std::atomic<bool> running_{false};
  std::thread thread_;
};

// `kvo index serve` as a child; the HTTP port is read from its listening line.
class IndexDaemon {
 public:
  // `prefix`: argv run before kvo (e.g. ip netns exec NS); `host`: the HTTP address's host.
  IndexDaemon(const std::string& db, const std::vector<std::string>& sources,
              const std::vector<std::string>& extra = {},
              const std::vector<std::string>& prefix = {}, const std::string& host = "127.0.0.1")
      : host_(host) {
    std::vector<std::string> argv = prefix;
    for (const std::string& a :
         std::vector<std::string>{KVO_BINARY, "--log-level", "warn", "index", "serve", "--db", db,
                                  "--http", host + ":0"}) {
      argv.push_back(a);
    }
    for (const std::string& s : sources) {
      argv.push_back("--source");
      argv.push_back(s);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    child_ = std::make_unique<ChildProcess>(argv);
    auto line = child_->ReadStdoutLine(SteadyClock::now() + std::chrono::seconds(60));
    if (!line) {
      ADD_FAILURE() << "the daemon printed no listening line; stderr:\n" << child_->err();
      return;
    }
    auto j = nlohmann::json::parse(*line, nullptr, false);
    if (j.is_object() && j.contains("port")) port_ = j["port"].get<int>();
    EXPECT_GT(port_, 0) << *line;
  }
  ChildProcess& child() { return *child_; }
  int port() const { return port_; }
  // GET path on the daemon's HTTP API.
  GetResult Get(const std::string& path, int timeout_ms = 10'000) {
    return HttpGet(port_, path, timeout_ms, host_);
  }
  // The stream (source, rank 0) of /v1/sources; null when absent or unreachable.
  nlohmann::json Stream(const std::string& source) {
    GetResult r = child_->DrainWhile([&] { return Get("/v1/sources", 3000); });
    if (r.status != 200) return nullptr;
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (!j.is_object() || !j.contains("sources")) return nullptr;
    for (const auto& src : j["sources"]) {
      if (src.value("name", "") != source) continue;
      for (const auto& st : src["streams"]) return st;
    }
    return nullptr;
  }
  pid_t pid() const { return child_->pid(); }

  // last_sequence of stream (source, rank 0) in /v1/sources; nullopt when none or unreachable.
  std::optional<uint64_t> LastSequence(const std::string& source) {
    const nlohmann::json st = Stream(source);
    if (st.is_object() && st.contains("last_sequence") &&
        st["last_sequence"].is_number_unsigned()) {
      return st["last_sequence"].get<uint64_t>();
    }
    return std::nullopt;
  }
  // Polls until the stream's last sequence is `seq` (poll interval 20 ms; bounded).
  bool WaitForSequence(const std::string& source, uint64_t seq, std::chrono::seconds guard) {
    const auto deadline = SteadyClock::now() + guard;
    while (SteadyClock::now() < deadline) {
      if (LastSequence(source) == seq) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // poll interval
    }
    return false;
  }
  void Kill() {
    child_->Signal(SIGKILL);
    (void)child_->Wait(SteadyClock::now() + std::chrono::seconds(30));
  }
  int Terminate() {
    child_->Signal(SIGTERM);
    return child_->Wait(SteadyClock::now() + std::chrono::seconds(60));
  }

 private:
  std::unique_ptr<ChildProcess> child_;
  std::string host_;
  int port_ = 0;
};

// `kvo index dump --db db --source source` read back; *ok false when the command failed.
inline Holdings DumpIndex(const std::string& db, const std::string& source, bool* ok,
                          std::string* err) {
  Holdings h;
  testing::CommandResult r =
      testing::RunCommand({KVO_BINARY, "index", "dump", "--db", db, "--source", source});
  *ok = r.code == 0;
  if (!*ok) {
    *err = r.err.substr(0, 2000);
    return h;
  }
  for (const std::string& line : testing::SplitLines(r.out)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    h[{j["engine_hash"].get<uint64_t>(), j["medium"].get<std::string>()}] +=
        j["refcount"].get<int64_t>();
  }
  return h;
}

// The durable checkpoint of (source, rank 0) from `kvo index stats`; nullopt when none.
inline std::optional<uint64_t> Checkpoint(const std::string& db, const std::string& source) {
  testing::CommandResult r = testing::RunCommand({KVO_BINARY, "index", "stats", "--db", db});
  if (r.code != 0) return std::nullopt;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  if (!j.is_object() || !j.contains("streams")) return std::nullopt;
  for (const auto& st : j["streams"]) {
    if (st.value("source", "") == source && st.value("dp_rank", -1) == 0 &&
        st["last_sequence"].is_number_unsigned()) {
      return st["last_sequence"].get<uint64_t>();
    }
  }
  return std::nullopt;
}

// Resident set of a process, bytes (VmRSS of /proc/pid/status); 0 when unreadable.
inline int64_t RssBytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %lld kB", &kb) == 1) return kb * 1024;
  }
  return 0;
}

}  // namespace kvo::faults
