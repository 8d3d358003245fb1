// kvo bench route: the latency `kvo route` adds to a request over loopback, against a direct
// request to the same engine in the same run (ARCHITECTURE.md §5: added p99 < 1 ms, kv policy
// included).
//
// Real sockets, in one process: two engines (HttpServer answering a fixed completion at once, so
// the figure is the router's cost, not an engine's), a real IndexerService whose index holds the
// prompt's prefix for engine "eng-a" (64 blocks on GPU) and part of it for "eng-b" (CPU), and the
// router in front (kv policy: every routed request asks the indexer's /query with its 1024 token
// ids). One keep-alive client measures direct and routed requests interleaved.
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "events/event.h"
#include "http/http_server.h"
#include "indexer/service/service.h"
#include "route/engine_client.h"
#include "route/route.h"

namespace kvo::bench {
namespace {

constexpr int kPromptTokens = 1024;
constexpr int kBlock = 16;

EventBatch Stores(const std::vector<int64_t>& tokens, int blocks, const char* medium,
                  uint64_t salt) {
  BlockStored s;
  for (int i = 0; i < blocks; ++i) s.block_hashes.push_back(BlockHash::Uint(salt + i + 1));
  s.token_ids.assign(tokens.begin(), tokens.begin() + blocks * kBlock);
  s.block_size = kBlock;
  s.medium = medium;
  s.group_idx = 0;
  return EventBatch{1700000000.0, {s}, 0};
}

struct Sample {
  std::vector<double> direct_us;
  std::vector<double> routed_us;
};

// Interleaves `n` direct and `n` routed requests; Unavailable when a request fails.
Status Measure(route::ClientPool& direct, route::ClientPool& routed, const std::string& body, int n,
               const std::string& expect_instance, Sample* out) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < n; ++i) {
    for (int which = 0; which < 2; ++which) {
      route::ClientPool& pool = which == 0 ? direct : routed;
      auto t0 = Clock::now();
      auto res = pool.Call("POST", "/v1/completions", body);
      double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (!res.ok()) return res.status();
      if (res->status != 200 || res->body.find(expect_instance) == std::string::npos) {
        return Status::Internal("unexpected answer " + std::to_string(res->status) + ": " +
                                res->body.substr(0, 200));
      }
      (which == 0 ? out->direct_us : out->routed_us).push_back(us);
    }
  }
  return Status::Ok();
}

}  // namespace

int RunRouteBench(const BenchOptions& options) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "route bench: %s\n", what.c_str());
    return 1;
  };
  // Engines.
  std::vector<std::unique_ptr<HttpServer>> engines;
  for (const char* name : {"eng-a", "eng-b"}) {
    std::string answer =
        std::string(R"({"id":"cmpl-bench","object":"text_completion","model":"kvo-sim",)") +
        R"("choices":[{"index":0,"text":"ok","finish_reason":"length"}],)" +
        R"("usage":{"prompt_tokens":1024,"completion_tokens":1,"total_tokens":1025},)" +
        R"("kvo":{"instance_id":")" + name + R"(","hit_tokens":{"GPU":1024,"CPU":0,"DISK":0}}})";
    HttpServerOptions o;
    o.address = HttpAddress{"127.0.0.1", 0};
    o.worker_threads = 2;
    auto s = HttpServer::Start(o, [answer](const HttpRequest&) {
      return HttpResponse{200, "application/json", answer};
    });
    if (!s.ok()) return fail(s.status().ToString());
    engines.push_back(std::move(s).value());
  }
  // The indexer, with the prompt's prefix held by eng-a (GPU) and a quarter of it by eng-b (CPU).
  std::error_code ec;
  auto dir =
      std::filesystem::temp_directory_path() / ("kvo-route-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir, ec);
  std::vector<int64_t> tokens(kPromptTokens);
  for (int i = 0; i < kPromptTokens; ++i) tokens[i] = (i * 7919) % 50000 + 1;
  IndexerConfig ic;
  ic.db = (dir / "index.db").string();
  ic.http = "127.0.0.1:0";
  ic.silent_after_ms = 3'600'000;  // nobody publishes: no "not answering" warnings
  // Sources nobody publishes on: the index is fed below, as a subscriber would feed it.
  for (const char* name : {"eng-a", "eng-b"}) {
    SourceConfig sc;
    sc.name = name;
    sc.endpoint = "inproc://kvo-route-bench-" + std::string(name);
    ic.sources.push_back(sc);
  }
  auto svc = IndexerService::Start(ic);
  if (!svc.ok()) return fail(svc.status().ToString());
  if (auto r = (*svc)->index().ApplyBatch("eng-a", 0, 1, Stores(tokens, 64, "GPU", 0)); !r.ok()) {
    return fail(r.status().ToString());
  }
  if (auto r = (*svc)->index().ApplyBatch("eng-b", 0, 1, Stores(tokens, 16, "CPU", 1000));
      !r.ok()) {
    return fail(r.status().ToString());
  }
  nlohmann::json req;
  req["model"] = "kvo-sim";
  req["prompt_token_ids"] = tokens;
  req["max_tokens"] = 1;
  const std::string body = req.dump();
  const int n = options.quick ? 300 : 3000;
  route::ClientPool direct(HttpAddress{"127.0.0.1", engines[0]->port()}, 5000);

  int rc = 0;
  for (route::Policy policy : {route::Policy::kKv, route::Policy::kRoundRobin}) {
    route::RouterOptions ro;
    ro.policy.policy = policy;
    ro.policy.block_size = kBlock;
    ro.indexer = HttpAddress{"127.0.0.1", (*svc)->http_port()};
    ro.model = "kvo-sim";
    std::vector<route::EngineConfig> ec_list;
    for (size_t i = 0; i < engines.size(); ++i) {
      route::EngineConfig c;
      c.instance_id = i == 0 ? "eng-a" : "eng-b";
      c.address = HttpAddress{"127.0.0.1", engines[i]->port()};
      c.url = "http://127.0.0.1:" + std::to_string(engines[i]->port());
      // round-robin: one engine, so that every routed request meets the same engine as the
      // direct one (the figure is then the hop alone).
      if (policy == route::Policy::kRoundRobin && i > 0) continue;
      ec_list.push_back(c);
    }
    auto router = route::Router::Create(ro, ec_list);
    if (!router.ok()) return fail(router.status().ToString());
    HttpServerOptions o;
    o.address = HttpAddress{"127.0.0.1", 0};
    o.worker_threads = 4;
    route::Router* r = router->get();
    auto server = HttpServer::Start(o, [r](const HttpRequest& q) { return r->Handle(q); });
    if (!server.ok()) return fail(server.status().ToString());
    route::ClientPool routed(HttpAddress{"127.0.0.1", (*server)->port()}, 5000);
    Sample warm, s;
    Status st = Measure(direct, routed, body, 100, "eng-a", &warm);
    if (st.ok()) st = Measure(direct, routed, body, n, "eng-a", &s);
    (*server)->Stop();
    if (!st.ok()) return fail(st.ToString());
    const std::string pname(route::PolicyName(policy));
    for (double p : {50.0, 99.0}) {
      double routed_p = Percentile(s.routed_us, p);
      double direct_p = Percentile(s.direct_us, p);
      double added = routed_p - direct_p;
      BenchResult res;
      res.area = "route";
      res.name = pname + "_p" + std::to_string(static_cast<int>(p)) + "_latency";
      res.unit = "us";
      res.value = routed_p;
      res.baseline_name = "direct request to the engine";
      res.baseline = direct_p;
      char notes[256];
      std::snprintf(notes, sizeof notes,
                    "added %.0f us at p%.0f over %d interleaved requests, %d-token prompt%s", added,
                    p, n, kPromptTokens,
                    p == 99.0 ? (added < 1000.0 ? "; target added p99 < 1000 us: met"
                                                : "; target added p99 < 1000 us: NOT met")
                              : "");
      res.notes = notes;
      PrintResult(res, options);
    }
  }
  (*svc)->Stop();
  for (auto& e : engines) e->Stop();
  std::filesystem::remove_all(dir, ec);
  return rc;
}

}  // namespace kvo::bench
