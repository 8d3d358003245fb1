// Discovery of vLLM engines' KV-event publishers (`kvo index serve --discover http://HOST:PORT`).
//
// vLLM binds its publishers on `tcp://*:0` (an OS-chosen port per DP rank) and its API server
// reports the bound endpoints at GET /kv_event_sources (vLLM #55844):
//   {"sources": [{"data_parallel_rank": 0, "endpoint": "tcp://*:41234",
//                 "replay_endpoint": "tcp://*:41235", "topic": ""}, ...]}
// A Discoverer polls one such server on the clock seam: every interval_ms after a good answer;
// after a failure (server down, HTTP error, an answer that is not that shape) it logs the URL and
// the reason and retries after retry_initial_ms, doubling up to retry_max_ms (DiscoveryBackoff:
// bounded, and deterministic under a ManualClock). A good answer goes to the service's apply
// callback, which registers each rank (service.cc: new rank -> registered, moved rank -> old
// stream cleared and the new endpoint followed, rank no longer listed -> unregistered).
//
// Thread-safety: PollIfDue is called from one thread; status() from any.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/repeat_filter.h"
#include "common/result.h"
#include "indexer/service/sources_config.h"

namespace kvo {

struct DiscoveredSource {
  int64_t dp_rank = 0;
  std::string endpoint;  // wildcard host rewritten to the discovery host
  std::optional<std::string> replay_endpoint;
  std::string topic;
};

// `tcp://*:P`, `tcp://0.0.0.0:P`, `tcp://[::]:P` and `tcp://:::P` name every interface of the
// engine's node: the indexer dials the host it discovered them from. Other endpoints unchanged.
std::string RewriteWildcardHost(std::string_view endpoint, std::string_view host);

// True for an ipc:// endpoint, or a tcp:// one whose host is `host` (brackets ignored).
bool EndpointOnHost(std::string_view endpoint, std::string_view host);

// Parses a GET /kv_event_sources body (at most 1024 sources, each rank once). InvalidArgument
// naming the field; the body is never echoed whole.
Result<std::vector<DiscoveredSource>> ParseKvEventSources(std::string_view body,
                                                          std::string_view host);
// The first model id of a GET /v1/models body ({"data": [{"id": ...}, ...]}).
Result<std::string> ParseFirstModel(std::string_view body);

// The wait after `consecutive_failures` failed polls (>= 1): initial * 2^(n-1), at most max.
int64_t DiscoveryBackoffMs(int64_t consecutive_failures, int64_t initial_ms, int64_t max_ms);

struct DiscoveryOptions {
  int64_t interval_ms = 2'000;
  int64_t retry_initial_ms = 500;
  int64_t retry_max_ms = 30'000;
  int64_t timeout_ms = 2'000;
};

enum class DiscoveryPhase {
  kPending,  // not polled yet
  kOk,       // the last poll was answered
  kFailing,  // the last poll failed; retried with backoff
};
// "pending" | "ok" | "failing"
const char* DiscoveryPhaseName(DiscoveryPhase phase);

struct DiscoveryStatus {
  std::string url;
  DiscoveryPhase state = DiscoveryPhase::kPending;
  int64_t polls = 0;
  int64_t failures = 0;
  int64_t consecutive_failures = 0;
  std::string last_error;
  int64_t next_delay_ms = 0;  // the wait scheduled after the last poll
  int64_t sources = 0;        // ranks in the last good answer
  std::string model;
};

class Discoverer {
 public:
  // Applies a good answer (model resolved); an error counts as a failed poll (logged, backoff).
  using ApplyFn = std::function<Status(const DiscoverTarget& target, const std::string& model,
                                       const std::vector<DiscoveredSource>& sources)>;
  Discoverer(DiscoverTarget target, DiscoveryOptions options, Clock* clock, ApplyFn apply);

  // Polls when the clock says a poll is due (the first call polls); true when it polled.
  bool PollIfDue();
  // Monotonic nanoseconds of the next poll.
  int64_t next_due_ns() const;
  DiscoveryStatus status() const;
  const DiscoverTarget& target() const { return target_; }

 private:
  Status PollOnce(std::string* model, size_t* count);

  const DiscoverTarget target_;
  const DiscoveryOptions options_;
  Clock* const clock_;
  const ApplyFn apply_;
  mutable Mutex mu_;
  int64_t next_due_ns_ GUARDED_BY(mu_) = 0;
  bool first_ GUARDED_BY(mu_) = true;
  DiscoveryStatus status_ GUARDED_BY(mu_);
  RepeatFilter failure_log_ GUARDED_BY(mu_);  // a target down for hours logs O(log n) lines
};

}  // namespace kvo
