// Internal to indexer/: the state behind IndexerService (IndexerService::Impl), shared by
// service.cc (streams, discovery, start and stop) and service_http.cc (the HTTP routes).
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/repeat_filter.h"
#include "events/zmq_subscriber.h"
#include "indexer/service/discovery.h"
#include "indexer/service/doctor.h"
#include "indexer/service/key_helper.h"
#include "indexer/service/router_api.h"
#include "indexer/service/service.h"

namespace kvo {
namespace service_internal {

// How long a stream thread waits for a batch before it looks at the clock (the silence report) and
// at whether it should stop. A stop or unregister wakes the wait at once through the stream's
// eventfd (WakeFd), so the slice is long: an idle stream wakes about once a second, not 40 times
// (100 idle sources polling every 25 ms were 4,000 context switches a second beside the query
// path). Without an eventfd the slice is short (kPollSlice), as it bounds /unregister then.
inline constexpr auto kPollSlice = std::chrono::milliseconds(25);
inline std::chrono::milliseconds StreamSlice(bool woken_by_fd, int64_t silent_after_ms) {
  if (!woken_by_fd) return kPollSlice;
  return std::chrono::milliseconds(
      std::clamp<int64_t>(silent_after_ms / 4, kPollSlice.count(), 1000));
}

// Whether a stream last heard from its publisher (`activity_ns`, monotonic; 0: never) within
// silent_after_ms of `now_ns`.
inline bool Recent(int64_t activity_ns, int64_t now_ns, int64_t silent_after_ms) {
  return activity_ns != 0 && now_ns - activity_ns <= silent_after_ms * 1'000'000;
}

// The state GET /v1/sources and GET /workers report for a stream whose thread last set `stored`
// (it sets only kConnecting and kRetrying): following or silent are read off its activity.
inline StreamPhase ObservedPhase(StreamPhase stored, int64_t activity_ns, int64_t now_ns,
                                 int64_t silent_after_ms) {
  if (stored == StreamPhase::kRetrying) return stored;
  if (Recent(activity_ns, now_ns, silent_after_ms)) return StreamPhase::kFollowing;
  return activity_ns != 0 ? StreamPhase::kSilent : StreamPhase::kConnecting;
}

inline std::vector<double> LatencyBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5};
}

// Per-source state shared by the source's streams.
struct SourceState {
  SourceConfig config;
  std::optional<Registration> reg;  // set for a source registered with POST /register
  std::unique_ptr<HashParityDoctor> doctor;
};

struct StreamMetrics {
  Counter* batches = nullptr;
  Counter* block_events = nullptr;
  Counter* gaps_filled = nullptr;
  Counter* batches_lost = nullptr;
  Counter* restarts = nullptr;
  Counter* clears = nullptr;
  Counter* decode_errors = nullptr;
  Counter* malformed = nullptr;
  Counter* apply_errors = nullptr;
  Counter* unknown_removals = nullptr;
  Counter* replay_failures = nullptr;
  Counter* absurd_sequences = nullptr;
  Gauge* last_seq = nullptr;
  Gauge* lag = nullptr;
  Gauge* connected = nullptr;
};

// The per-stream families (labels source, dp_rank): one row each, with the StreamMetrics member
// that holds the stream's series.
template <class Handle>
struct StreamRow {
  const char* name;
  const char* help;
  Handle* StreamMetrics::*handle;
};
inline constexpr StreamRow<Counter> kStreamCounters[] = {
    {"kvo_indexer_batches_applied", "Event batches applied", &StreamMetrics::batches},
    {"kvo_indexer_block_events_applied", "Block hashes in applied events",
     &StreamMetrics::block_events},
    {"kvo_indexer_gaps_filled", "Sequence gaps filled by replay", &StreamMetrics::gaps_filled},
    {"kvo_indexer_batches_lost", "Batches replay could not supply", &StreamMetrics::batches_lost},
    {"kvo_indexer_publisher_restarts", "Publisher restarts detected", &StreamMetrics::restarts},
    {"kvo_indexer_source_clears",
     "Times the stream's entries were cleared after a loss (restart, lost batches)",
     &StreamMetrics::clears},
    {"kvo_indexer_decode_errors", "Batches that failed to decode (skipped)",
     &StreamMetrics::decode_errors},
    {"kvo_indexer_malformed_messages", "Malformed bus messages (dropped)",
     &StreamMetrics::malformed},
    {"kvo_indexer_apply_errors", "Batches the index refused, in whole or in part (events left out)",
     &StreamMetrics::apply_errors},
    {"kvo_indexer_unknown_removals", "Removals of hashes the stream did not hold",
     &StreamMetrics::unknown_removals},
    {"kvo_indexer_replay_failures", "Replays timed out or abandoned (nothing lost by itself)",
     &StreamMetrics::replay_failures},
    {"kvo_indexer_absurd_sequences",
     "Live sequence numbers far ahead (>= max_seq_jump) or the end-marker value: a restart or "
     "garbage, not a loss",
     &StreamMetrics::absurd_sequences},
};
inline constexpr StreamRow<Gauge> kStreamGauges[] = {
    {"kvo_indexer_last_sequence", "Last applied sequence", &StreamMetrics::last_seq},
    {"kvo_indexer_lag_seconds", "Now minus the timestamp of the last applied batch",
     &StreamMetrics::lag},
    {"kvo_indexer_connected", "1 while the stream is answering", &StreamMetrics::connected},
};

// An eventfd that wakes a stream thread's wait for messages (SubscriberOptions::wake_fd): an
// unregister joins the thread in about a millisecond instead of up to a poll slice (25 ms).
class WakeFd {
 public:
  WakeFd() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  ~WakeFd() {
    if (fd_ >= 0) close(fd_);
  }
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;
  int fd() const { return fd_; }  // -1 when eventfd failed: the thread waits out its slice
  void Signal() const {
    if (fd_ < 0) return;
    const uint64_t one = 1;
    (void)!write(fd_, &one, sizeof one);  // EAGAIN (counter full) leaves it readable anyway
  }

 private:
  int fd_;
};

struct StreamState {
  SourceState* source = nullptr;
  SourceStream stream;
  StreamMetrics metrics;
  std::thread thread;
  std::atomic<bool> stop{false};  // unregistered: the thread ends (set under stop_mu)
  WakeFd wake;                    // signalled after `stop` (or the service's stop) is set
  mutable Mutex mu;
  StreamStatus status GUARDED_BY(mu);
  double last_batch_ts GUARDED_BY(mu) = 0;
  int64_t last_activity_ns GUARDED_BY(mu) = 0;  // 0: never
  bool rank_mismatch_logged = false;            // stream thread only
  RepeatFilter refused_log;                     // events the index left out; stream thread only
};

}  // namespace service_internal

struct IndexerService::Impl {
  IndexerConfig config;
  ServiceOptions options;
  Clock* clock = nullptr;
  std::unique_ptr<Indexer> index;
  // Walks /query keys in `index` (declared after it: destroyed first). Null: /query hashes and
  // walks its keys on its own thread.
  std::unique_ptr<KeyHelper> key_helper;
  std::unique_ptr<ListHelper> list_helper;  // a long /query list parsed by two threads
  MetricsRegistry metrics;
  // Serialises /register and /unregister (held across their SQLite writes and thread joins).
  // Order: reg_op_mu -> registry_mu -> a stream's mu.
  Mutex reg_op_mu;
  mutable Mutex registry_mu;  // the sources and streams followed now (config and registered)
  std::vector<std::unique_ptr<service_internal::SourceState>> sources GUARDED_BY(registry_mu);
  std::vector<std::unique_ptr<service_internal::StreamState>> streams GUARDED_BY(registry_mu);
  std::set<std::string, std::less<>> source_names GUARDED_BY(registry_mu);
  // Bumped by every change to `sources` or `streams` (AddSource, RemoveRegistered): the
  // /query answer plans below are for one value of it.
  uint64_t registry_generation GUARDED_BY(registry_mu) = 0;
  // /query's answer plans by scope (QueryScopeKey), valid for plans_generation; cleared when
  // the registry changes or when kMaxQueryPlans are held.
  static constexpr size_t kMaxQueryPlans = 256;
  static constexpr size_t kMaxQueryPlanKey = 1024;  // a longer scope is planned, not kept
  std::map<std::string, std::shared_ptr<const RouterAnswerPlan>, std::less<>> query_plans
      GUARDED_BY(registry_mu);
  uint64_t plans_generation GUARDED_BY(registry_mu) = 0;
  std::unique_ptr<HttpServer> http;
  std::atomic<bool> stopping{false};
  Mutex stop_mu;
  CondVar stop_cv{&stop_mu};
  bool stopped GUARDED_BY(stop_mu) = false;

  Counter* score_ok = nullptr;
  // /query's content keys: hashed on the helper while the body was parsed, or by the walk.
  Counter* keys_on_helper = nullptr;
  Counter* keys_in_walk = nullptr;
  Counter* keys_taken_back = nullptr;  // the key helper gave up; the handler finished the keys
  // /query bodies parsed as they arrived (HttpServerOptions::arriving_paths) or once complete.
  Counter* parsed_arriving = nullptr;
  Counter* parsed_whole = nullptr;
  Counter* list_chunks_on_helper = nullptr;  // ListHelper::Lease::joined_from_helper, per query
  // Work the handler took back from a helper that stalled (ServiceOptions::*_helper_patience_ns).
  Counter* helper_takeovers_list = nullptr;  // chunks
  Counter* helper_takeovers_keys = nullptr;  // queries

  Histogram* helper_start = nullptr;
  Histogram* helper_wait = nullptr;
  // /query answer plans: held now (query_plans.size()), and built (a scope's first query since
  // the registry last changed, or a scope too long to keep).
  Gauge* plans_held = nullptr;
  Counter* plans_built = nullptr;
  Counter* score_bad = nullptr;
  Counter* score_err = nullptr;
  Histogram* score_latency = nullptr;
  Gauge* memory_bytes = nullptr;
  Gauge* blocks_in_memory = nullptr;
  Gauge* entries_in_memory = nullptr;
  Gauge* dropped_by_budget = nullptr;
  Gauge* walk_blocks_hinted = nullptr;     // kvo_indexer_walk_blocks{via="hint"}
  Gauge* walk_blocks_looked_up = nullptr;  // {via="table"}
  Gauge* log_rows_pending = nullptr;
  Gauge* sqlite_bytes = nullptr;

  // The per-stream families, in the order of kStreamCounters / kStreamGauges (registered with
  // the first stream).
  std::vector<CounterFamily*> stream_counters GUARDED_BY(registry_mu);
  std::vector<GaugeFamily*> stream_gauges GUARDED_BY(registry_mu);

  Status RegisterMetrics();
  Status RegisterStream(service_internal::StreamState* s) EXCLUSIVE_LOCKS_REQUIRED(registry_mu);
  // Drops an unregistered stream's series (and its source's doctor series) from /metrics. Only
  // after its thread ended, under reg_op_mu: no registration can take the same labels meanwhile.
  void ForgetMetrics(const service_internal::SourceState& src,
                     const std::vector<const service_internal::StreamState*>& gone)
      EXCLUSIVE_LOCKS_REQUIRED(reg_op_mu);
  // Adds a source and its streams (threads started when start_threads).
  Status AddSource(const SourceConfig& sc, std::optional<Registration> reg,
                   std::vector<SourceStream> stream_list, bool start_threads)
      EXCLUSIVE_LOCKS_REQUIRED(registry_mu);
  void StartThread(service_internal::StreamState* s);
  void RunStream(service_internal::StreamState* s);
  bool Stopped(const service_internal::StreamState* s) const {
    return stopping.load() || s->stop.load();
  }
  // Waits up to `ms` unless stopping (or the stream is unregistered); false then.
  bool WaitFor(const service_internal::StreamState* s, int64_t ms);
  // The Mooncake/Dynamo API (router_api.h).
  HttpResponse Register(const HttpRequest& r);
  HttpResponse Unregister(const HttpRequest& r);
  // A router query's score input and the helpers' leases. A helper that stalled may still read
  // the token ids (and the body) after the answer is ready: the answer's after_sent drops this
  // once it is out, the leases first (each waits for its thread), then the tokens.
  struct RouterQueryState {
    ScoreQuery sq;
    std::unique_ptr<ListHelper::Lease> lists;
    std::unique_ptr<KeyHelper::Lease> keys;
  };
  HttpResponse RouterQuery(const HttpRequest& r, bool by_hash);
  HttpResponse RouterQuery(const HttpRequest& r, bool by_hash, RouterQueryState& state);
  // The answer plan of q's scope (tenant, instance_id, model, LoRA, salt), cached; a scope with
  // an unknown tenant, instance or model is an InvalidArgument naming it.
  Result<std::shared_ptr<const RouterAnswerPlan>> QueryPlan(const kvo::RouterQuery& q)
      EXCLUSIVE_LOCKS_REQUIRED(registry_mu);
  HttpResponse Workers() const;
  Status AddRegistered(const Registration& reg, bool start_thread)
      EXCLUSIVE_LOCKS_REQUIRED(registry_mu);
  // Checks that `reg` may be registered: Ok (and *same = true when exactly this registration
  // exists), AlreadyExists (409) for a name or endpoint taken otherwise.
  Status CheckRegistration(const Registration& reg, bool* same) EXCLUSIVE_LOCKS_REQUIRED(reg_op_mu);
  // Stores and starts one checked registration. REQUIRES: CheckRegistration said Ok, not same.
  Status AddNewRegistration(const Registration& reg) EXCLUSIVE_LOCKS_REQUIRED(reg_op_mu);
  // Removes the registered sources `pick` selects: stored rows deleted, threads stopped and
  // joined, entries cleared. Returns their keys ("<id>|<tenant>|<rank>").
  Result<std::vector<std::string>> RemoveRegistered(
      const std::function<bool(const Registration&)>& pick) EXCLUSIVE_LOCKS_REQUIRED(reg_op_mu);
  // Discovery (--discover): one thread per target polls it (discovery.h) and applies a good
  // answer here: a new rank is registered, a rank whose endpoints changed (the engine restarted
  // on new ports) has its old stream cleared and the new one followed, a rank no longer listed is
  // unregistered. A rank that cannot be registered is logged; the others are applied.
  Status ApplyDiscovered(const DiscoverTarget& t, const std::string& model,
                         const std::vector<DiscoveredSource>& list);
  void RunDiscovery(Discoverer* d);
  // GET /v1/discovery: {"targets": [{"url", "state", "polls", "failures",
  // "consecutive_failures", "last_error", "next_delay_ms", "sources", "model"}]}
  std::string DiscoveryJson() const;
  std::vector<std::unique_ptr<Discoverer>> discoverers;  // fixed after Start
  std::vector<std::thread> discovery_threads;
  // The doctor's metric families (per source).
  CounterFamily* doctor_checked = nullptr;
  CounterFamily* doctor_mismatched = nullptr;
  GaugeFamily* doctor_parity = nullptr;
  // A loss (restart, unrecoverable gap) on stream `s`: clear the stream when it holds anything.
  void HandleLoss(service_internal::StreamState* s, const std::string& why);
  // Applies one batch (errors are counted and logged).
  void Apply(service_internal::StreamState* s, const ReceivedBatch& b);
  HttpResponse Score(const HttpRequest& r, bool explain);
  // Keeps the instances of `wanted` sources, adds zero entries for their streams the index has
  // not seen, and sorts best first.
  void KeepSources(const std::set<std::string, std::less<>>& wanted, ScoreResult* result) const;
  std::vector<SourceStatus> Sources() const;
  std::string RenderMetrics();
  // "" or "N of M streams cannot subscribe: the process's open-file limit ... is reached ...":
  // streams whose last subscribe failed for want of descriptors (EMFILE; /health, /healthz).
  std::string FdLimitWarning() const;
};

}  // namespace kvo
