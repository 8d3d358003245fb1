#include "indexer/service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "common/json.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "events/zmq_subscriber.h"
#include "indexer/discovery.h"
#include "indexer/doctor.h"
#include "indexer/instance_blocks.h"
#include "indexer/router_api.h"

namespace kvo {
namespace {

// How long a stream thread waits for a batch before it checks whether it should stop: bounds how
// long /unregister (and a discovered engine's move) waits for the thread (the router API's
// /unregister p99 < 50 ms); an idle stream wakes 40 times a second for it.
constexpr auto kPollSlice = std::chrono::milliseconds(25);

std::vector<double> LatencyBuckets() {
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
constexpr StreamRow<Counter> kStreamCounters[] = {
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
    {"kvo_indexer_apply_errors", "Batches the index refused", &StreamMetrics::apply_errors},
    {"kvo_indexer_unknown_removals", "Removals of hashes the stream did not hold",
     &StreamMetrics::unknown_removals},
    {"kvo_indexer_replay_failures", "Replays timed out or abandoned (nothing lost by itself)",
     &StreamMetrics::replay_failures},
    {"kvo_indexer_absurd_sequences",
     "Live sequence numbers far ahead (>= max_seq_jump) or the end-marker value: a restart or "
     "garbage, not a loss",
     &StreamMetrics::absurd_sequences},
};
constexpr StreamRow<Gauge> kStreamGauges[] = {
    {"kvo_indexer_last_sequence", "Last applied sequence", &StreamMetrics::last_seq},
    {"kvo_indexer_lag_seconds", "Now minus the timestamp of the last applied batch",
     &StreamMetrics::lag},
    {"kvo_indexer_connected", "1 while the stream is answering", &StreamMetrics::connected},
};

struct StreamState {
  SourceState* source = nullptr;
  SourceStream stream;
  StreamMetrics metrics;
  std::thread thread;
  std::atomic<bool> stop{false};  // unregistered: the thread ends (set under stop_mu)
  mutable Mutex mu;
  StreamStatus status GUARDED_BY(mu);
  double last_batch_ts GUARDED_BY(mu) = 0;
  int64_t last_activity_ns GUARDED_BY(mu) = 0;  // 0: never
  bool rank_mismatch_logged = false;            // stream thread only
};

}  // namespace

struct IndexerService::Impl {
  IndexerConfig config;
  ServiceOptions options;
  Clock* clock = nullptr;
  std::unique_ptr<Indexer> index;
  MetricsRegistry metrics;
  // Serialises /register and /unregister (held across their SQLite writes and thread joins).
  // Order: reg_op_mu -> registry_mu -> a stream's mu.
  Mutex reg_op_mu;
  mutable Mutex registry_mu;  // the sources and streams followed now (config and registered)
  std::vector<std::unique_ptr<SourceState>> sources GUARDED_BY(registry_mu);
  std::vector<std::unique_ptr<StreamState>> streams GUARDED_BY(registry_mu);
  std::set<std::string, std::less<>> source_names GUARDED_BY(registry_mu);
  std::unique_ptr<HttpServer> http;
  std::atomic<bool> stopping{false};
  Mutex stop_mu;
  CondVar stop_cv{&stop_mu};
  bool stopped GUARDED_BY(stop_mu) = false;

  Counter* score_ok = nullptr;
  Counter* score_bad = nullptr;
  Counter* score_err = nullptr;
  Histogram* score_latency = nullptr;
  Gauge* memory_bytes = nullptr;
  Gauge* blocks_in_memory = nullptr;
  Gauge* entries_in_memory = nullptr;
  Gauge* dropped_by_budget = nullptr;
  Gauge* log_rows_pending = nullptr;
  Gauge* sqlite_bytes = nullptr;

  // The per-stream families, in the order of kStreamCounters / kStreamGauges (registered with
  // the first stream).
  std::vector<CounterFamily*> stream_counters GUARDED_BY(registry_mu);
  std::vector<GaugeFamily*> stream_gauges GUARDED_BY(registry_mu);

  Status RegisterMetrics();
  Status RegisterStream(StreamState* s) EXCLUSIVE_LOCKS_REQUIRED(registry_mu);
  // Adds a source and its streams (threads started when start_threads).
  Status AddSource(const SourceConfig& sc, std::optional<Registration> reg,
                   std::vector<SourceStream> streams, bool start_threads)
      EXCLUSIVE_LOCKS_REQUIRED(registry_mu);
  void StartThread(StreamState* s);
  void RunStream(StreamState* s);
  bool Stopped(const StreamState* s) const { return stopping.load() || s->stop.load(); }
  // Waits up to `ms` unless stopping (or the stream is unregistered); false then.
  bool WaitFor(const StreamState* s, int64_t ms);
  // The Mooncake/Dynamo API (router_api.h).
  HttpResponse Register(const HttpRequest& r);
  HttpResponse Unregister(const HttpRequest& r);
  HttpResponse RouterQuery(const HttpRequest& r, bool by_hash);
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
  void HandleLoss(StreamState* s, const std::string& why);
  // Applies one batch (errors are counted and logged).
  void Apply(StreamState* s, const ReceivedBatch& b);
  HttpResponse Score(const HttpRequest& r, bool explain);
  // Keeps the instances of `wanted` sources, adds zero entries for their streams the index has
  // not seen, and sorts best first.
  void KeepSources(const std::set<std::string, std::less<>>& wanted, ScoreResult* result) const;
  std::vector<SourceStatus> Sources() const;
  std::string RenderMetrics();
};

bool IndexerService::Impl::WaitFor(const StreamState* s, int64_t ms) {
  MutexLock lock(&stop_mu);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!Stopped(s)) {
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    stop_cv.WaitFor(deadline - now);
  }
  return !Stopped(s);
}

Status IndexerService::Impl::RegisterMetrics() {
  KVO_ASSIGN_OR_RETURN(
      auto* score_family,
      metrics.AddCounterFamily("kvo_indexer_score_requests",
                               "Score and explain requests by outcome", {"outcome"}));
  KVO_ASSIGN_OR_RETURN(score_ok, score_family->WithLabels({"ok"}));
  KVO_ASSIGN_OR_RETURN(score_bad, score_family->WithLabels({"bad_request"}));
  KVO_ASSIGN_OR_RETURN(score_err, score_family->WithLabels({"error"}));
  KVO_ASSIGN_OR_RETURN(
      score_latency,
      metrics.AddHistogram("kvo_indexer_score_latency_seconds",
                           "Time to score one request (parse to render)", LatencyBuckets()));
  KVO_ASSIGN_OR_RETURN(memory_bytes, metrics.AddGauge("kvo_indexer_memory_bytes",
                                                      "Resident bytes of the scoring structure"));
  KVO_ASSIGN_OR_RETURN(blocks_in_memory, metrics.AddGauge("kvo_indexer_blocks_in_memory",
                                                          "Distinct blocks held in memory"));
  KVO_ASSIGN_OR_RETURN(entries_in_memory,
                       metrics.AddGauge("kvo_indexer_entries_in_memory",
                                        "(stream, medium, group, block) entries in memory"));
  KVO_ASSIGN_OR_RETURN(dropped_by_budget,
                       metrics.AddGauge("kvo_indexer_dropped_by_budget_blocks",
                                        "Blocks dropped from memory by the byte budget (still "
                                        "in SQLite), since the index was opened"));
  KVO_ASSIGN_OR_RETURN(log_rows_pending,
                       metrics.AddGauge("kvo_indexer_log_rows_pending",
                                        "Event log rows not yet compacted into blocks"));
  KVO_ASSIGN_OR_RETURN(sqlite_bytes,
                       metrics.AddGauge("kvo_indexer_sqlite_bytes", "Size of the SQLite file"));
  return Status::Ok();
}

Status IndexerService::Impl::RegisterStream(StreamState* s) {
  const std::vector<std::string> labels = {"source", "dp_rank"};
  if (stream_counters.empty()) {
    for (const StreamRow<Counter>& row : kStreamCounters) {
      KVO_ASSIGN_OR_RETURN(CounterFamily * f, metrics.AddCounterFamily(row.name, row.help, labels));
      stream_counters.push_back(f);
    }
    for (const StreamRow<Gauge>& row : kStreamGauges) {
      KVO_ASSIGN_OR_RETURN(GaugeFamily * f, metrics.AddGaugeFamily(row.name, row.help, labels));
      stream_gauges.push_back(f);
    }
  }
  const std::vector<std::string> v = {s->stream.source, std::to_string(s->stream.dp_rank)};
  for (size_t i = 0; i < std::size(kStreamCounters); ++i) {
    KVO_ASSIGN_OR_RETURN(s->metrics.*kStreamCounters[i].handle, stream_counters[i]->WithLabels(v));
  }
  for (size_t i = 0; i < std::size(kStreamGauges); ++i) {
    KVO_ASSIGN_OR_RETURN(s->metrics.*kStreamGauges[i].handle, stream_gauges[i]->WithLabels(v));
  }
  return Status::Ok();
}

void IndexerService::Impl::HandleLoss(StreamState* s, const std::string& why) {
  auto last = index->LastSequence(s->stream.source, s->stream.dp_rank);
  if (!last.ok() && last.status().code() == StatusCode::kNotFound) {
    // The stream holds nothing (new, or just cleared): nothing is stale.
    KVO_LOG_INFO("source '{}' rank {}: {}; the stream holds nothing yet, nothing to clear",
                 s->stream.source, s->stream.dp_rank, why);
    return;
  }
  // Only this stream's entries are stale: its sibling ranks keep theirs.
  Status st = index->ClearStream(s->stream.source, s->stream.dp_rank);
  s->metrics.clears->Increment();
  {
    MutexLock slock(&s->mu);
    ++s->status.source_clears;
    s->status.has_seq = false;
    if (!st.ok()) s->status.last_error = st.ToString();
  }
  if (st.ok()) {
    KVO_LOG_WARN(
        "source '{}' rank {}: {}: cleared the stream's entries (last applied seq {}); rebuilding "
        "from what follows",
        s->stream.source, s->stream.dp_rank, why,
        last.ok() ? std::to_string(*last) : last.status().ToString());
  } else {
    KVO_LOG_ERROR("source '{}' rank {}: {}: clearing the stream failed: {}", s->stream.source,
                  s->stream.dp_rank, why, st.ToString());
  }
}

void IndexerService::Impl::Apply(StreamState* s, const ReceivedBatch& b) {
  SourceState* src = s->source;
  if (b.batch.data_parallel_rank && *b.batch.data_parallel_rank != s->stream.dp_rank &&
      !s->rank_mismatch_logged) {
    s->rank_mismatch_logged = true;
    KVO_LOG_WARN(
        "source '{}': batches on the endpoint of DP rank {} say data_parallel_rank {}; indexed "
        "under rank {} (the endpoint's)",
        s->stream.source, s->stream.dp_rank, *b.batch.data_parallel_rank, s->stream.dp_rank);
  }
  Result<ApplyOutcome> outcome =
      index->ApplyBatch(s->stream.source, s->stream.dp_rank, b.seq, b.batch);
  if (!outcome.ok()) {
    s->metrics.apply_errors->Increment();
    KVO_LOG_ERROR("source '{}' rank {}: batch seq {} not applied: {}", s->stream.source,
                  s->stream.dp_rank, b.seq, outcome.status().ToString());
    MutexLock lock(&s->mu);
    ++s->status.apply_errors;
    s->status.last_error = outcome.status().ToString();
    return;
  }
  if (outcome->applied) {
    if (src->doctor) src->doctor->Check(b.batch);  // once per batch, not per replay overlap
    s->metrics.batches->Increment();
    s->metrics.block_events->Increment(static_cast<double>(outcome->block_events));
    if (outcome->unknown_removals > 0) {
      s->metrics.unknown_removals->Increment(static_cast<double>(outcome->unknown_removals));
    }
  }
  s->metrics.last_seq->Set(static_cast<double>(b.seq));
  MutexLock lock(&s->mu);
  if (outcome->applied) ++s->status.batches_applied;
  s->status.has_seq = true;
  s->status.last_seq = b.seq;
  s->last_batch_ts = b.batch.ts;
  s->last_activity_ns = clock->MonotonicNanos();
}

void IndexerService::Impl::RunStream(StreamState* s) {
  const SourceConfig& cfg = s->source->config;
  int64_t backoff_ms = config.retry_initial_ms;
  const int64_t start_ns = clock->MonotonicNanos();
  int64_t next_silence_log_ns = start_ns + config.silent_after_ms * 1'000'000;
  int64_t silence_log_step_ms = config.silent_after_ms;
  while (!Stopped(s)) {
    SubscriberOptions o;
    o.endpoint = s->stream.endpoint;
    o.replay_endpoint = s->stream.replay_endpoint;
    o.topic = cfg.topic;
    o.bind = cfg.bind;
    o.hwm = config.hwm;
    o.replay_timeout_ms = config.replay_timeout_ms;
    o.idle_probe_ms = config.idle_probe_ms;
    auto last = index->LastSequence(s->stream.source, s->stream.dp_rank);
    if (last.ok()) {
      o.start_seq = *last + 1;
    } else if (s->stream.replay_endpoint) {
      o.start_seq = 0;  // everything the publisher still has
    }
    {
      MutexLock lock(&s->mu);
      s->status.state = "connecting";
    }
    auto created = Subscriber::Create(o, clock);
    if (!created.ok()) {
      KVO_LOG_WARN("source '{}' rank {}: cannot subscribe ({}); retrying in {} ms",
                   s->stream.source, s->stream.dp_rank, created.status().ToString(), backoff_ms);
      {
        MutexLock lock(&s->mu);
        s->status.state = "retrying";
        ++s->status.connect_failures;
        s->status.last_error = created.status().ToString();
      }
      if (!WaitFor(s, backoff_ms)) break;
      backoff_ms = std::min(backoff_ms * 2, config.retry_max_ms);
      continue;
    }
    backoff_ms = config.retry_initial_ms;
    std::unique_ptr<Subscriber> sub = std::move(created).value();
    SubscriberStats seen;  // this subscriber's stats already folded into the status
    std::vector<SubscriberNotice> pending;  // losses that precede a later batch
    bool resubscribe = false;
    while (!Stopped(s) && !resubscribe) {
      auto next = sub->Next(kPollSlice);
      if (!next.ok()) {
        KVO_LOG_ERROR("source '{}' rank {}: subscriber failed: {}; resubscribing", s->stream.source,
                      s->stream.dp_rank, next.status().ToString());
        MutexLock lock(&s->mu);
        s->status.last_error = next.status().ToString();
        resubscribe = true;
        break;
      }
      std::optional<ReceivedBatch> batch = std::move(next).value();
      // Fold the subscriber's counters in.
      SubscriberStats now = sub->stats();
      bool answered =
          now.live_received > seen.live_received || now.replayed_received > seen.replayed_received;
      bool replay_timed_out = false;
      for (const SubscriberNotice& n : sub->TakeNotices()) {
        switch (n.kind) {
          case NoticeKind::kPublisherRestart:
            pending.clear();  // anything pending belonged to the old stream
            HandleLoss(s, "publisher restart (" + n.detail + ")");
            break;
          case NoticeKind::kGapUnrecoverable:
            pending.push_back(n);
            break;
          case NoticeKind::kReplayFailed:
            replay_timed_out = true;  // nothing lost by itself; losses follow separately
            KVO_LOG_WARN("source '{}' rank {}: replay from seq {} failed: {}", s->stream.source,
                         s->stream.dp_rank, n.from_seq, n.detail);
            break;
          case NoticeKind::kDecodeError:
            KVO_LOG_ERROR("source '{}' rank {}: batch seq {} does not decode, skipped: {}",
                          s->stream.source, s->stream.dp_rank, n.from_seq, n.detail);
            break;
          case NoticeKind::kMalformedMessage:
            KVO_LOG_WARN("source '{}' rank {}: malformed message dropped: {}", s->stream.source,
                         s->stream.dp_rank, n.detail);
            break;
          case NoticeKind::kGapFilled:
            break;
        }
      }
      if (now.replay_requests > seen.replay_requests && !replay_timed_out) answered = true;
      s->metrics.gaps_filled->Increment(static_cast<double>(now.gaps_filled - seen.gaps_filled));
      s->metrics.batches_lost->Increment(static_cast<double>(now.batches_lost - seen.batches_lost));
      s->metrics.restarts->Increment(static_cast<double>(now.restarts - seen.restarts));
      s->metrics.decode_errors->Increment(
          static_cast<double>(now.decode_errors - seen.decode_errors));
      s->metrics.malformed->Increment(
          static_cast<double>(now.malformed_messages - seen.malformed_messages));
      s->metrics.replay_failures->Increment(
          static_cast<double>(now.replay_failures - seen.replay_failures));
      s->metrics.absurd_sequences->Increment(
          static_cast<double>(now.absurd_sequences - seen.absurd_sequences));
      {
        MutexLock lock(&s->mu);
        s->status.gaps_filled += now.gaps_filled - seen.gaps_filled;
        s->status.batches_lost += now.batches_lost - seen.batches_lost;
        s->status.restarts_seen += now.restarts - seen.restarts;
        s->status.decode_errors += now.decode_errors - seen.decode_errors;
        s->status.malformed_messages += now.malformed_messages - seen.malformed_messages;
        if (answered) s->last_activity_ns = clock->MonotonicNanos();
      }
      seen = now;
      // Losses are handled in sequence order: before the first batch at or past their end.
      for (auto it = pending.begin(); it != pending.end();) {
        if (!batch || batch->seq >= it->to_seq) {
          HandleLoss(s, "batches [" + std::to_string(it->from_seq) + ", " +
                            std::to_string(it->to_seq) + ") lost (" + it->detail + ")");
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
      if (batch) {
        Apply(s, *batch);
      } else {
        // Silence: report it (error log at growing intervals) while the subscriber keeps trying.
        int64_t now_ns = clock->MonotonicNanos();
        int64_t last_ns;
        {
          MutexLock lock(&s->mu);
          last_ns = s->last_activity_ns;
        }
        int64_t since_ns = now_ns - (last_ns != 0 ? last_ns : start_ns);
        if (since_ns > config.silent_after_ms * 1'000'000 && now_ns >= next_silence_log_ns) {
          KVO_LOG_WARN("source '{}' rank {} ({}): nothing received for {} s; still trying",
                       s->stream.source, s->stream.dp_rank, s->stream.endpoint,
                       since_ns / 1'000'000'000);
          MutexLock lock(&s->mu);
          s->status.last_error = "nothing received from " + s->stream.endpoint + " for " +
                                 std::to_string(since_ns / 1'000'000) + " ms";
          silence_log_step_ms = std::min<int64_t>(silence_log_step_ms * 2, 3'600'000);
          next_silence_log_ns = now_ns + silence_log_step_ms * 1'000'000;
        }
      }
    }
  }
}

void IndexerService::Impl::KeepSources(const std::set<std::string, std::less<>>& wanted,
                                       ScoreResult* result) const {
  std::erase_if(result->instances,
                [&](const InstanceScore& i) { return !wanted.contains(i.source); });
  std::set<std::pair<std::string, int64_t>> present;
  for (const InstanceScore& i : result->instances) present.insert({i.source, i.dp_rank});
  MutexLock lock(&registry_mu);
  for (const auto& st : streams) {
    if (!wanted.contains(st->stream.source) ||
        present.contains({st->stream.source, st->stream.dp_rank})) {
      continue;
    }
    InstanceScore zero;
    zero.source = st->stream.source;
    zero.dp_rank = st->stream.dp_rank;
    result->instances.push_back(std::move(zero));
  }
  std::stable_sort(result->instances.begin(), result->instances.end(),
                   [](const InstanceScore& a, const InstanceScore& b) {
                     if (a.score != b.score) return a.score > b.score;
                     if (a.prefix_blocks != b.prefix_blocks) {
                       return a.prefix_blocks > b.prefix_blocks;
                     }
                     if (a.source != b.source) return a.source < b.source;
                     return a.dp_rank < b.dp_rank;
                   });
}

HttpResponse IndexerService::Impl::Score(const HttpRequest& r, bool explain) {
  const int64_t start = clock->MonotonicNanos();
  ScoreRequestLimits limits;
  limits.max_query_tokens = config.max_query_tokens;
  std::set<std::string, std::less<>> names;
  {
    MutexLock lock(&registry_mu);
    names = source_names;
  }
  auto query = ParseScoreRequest(r.body, limits, names);
  if (!query.ok()) {
    score_bad->Increment();
    return HttpResponse{400, "application/json", RenderError(query.status().message())};
  }
  // Score every stream the index knows and keep the asked-for (default: configured) sources,
  // adding a zero entry for a configured stream that has published nothing yet: the index only
  // knows streams it has seen, the router wants one answer per configured instance.
  std::set<std::string, std::less<>> wanted(query->sources.begin(), query->sources.end());
  if (wanted.empty()) wanted = names;
  query->sources.clear();
  if (!query->block_size && !query->token_ids.empty()) {
    query->block_size = config.default_block_size;
  }
  HttpResponse out;
  if (explain) {
    auto result = index->Explain(*query);
    if (!result.ok()) {
      bool bad = result.status().code() == StatusCode::kInvalidArgument;
      (bad ? score_bad : score_err)->Increment();
      return HttpResponse{bad ? 400 : 500, "application/json",
                          RenderError(result.status().message())};
    }
    int64_t tokens = query->token_ids.empty()
                         ? result->score.query_blocks * result->score.block_size
                         : static_cast<int64_t>(query->token_ids.size());
    KeepSources(wanted, &result->score);
    std::erase_if(result->instances,
                  [&](const ExplainInstance& i) { return !wanted.contains(i.source); });
    out.body = RenderExplainResponse(*result, tokens);
  } else {
    auto result = index->Score(*query);
    if (!result.ok()) {
      bool bad = result.status().code() == StatusCode::kInvalidArgument;
      (bad ? score_bad : score_err)->Increment();
      return HttpResponse{bad ? 400 : 500, "application/json",
                          RenderError(result.status().message())};
    }
    int64_t tokens = query->token_ids.empty() ? result->query_blocks * result->block_size
                                              : static_cast<int64_t>(query->token_ids.size());
    KeepSources(wanted, &*result);
    out.body = RenderScoreResponse(*result, tokens);
  }
  score_ok->Increment();
  score_latency->Observe(static_cast<double>(clock->MonotonicNanos() - start) / 1e9);
  return out;
}

std::vector<SourceStatus> IndexerService::Impl::Sources() const {
  IndexerStats stats = index->Stats();
  std::map<std::pair<std::string, int64_t>, const StreamStats*> durable;
  for (const StreamStats& st : stats.streams) durable[{st.source, st.dp_rank}] = &st;
  const double now_s = clock->NowSeconds();
  const int64_t now_ns = clock->MonotonicNanos();
  std::vector<SourceStatus> out;
  MutexLock registry_lock(&registry_mu);
  for (const auto& src : sources) {
    SourceStatus ss;
    ss.name = src->config.name;
    ss.endpoint = src->config.endpoint;
    ss.replay_endpoint = src->config.replay_endpoint.value_or("");
    ss.topic = src->config.topic;
    ss.connected = true;
    if (src->doctor) ss.parity = src->doctor->report();
    if (src->config.hash) {
      ss.hash_algo = HashAlgoName(src->config.hash->algo);
      ss.hash_seed = src->config.hash->seed;
      ss.hash_block_size = src->config.hash->block_size;
    }
    for (const auto& st : streams) {
      if (st->source != src.get()) continue;
      StreamStatus status;
      double ts;
      int64_t activity;
      {
        MutexLock lock(&st->mu);
        status = st->status;
        ts = st->last_batch_ts;
        activity = st->last_activity_ns;
      }
      status.dp_rank = st->stream.dp_rank;
      status.endpoint = st->stream.endpoint;
      status.replay_endpoint = st->stream.replay_endpoint.value_or("");
      auto it = durable.find({st->stream.source, st->stream.dp_rank});
      if (it != durable.end() && it->second->has_seq) {
        status.has_seq = true;
        status.last_seq = it->second->last_seq;
        status.durable_seq = it->second->durable_seq;
        if (ts == 0) ts = it->second->last_event_ts;
      } else {
        status.has_seq = false;
      }
      status.lag_seconds = ts > 0 ? std::max(0.0, now_s - ts) : 0.0;
      bool recent = activity != 0 && now_ns - activity <= config.silent_after_ms * 1'000'000;
      status.connected = recent;
      if (status.state != "retrying") {
        status.state = recent ? "following" : (activity != 0 ? "silent" : "connecting");
      }
      st->metrics.connected->Set(recent ? 1 : 0);
      st->metrics.lag->Set(status.lag_seconds);
      ss.connected = ss.connected && recent;
      ss.streams.push_back(std::move(status));
    }
    out.push_back(std::move(ss));
  }
  return out;
}

std::string IndexerService::Impl::RenderMetrics() {
  IndexerStats stats = index->Stats();
  memory_bytes->Set(static_cast<double>(stats.memory_bytes));
  blocks_in_memory->Set(static_cast<double>(stats.blocks_in_memory));
  entries_in_memory->Set(static_cast<double>(stats.entries_in_memory));
  dropped_by_budget->Set(static_cast<double>(stats.counters.dropped_by_budget));
  log_rows_pending->Set(static_cast<double>(stats.log_rows_pending));
  sqlite_bytes->Set(static_cast<double>(stats.sqlite_bytes));
  (void)Sources();  // refreshes the connected and lag gauges
  return metrics.RenderPrometheus();
}

Status IndexerService::Impl::AddSource(const SourceConfig& sc, std::optional<Registration> reg,
                                       std::vector<SourceStream> stream_list, bool start_threads) {
  auto src = std::make_unique<SourceState>();
  src->config = sc;
  src->reg = std::move(reg);
  src->doctor = std::make_unique<HashParityDoctor>(sc.name, sc.hash);
  if (doctor_checked != nullptr) {
    KVO_ASSIGN_OR_RETURN(Counter * c, doctor_checked->WithLabels({sc.name}));
    KVO_ASSIGN_OR_RETURN(Counter * m, doctor_mismatched->WithLabels({sc.name}));
    KVO_ASSIGN_OR_RETURN(Gauge * g, doctor_parity->WithLabels({sc.name}));
    src->doctor->SetMetrics(c, m, g);
  }
  std::vector<std::unique_ptr<StreamState>> added;
  for (SourceStream& stream : stream_list) {
    auto st = std::make_unique<StreamState>();
    st->source = src.get();
    st->stream = std::move(stream);
    KVO_RETURN_IF_ERROR(RegisterStream(st.get()));
    {
      MutexLock lock(&st->mu);
      st->status.state = "connecting";
    }
    added.push_back(std::move(st));
  }
  source_names.insert(sc.name);
  for (auto& st : added) {
    if (start_threads) StartThread(st.get());
    streams.push_back(std::move(st));
  }
  sources.push_back(std::move(src));
  return Status::Ok();
}

Status IndexerService::Impl::AddRegistered(const Registration& reg, bool start_thread) {
  SourceConfig sc;
  sc.name = reg.SourceName();
  sc.endpoint = reg.endpoint;
  sc.replay_endpoint = reg.replay_endpoint;
  sc.topic = reg.topic;
  KVO_RETURN_IF_ERROR(ValidateSource(sc));
  SourceStream stream;
  stream.source = sc.name;
  stream.dp_rank = reg.dp_rank;  // the registration names the rank's own endpoint
  stream.endpoint = reg.endpoint;
  stream.replay_endpoint = reg.replay_endpoint;
  std::vector<SourceStream> list;
  list.push_back(std::move(stream));
  return AddSource(sc, reg, std::move(list), start_thread);
}

void IndexerService::Impl::StartThread(StreamState* s) {
  s->thread = std::thread([this, s] { RunStream(s); });
}

namespace {
HttpResponse JsonError(int code, const std::string& message) {
  return HttpResponse{code, "application/json", RenderError(message)};
}
}  // namespace

Status IndexerService::Impl::CheckRegistration(const Registration& reg, bool* same) {
  *same = false;
  const std::string name = reg.SourceName();
  MutexLock lock(&registry_mu);
  for (const auto& src : sources) {
    if (src->config.name != name) continue;
    if (!src->reg) {
      return Status::AlreadyExists("instance '" + reg.Key() +
                                   "' has the name of a --source/--config source ('" + name +
                                   "'); register it under another instance_id");
    }
    std::string diff = FirstDifference(*src->reg, reg);
    if (diff.empty()) {
      *same = true;  // idempotent
      return Status::Ok();
    }
    return Status::AlreadyExists("instance '" + reg.Key() +
                                 "' is already registered with another '" + diff +
                                 "'; POST /unregister it first");
  }
  for (const auto& st : streams) {
    if (st->stream.endpoint == reg.endpoint ||
        (reg.replay_endpoint && st->stream.replay_endpoint == reg.replay_endpoint)) {
      return Status::AlreadyExists("'endpoint' '" + CutForMessage(reg.endpoint) +
                                   "' is already followed as source '" + st->stream.source + "'");
    }
  }
  return Status::Ok();
}

Status IndexerService::Impl::AddNewRegistration(const Registration& reg) {
  const std::string name = reg.SourceName();
  Status st = index->PutRegistration(name, RenderRegistration(reg));
  if (!st.ok()) return Status::Internal("registration not stored: " + st.ToString());
  {
    MutexLock lock(&registry_mu);
    st = AddRegistered(reg, true);
  }
  if (!st.ok()) {
    (void)index->DeleteRegistration(name);
    return Status::InvalidArgument(std::string(st.message()));
  }
  KVO_LOG_INFO("indexer: registered '{}' ({}, replay {}{}{})", name, reg.endpoint,
               reg.replay_endpoint.value_or("none"),
               reg.discovered_from.empty() ? "" : ", discovered from ", reg.discovered_from);
  return Status::Ok();
}

Result<std::vector<std::string>> IndexerService::Impl::RemoveRegistered(
    const std::function<bool(const Registration&)>& pick) {
  std::vector<std::unique_ptr<SourceState>> gone_sources;
  std::vector<std::unique_ptr<StreamState>> gone_streams;
  std::vector<std::string> removed;
  {
    MutexLock lock(&registry_mu);
    Status failed;
    for (auto& src : sources) {
      if (!src->reg || !pick(*src->reg)) continue;
      Status st = index->DeleteRegistration(src->config.name);
      if (!st.ok()) {
        failed = st;
        break;
      }
      removed.push_back(src->reg->Key());
      gone_sources.push_back(std::move(src));
    }
    if (!failed.ok()) {
      // Put back what was taken out so far: nothing is half-removed.
      std::erase_if(sources, [](const auto& p) { return p == nullptr; });
      for (auto& g : gone_sources) {
        (void)index->PutRegistration(g->config.name, RenderRegistration(*g->reg));
        sources.push_back(std::move(g));
      }
      return Status::Internal("registration not deleted: " + failed.ToString());
    }
    std::erase_if(sources, [](const auto& p) { return p == nullptr; });
    for (auto& st : streams) {
      for (const auto& src : gone_sources) {
        if (st && st->source == src.get()) gone_streams.push_back(std::move(st));
      }
    }
    std::erase_if(streams, [](const auto& p) { return p == nullptr; });
    for (const auto& src : gone_sources) source_names.erase(src->config.name);
  }
  {
    MutexLock lock(&stop_mu);
    for (auto& st : gone_streams) st->stop = true;
  }
  stop_cv.SignalAll();
  for (auto& st : gone_streams) {
    if (st->thread.joinable()) st->thread.join();
  }
  for (const auto& src : gone_sources) {
    Status st = index->ClearSource(src->config.name);
    if (!st.ok()) {
      KVO_LOG_ERROR("indexer: unregistered '{}' but clearing its entries failed: {}",
                    src->config.name, st.ToString());
    }
    KVO_LOG_INFO("indexer: unregistered '{}'", src->config.name);
  }
  return removed;
}

namespace {
int HttpCodeOf(const Status& st) {
  switch (st.code()) {
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kAlreadyExists:
      return 409;
    default:
      return 500;
  }
}
}  // namespace

HttpResponse IndexerService::Impl::Register(const HttpRequest& r) {
  auto parsed = ParseRegisterRequest(r.body, options.allow_remote_sources);
  if (!parsed.ok()) return JsonError(400, std::string(parsed.status().message()));
  auto ranks = ExpandRanks(*parsed);
  if (!ranks.ok()) return JsonError(400, std::string(ranks.status().message()));
  MutexLock op(&reg_op_mu);
  // Every rank is checked before any is added: a refused request registers nothing.
  std::vector<const Registration*> fresh;
  for (const Registration& reg : *ranks) {
    bool same = false;
    Status st = CheckRegistration(reg, &same);
    if (!st.ok()) return JsonError(HttpCodeOf(st), std::string(st.message()));
    if (!same) fresh.push_back(&reg);
  }
  for (size_t i = 0; i < fresh.size(); ++i) {
    Status st = AddNewRegistration(*fresh[i]);
    if (!st.ok()) {
      std::set<std::string> undo;
      for (size_t j = 0; j < i; ++j) undo.insert(fresh[j]->SourceName());
      (void)RemoveRegistered([&](const Registration& g) { return undo.contains(g.SourceName()); });
      return JsonError(HttpCodeOf(st), std::string(st.message()));
    }
  }
  return HttpResponse{200, "application/json", RenderRegistered(parsed->instance_id)};
}

HttpResponse IndexerService::Impl::Unregister(const HttpRequest& r) {
  auto req = ParseUnregisterRequest(r.body);
  if (!req.ok()) return JsonError(400, std::string(req.status().message()));
  MutexLock op(&reg_op_mu);
  auto removed = RemoveRegistered([&](const Registration& g) {
    return g.instance_id == req->instance_id && g.tenant_id == req->tenant_id &&
           (!req->dp_rank || g.dp_rank == *req->dp_rank);
  });
  if (!removed.ok()) return JsonError(500, std::string(removed.status().message()));
  if (removed->empty()) {
    return JsonError(400, "'instance_id' '" + req->instance_id + "' (tenant_id '" + req->tenant_id +
                              "'" +
                              (req->dp_rank ? ", dp_rank " + std::to_string(*req->dp_rank) : "") +
                              ") is not registered");
  }
  return HttpResponse{200, "application/json", RenderUnregistered(*removed)};
}

Status IndexerService::Impl::ApplyDiscovered(const DiscoverTarget& t, const std::string& model,
                                             const std::vector<DiscoveredSource>& list) {
  MutexLock op(&reg_op_mu);
  if (stopping.load()) return Status::Ok();
  Status first_error;
  auto note = [&](const Status& st) {
    if (!st.ok() && first_error.ok()) first_error = st;
  };
  std::set<int64_t> listed;
  for (const DiscoveredSource& d : list) {
    listed.insert(d.dp_rank);
    Registration reg;
    reg.endpoint = d.endpoint;
    reg.replay_endpoint = d.replay_endpoint;
    reg.type = EngineType::kVllm;
    reg.model = model;
    reg.lora_name = t.lora_name;
    reg.tenant_id = t.tenant_id;
    reg.instance_id = t.instance_id;
    reg.block_size = t.block_size;
    reg.dp_rank = d.dp_rank;
    reg.additional_salt = t.additional_salt;
    reg.topic = d.topic;
    // Endpoints on the host the operator named (or loopback) are followed; any other host only
    // with --allow-remote (an API server must not point the daemon anywhere).
    const bool on_host =
        EndpointOnHost(reg.endpoint, t.address.host) &&
        (!reg.replay_endpoint || EndpointOnHost(*reg.replay_endpoint, t.address.host));
    auto valid =
        ParseRegisterRequest(RenderRegistration(reg), options.allow_remote_sources || on_host);
    if (!valid.ok()) {
      note(valid.status().WithContext("rank " + std::to_string(d.dp_rank)));
      continue;
    }
    reg.discovered_from = t.url;
    const std::string name = reg.SourceName();
    std::optional<Registration> old;
    {
      MutexLock lock(&registry_mu);
      for (const auto& src : sources) {
        if (src->config.name == name && src->reg) old = *src->reg;
      }
    }
    if (old && *old == reg) continue;  // unchanged
    if (old) {
      KVO_LOG_WARN(
          "discovery {}: rank {} moved from {} to {} (engine restarted?): clearing the old "
          "stream and following the new one",
          t.url, d.dp_rank, old->endpoint, reg.endpoint);
      auto gone = RemoveRegistered([&](const Registration& g) { return g.SourceName() == name; });
      if (!gone.ok()) {
        note(gone.status());
        continue;
      }
    }
    bool same = false;
    Status st = CheckRegistration(reg, &same);
    if (st.ok() && !same) st = AddNewRegistration(reg);
    if (!st.ok()) note(st.WithContext("rank " + std::to_string(d.dp_rank)));
  }
  auto gone = RemoveRegistered([&](const Registration& g) {
    return g.discovered_from == t.url && g.instance_id == t.instance_id &&
           g.tenant_id == t.tenant_id && !listed.contains(g.dp_rank);
  });
  if (!gone.ok()) {
    note(gone.status());
  } else {
    for (const std::string& key : *gone) {
      KVO_LOG_WARN("discovery {}: '{}' is no longer listed: unregistered", t.url, key);
    }
  }
  return first_error;
}

std::string IndexerService::Impl::DiscoveryJson() const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& d : discoverers) {
    DiscoveryStatus st = d->status();
    nlohmann::ordered_json j;
    j["url"] = st.url;
    j["state"] = st.state;
    j["polls"] = st.polls;
    j["failures"] = st.failures;
    j["consecutive_failures"] = st.consecutive_failures;
    j["last_error"] = st.last_error;
    j["next_delay_ms"] = st.next_delay_ms;
    j["sources"] = st.sources;
    j["model"] = st.model;
    list.push_back(std::move(j));
  }
  nlohmann::ordered_json out;
  out["targets"] = std::move(list);
  return out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void IndexerService::Impl::RunDiscovery(Discoverer* d) {
  while (!stopping.load()) {
    d->PollIfDue();
    // Wake at the next due time by the clock, at most every 50 ms of real time (a test's manual
    // clock moves without waking anyone), or at Stop.
    MutexLock lock(&stop_mu);
    if (stopped) break;
    stop_cv.WaitFor(std::chrono::milliseconds(50));
  }
}

HttpResponse IndexerService::Impl::RouterQuery(const HttpRequest& r, bool by_hash) {
  const int64_t start = clock->MonotonicNanos();
  auto q = ParseRouterQuery(r.body, by_hash, config.max_query_tokens);
  if (!q.ok()) {
    score_bad->Increment();
    return JsonError(400, std::string(q.status().message()));
  }
  // The streams in scope: registrations of the tenant (config sources are tenant "default",
  // instance_id = source name, any model), then instance_id, model, LoRA and salt.
  struct Target {
    std::string instance_id;
    std::string source;
    int64_t dp_rank;
  };
  std::vector<Target> targets;
  {
    MutexLock lock(&registry_mu);
    bool tenant_known = false;
    bool instance_known = false;
    bool model_known = false;
    for (const auto& src : sources) {
      const std::string tenant = src->reg ? src->reg->tenant_id : "default";
      const std::string instance = src->reg ? src->reg->instance_id : src->config.name;
      if (tenant != q->tenant_id) continue;
      tenant_known = true;
      if (q->instance_id && instance != *q->instance_id) continue;
      instance_known = true;
      if (src->reg && src->reg->model != q->model) continue;
      model_known = true;
      if (src->reg &&
          (src->reg->lora_name != q->lora_name || src->reg->additional_salt != q->cache_salt)) {
        continue;
      }
      for (const auto& st : streams) {
        if (st->source == src.get())
          targets.push_back({instance, src->config.name, st->stream.dp_rank});
      }
    }
    std::string why;
    if (!tenant_known) {
      why = "'tenant_id' '" + q->tenant_id + "' has no registered instance";
    } else if (!instance_known) {
      why = "'instance_id' '" + *q->instance_id + "' is not registered in tenant '" + q->tenant_id +
            "'";
    } else if (!model_known) {
      why = "'model' '" + CutForMessage(q->model) + "' has no registered instance in tenant '" +
            q->tenant_id + "'";
    }
    if (!why.empty()) {
      score_bad->Increment();
      return JsonError(400, why);
    }
  }
  std::map<std::string, InstanceMatch> matches;
  for (const Target& t : targets) {
    InstanceMatch& m = matches[t.instance_id];
    m.dp[t.dp_rank];  // listed even when nothing matches
  }
  ScoreQuery sq;
  if (by_hash) {
    sq.block_hashes = std::move(q->hashes);
  } else {
    sq.token_ids = std::move(q->token_ids);
    sq.block_size = q->block_size;
  }
  if (!q->lora_name.empty()) sq.lora_name = q->lora_name;
  const bool empty =
      sq.block_hashes.empty() && static_cast<int64_t>(sq.token_ids.size()) < q->block_size;
  if (!targets.empty() && !empty) {
    auto result = index->Tiered(sq);
    if (!result.ok()) {
      bool bad = result.status().code() == StatusCode::kInvalidArgument;
      (bad ? score_bad : score_err)->Increment();
      return JsonError(bad ? 400 : 500, std::string(result.status().message()));
    }
    std::map<std::pair<std::string, int64_t>, TierBoundaries> walked;
    for (const Indexer::TieredMatch& t : *result) {
      walked[{t.source, t.dp_rank}] = TierBoundaries{t.gpu, t.cpu, t.disk};
    }
    for (const Target& t : targets) {
      auto it = walked.find({t.source, t.dp_rank});
      AddRank(it != walked.end() ? it->second : TierBoundaries{}, t.dp_rank, q->block_size,
              &matches[t.instance_id]);
    }
  }
  score_ok->Increment();
  score_latency->Observe(static_cast<double>(clock->MonotonicNanos() - start) / 1e9);
  return HttpResponse{200, "application/json", RenderRouterQueryResponse(q->tenant_id, matches)};
}

HttpResponse IndexerService::Impl::Workers() const {
  std::vector<WorkerInfo> out;
  MutexLock lock(&registry_mu);
  for (const auto& st : streams) {
    WorkerInfo w;
    const SourceState* src = st->source;
    w.source = src->config.name;
    w.registered = src->reg.has_value();
    if (src->reg) {
      w.reg = *src->reg;
    } else {
      w.reg.instance_id = src->config.name;
      w.reg.endpoint = st->stream.endpoint;
      w.reg.replay_endpoint = st->stream.replay_endpoint;
      w.reg.dp_rank = st->stream.dp_rank;
    }
    {
      MutexLock slock(&st->mu);
      w.state = st->status.state;
    }
    auto last = index->LastSequence(st->stream.source, st->stream.dp_rank);
    if (last.ok()) w.last_sequence = *last;
    out.push_back(std::move(w));
  }
  return HttpResponse{200, "application/json", RenderWorkers(out)};
}

IndexerService::IndexerService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

IndexerService::~IndexerService() { Stop(); }

Result<std::unique_ptr<IndexerService>> IndexerService::Start(const IndexerConfig& config,
                                                              const ServiceOptions& options) {
  if (config.db.empty()) return Status::InvalidArgument("indexer: no database file (--db)");
  KVO_RETURN_IF_ERROR(ValidateSources(config.sources));
  // No sources is fine: registrations stored in the file are resumed below, and routers
  // register more with POST /register.
  HttpAddress address;
  if (options.start_http) {
    KVO_ASSIGN_OR_RETURN(address, ParseHttpAddress(config.http));
    if (!IsLoopbackHost(address.host)) {
      if (!options.allow_remote_http) {
        return Status::InvalidArgument(
            "indexer: HTTP address '" + config.http +
            "' is beyond loopback; pass --allow-remote to serve it (the API has no "
            "authentication)");
      }
      KVO_LOG_WARN("indexer: the HTTP API listens on {} beyond loopback, without authentication",
                   config.http);
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->options = options;
  impl->clock = options.clock != nullptr ? options.clock : SystemClock();
  IndexerOptions io = options.index;
  io.clock = impl->clock;
  io.default_block_size = config.default_block_size;
  KVO_ASSIGN_OR_RETURN(impl->index, Indexer::Open(config.db, io));
  KVO_RETURN_IF_ERROR(impl->RegisterMetrics());
  CounterFamily* checked = nullptr;
  CounterFamily* mismatched = nullptr;
  GaugeFamily* parity = nullptr;
  KVO_ASSIGN_OR_RETURN(checked, impl->metrics.AddCounterFamily(
                                    "kvo_indexer_hash_parity_checked_blocks",
                                    "Blocks whose hash the doctor recomputed", {"source"}));
  KVO_ASSIGN_OR_RETURN(mismatched,
                       impl->metrics.AddCounterFamily(
                           "kvo_indexer_hash_parity_mismatched_blocks",
                           "Blocks whose engine hash differs from the recomputed one", {"source"}));
  KVO_ASSIGN_OR_RETURN(parity, impl->metrics.AddGaugeFamily(
                                   "kvo_indexer_hash_parity_mismatch",
                                   "1 when the source's hashes disagree with the configured "
                                   "algorithm, seed and block size",
                                   {"source"}));
  impl->doctor_checked = checked;
  impl->doctor_mismatched = mismatched;
  impl->doctor_parity = parity;
  KVO_ASSIGN_OR_RETURN(std::vector<StoredRegistration> stored, impl->index->Registrations());
  {
    MutexLock lock(&impl->registry_mu);
    for (const SourceConfig& sc : config.sources) {
      KVO_ASSIGN_OR_RETURN(std::vector<SourceStream> streams, ExpandStreams(sc));
      KVO_RETURN_IF_ERROR(impl->AddSource(sc, std::nullopt, std::move(streams), false));
    }
    // Registered sources resume from their checkpoints (the file's streams rows).
    for (const StoredRegistration& sr : stored) {
      auto reg = ParseStoredRegistration(sr.body, /*allow_remote=*/true);
      Status st = reg.ok() ? Status::Ok() : reg.status();
      if (st.ok() && !options.allow_remote_sources) {
        st = ParseStoredRegistration(sr.body, false).status();
      }
      if (st.ok() && impl->source_names.contains(reg->SourceName())) {
        st = Status::AlreadyExists("a --source/--config source has the same name");
      }
      if (!st.ok()) {
        KVO_LOG_ERROR("indexer: registration '{}' in {} not resumed (kept in the file): {}",
                      CutForMessage(sr.name), config.db, st.ToString());
        continue;
      }
      KVO_RETURN_IF_ERROR(impl->AddRegistered(*reg, false));
      KVO_LOG_INFO("indexer: resuming registered source '{}' ({})", reg->SourceName(),
                   reg->endpoint);
    }
    for (const StreamStats& st : impl->index->Stats().streams) {
      if (!impl->source_names.contains(st.source)) {
        KVO_LOG_WARN(
            "indexer: '{}' holds entries of source '{}' rank {}, which is not configured: kept "
            "in the file but left out of scores",
            config.db, st.source, st.dp_rank);
      }
    }
  }
  InitLogging();  // before the stream threads log
  {
    MutexLock lock(&impl->registry_mu);
    for (auto& st : impl->streams) impl->StartThread(st.get());
  }
  KVO_RETURN_IF_ERROR(ValidateDiscoverTargets(config.discover));
  for (const DiscoverTarget& t : config.discover) {
    DiscoveryOptions dopt;
    dopt.interval_ms = config.discover_interval_ms;
    dopt.retry_initial_ms = config.discover_retry_initial_ms;
    dopt.retry_max_ms = config.discover_retry_max_ms;
    dopt.timeout_ms = config.discover_timeout_ms;
    Impl* raw = impl.get();
    impl->discoverers.push_back(
        std::make_unique<Discoverer>(t, dopt, impl->clock,
                                     [raw](const DiscoverTarget& target, const std::string& model,
                                           const std::vector<DiscoveredSource>& list) {
                                       return raw->ApplyDiscovered(target, model, list);
                                     }));
  }
  for (auto& d : impl->discoverers) {
    Impl* raw = impl.get();
    Discoverer* dp = d.get();
    impl->discovery_threads.emplace_back([raw, dp] { raw->RunDiscovery(dp); });
    KVO_LOG_INFO("indexer: discovering engines from {} (GET /kv_event_sources every {} ms)",
                 dp->target().url, config.discover_interval_ms);
  }
  auto service = std::unique_ptr<IndexerService>(new IndexerService(std::move(impl)));
  if (options.start_http) {
    HttpServerOptions ho;
    ho.address = address;
    IndexerService* svc = service.get();
    auto http = HttpServer::Start(ho, [svc](const HttpRequest& r) { return svc->Handle(r); });
    if (!http.ok()) {
      service->Stop();
      return http.status();
    }
    service->impl_->http = std::move(http).value();
  }
  return service;
}

void IndexerService::Stop() {
  if (!impl_) return;
  {
    MutexLock lock(&impl_->stop_mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
    impl_->stopping = true;
  }
  impl_->stop_cv.SignalAll();
  if (impl_->http) impl_->http->Stop();
  // Discovery applies registrations: it ends before the streams are joined.
  for (std::thread& t : impl_->discovery_threads) {
    if (t.joinable()) t.join();
  }
  // No request runs now (HTTP stopped), so no registration changes the list.
  MutexLock op(&impl_->reg_op_mu);
  std::vector<StreamState*> threads;
  {
    MutexLock lock(&impl_->registry_mu);
    for (auto& st : impl_->streams) threads.push_back(st.get());
  }
  for (StreamState* st : threads) {
    if (st->thread.joinable()) st->thread.join();
  }
  Status st = impl_->index->Flush();
  if (!st.ok()) KVO_LOG_ERROR("indexer: final flush failed: {}", st.ToString());
}

int IndexerService::http_port() const { return impl_->http ? impl_->http->port() : 0; }

HttpResponse IndexerService::Handle(const HttpRequest& r) {
  auto method_not_allowed = [&](const char* allowed) {
    return HttpResponse{405, "application/json",
                        RenderError(r.method + " " + r.path + ": use " + allowed)};
  };
  if (r.path == "/v1/score" || r.path == "/v1/explain") {
    if (r.method != "POST") return method_not_allowed("POST");
    return impl_->Score(r, r.path == "/v1/explain");
  }
  if (r.path == "/register" || r.path == "/unregister" || r.path == "/query" ||
      r.path == "/query_by_hash") {
    if (r.method != "POST") return method_not_allowed("POST");
    if (r.path == "/register") return impl_->Register(r);
    if (r.path == "/unregister") return impl_->Unregister(r);
    return impl_->RouterQuery(r, r.path == "/query_by_hash");
  }
  if (HttpResponse page; ServeOperatorPage(r, *impl_->index, &page)) return page;
  if (r.path == "/workers") {
    if (r.method != "GET") return method_not_allowed("GET");
    return impl_->Workers();
  }
  if (r.path == "/v1/discovery") {
    if (r.method != "GET") return method_not_allowed("GET");
    return HttpResponse{200, "application/json", impl_->DiscoveryJson()};
  }
  if (r.path == "/health") {
    if (r.method != "GET") return method_not_allowed("GET");
    return HttpResponse{200, "application/json", "{\"status\":\"ok\"}"};
  }
  if (r.path == "/v1/sources") {
    if (r.method != "GET") return method_not_allowed("GET");
    return HttpResponse{200, "application/json", RenderSources(impl_->Sources())};
  }
  if (r.path == "/metrics") {
    if (r.method != "GET") return method_not_allowed("GET");
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", impl_->RenderMetrics()};
  }
  if (r.path == "/healthz") {
    if (r.method != "GET") return method_not_allowed("GET");
    size_t connected = 0;
    std::vector<SourceStatus> sources = impl_->Sources();
    size_t streams = 0;
    for (const SourceStatus& s : sources) {
      for (const StreamStatus& st : s.streams) {
        ++streams;
        connected += st.connected ? 1 : 0;
      }
    }
    return HttpResponse{200, "application/json",
                        "{\"status\":\"ok\",\"sources\":" + std::to_string(sources.size()) +
                            ",\"streams\":" + std::to_string(streams) +
                            ",\"streams_connected\":" + std::to_string(connected) + "}"};
  }
  if (HttpResponse blocks; ServeInstanceBlocks(r, *impl_->index, &blocks)) return blocks;
  return HttpResponse{404, "application/json", RenderError("no such path: " + r.path)};
}

std::vector<SourceStatus> IndexerService::Sources() const { return impl_->Sources(); }
Indexer& IndexerService::index() { return *impl_->index; }
MetricsRegistry& IndexerService::metrics() { return impl_->metrics; }

}  // namespace kvo
