// End-to-end contract of `kvo index serve|query|doctor|stats|dump|explain`: the real `kvo` binary
// as a child process, real sockets, a real SQLite file. Several kvo publishers (one with two DP
// ranks) live in this process and keep a reference model of what they published; after a late
// join, dropped messages, a publisher restart, a SIGKILL of the daemon and its warm restart,
// /v1/score must answer what the model computes. A Python vLLM-style publisher (pyzmq + msgpack)
// feeds both event encodings and both replay reply shapes.
//
// Synchronisation is by observation only: the daemon's "listening" line, then polling
// /v1/sources for the expected sequence numbers; deadlines only turn a hang into a failure.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "events/block_hash.h"
#include "events/event_fold.h"
#include "events/event_json.h"
#include "events/zmq_publisher.h"
#include "http/http_server.h"
#include "tests/testing/child_process.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace kvo {
namespace {

using Json = nlohmann::json;
using testing::SteadyClock;

constexpr auto kGuard = std::chrono::seconds(60);  // failure guard for one step
constexpr char kPython[] = "/usr/bin/python3";     // Debian's, with python3-msgpack/python3-zmq
constexpr int kBlockSize = 4;

using Child = testing::ChildProcess;
using RunResult = testing::CommandResult;
using testing::RunCommand;

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  ASSERT_TRUE(f.good()) << path;
}

// Two consecutive free TCP ports on 127.0.0.1 (for a two-rank source).
int FreePortPair() {
  const int port = testing::FreePortPair();
  if (port == 0) ADD_FAILURE() << "no free port pair";
  return port;
}

// ---------------------------------------------------------------------------------------------
// The workload and its reference model.

using StreamKey = std::pair<std::string, int64_t>;  // (source, dp rank)

// Documents sharing prefixes; each block's engine hash is vLLM's (sha256, PYTHONHASHSEED=0).
struct Corpus {
  std::vector<std::vector<int64_t>> docs;
  std::vector<std::vector<uint64_t>> hashes;  // wire hash of each full block

  explicit Corpus(std::mt19937_64& rng, int n_docs = 10, int blocks = 8) {
    std::vector<int64_t> system = {101, 102, 103, 104, 105, 106, 107, 108};
    for (int d = 0; d < n_docs; ++d) {
      std::vector<int64_t> t = system;
      if (d > 0 && rng() % 2 == 0) {  // extend another document's first blocks
        const auto& other = docs[rng() % docs.size()];
        t.assign(other.begin(), other.begin() + 4 * kBlockSize);
      }
      while (t.size() < static_cast<size_t>(blocks * kBlockSize)) {
        t.push_back(static_cast<int64_t>(rng() % 50000));
      }
      BlockHashOptions o;
      o.none_hash = NoneHash(HashAlgo::kSha256, "0");
      o.block_size = kBlockSize;
      auto digests = HashBlocks(t, o);
      EXPECT_TRUE(digests.ok());
      std::vector<uint64_t> h;
      for (const std::string& dg : *digests) h.push_back(BlockDigest::Low64(dg));
      docs.push_back(std::move(t));
      hashes.push_back(std::move(h));
    }
  }
};

// What each stream holds: the one meaning of the events (events/event_fold.h), viewed per stream
// as engine hash -> medium -> reference count (A.6 duplicates).
class Model {
 public:
  void Apply(const StreamKey& s, const EventBatch& b) { fold_.Apply({s.first, s.second}, b); }
  void Clear(const std::string& source) { fold_.ClearSource(source); }
  // A random (hash, medium) the stream holds, for removals.
  std::optional<std::pair<uint64_t, std::string>> Pick(const StreamKey& s, std::mt19937_64& rng) {
    const auto held = Held(s);
    if (held.empty()) return std::nullopt;
    auto it = std::next(held.begin(), static_cast<long>(rng() % held.size()));
    auto m = std::next(it->second.begin(), static_cast<long>(rng() % it->second.size()));
    return std::make_pair(it->first, m->first);
  }

  struct Expected {
    int64_t prefix = 0;
    std::map<std::string, int64_t> media;
    double score = 0;
  };
  Expected Score(const StreamKey& s, const std::vector<uint64_t>& query) const {
    static const std::map<std::string, double> kWeights = {
        {"GPU", 1.0}, {"CPU", 0.8}, {"STORAGE", 0.5}};
    Expected e;
    const auto held = Held(s);
    for (uint64_t h : query) {
      auto it = held.find(h);
      if (it == held.end()) break;
      ++e.prefix;
      double best = 0;
      for (const auto& [medium, n] : it->second) {
        ++e.media[medium];
        best = std::max(best, kWeights.at(medium));
      }
      e.score += best;
    }
    return e;
  }

 private:
  std::map<uint64_t, std::map<std::string, int64_t>> Held(const StreamKey& s) const {
    std::map<uint64_t, std::map<std::string, int64_t>> out;
    for (const auto& [id, n] : fold_.ByBlock()) {
      if (id.stream.source == s.first && id.stream.dp_rank == s.second)
        out[id.hash][id.medium] += n;
    }
    return out;
  }

  KvEventFold fold_;
};

// The next batch a stream publishes: mostly stores of a document prefix from block 0 (GPU or
// CPU), some removals of held blocks, now and then AllBlocksCleared.
EventBatch NextBatch(const Corpus& c, Model& model, const StreamKey& s, std::mt19937_64& rng) {
  EventBatch b;
  b.ts = static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count()) /
         1e6;
  b.data_parallel_rank = s.second;
  unsigned r = static_cast<unsigned>(rng() % 20);
  if (r >= 12 && r < 19) {
    if (auto pick = model.Pick(s, rng)) {
      BlockRemoved rm;
      rm.block_hashes = {BlockHash::Uint(pick->first)};
      rm.medium = pick->second;
      rm.group_idx = 0;
      b.events.push_back(rm);
      model.Apply(s, b);
      return b;
    }
  } else if (r == 19 && rng() % 4 == 0) {
    b.events.push_back(AllBlocksCleared{});
    model.Apply(s, b);
    return b;
  }
  size_t d = rng() % c.docs.size();
  size_t k = 1 + rng() % c.hashes[d].size();
  BlockStored st;
  for (size_t i = 0; i < k; ++i) st.block_hashes.push_back(BlockHash::Uint(c.hashes[d][i]));
  st.token_ids.assign(c.docs[d].begin(), c.docs[d].begin() + static_cast<long>(k * kBlockSize));
  st.block_size = kBlockSize;
  st.medium = rng() % 4 == 0 ? kMediumCpu : kMediumGpu;
  st.extra_keys = std::vector<Value>(k);
  st.group_idx = 0;
  st.kv_cache_spec_kind = "full_attention";
  b.events.push_back(st);
  model.Apply(s, b);
  return b;
}

// ---------------------------------------------------------------------------------------------
// The daemon and its HTTP API.

class Daemon {
 public:
  Daemon(const std::string& db, const std::string& config)
      : Daemon(db, std::vector<std::string>{"--config", config}) {}
  // `kvo index serve --db DB --http 127.0.0.1:0` plus `flags` (none: registrations only).
  // `shell`: run by /bin/sh first, in the same process (e.g. "ulimit -n 64").
  Daemon(const std::string& db, const std::vector<std::string>& flags,
         const std::string& shell = "") {
    std::vector<std::string> argv = {
        KVO_BINARY, "--log-level", "info", "index", "serve", "--db", db, "--http", "127.0.0.1:0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    if (!shell.empty()) {
      argv.insert(argv.begin(), {"/bin/sh", "-c", shell + " && exec \"$0\" \"$@\""});
    }
    child_ = std::make_unique<Child>(argv, /*stdin_pipe=*/true);
    auto line = child_->ReadStdoutLine(SteadyClock::now() + kGuard);
    if (!line) {
      ADD_FAILURE() << "the daemon printed no listening line; stderr:\n" << child_->err();
      return;
    }
    Json j = Json::parse(*line);
    EXPECT_EQ(j["event"], "listening");
    listening_ = j;
    address_.host = "127.0.0.1";
    address_.port = j["port"].get<int>();
  }

  Child& child() { return *child_; }
  const Json& listening() const { return listening_; }
  const HttpAddress& address() const { return address_; }
  std::string http() const { return "127.0.0.1:" + std::to_string(address_.port); }

  // The daemon's stdout is read during the call (ChildProcess::DrainWhile); its stderr is a file
  // and never blocks it (40 streams refused at once when descriptors run out used to fill a
  // stderr pipe: /register timed out).
  HttpClientResult Call(const std::string& method, const std::string& path,
                        const std::string& body = "") {
    auto r = child_->DrainWhile([&] { return HttpCall(address_, method, path, body, 10'000); });
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : HttpClientResult{};
  }

  Json Sources() { return Json::parse(Call("GET", "/v1/sources").body); }

  // Polls /v1/sources until every stream's last_sequence is as expected (and `extra` holds).
  bool WaitForSequences(const std::map<StreamKey, uint64_t>& want,
                        const std::function<bool(const Json&)>& extra = nullptr) {
    auto deadline = SteadyClock::now() + kGuard;
    Json last;
    while (SteadyClock::now() < deadline) {
      last = Sources();
      size_t ok = 0;
      for (const auto& src : last["sources"]) {
        for (const auto& st : src["streams"]) {
          auto it = want.find({src["name"].get<std::string>(), st["dp_rank"].get<int64_t>()});
          if (it != want.end() && st["last_sequence"].is_number() &&
              st["last_sequence"].get<uint64_t>() == it->second) {
            ++ok;
          }
        }
      }
      if (ok == want.size() && (!extra || extra(last))) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // poll interval, not a sync
    }
    ADD_FAILURE() << "sequences not reached; /v1/sources: " << last.dump(1) << "\nstderr:\n"
                  << child_->err();
    return false;
  }

 private:
  std::unique_ptr<Child> child_;
  Json listening_;
  HttpAddress address_;
};

// Checks /v1/score for every document (by token ids and by block hashes) against the model.
void ExpectScoresMatch(Daemon& d, const Corpus& c, const Model& model,
                       const std::vector<StreamKey>& streams, const std::string& phase) {
  for (size_t doc = 0; doc < c.docs.size(); ++doc) {
    for (bool by_tokens : {true, false}) {
      Json q;
      if (by_tokens) {
        std::vector<int64_t> t = c.docs[doc];
        t.push_back(7);  // a trailing partial block is ignored
        q["token_ids"] = t;
        q["block_size"] = kBlockSize;
      } else {
        q["block_hashes"] = c.hashes[doc];
      }
      HttpClientResult r = d.Call("POST", "/v1/score", q.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      Json ans = Json::parse(r.body);
      std::map<StreamKey, Json> got;
      double prev = 1e300;
      for (const auto& inst : ans["instances"]) {
        got[{inst["source"].get<std::string>(), inst["dp_rank"].get<int64_t>()}] = inst;
        EXPECT_LE(inst["score"].get<double>(), prev + 1e-12) << "not best first: " << r.body;
        prev = inst["score"].get<double>();
      }
      for (const StreamKey& s : streams) {
        Model::Expected e = model.Score(s, c.hashes[doc]);
        std::string where = phase + ": doc " + std::to_string(doc) +
                            (by_tokens ? " by tokens" : " by hashes") + ", " + s.first + "/" +
                            std::to_string(s.second);
        auto it = got.find(s);
        if (it == got.end()) {
          EXPECT_EQ(e.prefix, 0) << where << ": missing from " << r.body;
          continue;
        }
        const Json& inst = it->second;
        EXPECT_EQ(inst["prefix_blocks"].get<int64_t>(), e.prefix) << where;
        EXPECT_EQ(inst["prefix_tokens"].get<int64_t>(), e.prefix * kBlockSize) << where;
        std::map<std::string, int64_t> media;
        for (const auto& [m, n] : inst["blocks_per_medium"].items()) {
          if (n.get<int64_t>() != 0) media[m] = n.get<int64_t>();
        }
        EXPECT_EQ(media, e.media) << where;
        EXPECT_NEAR(inst["score"].get<double>(), e.score, 1e-9) << where;
      }
    }
  }
}

// A kvo publisher of one source (all its DP ranks) and the seqs it has published.
struct Source {
  std::string name;
  KvEventsConfig config;
  std::vector<std::unique_ptr<EventPublisher>> ranks;

  void Start(int64_t n_ranks) {
    ranks.clear();
    for (int64_t r = 0; r < n_ranks; ++r) {
      auto p = CreateEventPublisher(config, r);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      ranks.push_back(std::move(p).value());
    }
  }
  void Publish(const Corpus& c, Model& model, std::mt19937_64& rng, int n) {
    for (int i = 0; i < n; ++i) {
      for (size_t r = 0; r < ranks.size(); ++r) {
        StreamKey s{name, static_cast<int64_t>(r)};
        ASSERT_TRUE(ranks[r]->Publish(NextBatch(c, model, s, rng)).ok());
      }
    }
    for (auto& p : ranks) p->Flush();
  }
  void Expect(std::map<StreamKey, uint64_t>* want) const {
    for (size_t r = 0; r < ranks.size(); ++r) {
      (*want)[{name, static_cast<int64_t>(r)}] = *ranks[r]->stats().next_seq - 1;
    }
  }
};

class IndexCommandTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }
  testing::TempDir dir_;
};

TEST_F(IndexCommandTest, FollowsPublishersThroughLateJoinDropsRestartAndKill9) {
  unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  Corpus corpus(rng);
  Model model;

  Source a;  // one rank over ipc, small HWM so that bursts overflow
  a.name = "engine-a";
  a.config.enable_kv_cache_events = true;
  a.config.publisher = "zmq";
  a.config.endpoint = "ipc://" + Path("a.pub");
  a.config.replay_endpoint = "ipc://" + Path("a.replay");
  a.config.hwm = 10;
  a.Start(1);
  Source b;  // two DP ranks on offset tcp ports
  int port = FreePortPair();
  int replay_port = FreePortPair();
  b.name = "engine-b";
  b.config.enable_kv_cache_events = true;
  b.config.publisher = "zmq";
  b.config.endpoint = "tcp://*:" + std::to_string(port);
  b.config.replay_endpoint = "tcp://*:" + std::to_string(replay_port);
  b.config.topic = "kv";
  b.Start(2);
  const std::vector<StreamKey> streams = {{"engine-a", 0}, {"engine-b", 0}, {"engine-b", 1}};

  Json cfg;
  cfg["max_query_tokens"] = 1000;
  cfg["hwm"] = 10;
  cfg["idle_probe_ms"] = 200;
  cfg["replay_timeout_ms"] = 2000;
  cfg["sources"] =
      Json::array({{{"name", "engine-a"},
                    {"endpoint", a.config.endpoint},
                    {"replay_endpoint", *a.config.replay_endpoint},
                    {"hash", {{"algo", "sha256"}, {"seed", "0"}, {"block_size", kBlockSize}}}},
                   {{"name", "engine-b"},
                    {"endpoint", "tcp://127.0.0.1:" + std::to_string(port)},
                    {"replay_endpoint", "tcp://127.0.0.1:" + std::to_string(replay_port)},
                    {"topic", "kv"},
                    {"dp_ranks", 2},
                    {"hash", {{"algo", "sha256"}, {"seed", "1"}, {"block_size", kBlockSize}}}}});
  WriteFile(Path("indexer.json"), cfg.dump(1));
  const std::string db = Path("index.sqlite");

  // 1. Late join: everything published before the daemon starts arrives by replay.
  a.Publish(corpus, model, rng, 150);
  b.Publish(corpus, model, rng, 150);
  std::map<StreamKey, uint64_t> want;
  auto daemon = std::make_unique<Daemon>(db, Path("indexer.json"));
  a.Expect(&want);
  b.Expect(&want);
  ASSERT_TRUE(daemon->WaitForSequences(want));
  ExpectScoresMatch(*daemon, corpus, model, streams, "late join");

  // Hash parity: engine-a is configured with the engine's seed, engine-b with a wrong one.
  Json sources = daemon->Sources();
  EXPECT_EQ(sources["sources"][0]["hash_parity"]["state"], "ok") << sources.dump(1);
  EXPECT_EQ(sources["sources"][1]["hash_parity"]["state"], "mismatch") << sources.dump(1);
  EXPECT_EQ(sources["sources"][1]["hash_parity"]["cause"], "seed") << sources.dump(1);
  EXPECT_EQ(sources["sources"][1]["streams"].size(), 2u);
  RunResult doctor = RunCommand({KVO_BINARY, "index", "doctor", "--http", daemon->http()});
  EXPECT_EQ(doctor.code, 1) << doctor.out << doctor.err;
  EXPECT_NE(doctor.err.find("engine-b: hash parity MISMATCH (seed)"), std::string::npos)
      << doctor.err;

  // 2. Dropped messages: bursts through HWM 10 on both sides; gaps are filled by replay.
  a.Publish(corpus, model, rng, 3000);
  b.Publish(corpus, model, rng, 300);
  a.Expect(&want);
  b.Expect(&want);
  ASSERT_TRUE(daemon->WaitForSequences(want));
  ExpectScoresMatch(*daemon, corpus, model, streams, "after drops");
  std::printf("[ info ] gaps filled after the burst: %s\n",
              daemon->Sources()["sources"][0]["gaps_filled"].dump().c_str());

  // 3. Publisher restart: engine-a comes back without a journal, its sequence back at 0.
  for (auto& p : a.ranks) p->Shutdown();
  a.Start(1);
  model.Clear("engine-a");
  a.Publish(corpus, model, rng, 20);
  a.Expect(&want);
  ASSERT_TRUE(daemon->WaitForSequences(
      want, [](const Json& s) { return s["sources"][0]["restarts_seen"].get<int64_t>() >= 1; }));
  ExpectScoresMatch(*daemon, corpus, model, streams, "after publisher restart");

  // The HTTP contract: 400s naming the problem, /metrics, /healthz, the C++ client via the CLI.
  HttpClientResult bad = daemon->Call("POST", "/v1/score", "{\"token_ids\": [1,");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("invalid JSON"), std::string::npos) << bad.body;
  bad = daemon->Call("POST", "/v1/score", R"({"token_ids": [1], "sources": ["nope"]})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("unknown source 'nope'"), std::string::npos) << bad.body;
  Json big;
  big["token_ids"] = std::vector<int64_t>(1001, 1);
  bad = daemon->Call("POST", "/v1/score", big.dump());
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("more than the maximum 1000"), std::string::npos) << bad.body;
  EXPECT_EQ(daemon->Call("GET", "/v1/score").status, 405);
  EXPECT_EQ(daemon->Call("GET", "/healthz").status, 200);
  std::string metrics = daemon->Call("GET", "/metrics").body;
  EXPECT_NE(metrics.find("kvo_indexer_batches_applied_total{source=\"engine-b\",dp_rank=\"1\"}"),
            std::string::npos);
  EXPECT_NE(metrics.find("kvo_indexer_hash_parity_mismatch{source=\"engine-b\"} 1.0"),
            std::string::npos);
  EXPECT_NE(metrics.find("kvo_indexer_publisher_restarts_total{source=\"engine-a\""),
            std::string::npos);
  std::string tokens;
  for (int64_t t : corpus.docs[0]) tokens += (tokens.empty() ? "" : ",") + std::to_string(t);
  RunResult query = RunCommand({KVO_BINARY, "index", "query", "--http", daemon->http(), "--tokens",
                                tokens, "--block-size", std::to_string(kBlockSize)});
  ASSERT_EQ(query.code, 0) << query.err;
  Json qa = Json::parse(query.out);
  for (const auto& inst : qa["instances"]) {
    StreamKey s{inst["source"].get<std::string>(), inst["dp_rank"].get<int64_t>()};
    EXPECT_EQ(inst["prefix_blocks"].get<int64_t>(), model.Score(s, corpus.hashes[0]).prefix);
  }

  // 4. kill -9, publish while the daemon is down, restart on the same file: it resumes from its
  // checkpoint (warm), replaying only what it missed.
  daemon->child().Signal(SIGKILL);
  EXPECT_EQ(daemon->child().Wait(SteadyClock::now() + kGuard), -1);
  daemon.reset();
  a.Publish(corpus, model, rng, 40);
  b.Publish(corpus, model, rng, 40);
  a.Expect(&want);
  b.Expect(&want);
  daemon = std::make_unique<Daemon>(db, Path("indexer.json"));
  ASSERT_TRUE(daemon->WaitForSequences(want));
  ExpectScoresMatch(*daemon, corpus, model, streams, "after kill -9 and restart");
  const Json warm_sources = daemon->Sources();  // kept alive for the loop
  for (const auto& src : warm_sources["sources"]) {
    for (const auto& st : src["streams"]) {
      // A cold start would re-apply everything the publishers still hold (hundreds of batches).
      EXPECT_LE(st["batches_applied"].get<int64_t>(), 45) << src["name"] << ": not warm";
    }
  }

  // 5. SIGTERM: clean exit with the checkpoint flushed; the audit commands read the file.
  daemon->child().Signal(SIGTERM);
  EXPECT_EQ(daemon->child().Wait(SteadyClock::now() + kGuard), 0) << daemon->child().err();
  EXPECT_NE(daemon->child().out().find("\"stopped\""), std::string::npos);
  daemon.reset();
  RunResult stats = RunCommand({KVO_BINARY, "index", "stats", "--db", db});
  ASSERT_EQ(stats.code, 0) << stats.err;
  Json sj = Json::parse(stats.out);
  size_t checked = 0;
  for (const auto& st : sj["streams"]) {
    StreamKey s{st["source"].get<std::string>(), st["dp_rank"].get<int64_t>()};
    ASSERT_TRUE(want.contains(s)) << stats.out;
    EXPECT_EQ(st["durable_sequence"].get<uint64_t>(), want[s]) << stats.out;
    ++checked;
  }
  EXPECT_EQ(checked, want.size());
  RunResult dump = RunCommand({KVO_BINARY, "index", "dump", "--db", db, "--limit", "3"});
  ASSERT_EQ(dump.code, 0) << dump.err;
  EXPECT_EQ(std::count(dump.out.begin(), dump.out.end(), '\n'), 3) << dump.out;
  RunResult explain = RunCommand({KVO_BINARY, "index", "explain", "--db", db, "--tokens", tokens,
                                  "--block-size", std::to_string(kBlockSize)});
  ASSERT_EQ(explain.code, 0) << explain.err;
  EXPECT_NE(explain.out.find("prefix ends because"), std::string::npos) << explain.out;
  RunResult explain_json =
      RunCommand({KVO_BINARY, "index", "explain", "--db", db, "--json", "--tokens", tokens,
                  "--block-size", std::to_string(kBlockSize)});
  ASSERT_EQ(explain_json.code, 0) << explain_json.err;
  Json ej = Json::parse(explain_json.out);
  int64_t deepest = 0;
  for (const auto& inst : ej["score"]["instances"]) {
    StreamKey s{inst["source"].get<std::string>(), inst["dp_rank"].get<int64_t>()};
    EXPECT_EQ(inst["prefix_blocks"].get<int64_t>(), model.Score(s, corpus.hashes[0]).prefix);
    deepest = std::max(deepest, inst["prefix_blocks"].get<int64_t>());
  }
  // Explain lists the blocks up to the one where the deepest prefix breaks.
  EXPECT_EQ(ej["blocks"].size(),
            std::min(corpus.hashes[0].size(), static_cast<size_t>(deepest) + 1));
  for (auto& p : a.ranks) p->Shutdown();
  for (auto& p : b.ranks) p->Shutdown();
}

TEST_F(IndexCommandTest, RefusesBadConfigurationAndRemoteHttpWithoutConsent) {
  // No sources is valid now (registrations come over POST /register); no file is not.
  RunResult none = RunCommand({KVO_BINARY, "index", "serve", "--http", "127.0.0.1:0"});
  EXPECT_EQ(none.code, 2) << none.err;
  EXPECT_NE(none.err.find("--db"), std::string::npos) << none.err;
  RunResult bad = RunCommand(
      {KVO_BINARY, "index", "serve", "--db", Path("x.sqlite"), "--source", "a=udp://h:1"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("a=udp://h:1"), std::string::npos) << bad.err;
  RunResult remote = RunCommand({KVO_BINARY, "index", "serve", "--db", Path("x.sqlite"), "--source",
                                 "a=ipc://" + Path("a"), "--http", "0.0.0.0:0"});
  EXPECT_EQ(remote.code, 2);
  EXPECT_NE(remote.err.find("beyond loopback"), std::string::npos) << remote.err;
  WriteFile(Path("foreign.sqlite"), "this is not a database, and must not be overwritten\n");
  RunResult foreign = RunCommand({KVO_BINARY, "index", "serve", "--db", Path("foreign.sqlite"),
                                  "--source", "a=ipc://" + Path("a"), "--http", "127.0.0.1:0"});
  EXPECT_NE(foreign.code, 0);
  std::ifstream f(Path("foreign.sqlite"));
  std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "this is not a database, and must not be overwritten\n");
}

// --max-early-requests reaches the HTTP server: with 1 (the default) a large /query is parsed
// while its body arrives, with 0 its body is read whole first; a value past the workers is refused
// naming the flag.
TEST_F(IndexCommandTest, MaxEarlyRequestsDecidesWhetherALargeQueryIsFollowed) {
  RunResult bad = RunCommand(
      {KVO_BINARY, "index", "serve", "--db", Path("early.sqlite"), "--max-early-requests", "9"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--max-early-requests"), std::string::npos) << bad.err;
  std::string body = R"({"model": "m", "block_size": 16, "token_ids": [)";
  for (int i = 0; i < 20000; ++i) body += (i ? "," : "") + std::to_string(1000 + i);  // ~100 kB
  body += "]}";
  auto series = [](const std::string& metrics, const std::string& name) {
    const std::string line = "\n" + name + " ";
    const size_t at = metrics.find(line);
    EXPECT_NE(at, std::string::npos) << name;
    return at == std::string::npos ? -1.0 : std::atof(metrics.c_str() + at + line.size());
  };
  for (const int early : {0, 1}) {
    SCOPED_TRACE("--max-early-requests " + std::to_string(early));
    Daemon daemon(Path("early" + std::to_string(early) + ".sqlite"),
                  std::vector<std::string>{"--max-early-requests", std::to_string(early)});
    // Nothing is registered: the parsed query names a tenant with no instance (the parse counts).
    const HttpClientResult answer = daemon.Call("POST", "/query", body);
    EXPECT_EQ(answer.status, 400) << answer.body;
    EXPECT_NE(answer.body.find("no registered instance"), std::string::npos) << answer.body;
    const std::string metrics = daemon.Call("GET", "/metrics").body;
    EXPECT_EQ(series(metrics, R"(kvo_indexer_query_parses_total{when="arriving"})"), early);
    EXPECT_EQ(series(metrics, R"(kvo_indexer_query_parses_total{when="whole"})"), 1 - early);
  }
}

// The open-file limit: `kvo index serve` lifts a low soft limit to the hard one at start (the
// listening line says what it runs under); where the hard limit itself is too low for the
// registered sources, /health and the sources' errors name the limit instead of failing quietly.
TEST_F(IndexCommandTest, RaisesTheSoftOpenFileLimitAndNamesItWhenExhausted) {
  rlimit rl{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 1024) GTEST_SKIP() << "hard limit < 1024";
  {
    Daemon raised(Path("raised.sqlite"), {}, "ulimit -S -n 64");
    const uint64_t want = rl.rlim_max == RLIM_INFINITY ? UINT64_MAX : rl.rlim_max;
    EXPECT_EQ(raised.listening()["open_files_limit"].get<uint64_t>(), want)
        << raised.listening().dump();
  }
  // UBSan's vptr check probes memory through a pipe; with no descriptor left it reports a false
  // error and ends kvo. events_zmq_fd_limit_test covers the named error under the sanitizers.
  if (testing::kAddressSanitizer)
    GTEST_SKIP() << "the exhaustion half needs a build without sanitizers";
  // This half used to time out /register now and then (under TSan in most loaded runs; in release
  // 1 run in 20 beside a build), and was skipped under TSan. The cause was this harness:
  // ChildProcess::Drain read nothing, so the daemon's retry warnings filled its stderr pipe, the
  // thread writing one blocked in write() holding spdlog's console mutex, and every thread that
  // logs (the HTTP handler's "registered" line among them) queued behind it. A child's stderr is
  // a file now (tests/testing/child_process_test.cc), and the daemon logs a run of identical
  // retries as its 1st, 2nd, 4th, ... line.
  Daemon d(Path("low.sqlite"), {}, "ulimit -n 64");  // soft and hard: nothing to raise to
  EXPECT_EQ(d.listening()["open_files_limit"].get<uint64_t>(), 64u) << d.listening().dump();
  // Each source: a SUB and a replay DEALER socket, their mailboxes, connection attempts.
  const int n = 40;
  for (int i = 0; i < n; ++i) {
    Json reg = {{"endpoint", "ipc://" + Path("e" + std::to_string(i) + ".pub")},
                {"replay_endpoint", "ipc://" + Path("e" + std::to_string(i) + ".rep")},
                {"type", "vLLM"},
                {"modelname", "m"},
                {"instance_id", "e" + std::to_string(i)},
                {"block_size", 16},
                {"dp_rank", 0}};
    HttpClientResult r = d.Call("POST", "/register", reg.dump());
    ASSERT_EQ(r.status, 200) << r.body << "\nstderr:\n" << d.child().err();
  }
  // The stream threads subscribe after /register answers: poll until one is refused.
  Json health;
  const auto deadline = SteadyClock::now() + kGuard;
  while (SteadyClock::now() < deadline) {
    health = Json::parse(d.Call("GET", "/health").body);
    if (health.contains("warning")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // poll interval, not a sync
  }
  ASSERT_TRUE(health.contains("warning")) << health.dump() << "\nstderr:\n" << d.child().err();
  const std::string w = health["warning"].get<std::string>();
  EXPECT_NE(w.find("streams cannot subscribe"), std::string::npos) << w;
  EXPECT_NE(w.find("RLIMIT_NOFILE) is 64 (hard 64)"), std::string::npos) << w;
  EXPECT_EQ(health["status"], "ok");
  Json healthz = Json::parse(d.Call("GET", "/healthz").body);
  EXPECT_EQ(healthz["open_files_limit"], 64) << healthz.dump();
  EXPECT_GE(healthz["streams_out_of_descriptors"].get<int64_t>(), 1) << healthz.dump();
  EXPECT_EQ(healthz["sources"], n);
  // The refused streams say why in their own error.
  bool named = false;
  const Json sources = d.Sources();
  for (const auto& src : sources["sources"]) {
    for (const auto& st : src["streams"]) {
      if (st["last_error"].is_string() &&
          st["last_error"].get<std::string>().find("RLIMIT_NOFILE") != std::string::npos) {
        named = true;
      }
    }
  }
  EXPECT_TRUE(named) << sources.dump().substr(0, 4000);
}

// `--discover`: a bad URL is refused naming it; a server that is down is logged with its URL and
// retried while the daemon serves (GET /v1/discovery reports it failing, /health answers).
TEST_F(IndexCommandTest, DiscoverFlagRefusesBadUrlsAndSurvivesADownServer) {
  RunResult bad = RunCommand(
      {KVO_BINARY, "index", "serve", "--db", Path("d.sqlite"), "--discover", "ftp://h:1"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("ftp://h:1"), std::string::npos) << bad.err;
  // Port 1 on loopback: nothing listens there (connection refused at once).
  auto daemon = std::make_unique<Daemon>(
      Path("d.sqlite"), std::vector<std::string>{"--discover", "http://127.0.0.1:1,model=m"});
  ASSERT_GT(daemon->address().port, 0);
  Json state;
  auto deadline = SteadyClock::now() + kGuard;
  while (SteadyClock::now() < deadline) {
    state = Json::parse(daemon->Call("GET", "/v1/discovery").body)["targets"][0];
    if (state["failures"].get<int64_t>() >= 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(state["state"], "failing") << state;
  EXPECT_EQ(state["url"], "http://127.0.0.1:1");
  EXPECT_GE(state["failures"].get<int64_t>(), 2) << state;
  EXPECT_EQ(daemon->Call("GET", "/health").status, 200);
  daemon->child().Signal(SIGTERM);
  EXPECT_EQ(daemon->child().Wait(SteadyClock::now() + kGuard), 0);
  EXPECT_NE(daemon->child().err().find("discovery http://127.0.0.1:1"), std::string::npos)
      << daemon->child().err();
}

// ---------------------------------------------------------------------------------------------
// A vLLM-style publisher in Python: msgpack-encodes kvo's JSON batches itself, as map-encoded
// events (vLLM >= 0.26) or legacy arrays, and answers replay with [topic, seq, payload] (after
// vLLM #45177) or the old [seq, payload]. Publishes the first `half` batches, prints "ready",
// publishes the rest when it reads "go", prints "done", and serves replay until stdin closes.
constexpr char kPythonPublisher[] = R"PY(
import json, select, sys, zmq, msgpack
pub_ep, replay_ep, topic, encoding, shape, path, half = sys.argv[1:8]
half = int(half)
topic_b = topic.encode()
END = (-1).to_bytes(8, "big", signed=True)
ctx = zmq.Context.instance()
pub = ctx.socket(zmq.PUB); pub.bind(pub_ep)
router = ctx.socket(zmq.ROUTER); router.bind(replay_ep)

def event(e):
    t = e["type"]
    if t == "BlockStored":
        f = [("block_hashes", e["block_hashes"]), ("parent_block_hash", e.get("parent_block_hash")),
             ("token_ids", e["token_ids"]), ("block_size", e["block_size"]),
             ("lora_id", e.get("lora_id")), ("medium", e.get("medium")),
             ("lora_name", e.get("lora_name")), ("extra_keys", e.get("extra_keys")),
             ("group_idx", e.get("group_idx")), ("kv_cache_spec_kind", e.get("kv_cache_spec_kind")),
             ("kv_cache_spec_sliding_window", None), ("locality", None)]
        required = 7
    elif t == "BlockRemoved":
        f = [("block_hashes", e["block_hashes"]), ("medium", e.get("medium")),
             ("group_idx", e.get("group_idx")), ("locality", None)]
        required = 2
    else:
        f, required = [], 0
    if encoding == "array":
        return [t] + [v for _, v in f]
    m = {"type": t}
    for i, (k, v) in enumerate(f):
        if i < required or v is not None:
            m[k] = v
    return m

batches = [json.loads(l) for l in open(path)]
payloads = [msgpack.packb([b["ts"], [event(e) for e in b["events"]], b.get("data_parallel_rank", 0)],
                          use_bin_type=True) for b in batches]
sent = []
def publish(i):
    seq = i.to_bytes(8, "big")
    pub.send_multipart([topic_b, seq, payloads[i]])
    sent.append((i, payloads[i]))

def serve_replay():
    frames = router.recv_multipart()
    if len(frames) != 3:
        return
    ident, _, start = frames
    start = int.from_bytes(start, "big")
    for seq, p in sent:
        if seq >= start:
            s8 = seq.to_bytes(8, "big")
            router.send_multipart([ident, b"", topic_b, s8, p] if shape == "new" else [ident, b"", s8, p])
    router.send_multipart([ident, b"", b"", END, b""] if shape == "new" else [ident, b"", END, b""])

for i in range(half):
    publish(i)
print("ready", flush=True)
poller = zmq.Poller()
poller.register(router, zmq.POLLIN)
poller.register(sys.stdin, zmq.POLLIN)
while True:
    for sock, _ in poller.poll(1000):
        if sock is router:
            serve_replay()
        else:
            line = sys.stdin.readline()
            if not line:
                sys.exit(0)
            if line.strip() == "go":
                for i in range(half, len(payloads)):
                    publish(i)
                print("done", flush=True)
)PY";

TEST_F(IndexCommandTest, ConsumesVllmStyleBusInBothEncodingsAndReplyShapes) {
  if (RunCommand({kPython, "-c", "import zmq, msgpack"}).code != 0) {
    GTEST_SKIP() << "needs /usr/bin/python3 with python3-zmq and python3-msgpack";
  }
  unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  Corpus corpus(rng);
  Model model;
  WriteFile(Path("publisher.py"), kPythonPublisher);
  struct Py {
    std::string name, encoding, shape;
    std::unique_ptr<Child> child;
    int n = 0;
  };
  std::vector<Py> pys(2);
  pys[0].name = "vllm-map-new";
  pys[0].encoding = "map";
  pys[0].shape = "new";
  pys[1].name = "vllm-array-old";
  pys[1].encoding = "array";
  pys[1].shape = "old";
  Json cfg;
  cfg["idle_probe_ms"] = 200;
  cfg["sources"] = Json::array();
  std::vector<StreamKey> streams;
  for (Py& p : pys) {
    std::string lines;
    StreamKey s{p.name, 0};
    p.n = 60;
    for (int i = 0; i < p.n; ++i) {
      lines += BatchToJson(NextBatch(corpus, model, s, rng), std::nullopt, std::nullopt) + "\n";
    }
    WriteFile(Path(p.name + ".jsonl"), lines);
    std::string pub = "ipc://" + Path(p.name + ".pub");
    std::string rep = "ipc://" + Path(p.name + ".replay");
    p.child = std::make_unique<Child>(
        std::vector<std::string>{kPython, Path("publisher.py"), pub, rep, "kv-events", p.encoding,
                                 p.shape, Path(p.name + ".jsonl"), "30"},
        /*stdin_pipe=*/true);
    auto ready = p.child->ReadStdoutLine(SteadyClock::now() + kGuard);
    ASSERT_EQ(ready, "ready") << p.child->err();
    cfg["sources"].push_back({{"name", p.name},
                              {"endpoint", "ipc://" + Path(p.name + ".pub")},
                              {"replay_endpoint", "ipc://" + Path(p.name + ".replay")},
                              {"topic", "kv-events"},
                              {"hash", {{"algo", "sha256"}, {"seed", "0"}, {"block_size", 4}}}});
    streams.push_back(s);
  }
  WriteFile(Path("indexer.json"), cfg.dump(1));
  Daemon daemon(Path("vllm.sqlite"), Path("indexer.json"));
  // The first half comes by replay (both reply shapes), the rest live.
  std::map<StreamKey, uint64_t> want;
  for (const Py& p : pys) want[{p.name, 0}] = 29;
  ASSERT_TRUE(daemon.WaitForSequences(want));
  for (Py& p : pys) {
    p.child->WriteStdin("go\n");
    ASSERT_EQ(p.child->ReadStdoutLine(SteadyClock::now() + kGuard), "done") << p.child->err();
    want[{p.name, 0}] = static_cast<uint64_t>(p.n - 1);
  }
  ASSERT_TRUE(daemon.WaitForSequences(want));
  ExpectScoresMatch(daemon, corpus, model, streams, "vLLM-style bus");
  const Json sources = daemon.Sources();  // kept alive for the loop
  for (const auto& src : sources["sources"]) {
    EXPECT_EQ(src["hash_parity"]["state"], "ok") << src.dump(1);
    EXPECT_GT(src["hash_parity"]["checked_blocks"].get<int64_t>(), 0);
    EXPECT_EQ(src["decode_errors"], 0);
  }
  // kvo index doctor straight against a publisher: a wrong seed is named.
  RunResult doctor =
      RunCommand({KVO_BINARY, "index", "doctor", "--endpoint", "ipc://" + Path("vllm-map-new.pub"),
                  "--replay", "ipc://" + Path("vllm-map-new.replay"), "--topic", "kv-events",
                  "--hash-seed", "3", "--block-size", "4"});
  EXPECT_EQ(doctor.code, 1) << doctor.out << doctor.err;
  EXPECT_EQ(Json::parse(doctor.out)["cause"], "seed") << doctor.out;
  RunResult fine = RunCommand({KVO_BINARY, "index", "doctor", "--endpoint",
                               "ipc://" + Path("vllm-array-old.pub"), "--replay",
                               "ipc://" + Path("vllm-array-old.replay"), "--topic", "kv-events",
                               "--hash-seed", "0", "--block-size", "4", "--blocks", "8"});
  EXPECT_EQ(fine.code, 0) << fine.out << fine.err;
  EXPECT_EQ(Json::parse(fine.out)["state"], "ok") << fine.out;
}

// The Mooncake/Dynamo API over loopback HTTP against a vLLM-format Python publisher: register with
// the reference's body (endpoints on this host), query with its shapes, kill -9 the daemon,
// restart it with no flags: the registration resumes from its checkpoint and the answers hold;
// then kill -9 the engine and restart it as vLLM does (sequence back at 0): the answers follow.
TEST_F(IndexCommandTest, RouterApiRegistrationSurvivesKill9WithVllmPublisher) {
  if (RunCommand({kPython, "-c", "import zmq, msgpack"}).code != 0) {
    GTEST_SKIP() << "needs /usr/bin/python3 with python3-zmq and python3-msgpack";
  }
  unsigned seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  Corpus corpus(rng);
  Model model;
  WriteFile(Path("publisher.py"), kPythonPublisher);
  const std::string source = "vllm-node1@default@0";  // what kvo names the registration
  const StreamKey s{source, 0};
  std::string lines;
  const int n = 60;
  for (int i = 0; i < n; ++i) {
    lines += BatchToJson(NextBatch(corpus, model, s, rng), std::nullopt, std::nullopt) + "\n";
  }
  WriteFile(Path("py.jsonl"), lines);
  const std::string pub = "ipc://" + Path("py.pub");
  const std::string rep = "ipc://" + Path("py.replay");
  Child py(
      {kPython, Path("publisher.py"), pub, rep, "kv-events", "map", "new", Path("py.jsonl"), "30"},
      /*stdin_pipe=*/true);
  ASSERT_EQ(py.ReadStdoutLine(SteadyClock::now() + kGuard), "ready") << py.err();

  auto daemon = std::make_unique<Daemon>(Path("router.sqlite"), std::vector<std::string>{});
  Json reg = Json::parse(
      R"({"endpoint": "tcp://1.1.1.1:5557", "replay_endpoint": "tcp://1.1.1.1:5558", "type": "vLLM",
 "modelname": "deepseek", "lora_name": "sql-adapter", "tenant_id": "default",
 "instance_id": "vllm-prefill-node1", "block_size": 128, "dp_rank": 0, "additionalsalt": "w8a8"})");
  HttpClientResult refused = daemon->Call("POST", "/register", reg.dump());
  EXPECT_EQ(refused.status, 400) << refused.body;  // off loopback without --allow-remote
  reg["endpoint"] = pub;
  reg["replay_endpoint"] = rep;
  reg["instance_id"] = "vllm-node1";
  reg["lora_name"] = nullptr;
  reg["additionalsalt"] = "";
  reg["block_size"] = kBlockSize;
  HttpClientResult ok = daemon->Call("POST", "/register", reg.dump());
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(Json::parse(ok.body),
            Json::parse(R"({"status": "registered successfully", "instance_id": "vllm-node1"})"));
  ASSERT_TRUE(daemon->WaitForSequences({{s, 29}}));

  // Every document by tokens and by hash: the reference's shape, longest_matched = the prefix
  // /v1/score reports (this corpus has GPU and CPU blocks only: the tiered walk reaches the same
  // prefix), which after the last batch is the model's.
  auto expect_answers = [&](const std::string& phase, bool all_published) {
    for (size_t doc = 0; doc < corpus.docs.size(); ++doc) {
      Json sq = {{"block_hashes", corpus.hashes[doc]}};
      Json score = Json::parse(daemon->Call("POST", "/v1/score", sq.dump()).body);
      int64_t prefix = -1;
      for (const auto& inst : score["instances"]) {
        if (inst["source"] == source) prefix = inst["prefix_tokens"].get<int64_t>();
      }
      ASSERT_GE(prefix, 0) << score.dump();
      if (all_published) {
        EXPECT_EQ(prefix, model.Score(s, corpus.hashes[doc]).prefix * kBlockSize);
      }
      for (bool by_hash : {false, true}) {
        Json q = {{"model", "deepseek"}, {"tenant_id", "default"}, {"block_size", kBlockSize}};
        if (by_hash) {
          q["seq_hashes"] = corpus.hashes[doc];
        } else {
          q["token_ids"] = corpus.docs[doc];
          q["instance_id"] = "vllm-node1";
        }
        HttpClientResult r = daemon->Call("POST", by_hash ? "/query_by_hash" : "/query", q.dump());
        ASSERT_EQ(r.status, 200) << phase << " " << r.body;
        Json a = Json::parse(r.body);
        ASSERT_EQ(a.size(), 1u) << r.body;
        ASSERT_EQ(a["default"].size(), 1u) << r.body;
        const Json& i = a["default"]["vllm-node1"];
        std::vector<std::string> keys;
        const auto ordered = nlohmann::ordered_json::parse(r.body);  // the wire's key order
        for (const auto& [k, v] : ordered["default"]["vllm-node1"].items()) keys.push_back(k);
        EXPECT_EQ(keys, (std::vector<std::string>{"longest_matched", "GPU", "DP", "CPU", "DISK"}))
            << r.body;
        EXPECT_EQ(i["longest_matched"].get<int64_t>(), prefix) << phase << " doc " << doc;
        EXPECT_EQ(i["DP"], Json({{"0", prefix}})) << r.body;
        EXPECT_LE(i["GPU"].get<int64_t>(), prefix) << r.body;
        EXPECT_EQ(i["DISK"].get<int64_t>(), 0) << r.body;
      }
    }
  };
  expect_answers("before kill -9", false);

  daemon->child().Signal(SIGKILL);
  daemon->child().Wait(SteadyClock::now() + kGuard);
  daemon = std::make_unique<Daemon>(Path("router.sqlite"), std::vector<std::string>{});
  Json workers = Json::parse(daemon->Call("GET", "/workers").body);
  ASSERT_EQ(workers["workers"].size(), 1u) << workers.dump();
  EXPECT_EQ(workers["workers"][0]["instance_id"], "vllm-node1");
  EXPECT_EQ(workers["workers"][0]["endpoint"], pub);
  py.WriteStdin("go\n");
  ASSERT_EQ(py.ReadStdoutLine(SteadyClock::now() + kGuard), "done") << py.err();
  ASSERT_TRUE(daemon->WaitForSequences({{s, n - 1}}));
  ExpectScoresMatch(*daemon, corpus, model, {s}, "registered, after kill -9");
  expect_answers("after kill -9 and restart", true);

  // The engine killed -9 and started again the way vLLM restarts: the same endpoints, an empty
  // cache, its sequence back at 0, its whole new stream sent before the indexer's SUB socket has
  // reconnected (none of it arrives live). The registration follows it: the idle probe finds the
  // old stream gone, the new one is replayed from 0, and the old blocks leave the index.
  py.Signal(SIGKILL);
  py.Wait(SteadyClock::now() + kGuard);
  model.Clear(source);
  std::string restarted;
  const int n2 = 20;
  for (int i = 0; i < n2; ++i) {
    restarted += BatchToJson(NextBatch(corpus, model, s, rng), std::nullopt, std::nullopt) + "\n";
  }
  WriteFile(Path("py2.jsonl"), restarted);
  Child py2({kPython, Path("publisher.py"), pub, rep, "kv-events", "map", "new", Path("py2.jsonl"),
             std::to_string(n2)},
            /*stdin_pipe=*/true);
  ASSERT_EQ(py2.ReadStdoutLine(SteadyClock::now() + kGuard), "ready") << py2.err();
  ASSERT_TRUE(daemon->WaitForSequences({{s, n2 - 1}}, [](const Json& j) {
    return j["sources"][0]["restarts_seen"].get<int64_t>() >= 1;
  }));
  ExpectScoresMatch(*daemon, corpus, model, {s}, "after the engine's kill -9 and restart");
  expect_answers("after the engine's kill -9 and restart", true);

  HttpClientResult gone = daemon->Call(
      "POST", "/unregister", R"({"type": "vLLM", "instance_id": "vllm-node1", "dp_rank": 0})");
  ASSERT_EQ(gone.status, 200) << gone.body;
  EXPECT_EQ(Json::parse(gone.body)["removed_instances"],
            Json::parse(R"(["vllm-node1|default|0"])"));
  EXPECT_EQ(Json::parse(daemon->Call("GET", "/workers").body)["workers"].size(), 0u);
}

}  // namespace
}  // namespace kvo
