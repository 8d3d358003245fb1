// IndexerService: the HTTP routes (score, explain, sources, metrics, the Mooncake/Dynamo router
// API: register, unregister, query, workers).
#include "indexer/service/service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "common/json.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "events/zmq_subscriber.h"
#include "indexer/service/discovery.h"
#include "indexer/service/doctor.h"
#include "indexer/service/instance_blocks_api.h"
#include "indexer/service/router_api.h"
#include "indexer/service/service_internal.h"

namespace kvo {

using service_internal::ObservedPhase;
using service_internal::Recent;
using service_internal::SourceState;
using service_internal::StreamState;

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
      const bool recent = Recent(activity, now_ns, config.silent_after_ms);
      status.connected = recent;
      status.state = ObservedPhase(status.state, activity, now_ns, config.silent_after_ms);
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
  walk_blocks_hinted->Set(static_cast<double>(stats.counters.walk_blocks_hinted));
  walk_blocks_looked_up->Set(static_cast<double>(stats.counters.walk_blocks_looked_up));
  log_rows_pending->Set(static_cast<double>(stats.log_rows_pending));
  sqlite_bytes->Set(static_cast<double>(stats.sqlite_bytes));
  (void)Sources();  // refreshes the connected and lag gauges
  return metrics.RenderPrometheus();
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
  // An endpoint already followed, as a PUB or a replay endpoint, in either role.
  for (const auto& st : streams) {
    const std::optional<std::string>& theirs = st->stream.replay_endpoint;
    const bool pub_taken = st->stream.endpoint == reg.endpoint || theirs == reg.endpoint;
    const bool replay_taken = reg.replay_endpoint && (st->stream.endpoint == *reg.replay_endpoint ||
                                                      theirs == reg.replay_endpoint);
    if (pub_taken || replay_taken) {
      const std::string& ep = pub_taken ? reg.endpoint : *reg.replay_endpoint;
      return Status::AlreadyExists(std::string(pub_taken ? "'endpoint'" : "'replay_endpoint'") +
                                   " '" + CutForMessage(ep) + "' is already followed by source '" +
                                   st->stream.source + "'");
    }
  }
  return Status::Ok();
}

Status IndexerService::Impl::AddNewRegistration(const Registration& reg) {
  const std::string name = reg.SourceName();
  {
    MutexLock lock(&registry_mu);
    if (static_cast<int64_t>(streams.size()) >= config.max_sources) {
      return Status::OutOfSpace("registration of '" + CutForMessage(reg.Key()) +
                                "' refused: " + std::to_string(streams.size()) +
                                " streams are followed, the limit is " +
                                std::to_string(config.max_sources) +
                                " (kvo index serve --max-sources, config key max_sources)");
    }
  }
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
  // The picked registrations, deleted from the file first, outside registry_mu (a commit may hold
  // the database for a while, and every query and status route waits on registry_mu). reg_op_mu
  // keeps any other registration change out meanwhile, so the list read here still holds.
  std::vector<Registration> picked;
  {
    MutexLock lock(&registry_mu);
    for (const auto& src : sources) {
      if (src->reg && pick(*src->reg)) picked.push_back(*src->reg);
    }
  }
  for (size_t i = 0; i < picked.size(); ++i) {
    Status st = index->DeleteRegistration(picked[i].SourceName());
    if (!st.ok()) {
      // Put back what was deleted so far: nothing is half-removed.
      for (size_t j = 0; j < i; ++j) {
        (void)index->PutRegistration(picked[j].SourceName(), RenderRegistration(picked[j]));
      }
      return Status::Internal("registration not deleted: " + st.ToString());
    }
  }
  {
    MutexLock lock(&registry_mu);
    ++registry_generation;  // even when nothing is removed: plans rebuild
    for (auto& src : sources) {
      if (!src->reg || !pick(*src->reg)) continue;
      removed.push_back(src->reg->Key());
      gone_sources.push_back(std::move(src));
    }
    std::erase_if(sources, [](const auto& p) { return p == nullptr; });
    for (auto& st : streams) {
      for (const auto& src : gone_sources) {
        if (st && st->source == src.get()) {
          gone_streams.push_back(std::move(st));
          break;
        }
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
  for (auto& st : gone_streams) st->wake.Signal();
  for (auto& st : gone_streams) {
    if (st->thread.joinable()) st->thread.join();
  }
  for (const auto& src : gone_sources) {
    std::vector<const StreamState*> its;
    for (const auto& st : gone_streams) {
      if (st->source == src.get()) its.push_back(st.get());
    }
    ForgetMetrics(*src, its);
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
    case StatusCode::kOutOfSpace:
      return 429;
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

Result<std::shared_ptr<const RouterAnswerPlan>> IndexerService::Impl::QueryPlan(
    const kvo::RouterQuery& q) {
  // The scope's key: every field the streams in scope depend on, each length-prefixed (no two
  // scopes share a key).
  std::string key;
  for (std::string_view f :
       {std::string_view(q.tenant_id),
        q.instance_id ? std::string_view(*q.instance_id) : std::string_view(),
        std::string_view(q.model), std::string_view(q.lora_name), std::string_view(q.cache_salt)}) {
    key += std::to_string(f.size());
    key += ':';
    key += f;
  }
  key += q.instance_id ? '1' : '0';
  if (plans_generation != registry_generation || query_plans.size() >= kMaxQueryPlans) {
    query_plans.clear();
    plans_generation = registry_generation;
    plans_held->Set(0);  // also when this query then fails (an unknown tenant)
  }
  if (auto it = query_plans.find(key); it != query_plans.end()) return it->second;
  // The streams in scope: registrations of the tenant (config sources are tenant "default",
  // instance_id = source name, any model), then instance_id, model, LoRA and salt.
  bool tenant_known = false;
  bool instance_known = false;
  bool model_known = false;
  static const std::string kDefaultTenant = "default";
  std::vector<const SourceState*> in_scope;  // sorted by address: looked up per stream below
  for (const auto& src : sources) {
    const std::string& tenant = src->reg ? src->reg->tenant_id : kDefaultTenant;
    const std::string& instance = src->reg ? src->reg->instance_id : src->config.name;
    if (tenant != q.tenant_id) continue;
    tenant_known = true;
    if (q.instance_id && instance != *q.instance_id) continue;
    instance_known = true;
    if (src->reg && src->reg->model != q.model) continue;
    model_known = true;
    if (src->reg &&
        (src->reg->lora_name != q.lora_name || src->reg->additional_salt != q.cache_salt)) {
      continue;
    }
    in_scope.push_back(src.get());
  }
  if (!tenant_known) {
    return Status::InvalidArgument("'tenant_id' '" + CutForMessage(q.tenant_id) +
                                   "' has no registered instance");
  }
  if (!instance_known) {
    return Status::InvalidArgument("'instance_id' '" + CutForMessage(*q.instance_id) +
                                   "' is not registered in tenant '" + CutForMessage(q.tenant_id) +
                                   "'");
  }
  if (!model_known) {
    return Status::InvalidArgument("'model' '" + CutForMessage(q.model) +
                                   "' has no registered instance in tenant '" +
                                   CutForMessage(q.tenant_id) + "'");
  }
  // One pass over the streams (not one per source: 100 registrations made that 10 000 steps).
  std::sort(in_scope.begin(), in_scope.end());
  std::vector<ScopedStream> scoped;
  for (const auto& st : streams) {
    const SourceState* src = st->source;
    if (!std::binary_search(in_scope.begin(), in_scope.end(), src)) continue;
    scoped.push_back({src->reg ? src->reg->instance_id : src->config.name, src->config.name,
                      st->stream.dp_rank});
  }
  auto plan = std::make_shared<const RouterAnswerPlan>(PlanRouterAnswer(std::move(scoped)));
  // Only scopes named in a reasonable size are kept: a client varying a megabyte-long salt must
  // not make the cache hold 256 of them.
  if (key.size() <= kMaxQueryPlanKey) query_plans.emplace(std::move(key), plan);
  plans_built->Increment();
  plans_held->Set(static_cast<double>(query_plans.size()));
  return plan;
}

HttpResponse IndexerService::Impl::RouterQuery(const HttpRequest& r, bool by_hash) {
  auto state = std::make_shared<RouterQueryState>();
  HttpResponse res = RouterQuery(r, by_hash, *state);
  if (state->keys != nullptr || state->lists != nullptr) {
    res.after_sent = [state]() mutable { state.reset(); };
  }
  return res;
}

HttpResponse IndexerService::Impl::RouterQuery(const HttpRequest& r, bool by_hash,
                                               RouterQueryState& state) {
  const int64_t start = clock->MonotonicNanos();
  // /query: the content keys hashed on the helper while the token list is read (when it is free).
  if (!by_hash && key_helper != nullptr) state.keys = key_helper->TryLease();
  KeyHelper::Lease* const keys = state.keys.get();
  const bool arriving = r.arriving != nullptr && !by_hash;
  if (!by_hash) (arriving ? parsed_arriving : parsed_whole)->Increment();
  // The list helper's chunks for this query (one query holds it at a time).
  if (arriving && list_helper != nullptr) state.lists = list_helper->TryLease();
  auto q = arriving
               ? ParseRouterQuery(*r.arriving, config.max_query_tokens, keys, state.lists.get())
               : ParseRouterQuery(r.body, by_hash, config.max_query_tokens, keys);
  if (state.lists != nullptr) {
    if (state.lists->joined_from_helper() != 0) {
      list_chunks_on_helper->Increment(static_cast<double>(state.lists->joined_from_helper()));
    }
    if (state.lists->takeovers() != 0) {
      helper_takeovers_list->Increment(static_cast<double>(state.lists->takeovers()));
    }
  }
  if (keys != nullptr && keys->gave_up()) helper_takeovers_keys->Increment();
  if (!q.ok()) {
    score_bad->Increment();
    return JsonError(400, std::string(q.status().message()));
  }
  ScoreQuery& sq = state.sq;
  // The token ids first: a key helper that gave the job up may read them until its lease goes.
  if (!by_hash) sq.token_ids = std::move(q->token_ids);
  std::shared_ptr<const RouterAnswerPlan> plan;
  {
    MutexLock lock(&registry_mu);
    Result<std::shared_ptr<const RouterAnswerPlan>> planned = QueryPlan(*q);
    if (!planned.ok()) {
      score_bad->Increment();
      return JsonError(400, std::string(planned.status().message()));
    }
    plan = std::move(planned).value();
  }
  RouterAnswer answer(*plan);
  // /query: the helper's walk of the keys it hashed (over every source, as Tiered below).
  std::optional<std::vector<Indexer::TieredMatch>> helper_walk;
  if (by_hash) {
    sq.block_hashes = std::move(q->hashes);
  } else {
    sq.block_size = q->block_size;
    if (keys != nullptr) {
      if (keys->start_delay_ns() >= 0) {
        helper_start->Observe(static_cast<double>(keys->start_delay_ns()) / 1e9);
      }
      if (keys->end_wait_ns() >= 0) {
        helper_wait->Observe(static_cast<double>(keys->end_wait_ns()) / 1e9);
      }
      helper_walk = keys->TakeWalk();
      if (!helper_walk) sq.content_keys = keys->TakeKeys();
    }
    (keys != nullptr && keys->gave_up()        ? keys_taken_back
     : helper_walk || !sq.content_keys.empty() ? keys_on_helper
                                               : keys_in_walk)
        ->Increment();
  }
  if (!q->lora_name.empty()) sq.lora_name = q->lora_name;
  const bool empty =
      sq.block_hashes.empty() && static_cast<int64_t>(sq.token_ids.size()) < q->block_size;
  if (!plan->streams.empty() && !empty) {
    Result<std::vector<Indexer::TieredMatch>> result =
        helper_walk ? Result<std::vector<Indexer::TieredMatch>>(std::move(*helper_walk))
                    : index->Tiered(sq);
    if (!result.ok()) {
      bool bad = result.status().code() == StatusCode::kInvalidArgument;
      (bad ? score_bad : score_err)->Increment();
      return JsonError(bad ? 400 : 500, std::string(result.status().message()));
    }
    // Every stream's match folded into its instance; streams out of scope are skipped.
    for (const Indexer::TieredMatch& t : *result) {
      FoldStream(*plan, t.source, t.dp_rank, TierBoundaries{t.gpu, t.cpu, t.disk}, q->block_size,
                 &answer);
    }
  }
  score_ok->Increment();
  score_latency->Observe(static_cast<double>(clock->MonotonicNanos() - start) / 1e9);
  return HttpResponse{200, "application/json", RenderRouterAnswer(q->tenant_id, *plan, answer)};
}

HttpResponse IndexerService::Impl::Workers() const {
  const int64_t now_ns = clock->MonotonicNanos();
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
      w.state =
          ObservedPhase(st->status.state, st->last_activity_ns, now_ns, config.silent_after_ms);
    }
    auto last = index->LastSequence(st->stream.source, st->stream.dp_rank);
    if (last.ok()) w.last_sequence = *last;
    out.push_back(std::move(w));
  }
  return HttpResponse{200, "application/json", RenderWorkers(out)};
}

}  // namespace kvo
