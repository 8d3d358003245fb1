#include "sim/server.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/logging.h"
#include "openai/openai.h"

namespace kvo::sim {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

HttpResponse Json(int status, const json& j) {
  return HttpResponse(status, "application/json", Dump(j));
}

HttpResponse Error(int status, std::string_view message, std::string_view param = {}) {
  return HttpResponse(status, "application/json", openai::ErrorJson(status, message, param));
}

// The parameter an InvalidArgument from kvo_openai names: its message's first word.
std::string ParamOf(const std::string& message) {
  size_t end = message.find_first_of(":[. ");
  std::string p = message.substr(0, end);
  return p == "body" ? std::string() : p;
}

// Client form of a bound endpoint: tcp://*:P -> tcp://127.0.0.1:P.
std::string ClientEndpoint(std::string e) {
  if (e.starts_with("tcp://*:")) e = "tcp://127.0.0.1:" + e.substr(8);
  if (e.starts_with("tcp://0.0.0.0:")) e = "tcp://127.0.0.1:" + e.substr(14);
  return e;
}

constexpr const char* kWords[] = {" the", " cache", " block", " token", " prefix", " of",
                                  " kv",  " and",   " to",    " a",     " engine", " is",
                                  " in",  " warm",  " hit",   " fast"};

}  // namespace

struct SimServer::Impl {
  SimEngine* engine = nullptr;
  SimTiming timing;
  std::string instance_id, engine_model;
  std::unique_ptr<HttpServer> http;
  std::atomic<uint64_t> next_id{0};
  std::atomic<uint64_t> generation_tokens{0}, request_errors{0}, requests_finished{0};

  // Scheduler: FIFO tickets, at most max_concurrency running.
  std::mutex mu;
  std::condition_variable cv;
  uint64_t next_ticket = 0, admit_next = 0;
  int running = 0;
  bool stopping = false;
  Clock::time_point gpu_free_at = Clock::now();  // the shared prefill timeline

  // False when stopping or the queue is full.
  bool Acquire() {
    std::unique_lock<std::mutex> lock(mu);
    if (stopping || next_ticket - admit_next >= uint64_t(timing.max_waiting)) return false;
    const uint64_t t = next_ticket++;
    cv.wait(lock,
            [&] { return stopping || (t == admit_next && running < timing.max_concurrency); });
    if (stopping) return false;
    ++admit_next;
    ++running;
    cv.notify_all();
    return true;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu);
    --running;
    cv.notify_all();
  }
  // Modelled time passes; false when the server stops first.
  bool SleepUntil(Clock::time_point t) {
    std::unique_lock<std::mutex> lock(mu);
    return !cv.wait_until(lock, t, [&] { return stopping; });
  }
  Clock::time_point ReservePrefill(double seconds) {
    std::lock_guard<std::mutex> lock(mu);
    const auto start = std::max(Clock::now(), gpu_free_at);
    gpu_free_at =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    return gpu_free_at;
  }
  std::pair<int, int> RunningWaiting() {
    std::lock_guard<std::mutex> lock(mu);
    return {running, static_cast<int>(next_ticket - admit_next)};
  }

  HttpResponse Handle(const HttpRequest& r);
  HttpResponse Complete(const HttpRequest& r, openai::Endpoint endpoint);
  json State();
  std::string Metrics();
};

namespace {

// What one request went through, for its response.
struct Outcome {
  ServeResult serve;
  double queue_ms = 0, prefill_ms = 0;
  int completion_tokens = 0;
  int error_status = 0;  // 0: fine
  std::string error;
};

json KvoObject(const std::string& instance, const Outcome& o) {
  json hit = json::object();
  for (int m = 0; m < kNumMedia; ++m) hit[MediumName(m)] = o.serve.hit_tokens[m];
  return {{"instance_id", instance},
          {"hit_tokens", hit},
          {"queue_ms", o.queue_ms},
          {"prefill_ms", o.prefill_ms},
          {"load_ms", o.serve.load_seconds * 1000.0}};
}

json Usage(const Outcome& o) {
  size_t cached = 0;
  for (int m = 0; m < kNumMedia; ++m) cached += o.serve.hit_tokens[m];
  return {{"prompt_tokens", o.serve.prompt_tokens},
          {"completion_tokens", o.completion_tokens},
          {"total_tokens", o.serve.prompt_tokens + size_t(o.completion_tokens)},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

}  // namespace

HttpResponse SimServer::Impl::Complete(const HttpRequest& r, openai::Endpoint endpoint) {
  auto parsed = endpoint == openai::Endpoint::kCompletions
                    ? openai::ParseCompletionRequest(r.body)
                    : openai::ParseChatCompletionRequest(r.body);
  if (!parsed.ok()) {
    return Error(400, parsed.status().message(), ParamOf(parsed.status().message()));
  }
  const std::string& model = engine_model;
  if (!parsed->model.empty() && parsed->model != model) {
    return Error(
        404,
        "The model `" + parsed->model + "` does not exist (this engine serves `" + model + "`).",
        "model");
  }
  if (parsed->prompt_tokens.empty()) return Error(400, "prompt: empty", "prompt");
  const SimEngineOptions& eo = engine->options();
  const size_t blocks = parsed->prompt_tokens.size() / size_t(eo.block_size);
  if (blocks > eo.gpu_blocks) {
    // vLLM answers a prompt beyond max_model_len with 400 as well.
    return Error(400,
                 "prompt: " + std::to_string(parsed->prompt_tokens.size()) + " tokens need " +
                     std::to_string(blocks) + " KV blocks; this engine's GPU cache holds " +
                     std::to_string(eo.gpu_blocks) + " (--gpu-blocks)",
                 "prompt");
  }
  const bool chat = endpoint == openai::Endpoint::kChatCompletions;
  const uint64_t n = next_id.fetch_add(1);
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + instance_id + "-" + std::to_string(n);
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  auto req = std::make_shared<openai::CompletionRequest>(std::move(parsed).value());

  // Runs the request; `emit` gets each generated piece of text (false: the client left).
  auto run = [this, req, id, n](const std::function<bool(const std::string&, bool first)>& emit) {
    Outcome o;
    const auto t0 = Clock::now();
    if (!Acquire()) {
      o.error_status = 503;
      o.error = "engine busy or stopping: retry later";
      return o;
    }
    o.queue_ms = MsSince(t0);
    struct Slot {
      Impl* s;
      ~Slot() { s->Release(); }
    } slot{this};
    auto served = engine->Serve(req->prompt_tokens, id);
    if (!served.ok()) {
      o.error_status = 500;
      o.error = served.status().ToString();
      KVO_LOG_ERROR("{}: {}", id, o.error);
      return o;
    }
    o.serve = *served;
    const auto t_prefill = Clock::now();
    const auto done = ReservePrefill(double(o.serve.computed_tokens) / timing.prefill_tps);
    if (!SleepUntil(done)) return o;
    o.prefill_ms = MsSince(t_prefill);
    const auto first = Clock::now();
    uint64_t x = timing.seed ^ (n * 0x9e3779b97f4a7c15ULL);
    for (int i = 0; i < req->max_tokens; ++i) {
      if (i > 0 && !SleepUntil(first + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(i / timing.decode_tps)))) {
        break;
      }
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      ++o.completion_tokens;
      if (!emit(kWords[(x >> 59) & 15], i == 0)) break;
    }
    generation_tokens += uint64_t(o.completion_tokens);
    ++requests_finished;
    return o;
  };

  const std::string object = chat ? "chat.completion" : "text_completion";
  if (!req->stream) {
    std::string text;
    Outcome o = run([&](const std::string& piece, bool) {
      text += piece;
      return true;
    });
    if (o.error_status != 0) {
      ++request_errors;
      return Error(o.error_status, o.error);
    }
    json choice = {{"index", 0}, {"finish_reason", "length"}, {"logprobs", nullptr}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
      choice["text"] = text;
    }
    return Json(200, {{"id", id},
                      {"object", object},
                      {"created", created},
                      {"model", model},
                      {"choices", json::array({choice})},
                      {"usage", Usage(o)},
                      {"kvo", KvoObject(instance_id, o)}});
  }
  const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
  return HttpResponse::Stream(
      [this, run, id, created, chat, chunk_object, model](const ChunkWriter& write) {
        auto chunk = [&](const std::string& piece, bool first, const json& finish) {
          json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
          if (chat) {
            json delta = {{"content", piece}};
            if (first) delta["role"] = "assistant";
            choice["delta"] = delta;
          } else {
            choice["text"] = piece;
          }
          return json{{"id", id},
                      {"object", chunk_object},
                      {"created", created},
                      {"model", model},
                      {"choices", json::array({choice})}};
        };
        Outcome o = run([&](const std::string& piece, bool first) {
          return write(openai::SseData(Dump(chunk(piece, first, nullptr))));
        });
        if (o.error_status != 0) {
          ++request_errors;
          write(openai::SseData(openai::ErrorJson(o.error_status, o.error)));
          write(openai::kSseDone);
          return;
        }
        json last = chunk("", o.completion_tokens == 0, "length");
        last["usage"] = Usage(o);
        last["kvo"] = KvoObject(instance_id, o);
        if (write(openai::SseData(Dump(last)))) write(openai::kSseDone);
      });
}

json SimServer::Impl::State() {
  EngineState st = engine->State();
  const EngineCounters& c = st.counters;
  auto [run, wait] = RunningWaiting();
  auto per = [](const uint64_t* v, int from) {
    json o = json::object();
    for (int m = from; m < kNumMedia; ++m) o[MediumName(m)] = v[m];
    return o;
  };
  json blocks = json::object(), digest = json::object();
  for (int m = 0; m < kNumMedia; ++m) {
    json list = json::array();
    for (uint64_t h : st.blocks[m]) list.push_back(HashHex(h));
    blocks[MediumName(m)] = std::move(list);
    digest[MediumName(m)] = SetDigest(st.blocks[m]);
  }
  return {{"instance_id", instance_id},
          {"counters",
           {{"requests", c.requests},
            {"prompt_tokens", c.prompt_tokens},
            {"hit_tokens", per(c.hit_tokens, 0)},
            {"prefill_tokens_computed", c.prefill_tokens_computed},
            {"bytes_loaded", per(c.bytes_loaded, 1)},
            {"bytes_stored", per(c.bytes_stored, 1)},
            {"load_seconds", c.load_seconds},
            {"store_seconds", c.store_seconds},
            {"blocks_verified", c.blocks_verified},
            {"mismatches", c.mismatches},
            {"events_published", c.events_published},
            {"gpu_blocks_used", c.gpu_blocks_used},
            {"gpu_blocks_total", c.gpu_blocks_total},
            {"running", run},
            {"waiting", wait}}},
          {"blocks", std::move(blocks)},
          {"digest", std::move(digest)}};
}

std::string SimServer::Impl::Metrics() {
  const EngineCounters c = engine->Counters();
  auto [run, wait] = RunningWaiting();
  const std::string l = "{model_name=\"" + engine_model + "\",engine=\"" + instance_id + "\"}";
  auto line = [](std::string& out, const std::string& name, const char* type,
                 const std::string& labels, double v) {
    out += "# TYPE " + name + " " + type + "\n" + name + labels + " " + std::to_string(v) + "\n";
  };
  std::string out;
  line(out, "vllm:num_requests_running", "gauge", l, run);
  line(out, "vllm:num_requests_waiting", "gauge", l, wait);
  line(out, "vllm:gpu_cache_usage_perc", "gauge", l,
       c.gpu_blocks_total ? double(c.gpu_blocks_used) / double(c.gpu_blocks_total) : 0.0);
  line(out, "vllm:prompt_tokens_total", "counter", l, double(c.prompt_tokens));
  line(out, "vllm:generation_tokens_total", "counter", l, double(generation_tokens.load()));
  line(out, "vllm:request_success_total", "counter", l, double(requests_finished.load()));
  line(out, "vllm:prefix_cache_queries_total", "counter", l, double(c.prompt_tokens));
  line(out, "vllm:prefix_cache_hits_total", "counter", l, double(c.hit_tokens[kGpu]));
  out += "# TYPE kvo_sim_hit_tokens_total counter\n";
  for (int m = 0; m < kNumMedia; ++m) {
    out += "kvo_sim_hit_tokens_total{engine=\"" + instance_id + "\",medium=\"" + MediumName(m) +
           "\"} " + std::to_string(c.hit_tokens[m]) + "\n";
  }
  out += "# TYPE kvo_sim_bytes_loaded_total counter\n";
  for (int m = 1; m < kNumMedia; ++m) {
    out += "kvo_sim_bytes_loaded_total{engine=\"" + instance_id + "\",medium=\"" + MediumName(m) +
           "\"} " + std::to_string(c.bytes_loaded[m]) + "\n";
  }
  const std::string e = "{engine=\"" + instance_id + "\"}";
  line(out, "kvo_sim_prefill_tokens_computed_total", "counter", e,
       double(c.prefill_tokens_computed));
  line(out, "kvo_sim_blocks_verified_total", "counter", e, double(c.blocks_verified));
  line(out, "kvo_sim_mismatches_total", "counter", e, double(c.mismatches));
  line(out, "kvo_sim_events_published_total", "counter", e, double(c.events_published));
  line(out, "kvo_sim_request_errors_total", "counter", e, double(request_errors.load()));
  return out + engine->PrometheusText();
}

HttpResponse SimServer::Impl::Handle(const HttpRequest& r) {
  const bool get = r.method == "GET", post = r.method == "POST";
  if (r.path == "/v1/completions" || r.path == "/v1/chat/completions") {
    if (!post) return Error(405, r.path + " takes POST");
    return Complete(r, r.path == "/v1/completions" ? openai::Endpoint::kCompletions
                                                   : openai::Endpoint::kChatCompletions);
  }
  if (r.path == "/health" && get) return HttpResponse(200, "application/json", "{}");
  if (r.path == "/v1/models" && get) {
    return Json(200, {{"object", "list"},
                      {"data", json::array({{{"id", engine_model},
                                             {"object", "model"},
                                             {"created", 0},
                                             {"owned_by", "kvo"},
                                             {"root", engine_model}}})}});
  }
  if (r.path == "/metrics" && get) {
    return HttpResponse(200, "text/plain; version=0.0.4", Metrics());
  }
  if (r.path == "/kv_event_sources" && get) {
    const KvEventsConfig& ev = engine->events_config();
    json sources = json::array();
    if (ev.enable_kv_cache_events && ev.publisher != "null") {
      json s = {{"data_parallel_rank", 0},
                {"endpoint", ClientEndpoint(ev.endpoint)},
                {"topic", ev.topic},
                {"instance_id", instance_id}};
      s["replay_endpoint"] =
          ev.replay_endpoint ? json(ClientEndpoint(*ev.replay_endpoint)) : json(nullptr);
      sources.push_back(std::move(s));
    }
    return Json(200, {{"sources", std::move(sources)}, {"instance_id", instance_id}});
  }
  if (r.path == "/reset_prefix_cache" && post) {
    Status s = engine->ResetPrefixCache();
    if (!s.ok()) return Error(500, s.ToString());
    return HttpResponse(200, "application/json", "{}");
  }
  if (r.path == "/kvo/state" && get) {
    engine->FlushEvents();
    return Json(200, State());
  }
  return Error(404, "no route " + r.method + " " + r.path);
}

SimServer::SimServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SimServer::~SimServer() { Stop(); }

int SimServer::port() const { return impl_->http->port(); }

void SimServer::Stop() {
  if (!impl_ || !impl_->http) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    impl_->cv.notify_all();
  }
  impl_->http->Stop();
}

Result<std::unique_ptr<SimServer>> SimServer::Start(SimEngine* engine, const HttpAddress& address,
                                                    const SimTiming& timing) {
  if (!(timing.prefill_tps > 0)) return Status::InvalidArgument("--prefill-tps must be positive");
  if (!(timing.decode_tps > 0)) return Status::InvalidArgument("--decode-tps must be positive");
  if (timing.max_concurrency < 1) {
    return Status::InvalidArgument("--max-concurrency must be positive");
  }
  auto impl = std::make_unique<Impl>();
  impl->engine = engine;
  impl->timing = timing;
  impl->instance_id = engine->options().instance_id;
  impl->engine_model = engine->options().model;
  HttpServerOptions ho;
  ho.address = address;
  // Each running or queued request holds a worker (streams and the FIFO queue block on it).
  ho.worker_threads = std::min(timing.max_concurrency + 64, 512);
  ho.max_pending_requests = timing.max_waiting + timing.max_concurrency;
  ho.priority_paths = {"/health", "/metrics", "/kvo/state", "/kv_event_sources"};
  Impl* raw = impl.get();
  KVO_ASSIGN_OR_RETURN(
      impl->http, HttpServer::Start(ho, [raw](const HttpRequest& r) { return raw->Handle(r); }));
  return std::unique_ptr<SimServer>(new SimServer(std::move(impl)));
}

}  // namespace kvo::sim
