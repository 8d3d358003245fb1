// IndexerService: the stream threads (subscribe, replay, apply), discovery, start and stop.
// The HTTP routes are in service_http.cc.
#include "indexer/service/service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "common/fd_limit.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/repeat_filter.h"
#include "events/zmq_subscriber.h"
#include "indexer/service/discovery.h"
#include "indexer/service/doctor.h"
#include "indexer/service/instance_blocks_api.h"
#include "indexer/service/router_api.h"
#include "indexer/service/service_internal.h"

namespace kvo {

using service_internal::kStreamCounters;
using service_internal::kStreamGauges;
using service_internal::LatencyBuckets;
using service_internal::SourceState;
using service_internal::StreamRow;
using service_internal::StreamSlice;
using service_internal::StreamState;

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
      auto* keys_family,
      metrics.AddCounterFamily("kvo_indexer_query_keys",
                               "POST /query content keys by where they were hashed: on the key "
                               "helper while the body was parsed, in the walk, or finished by "
                               "the handler after the helper stalled (taken_back)",
                               {"by"}));
  KVO_ASSIGN_OR_RETURN(keys_on_helper, keys_family->WithLabels({"helper"}));
  KVO_ASSIGN_OR_RETURN(keys_in_walk, keys_family->WithLabels({"walk"}));
  KVO_ASSIGN_OR_RETURN(keys_taken_back, keys_family->WithLabels({"taken_back"}));
  KVO_ASSIGN_OR_RETURN(
      auto* parse_family,
      metrics.AddCounterFamily("kvo_indexer_query_parses",
                               "POST /query bodies by when their token list was parsed: as the "
                               "body arrived, or once it was complete",
                               {"when"}));
  KVO_ASSIGN_OR_RETURN(parsed_arriving, parse_family->WithLabels({"arriving"}));
  KVO_ASSIGN_OR_RETURN(parsed_whole, parse_family->WithLabels({"whole"}));
  KVO_ASSIGN_OR_RETURN(
      list_chunks_on_helper,
      metrics.AddCounter("kvo_indexer_query_list_chunks_on_helper",
                         "POST /query token list chunks read by the list helper's thread and "
                         "joined by the handler, which read the others (lists of 192 kB or "
                         "more, 8 CPUs or more)"));
  KVO_ASSIGN_OR_RETURN(
      auto* takeover_family,
      metrics.AddCounterFamily("kvo_indexer_query_helper_takeovers",
                               "POST /query: work the handler did itself because a helper thread "
                               "stalled (list: chunks of the token list; keys: queries whose "
                               "content keys and walk the key helper gave up)",
                               {"helper"}));
  KVO_ASSIGN_OR_RETURN(helper_takeovers_list, takeover_family->WithLabels({"list"}));
  KVO_ASSIGN_OR_RETURN(helper_takeovers_keys, takeover_family->WithLabels({"keys"}));
  KVO_ASSIGN_OR_RETURN(
      helper_start,
      metrics.AddHistogram("kvo_indexer_query_helper_start_seconds",
                           "POST /query: from the key helper's job posted to the helper starting "
                           "it (its wake-up)",
                           LatencyBuckets()));
  KVO_ASSIGN_OR_RETURN(
      helper_wait,
      metrics.AddHistogram("kvo_indexer_query_helper_wait_seconds",
                           "POST /query: how long the handler waited for the key helper after "
                           "the token list was read (the keys' and the walk's tail)",
                           LatencyBuckets()));
  KVO_ASSIGN_OR_RETURN(plans_held,
                       metrics.AddGauge("kvo_indexer_query_plans",
                                        "POST /query answer plans held (one per scope queried "
                                        "since the registry last changed; at most 256)"));
  KVO_ASSIGN_OR_RETURN(plans_built,
                       metrics.AddCounter("kvo_indexer_query_plans_built",
                                          "POST /query answer plans built: a scope's first query "
                                          "since the registry changed, or one named in over 1 KiB "
                                          "(planned every time, never held)"));
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
  KVO_ASSIGN_OR_RETURN(
      auto* walk_family,
      metrics.AddGaugeFamily("kvo_indexer_walk_blocks",
                             "Blocks the scoring walks resolved since the index was opened: "
                             "through the chain hint of the block before (hint) or the hash "
                             "table (table)",
                             {"via"}));
  KVO_ASSIGN_OR_RETURN(walk_blocks_hinted, walk_family->WithLabels({"hint"}));
  KVO_ASSIGN_OR_RETURN(walk_blocks_looked_up, walk_family->WithLabels({"table"}));
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

void IndexerService::Impl::ForgetMetrics(const SourceState& src,
                                         const std::vector<const StreamState*>& gone) {
  {
    MutexLock lock(&registry_mu);
    for (const StreamState* s : gone) {
      const std::vector<std::string> v = {s->stream.source, std::to_string(s->stream.dp_rank)};
      for (CounterFamily* f : stream_counters) f->Remove(v);
      for (GaugeFamily* f : stream_gauges) f->Remove(v);
    }
  }
  if (src.doctor && doctor_checked != nullptr) {
    doctor_checked->Remove({src.config.name});
    doctor_mismatched->Remove({src.config.name});
    doctor_parity->Remove({src.config.name});
  }
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
    if (st.ok()) {
      // Nothing applied is left: no sequence, no batch time to measure lag from.
      s->status.has_seq = false;
      s->status.last_seq = 0;
      s->last_batch_ts = 0;
    } else {
      s->status.last_error = st.ToString();
    }
  }
  if (st.ok()) s->metrics.last_seq->Set(0);
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
    if (outcome->refused_events > 0) {
      s->metrics.apply_errors->Increment();
      if (RepeatFilter::Decision d = s->refused_log.Note(outcome->refused_reason); d.log) {
        KVO_LOG_WARN(
            "source '{}' rank {}: batch seq {}: {} event(s) left out, the rest applied: {}{}",
            s->stream.source, s->stream.dp_rank, b.seq, outcome->refused_events,
            outcome->refused_reason, d.Describe());
      }
      MutexLock lock(&s->mu);
      ++s->status.apply_errors;
      s->status.last_error = outcome->refused_reason;
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
  // Silence counts from the first subscription, not from the stream's start: a source that could
  // not subscribe for a while (its port taken, descriptors gone) was not silent meanwhile, and
  // logging "nothing received for N s" right after "subscribed after N failed attempts" misleads.
  int64_t subscribed_ns = 0;
  int64_t next_silence_log_ns = 0;
  int64_t silence_log_step_ms = config.silent_after_ms;
  const auto slice = StreamSlice(s->wake.fd() >= 0, config.silent_after_ms);
  RepeatFilter failures;  // "cannot subscribe" warnings: the first, then the 2nd, 4th, 8th, ...
  while (!Stopped(s)) {
    SubscriberOptions o;
    o.endpoint = s->stream.endpoint;
    o.replay_endpoint = s->stream.replay_endpoint;
    o.topic = cfg.topic;
    o.bind = cfg.bind;
    o.hwm = config.hwm;
    o.replay_timeout_ms = config.replay_timeout_ms;
    o.idle_probe_ms = config.idle_probe_ms;
    o.wake_fd = s->wake.fd();
    auto last = index->LastSequence(s->stream.source, s->stream.dp_rank);
    if (last.ok()) {
      o.start_seq = *last + 1;
    } else if (s->stream.replay_endpoint) {
      o.start_seq = 0;  // everything the publisher still has
    }
    {
      MutexLock lock(&s->mu);
      s->status.state = StreamPhase::kConnecting;
    }
    auto created = Subscriber::Create(o, clock);
    if (!created.ok()) {
      const std::string why = created.status().ToString();
      RepeatFilter::Decision d = failures.Note(why);
      if (d.log) {
        KVO_LOG_WARN("source '{}' rank {}: cannot subscribe ({}); retrying in {} ms{}",
                     s->stream.source, s->stream.dp_rank, why, backoff_ms, d.Describe());
      }
      {
        MutexLock lock(&s->mu);
        s->status.state = StreamPhase::kRetrying;
        ++s->status.connect_failures;
        s->status.last_error = created.status().ToString();
      }
      if (!WaitFor(s, backoff_ms)) break;
      backoff_ms = std::min(backoff_ms * 2, config.retry_max_ms);
      continue;
    }
    backoff_ms = config.retry_initial_ms;
    if (subscribed_ns == 0) {
      subscribed_ns = clock->MonotonicNanos();
      next_silence_log_ns = subscribed_ns + config.silent_after_ms * 1'000'000;
    }
    if (int64_t failed = failures.Reset(); failed > 0) {
      KVO_LOG_INFO("source '{}' rank {}: subscribed after {} failed attempt{}", s->stream.source,
                   s->stream.dp_rank, failed, failed == 1 ? "" : "s");
    }
    std::unique_ptr<Subscriber> sub = std::move(created).value();
    SubscriberStats seen;  // this subscriber's stats already folded into the status
    std::vector<SubscriberNotice> pending;  // losses that precede a later batch
    bool resubscribe = false;
    while (!Stopped(s) && !resubscribe) {
      auto next = sub->Next(slice);
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
        int64_t since_ns = now_ns - (last_ns != 0 ? last_ns : subscribed_ns);
        if (since_ns > config.silent_after_ms * 1'000'000 && now_ns >= next_silence_log_ns) {
          KVO_LOG_WARN("source '{}' rank {} ({}): nothing received for {:.1f} s; still trying",
                       s->stream.source, s->stream.dp_rank, s->stream.endpoint,
                       static_cast<double>(since_ns) / 1e9);
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
      st->status.state = StreamPhase::kConnecting;
    }
    added.push_back(std::move(st));
  }
  source_names.insert(sc.name);
  ++registry_generation;
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
    if (old && FirstDifference(*old, reg).empty()) continue;  // unchanged, whoever registered it
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

namespace {
// A stream waiting to retry a subscribe refused for want of descriptors (events/zmq_util.cc
// names the limit in the error).
bool IsFdLimitError(const StreamStatus& st) {
  return st.state == StreamPhase::kRetrying &&
         st.last_error.find("RLIMIT_NOFILE") != std::string::npos;
}
}  // namespace

std::string IndexerService::Impl::FdLimitWarning() const {
  size_t total = 0;
  size_t limited = 0;
  for (const SourceStatus& s : Sources()) {
    for (const StreamStatus& st : s.streams) {
      ++total;
      limited += IsFdLimitError(st) ? 1 : 0;
    }
  }
  if (limited == 0) return {};
  return std::to_string(limited) + " of " + std::to_string(total) +
         " streams cannot subscribe: " + FdLimitNote();
}

std::string IndexerService::Impl::DiscoveryJson() const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& d : discoverers) {
    DiscoveryStatus st = d->status();
    nlohmann::ordered_json j;
    j["url"] = st.url;
    j["state"] = DiscoveryPhaseName(st.state);
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
  if (options.parallel_query_keys && std::thread::hardware_concurrency() > 1) {
    // Four CPUs or more: the walk on a thread of its own beside the hashing (with fewer, the
    // helper walks while it waits for the parser).
    KeyHelper::Options ko;
    ko.walk_thread = std::thread::hardware_concurrency() >= 4;
    ko.give_up_after_ns = options.key_helper_patience_ns;
    impl->key_helper = std::make_unique<KeyHelper>(impl->index.get(), impl->clock, std::move(ko));
  }
  if (options.parallel_list_parse && options.parse_arriving_queries &&
      std::thread::hardware_concurrency() >= options.list_helper_min_cpus) {
    // The handler, the I/O thread, the key helper's two threads and this one: cores for each.
    ListHelper::Options lo;
    lo.threads = options.list_helper_threads > 0
                     ? options.list_helper_threads
                     : (std::thread::hardware_concurrency() >= 16 ? 3u : 1u);
    lo.takeover_after_ns = options.list_helper_patience_ns;
    lo.clock = impl->clock;
    impl->list_helper = std::make_unique<ListHelper>(std::move(lo));
  }
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
    // A 128k-token /query is ~0.9 MB: a worker follows its body while it arrives (http_server.h).
    if (options.follow_query_bodies) ho.early_paths = {"/query", "/query_by_hash", "/v1/score"};
    ho.max_early_requests = options.max_early_requests;
    if (options.follow_query_bodies && options.parse_arriving_queries) {
      ho.arriving_paths = {"/query"};
    }
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
  for (StreamState* st : threads) st->wake.Signal();
  for (StreamState* st : threads) {
    if (st->thread.joinable()) st->thread.join();
  }
  Status st = impl_->index->Flush();
  if (!st.ok()) KVO_LOG_ERROR("indexer: final flush failed: {}", st.ToString());
}

int IndexerService::http_port() const { return impl_->http ? impl_->http->port() : 0; }

size_t IndexerService::list_helper_threads() const {
  return impl_->list_helper ? impl_->list_helper->options().threads : 0;
}

HttpResponse IndexerService::Handle(const HttpRequest& r) {
  if (r.arriving != nullptr && r.path != "/query") {
    // A body still arriving on a route that reads it whole (only /query is set up to arrive).
    const std::optional<std::string_view> body = WholeBody(r);
    if (!body) {
      return HttpResponse{400, "application/json",
                          RenderError("the body ended before its Content-Length")};
    }
    HttpRequest whole{r.method, r.path, std::string(*body)};
    return Handle(whole);
  }
  auto method_not_allowed = [&](const char* allowed) {
    return HttpResponse{405, "application/json",
                        RenderError(CutForMessage(r.method, 16) + " " + CutForMessage(r.path) +
                                    ": use " + allowed)};
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
    // Streams that cannot subscribe because descriptors ran out: named (the limit and how to
    // raise it) instead of a plain "ok" that hides them.
    const std::string fd_note = impl_->FdLimitWarning();
    if (fd_note.empty()) return HttpResponse{200, "application/json", "{\"status\":\"ok\"}"};
    return HttpResponse{200, "application/json",
                        "{\"status\":\"ok\",\"warning\":" + nlohmann::json(fd_note).dump() + "}"};
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
    size_t fd_limited = 0;
    for (const SourceStatus& s : sources) {
      for (const StreamStatus& st : s.streams) fd_limited += IsFdLimitError(st) ? 1 : 0;
    }
    std::string body = "{\"status\":\"ok\",\"sources\":" + std::to_string(sources.size()) +
                       ",\"streams\":" + std::to_string(streams) +
                       ",\"streams_connected\":" + std::to_string(connected);
    if (auto lim = CurrentFdLimit(); lim.ok()) {
      body += ",\"open_files_limit\":" + std::to_string(lim->soft);
    }
    if (fd_limited > 0) {
      body += ",\"streams_out_of_descriptors\":" + std::to_string(fd_limited) +
              ",\"warning\":" + nlohmann::json(impl_->FdLimitWarning()).dump();
    }
    return HttpResponse{200, "application/json", body + "}"};
  }
  if (HttpResponse blocks; ServeInstanceBlocks(r, *impl_->index, &blocks)) return blocks;
  return HttpResponse{404, "application/json",
                      RenderError("no such path: " + CutForMessage(r.path))};
}

std::vector<SourceStatus> IndexerService::Sources() const { return impl_->Sources(); }
Indexer& IndexerService::index() { return *impl_->index; }
MetricsRegistry& IndexerService::metrics() { return impl_->metrics; }

}  // namespace kvo
