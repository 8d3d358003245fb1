// The stateful router (route.h): engines, in-flight counts, the indexer client, forwarding,
// retries and metrics. nlohmann_json exceptions stop in this file.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <random>
#include <set>
#include <thread>

#include "common/json.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "openai/openai.h"
#include "route/engine_client.h"
#include "route/route.h"

namespace kvo::route {
namespace {

using nlohmann::json;
using OJson = nlohmann::ordered_json;

constexpr size_t kLatencyWindow = 8192;   // routing latencies kept for /route/stats percentiles
constexpr size_t kMaxQueuedChunks = 256;  // a streaming relay's bound on chunks not yet written

HttpResponse Json(int status, std::string body) {
  return HttpResponse{status, "application/json", std::move(body)};
}

HttpResponse OpenAiError(int status, const std::string& message) {
  return Json(status, openai::ErrorJson(status, message));
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::lround(p / 100.0 * static_cast<double>(v.size() - 1)));
  return v[std::min(i, v.size() - 1)];
}

// Per engine. Counters are atomics (read by /route/stats without a lock).
struct EngineState {
  EngineConfig config;
  std::unique_ptr<ClientPool> pool;
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> down_until_ns{0};
  std::atomic<int64_t> decisions{0};
  std::atomic<int64_t> predicted_hit_tokens{0};
  std::atomic<int64_t> delivered_hit_tokens{0};
  std::atomic<int64_t> delivered_reports{0};  // answers that reported their hit tokens
  std::atomic<int64_t> failures{0};           // times it could not be reached
  std::atomic<int64_t> errors{0};             // answers with an HTTP error status
  Counter* m_decisions = nullptr;
  Counter* m_predicted = nullptr;
  Counter* m_delivered = nullptr;
  Counter* m_failures = nullptr;
  Gauge* m_in_flight = nullptr;
};

// Chunks handed from the thread reading an engine's streamed answer to the server's writer.
struct Relay {
  Mutex mu;
  CondVar cv{&mu};
  bool head GUARDED_BY(mu) = false;
  int status GUARDED_BY(mu) = 0;
  std::string content_type GUARDED_BY(mu);
  std::deque<std::string> chunks GUARDED_BY(mu);
  bool done GUARDED_BY(mu) = false;
  bool cancelled GUARDED_BY(mu) = false;
  Status result GUARDED_BY(mu);
  std::thread reader;
};

}  // namespace

struct Router::Impl {
  RouterOptions options;
  Clock* clock = nullptr;
  std::vector<std::unique_ptr<EngineState>> engines;
  std::unique_ptr<ClientPool> indexer;
  std::atomic<uint64_t> turn{0};
  Mutex rng_mu;
  std::mt19937_64 rng GUARDED_BY(rng_mu);

  std::atomic<int64_t> requests{0};
  std::atomic<int64_t> retries{0};
  std::atomic<int64_t> unplaced{0};
  std::atomic<int64_t> indexer_errors{0};
  std::atomic<int64_t> bad_requests{0};
  MetricsRegistry metrics;
  Counter* m_requests = nullptr;
  Counter* m_retries = nullptr;
  Counter* m_unplaced = nullptr;
  Counter* m_indexer_errors = nullptr;
  Histogram* m_latency = nullptr;
  mutable Mutex lat_mu;
  std::vector<double> latencies_ms GUARDED_BY(lat_mu);
  size_t lat_next GUARDED_BY(lat_mu) = 0;

  Status Init();
  int64_t Now() { return clock->MonotonicNanos(); }
  void RecordLatency(int64_t ns);
  std::map<std::string, PrefixMatch> QueryIndexer(const std::vector<uint32_t>& tokens);
  HttpResponse Complete(const HttpRequest& r, bool chat);
  HttpResponse Forward(const HttpRequest& r, const std::string& path);
  void MarkDown(EngineState* e);
  void Delivered(EngineState* e, std::optional<int64_t> tokens);
  HttpResponse StartStream(EngineState* e, const HttpRequest& r, bool* unreachable);
  std::string Stats() const;
};

Status Router::Impl::Init() {
  clock = options.clock != nullptr ? options.clock : SystemClock();
  {
    MutexLock lock(&rng_mu);
    rng.seed(options.seed);
  }
  if (options.policy.policy == Policy::kKv && !options.indexer) {
    return Status::InvalidArgument("--policy kv needs --indexer URL");
  }
  if (options.policy.block_size < 1) {
    return Status::InvalidArgument("--block-size must be >= 1, got " +
                                   std::to_string(options.policy.block_size));
  }
  if (!std::isfinite(options.policy.load_penalty) || options.policy.load_penalty < 0) {
    return Status::InvalidArgument("--load-penalty must be a finite number >= 0");
  }
  if (options.indexer) {
    indexer = std::make_unique<ClientPool>(*options.indexer, options.indexer_timeout_ms);
  }
  KVO_ASSIGN_OR_RETURN(auto* dec,
                       metrics.AddCounterFamily("kvo_route_decisions_total",
                                                "Requests placed, by instance", {"instance"}));
  KVO_ASSIGN_OR_RETURN(auto* pred, metrics.AddCounterFamily(
                                       "kvo_route_predicted_hit_tokens_total",
                                       "Prefix tokens the indexer reported for the chosen instance "
                                       "(kv policy)",
                                       {"instance"}));
  KVO_ASSIGN_OR_RETURN(
      auto* deliv,
      metrics.AddCounterFamily("kvo_route_delivered_hit_tokens_total",
                               "Hit tokens the engines reported in their answers "
                               "(kvo.hit_tokens, else usage.prompt_tokens_details.cached_tokens)",
                               {"instance"}));
  KVO_ASSIGN_OR_RETURN(auto* fail,
                       metrics.AddCounterFamily("kvo_route_engine_unreachable_total",
                                                "Times an engine could not be reached (the "
                                                "request was retried on another)",
                                                {"instance"}));
  KVO_ASSIGN_OR_RETURN(
      auto* inflight,
      metrics.AddGaugeFamily("kvo_route_in_flight", "Requests forwarded and not yet answered",
                             {"instance"}));
  KVO_ASSIGN_OR_RETURN(
      m_requests, metrics.AddCounter("kvo_route_requests_total", "Completion requests received"));
  KVO_ASSIGN_OR_RETURN(m_retries,
                       metrics.AddCounter("kvo_route_retries_total",
                                          "Requests sent again to another engine after one "
                                          "could not be reached"));
  KVO_ASSIGN_OR_RETURN(m_unplaced,
                       metrics.AddCounter("kvo_route_unplaced_total",
                                          "Requests answered 503: no engine could be reached"));
  KVO_ASSIGN_OR_RETURN(
      m_indexer_errors,
      metrics.AddCounter("kvo_route_indexer_errors_total",
                         "Indexer queries that failed (the request was placed without scores)"));
  KVO_ASSIGN_OR_RETURN(
      m_latency, metrics.AddHistogram(
                     "kvo_route_decision_seconds",
                     "From the request read to its forwarding (parsing, the indexer query, "
                     "the policy)",
                     {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25}));
  for (auto& e : engines) {
    const std::string& id = e->config.instance_id;
    KVO_ASSIGN_OR_RETURN(e->m_decisions, dec->WithLabels({id}));
    KVO_ASSIGN_OR_RETURN(e->m_predicted, pred->WithLabels({id}));
    KVO_ASSIGN_OR_RETURN(e->m_delivered, deliv->WithLabels({id}));
    KVO_ASSIGN_OR_RETURN(e->m_failures, fail->WithLabels({id}));
    KVO_ASSIGN_OR_RETURN(e->m_in_flight, inflight->WithLabels({id}));
  }
  return Status::Ok();
}

void Router::Impl::RecordLatency(int64_t ns) {
  m_latency->Observe(static_cast<double>(ns) / 1e9);
  MutexLock lock(&lat_mu);
  double ms = static_cast<double>(ns) / 1e6;
  if (latencies_ms.size() < kLatencyWindow) {
    latencies_ms.push_back(ms);
  } else {
    latencies_ms[lat_next] = ms;
    lat_next = (lat_next + 1) % kLatencyWindow;
  }
}

std::map<std::string, PrefixMatch> Router::Impl::QueryIndexer(const std::vector<uint32_t>& tokens) {
  const int64_t bs = options.policy.block_size;
  // Only complete blocks can match: the tail is not sent.
  size_t n = tokens.size() / static_cast<size_t>(bs) * static_cast<size_t>(bs);
  if (n == 0 || !indexer) return {};
  std::vector<int64_t> ids(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(n));
  std::string body = RenderQueryRequest(options.model, bs, ids);
  auto res = indexer->Call("POST", "/query", body);
  Status st;
  if (!res.ok()) {
    st = res.status();
  } else if (res->status != 200) {
    st = Status::Unavailable("indexer /query answered " + std::to_string(res->status) + ": " +
                             CutForMessage(res->body, 256));
  } else {
    auto parsed = ParseQueryResponse(res->body, options.tenant);
    if (parsed.ok()) return std::move(parsed).value();
    st = parsed.status();
  }
  int64_t errors = indexer_errors.fetch_add(1, std::memory_order_relaxed) + 1;
  m_indexer_errors->Increment();
  if ((errors & (errors - 1)) == 0) {  // the 1st, 2nd, 4th, 8th ... failure: no log flood
    KVO_LOG_WARN("kvo route: indexer query failed ({} so far; placing without scores): {}", errors,
                 st.ToString());
  }
  return {};
}

void Router::Impl::MarkDown(EngineState* e) {
  e->failures.fetch_add(1, std::memory_order_relaxed);
  e->m_failures->Increment();
  e->down_until_ns.store(Now() + options.down_ms * 1'000'000, std::memory_order_relaxed);
}

void Router::Impl::Delivered(EngineState* e, std::optional<int64_t> tokens) {
  if (!tokens) return;
  e->delivered_hit_tokens.fetch_add(*tokens, std::memory_order_relaxed);
  e->delivered_reports.fetch_add(1, std::memory_order_relaxed);
  e->m_delivered->Increment(static_cast<double>(*tokens));
}

HttpResponse Router::Impl::Complete(const HttpRequest& r, bool chat) {
  const int64_t start = Now();
  requests.fetch_add(1, std::memory_order_relaxed);
  m_requests->Increment();
  auto req =
      chat ? openai::ParseChatCompletionRequest(r.body) : openai::ParseCompletionRequest(r.body);
  if (!req.ok()) {
    bad_requests.fetch_add(1, std::memory_order_relaxed);
    return OpenAiError(400, req.status().message());
  }
  std::map<std::string, PrefixMatch> matches;
  if (options.policy.policy == Policy::kKv) matches = QueryIndexer(req->prompt_tokens);

  std::vector<Candidate> candidates(engines.size());
  std::vector<bool> tried(engines.size(), false);
  uint64_t turn_now = turn.fetch_add(1, std::memory_order_relaxed);
  bool first = true;
  std::string last_error;
  for (size_t attempt = 0; attempt < engines.size(); ++attempt) {
    const int64_t now = Now();
    for (size_t i = 0; i < engines.size(); ++i) {
      EngineState& e = *engines[i];
      Candidate& c = candidates[i];
      auto m = matches.find(e.config.instance_id);
      c.match = m == matches.end() ? PrefixMatch{} : m->second;
      c.in_flight = e.in_flight.load(std::memory_order_relaxed);
      c.available = !tried[i] && e.down_until_ns.load(std::memory_order_relaxed) <= now;
    }
    uint64_t draw;
    {
      MutexLock lock(&rng_mu);
      draw = rng();
    }
    Choice choice = Pick(options.policy, candidates, turn_now, draw);
    if (choice.index < 0) break;
    EngineState* e = engines[static_cast<size_t>(choice.index)].get();
    tried[static_cast<size_t>(choice.index)] = true;
    if (first) {
      RecordLatency(Now() - start);
      first = false;
    } else {
      retries.fetch_add(1, std::memory_order_relaxed);
      m_retries->Increment();
    }
    e->in_flight.fetch_add(1, std::memory_order_relaxed);
    e->m_in_flight->Increment();
    auto done = [e] {
      e->in_flight.fetch_sub(1, std::memory_order_relaxed);
      e->m_in_flight->Decrement();
    };
    auto decided = [&] {
      e->decisions.fetch_add(1, std::memory_order_relaxed);
      e->m_decisions->Increment();
      e->predicted_hit_tokens.fetch_add(choice.predicted_hit_tokens, std::memory_order_relaxed);
      e->m_predicted->Increment(static_cast<double>(choice.predicted_hit_tokens));
    };
    if (req->stream) {
      bool unreachable = false;
      HttpResponse out = StartStream(e, r, &unreachable);
      if (!unreachable) {
        decided();
        return out;  // the relay's producer ends the in-flight count
      }
      last_error = out.body;
      MarkDown(e);
      done();
      continue;
    }
    auto res = e->pool->Call("POST", r.path, r.body);
    done();
    if (!res.ok()) {
      last_error = res.status().message();
      KVO_LOG_WARN("kvo route: engine {} unreachable, trying another: {}", e->config.instance_id,
                   last_error);
      MarkDown(e);
      continue;
    }
    decided();
    if (res->status == 200) {
      Delivered(e, DeliveredHitTokens(res->body));
    } else {
      e->errors.fetch_add(1, std::memory_order_relaxed);
    }
    return Json(res->status, std::move(res->body));  // engine errors are relayed as they are
  }
  unplaced.fetch_add(1, std::memory_order_relaxed);
  m_unplaced->Increment();
  return OpenAiError(503, "no engine could take the request" +
                              (last_error.empty() ? std::string(" (all are down)")
                                                  : ": last error: " + last_error));
}

HttpResponse Router::Impl::StartStream(EngineState* e, const HttpRequest& r, bool* unreachable) {
  auto relay = std::make_shared<Relay>();
  ClientPool* pool = e->pool.get();
  std::string path = r.path;
  std::string body = r.body;
  relay->reader = std::thread([relay, pool, path = std::move(path), body = std::move(body)] {
    auto on_head = [&](int status, const std::string& type) {
      MutexLock lock(&relay->mu);
      relay->head = true;
      relay->status = status;
      relay->content_type = type;
      relay->cv.SignalAll();
      return !relay->cancelled;
    };
    auto on_chunk = [&](std::string_view data) {
      MutexLock lock(&relay->mu);
      while (relay->chunks.size() >= kMaxQueuedChunks && !relay->cancelled) relay->cv.Wait();
      if (relay->cancelled) return false;
      relay->chunks.emplace_back(data);
      relay->cv.SignalAll();
      return true;
    };
    auto res = pool->Stream(path, body, on_head, on_chunk);
    MutexLock lock(&relay->mu);
    relay->done = true;
    relay->result = res.ok() ? Status::Ok() : res.status();
    relay->cv.SignalAll();
  });
  bool reachable = false;
  std::string why;
  int status = 0;
  std::string type;
  {
    MutexLock lock(&relay->mu);
    while (!relay->head && !relay->done) relay->cv.Wait();
    reachable = relay->head;
    why = relay->result.message();
    status = relay->status;
    type = relay->content_type.empty() ? "text/event-stream" : relay->content_type;
  }
  if (!reachable) {
    relay->reader.join();
    *unreachable = true;
    return HttpResponse{503, "application/json", why};
  }
  Impl* self = this;
  HttpResponse out = HttpResponse::Stream(
      [relay, e, self, status](const ChunkWriter& write) {
        openai::SseReader sse;
        std::optional<int64_t> delivered;
        std::string error_body;
        bool writer_ok = true;
        for (;;) {
          std::string chunk;
          {
            MutexLock lock(&relay->mu);
            while (relay->chunks.empty() && !relay->done) relay->cv.Wait();
            if (relay->chunks.empty()) break;
            chunk = std::move(relay->chunks.front());
            relay->chunks.pop_front();
            relay->cv.SignalAll();
          }
          if (status == 200) {
            (void)sse.Feed(chunk, [&](std::string_view data) {
              if (data == "[DONE]") return;
              if (auto d = DeliveredHitTokens(data)) delivered = d;
            });
          }
          if (writer_ok && !write(chunk)) {
            writer_ok = false;  // the client went away: stop reading the engine
            MutexLock lock(&relay->mu);
            relay->cancelled = true;
            relay->cv.SignalAll();
          }
        }
        relay->reader.join();
        if (status == 200) {
          self->Delivered(e, delivered);
        } else {
          e->errors.fetch_add(1, std::memory_order_relaxed);
        }
        e->in_flight.fetch_sub(1, std::memory_order_relaxed);
        e->m_in_flight->Decrement();
      },
      type);
  out.status = status;
  return out;
}

HttpResponse Router::Impl::Forward(const HttpRequest& r, const std::string& path) {
  const int64_t now = Now();
  for (auto& e : engines) {
    if (e->down_until_ns.load(std::memory_order_relaxed) > now) continue;
    auto res = e->pool->Call(r.method, path, r.body);
    if (!res.ok()) {
      MarkDown(e.get());
      continue;
    }
    return Json(res->status, std::move(res->body));
  }
  return OpenAiError(503, "no engine could be reached for " + path);
}

std::string Router::Impl::Stats() const {
  OJson out;
  out["policy"] = std::string(PolicyName(options.policy.policy));
  OJson w;
  w["GPU"] = options.policy.weights.gpu;
  w["CPU"] = options.policy.weights.cpu;
  w["DISK"] = options.policy.weights.disk;
  out["tier_weights"] = std::move(w);
  out["load_penalty"] = options.policy.load_penalty;
  out["block_size"] = options.policy.block_size;
  out["requests"] = requests.load();
  out["retries"] = retries.load();
  out["unplaced"] = unplaced.load();
  out["indexer_errors"] = indexer_errors.load();
  out["bad_requests"] = bad_requests.load();
  int64_t predicted = 0, delivered = 0;
  OJson list = OJson::array();
  const int64_t now = clock->MonotonicNanos();
  for (const auto& e : engines) {
    OJson j;
    j["instance_id"] = e->config.instance_id;
    j["url"] = e->config.url;
    j["up"] = e->down_until_ns.load() <= now;
    j["decisions"] = e->decisions.load();
    j["in_flight"] = e->in_flight.load();
    j["predicted_hit_tokens"] = e->predicted_hit_tokens.load();
    j["delivered_hit_tokens"] = e->delivered_hit_tokens.load();
    j["delivered_reports"] = e->delivered_reports.load();
    j["unreachable"] = e->failures.load();
    j["error_answers"] = e->errors.load();
    predicted += e->predicted_hit_tokens.load();
    delivered += e->delivered_hit_tokens.load();
    list.push_back(std::move(j));
  }
  out["predicted_hit_tokens"] = predicted;
  out["delivered_hit_tokens"] = delivered;
  out["instances"] = std::move(list);
  std::vector<double> lat;
  {
    MutexLock lock(&lat_mu);
    lat = latencies_ms;
  }
  OJson l;
  l["count"] = lat.size();
  l["p50"] = Percentile(lat, 50);
  l["p90"] = Percentile(lat, 90);
  l["p99"] = Percentile(lat, 99);
  l["max"] = lat.empty() ? 0.0 : *std::max_element(lat.begin(), lat.end());
  out["routing_latency_ms"] = std::move(l);
  return out.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

Router::Router(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Router::~Router() = default;

Result<std::unique_ptr<Router>> Router::Create(RouterOptions options,
                                               std::vector<EngineConfig> engines) {
  if (engines.empty()) return Status::InvalidArgument("no engine: give at least one --engine URL");
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  std::set<std::string> ids;
  for (EngineConfig& c : engines) {
    if (!ids.insert(c.instance_id).second) {
      return Status::InvalidArgument("two engines have the instance id '" + c.instance_id + "'");
    }
    auto e = std::make_unique<EngineState>();
    e->pool = std::make_unique<ClientPool>(c.address, impl->options.engine_timeout_ms);
    e->config = std::move(c);
    impl->engines.push_back(std::move(e));
  }
  KVO_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Router>(new Router(std::move(impl)));
}

HttpResponse Router::Handle(const HttpRequest& r) {
  auto only = [&](const char* method) -> std::optional<HttpResponse> {
    if (r.method == method) return std::nullopt;
    return OpenAiError(
        405, CutForMessage(r.method, 16) + " " + CutForMessage(r.path) + ": use " + method);
  };
  if (r.path == "/v1/completions" || r.path == "/v1/chat/completions") {
    if (auto bad = only("POST")) return *bad;
    return impl_->Complete(r, r.path == "/v1/chat/completions");
  }
  if (r.path == "/v1/models") {
    if (auto bad = only("GET")) return *bad;
    return impl_->Forward(r, r.path);
  }
  if (r.path == "/health") {
    if (auto bad = only("GET")) return *bad;
    const int64_t now = impl_->Now();
    size_t up = 0;
    for (const auto& e : impl_->engines) up += e->down_until_ns.load() <= now ? 1 : 0;
    return Json(up > 0 ? 200 : 503, "{\"status\":\"" + std::string(up > 0 ? "ok" : "no engine up") +
                                        "\",\"engines\":" + std::to_string(impl_->engines.size()) +
                                        ",\"engines_up\":" + std::to_string(up) + "}");
  }
  if (r.path == "/metrics") {
    if (auto bad = only("GET")) return *bad;
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", MetricsText()};
  }
  if (r.path == "/route/stats") {
    if (auto bad = only("GET")) return *bad;
    return Json(200, StatsJson());
  }
  return OpenAiError(404, "no such path: " + CutForMessage(r.path));
}

std::string Router::StatsJson() const { return impl_->Stats(); }
std::string Router::MetricsText() const { return impl_->metrics.RenderPrometheus(); }

Result<std::vector<EngineConfig>> DiscoverEngines(const std::vector<std::string>& urls,
                                                  const std::optional<HttpAddress>& register_with,
                                                  const std::string& model, int64_t block_size,
                                                  int timeout_ms) {
  std::vector<EngineConfig> out;
  for (const std::string& url : urls) {
    EngineConfig c;
    c.url = url;
    while (!c.url.empty() && c.url.back() == '/') c.url.pop_back();
    auto addr = ParseHttpUrl(url);
    if (!addr.ok()) return Status::InvalidArgument("--engine: " + addr.status().message());
    c.address = *addr;
    // The indexer's names allow [A-Za-z0-9_.:@-]: HOST:PORT, not the URL.
    c.instance_id = c.address.host + ":" + std::to_string(c.address.port);
    // The engine's own name, when it tells it (kvo sim's GET /kvo/state).
    auto state = HttpCall(c.address, "GET", "/kvo/state", "", timeout_ms);
    if (!state.ok()) {
      return Status::Unavailable("--engine " + url + ": " + state.status().message());
    }
    if (state->status == 200) {
      auto doc = ParseJson(state->body);
      if (doc.ok() && doc->is_object() && doc->contains("instance_id") &&
          (*doc)["instance_id"].is_string()) {
        c.instance_id = (*doc)["instance_id"].get<std::string>();
      }
    }
    if (register_with) {
      auto src = HttpCall(c.address, "GET", "/kv_event_sources", "", timeout_ms);
      if (!src.ok()) return Status::Unavailable("--engine " + url + ": " + src.status().message());
      if (src->status != 200) {
        return Status::Unavailable("--engine " + url + ": GET /kv_event_sources answered " +
                                   std::to_string(src->status) + ": " +
                                   CutForMessage(src->body, 256));
      }
      auto doc = ParseJson(src->body, "GET " + url + "/kv_event_sources");
      if (!doc.ok()) return doc.status();
      try {
        const json& sources = doc->at("sources");
        if (!sources.is_array() || sources.empty()) {
          return Status::InvalidArgument("--engine " + url +
                                         ": GET /kv_event_sources lists no source");
        }
        for (const json& s : sources) {
          OJson reg;
          reg["endpoint"] = s.at("endpoint").get<std::string>();
          if (s.contains("replay_endpoint") && s["replay_endpoint"].is_string()) {
            reg["replay_endpoint"] = s["replay_endpoint"].get<std::string>();
          }
          reg["type"] = "vLLM";
          reg["modelname"] = model;
          reg["instance_id"] = c.instance_id;
          reg["block_size"] = block_size;
          reg["dp_rank"] = s.value("data_parallel_rank", int64_t{0});
          auto res = HttpCall(*register_with, "POST", "/register", reg.dump(), timeout_ms);
          if (!res.ok()) return Status::Unavailable("--indexer: " + res.status().message());
          if (res->status != 200) {
            return Status::InvalidArgument("--indexer refused to register " + c.instance_id + " (" +
                                           url + "): " + CutForMessage(res->body, 512));
          }
        }
      } catch (const json::exception& e) {
        return Status::InvalidArgument("--engine " + url +
                                       ": GET /kv_event_sources: " + CutForMessage(e.what(), 256));
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace kvo::route
