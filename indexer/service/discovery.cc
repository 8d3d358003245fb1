// JSON adapter for vLLM's /kv_event_sources and /v1/models: nlohmann_json exceptions stop here.
#include "indexer/service/discovery.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

#include "common/json.h"
#include "common/logging.h"
#include "http/http_server.h"

namespace kvo {
namespace {

using nlohmann::json;

constexpr size_t kMaxSources = 1024;
constexpr int64_t kMaxRank = 1 << 16;

}  // namespace

std::string RewriteWildcardHost(std::string_view endpoint, std::string_view host) {
  if (!endpoint.starts_with("tcp://")) return std::string(endpoint);
  std::string_view hp = endpoint.substr(6);
  size_t colon = hp.rfind(':');
  if (colon == std::string_view::npos) return std::string(endpoint);
  std::string_view h = hp.substr(0, colon);
  if (h == "*" || h == "0.0.0.0" || h == "[::]" || h == "::" || h == "[*]") {
    std::string bracketed = host.find(':') != std::string_view::npos ? "[" + std::string(host) + "]"
                                                                     : std::string(host);
    return "tcp://" + bracketed + std::string(hp.substr(colon));
  }
  return std::string(endpoint);
}

bool EndpointOnHost(std::string_view endpoint, std::string_view host) {
  if (endpoint.starts_with("ipc://")) return true;
  if (!endpoint.starts_with("tcp://")) return false;
  std::string_view hp = endpoint.substr(6);
  size_t colon = hp.rfind(':');
  if (colon == std::string_view::npos) return false;
  std::string_view h = hp.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  return h == host;
}

Result<std::vector<DiscoveredSource>> ParseKvEventSources(std::string_view body,
                                                          std::string_view host) {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("/kv_event_sources answer: " + what);
  };
  JsonLimits limits;
  limits.max_depth = 8;
  limits.max_array_elements = kMaxSources;
  auto doc = ParseJson(body, "/kv_event_sources answer", limits);
  if (!doc.ok()) return doc.status();
  if (!doc->is_object()) return bad("expected a JSON object, got " + DescribeJson(*doc));
  auto it = doc->find("sources");
  if (it == doc->end()) return bad("'sources' is missing");
  if (!it->is_array()) return bad("'sources' must be an array, got " + DescribeJson(*it));
  std::vector<DiscoveredSource> out;
  std::set<int64_t> ranks;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string at = "'sources[" + std::to_string(i) + "]";
    if (!e.is_object()) return bad(at + "' must be an object, got " + DescribeJson(e));
    DiscoveredSource s;
    auto rank = e.find("data_parallel_rank");
    if (rank == e.end() || rank->is_null()) {
      s.dp_rank = 0;  // a single-rank engine may leave it out
    } else if (!rank->is_number_integer() || rank->get<int64_t>() < 0 ||
               rank->get<int64_t>() > kMaxRank ||
               (rank->is_number_unsigned() && rank->get<uint64_t>() > kMaxRank)) {
      return bad(at + ".data_parallel_rank' must be an integer in [0, " + std::to_string(kMaxRank) +
                 "], got " + DescribeJson(*rank));
    } else {
      s.dp_rank = rank->get<int64_t>();
    }
    if (!ranks.insert(s.dp_rank).second) {
      return bad(at + "': data_parallel_rank " + std::to_string(s.dp_rank) + " is listed twice");
    }
    auto ep = e.find("endpoint");
    if (ep == e.end() || !ep->is_string() || ep->get<std::string>().empty()) {
      return bad(at + ".endpoint' must be a non-empty string, got " +
                 (ep == e.end() ? std::string("nothing") : DescribeJson(*ep)));
    }
    s.endpoint = RewriteWildcardHost(ep->get<std::string>(), host);
    auto rep = e.find("replay_endpoint");
    if (rep != e.end() && !rep->is_null()) {
      if (!rep->is_string()) {
        return bad(at + ".replay_endpoint' must be a string or null, got " + DescribeJson(*rep));
      }
      if (!rep->get<std::string>().empty()) {
        s.replay_endpoint = RewriteWildcardHost(rep->get<std::string>(), host);
      }
    }
    auto topic = e.find("topic");
    if (topic != e.end() && !topic->is_null()) {
      if (!topic->is_string() || topic->get<std::string>().size() > 1024) {
        return bad(at + ".topic' must be a string of at most 1024 bytes, got " +
                   DescribeJson(*topic));
      }
      s.topic = topic->get<std::string>();
    }
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const DiscoveredSource& a, const DiscoveredSource& b) {
    return a.dp_rank < b.dp_rank;
  });
  return out;
}

Result<std::string> ParseFirstModel(std::string_view body) {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("/v1/models answer: " + what);
  };
  JsonLimits limits;
  limits.max_depth = 16;
  auto doc = ParseJson(body, "/v1/models answer", limits);
  if (!doc.ok()) return doc.status();
  if (!doc->is_object()) return bad("expected a JSON object, got " + DescribeJson(*doc));
  auto data = doc->find("data");
  if (data == doc->end() || !data->is_array() || data->empty()) {
    return bad("'data' must be a non-empty array (or give the model with model=)");
  }
  const json& first = (*data)[0];
  if (!first.is_object()) return bad("'data[0]' must be an object, got " + DescribeJson(first));
  auto id = first.find("id");
  if (id == first.end() || !id->is_string() || id->get<std::string>().empty() ||
      id->get<std::string>().size() > 4096) {
    return bad("'data[0].id' must be a non-empty string");
  }
  return id->get<std::string>();
}

int64_t DiscoveryBackoffMs(int64_t consecutive_failures, int64_t initial_ms, int64_t max_ms) {
  int64_t d = std::max<int64_t>(initial_ms, 1);
  for (int64_t i = 1; i < consecutive_failures && d < max_ms; ++i) d *= 2;
  return std::min(d, max_ms);
}

Discoverer::Discoverer(DiscoverTarget target, DiscoveryOptions options, Clock* clock, ApplyFn apply)
    : target_(std::move(target)), options_(options), clock_(clock), apply_(std::move(apply)) {
  MutexLock lock(&mu_);
  status_.url = target_.url;
  status_.model = target_.model;
}

Status Discoverer::PollOnce(std::string* model, size_t* count) {
  const int timeout = static_cast<int>(options_.timeout_ms);
  *model = target_.model;
  if (model->empty()) {
    auto r = HttpCall(target_.address, "GET", "/v1/models", "", timeout);
    if (!r.ok()) return r.status().WithContext("GET /v1/models");
    if (r->status != 200) {
      return Status::Unavailable("GET /v1/models: HTTP " + std::to_string(r->status));
    }
    KVO_ASSIGN_OR_RETURN(*model, ParseFirstModel(r->body));
  }
  auto r = HttpCall(target_.address, "GET", "/kv_event_sources", "", timeout);
  if (!r.ok()) return r.status().WithContext("GET /kv_event_sources");
  if (r->status != 200) {
    return Status::Unavailable("GET /kv_event_sources: HTTP " + std::to_string(r->status) +
                               " (is the engine started with --kv-events-config?)");
  }
  KVO_ASSIGN_OR_RETURN(std::vector<DiscoveredSource> sources,
                       ParseKvEventSources(r->body, target_.address.host));
  *count = sources.size();
  return apply_(target_, *model, sources);
}

const char* DiscoveryPhaseName(DiscoveryPhase phase) {
  switch (phase) {
    case DiscoveryPhase::kPending:
      return "pending";
    case DiscoveryPhase::kOk:
      return "ok";
    case DiscoveryPhase::kFailing:
      return "failing";
  }
  return "pending";
}

bool Discoverer::PollIfDue() {
  {
    MutexLock lock(&mu_);
    if (!first_ && clock_->MonotonicNanos() < next_due_ns_) return false;
    first_ = false;
  }
  std::string model;
  size_t count = 0;
  Status st = PollOnce(&model, &count);
  MutexLock lock(&mu_);
  ++status_.polls;
  int64_t delay_ms;
  if (st.ok()) {
    if (status_.state == DiscoveryPhase::kFailing) {
      KVO_LOG_INFO("discovery {}: answering again ({} sources) after {} failed polls", target_.url,
                   count, status_.consecutive_failures);
    }
    failure_log_.Reset();
    status_.state = DiscoveryPhase::kOk;
    status_.consecutive_failures = 0;
    status_.sources = static_cast<int64_t>(count);
    status_.model = model;
    delay_ms = options_.interval_ms;
  } else {
    status_.state = DiscoveryPhase::kFailing;
    ++status_.failures;
    ++status_.consecutive_failures;
    status_.last_error = CutForMessage(st.ToString(), 512);
    delay_ms = DiscoveryBackoffMs(status_.consecutive_failures, options_.retry_initial_ms,
                                  options_.retry_max_ms);
    RepeatFilter::Decision d = failure_log_.Note(status_.last_error);
    if (d.log) {
      KVO_LOG_WARN("discovery {}: {}; other sources unaffected; retrying in {} ms{}", target_.url,
                   status_.last_error, delay_ms, d.Describe());
    }
  }
  status_.next_delay_ms = delay_ms;
  next_due_ns_ = clock_->MonotonicNanos() + delay_ms * 1'000'000;
  return true;
}

int64_t Discoverer::next_due_ns() const {
  MutexLock lock(&mu_);
  return next_due_ns_;
}

DiscoveryStatus Discoverer::status() const {
  MutexLock lock(&mu_);
  return status_;
}

}  // namespace kvo
