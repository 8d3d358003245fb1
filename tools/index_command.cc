// `kvo index serve|query|doctor|stats|dump|explain`: the prefix indexer from the command line.
//   serve    the daemon: follows the configured sources, answers the HTTP API;
//   query    asks a running daemon (POST /v1/score or /v1/explain);
//   doctor   hash parity: of a running daemon's sources, or of one publisher directly;
//   stats | dump | explain   audit an index file (opened read-only; a daemon may be running).
// stdout carries only data (JSON unless stated); diagnostics go to stderr.
#include <signal.h>
#include <time.h>

#include <nlohmann/json.hpp>

#include <charconv>
#include <cstdio>
#include <string>
#include <vector>

#include "common/fd_limit.h"
#include "common/hex.h"
#include "common/json.h"
#include "common/json_fields.h"
#include "common/logging.h"
#include "events/events.h"
#include "indexer/indexer.h"
#include "indexer/service/client.h"
#include "indexer/service/doctor.h"
#include "indexer/service/http_api.h"
#include "indexer/service/service.h"
#include "indexer/service/sources_config.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace kvo::cli {
namespace {

using OJson = nlohmann::ordered_json;

std::string Dump(const OJson& j) { return j.dump(-1, ' ', false, OJson::error_handler_t::replace); }

// "1,2,3" -> ints (int64 for tokens; u64 or hex digests for hashes).
Result<std::vector<int64_t>> ParseTokenList(const std::string& text) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size()) {
      return Status::InvalidArgument("--tokens: '" + item + "' is not an integer");
    }
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

Result<std::vector<uint64_t>> ParseHashList(const std::string& text) {
  std::vector<uint64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    uint64_t v = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (!item.empty() && ec == std::errc() && ptr == item.data() + item.size()) {
      out.push_back(v);
    } else {
      auto raw = ParseHex(item);
      if (!raw.ok() || raw->empty()) {
        return Status::InvalidArgument("--block-hashes: '" + item +
                                       "' is neither a u64 nor a hex digest");
      }
      out.push_back(BlockDigest::Low64(*raw));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// Query options shared by query and explain.
struct QueryArgs {
  std::string tokens;
  std::string block_hashes;
  int64_t block_size = 0;
  std::string lora_name;
  std::vector<std::string> weights;  // MEDIUM=W
  std::vector<std::string> sources;
};

void AddQueryOptions(CLI::App* cmd, QueryArgs* a) {
  cmd->add_option("--tokens", a->tokens, "token ids, comma-separated");
  cmd->add_option("--block-hashes", a->block_hashes,
                  "engine block hashes (u64 or hex digests), comma-separated");
  cmd->add_option("--block-size", a->block_size, "tokens per block (token queries)");
  cmd->add_option("--lora-name", a->lora_name, "LoRA adapter name");
  cmd->add_option("--weight", a->weights, "MEDIUM=WEIGHT (repeatable), e.g. CPU=0.8");
  cmd->add_option("--source", a->sources, "only these sources (repeatable)");
}

Result<ScoreQuery> BuildQuery(const QueryArgs& a) {
  ScoreQuery q;
  if (a.tokens.empty() == a.block_hashes.empty()) {
    return Status::InvalidArgument("give exactly one of --tokens or --block-hashes");
  }
  if (!a.tokens.empty()) {
    KVO_ASSIGN_OR_RETURN(q.token_ids, ParseTokenList(a.tokens));
  } else {
    KVO_ASSIGN_OR_RETURN(q.block_hashes, ParseHashList(a.block_hashes));
  }
  if (a.block_size > 0) q.block_size = a.block_size;
  if (!a.lora_name.empty()) q.lora_name = a.lora_name;
  for (const std::string& w : a.weights) {
    size_t eq = w.find('=');
    double v = 0;
    if (eq == std::string::npos || eq == 0) {
      return Status::InvalidArgument("--weight '" + w + "': expected MEDIUM=WEIGHT");
    }
    try {
      size_t used = 0;
      v = std::stod(w.substr(eq + 1), &used);
      if (used != w.size() - eq - 1) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      return Status::InvalidArgument("--weight '" + w + "': weight is not a number");
    }
    q.weights[w.substr(0, eq)] = v;
  }
  q.sources = a.sources;
  return q;
}

// ---------------------------------------------------------------------------------------------
// serve

struct ServeArgs {
  std::string db;
  std::string config;
  std::vector<std::string> sources;
  std::vector<std::string> discover;
  std::string http;
  bool allow_remote = false;
  int64_t max_query_tokens = 0;
  int64_t max_sources = 0;
  int64_t memory_budget_mb = 0;
  int max_early_requests = -1;
};

Status RunServe(const ServeArgs& a) {
  IndexerConfig config;
  if (!a.config.empty()) {
    KVO_ASSIGN_OR_RETURN(std::string text, ReadInputFile(a.config, "config file"));
    KVO_ASSIGN_OR_RETURN(config, ParseIndexerConfig(text, a.config));
  }
  for (const std::string& flag : a.sources) {
    KVO_ASSIGN_OR_RETURN(SourceConfig s, ParseSourceFlag(flag));
    config.sources.push_back(std::move(s));
  }
  for (const std::string& flag : a.discover) {
    KVO_ASSIGN_OR_RETURN(DiscoverTarget t, ParseDiscoverFlag(flag));
    config.discover.push_back(std::move(t));
  }
  KVO_RETURN_IF_ERROR(ValidateDiscoverTargets(config.discover));
  if (!a.db.empty()) config.db = a.db;
  if (!a.http.empty()) config.http = a.http;
  if (a.max_query_tokens > 0) config.max_query_tokens = a.max_query_tokens;
  if (a.max_sources > 0) config.max_sources = a.max_sources;
  KVO_RETURN_IF_ERROR(ValidateSources(config.sources));
  ServiceOptions options;
  options.allow_remote_http = a.allow_remote;
  options.allow_remote_sources = a.allow_remote;
  if (a.max_early_requests >= 0) options.max_early_requests = a.max_early_requests;
  if (a.memory_budget_mb > 0) {
    options.index.memory_budget_bytes = static_cast<size_t>(a.memory_budget_mb) << 20;
  }
  // Each source holds a few descriptors (ZeroMQ sockets, their mailboxes and connections): lift
  // the soft open-file limit (1024 on Debian) to the hard one before any socket is made.
  auto fd_limit = RaiseFdLimit();
  if (!fd_limit.ok()) KVO_LOG_WARN("kvo index serve: {}", fd_limit.status().ToString());
  // Threads started from here on inherit the mask; this thread takes the signals with sigwait.
  sigset_t signals = BlockTerminationSignals();
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<IndexerService> service,
                       IndexerService::Start(config, options));
  OJson ready;
  ready["event"] = "listening";
  ready["http"] =
      "http://" + ParseHttpAddress(config.http)->host + ":" + std::to_string(service->http_port());
  ready["port"] = service->http_port();
  ready["db"] = config.db;
  ready["sources"] = config.sources.size();
  ready["discover"] = config.discover.size();
  if (auto lim = CurrentFdLimit(); lim.ok()) ready["open_files_limit"] = lim->soft;
  PrintLine(Dump(ready));
  KVO_LOG_INFO("kvo index serve: listening on port {}, {} sources", service->http_port(),
               config.sources.size());
  const int sig = WaitForTerminationSignal(signals);
  KVO_LOG_INFO("kvo index serve: signal {}, shutting down", sig);
  service->Stop();
  OJson stopped;
  stopped["event"] = "stopped";
  stopped["signal"] = sig;
  PrintLine(Dump(stopped));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// query

struct ClientArgs {
  std::string http;
  int timeout_ms = 5'000;
};

Status RunQuery(const ClientArgs& c, const QueryArgs& a, bool explain) {
  KVO_ASSIGN_OR_RETURN(ScoreQuery q, BuildQuery(a));
  KVO_ASSIGN_OR_RETURN(IndexerClient client, IndexerClient::Create(c.http, c.timeout_ms));
  KVO_ASSIGN_OR_RETURN(std::string body, explain ? client.ExplainJson(q) : client.ScoreJson(q));
  PrintLine(body);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// doctor

struct DoctorArgs {
  std::string http;
  std::string endpoint;
  std::string replay;
  std::string topic;
  std::string algo = "sha256";
  std::optional<std::string> seed;  // unset: vLLM's rule (ResolveNoneHashSeed)
  int64_t block_size = 16;
  int64_t blocks = 64;
  int64_t timeout_ms = 10'000;
};

OJson ReportJson(const ParityReport& r) {
  OJson j;
  j["state"] = ParityStateName(r.state);
  j["checked_blocks"] = r.checked_blocks;
  j["matched_blocks"] = r.matched_blocks;
  j["mismatched_blocks"] = r.mismatched_blocks;
  j["unverifiable_blocks"] = r.unverifiable_blocks;
  if (r.state == ParityState::kMismatch) {
    j["cause"] = r.cause;
    j["detail"] = r.detail;
    j["example"] = r.example;
  }
  return j;
}

// Exit status: 0 parity ok, 1 mismatch, 3 nothing verifiable seen.
ExitCode RunDoctor(const DoctorArgs& a) {
  if (a.http.empty() == a.endpoint.empty()) {
    return Status::InvalidArgument("give exactly one of --http (a running daemon) or --endpoint");
  }
  if (!a.http.empty()) {
    KVO_ASSIGN_OR_RETURN(IndexerClient client, IndexerClient::Create(a.http));
    KVO_ASSIGN_OR_RETURN(std::string body, client.SourcesJson());
    auto parsed = ParseOrderedJson(body, "/v1/sources answer");
    if (!parsed.ok()) return Status::Corruption(parsed.status().message());
    OJson doc = std::move(parsed).value();
    int code = 0;
    OJson out = OJson::array();
    for (const auto& s : doc["sources"]) {
      OJson line;
      line["source"] = s["name"];
      line["hash_parity"] = s["hash_parity"];
      std::string state = s["hash_parity"]["state"].get<std::string>();
      if (state == "mismatch") code = 1;
      out.push_back(std::move(line));
      if (state == "mismatch") {
        std::fprintf(stderr, "kvo: source %s: hash parity MISMATCH (%s): %s\n",
                     s["name"].get<std::string>().c_str(),
                     s["hash_parity"]["cause"].get<std::string>().c_str(),
                     s["hash_parity"]["detail"].get<std::string>().c_str());
      }
    }
    PrintLine(Dump(out));
    return code;
  }
  HashParityConfig cfg;
  KVO_ASSIGN_OR_RETURN(cfg.algo, ParseHashAlgo(a.algo));
  auto seed = ResolveNoneHashSeed(cfg.algo, a.seed);
  if (!seed.ok()) return Status::InvalidArgument("--hash-seed: " + seed.status().message());
  cfg.seed = *seed;
  if (a.block_size < 1) return Status::InvalidArgument("--block-size must be positive");
  cfg.block_size = a.block_size;
  SubscriberOptions o;
  o.endpoint = a.endpoint;
  if (!a.replay.empty()) {
    o.replay_endpoint = a.replay;
    o.start_seq = 0;  // what the publisher still has: verifiable at once
  }
  o.topic = a.topic;
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<Subscriber> sub, Subscriber::Create(o));
  HashParityDoctor doctor(a.endpoint, cfg);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(a.timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    ParityReport r = doctor.report();
    if (r.checked_blocks >= static_cast<uint64_t>(a.blocks) || r.state == ParityState::kMismatch) {
      break;
    }
    KVO_ASSIGN_OR_RETURN(auto batch, sub->Next(std::chrono::milliseconds(100)));
    if (batch) doctor.Check(batch->batch);
  }
  ParityReport r = doctor.report();
  OJson out = ReportJson(r);
  out["endpoint"] = a.endpoint;
  out["algo"] = HashAlgoName(cfg.algo);
  out["seed"] = cfg.seed;
  out["block_size"] = cfg.block_size;
  PrintLine(Dump(out));
  if (r.state == ParityState::kMismatch) {
    std::fprintf(stderr, "kvo: hash parity MISMATCH (%s): %s\n", r.cause.c_str(), r.detail.c_str());
    return 1;
  }
  if (r.state != ParityState::kOk) {
    std::fprintf(stderr, "kvo: no self-describing block verified within %lld ms\n",
                 static_cast<long long>(a.timeout_ms));
    return 3;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// stats | dump | explain over an index file

Result<std::unique_ptr<Indexer>> OpenReadOnly(const std::string& db) {
  IndexerOptions o;
  o.read_only = true;
  o.create_if_missing = false;
  o.background_thread = false;
  return Indexer::Open(db, o);
}

Status RunStats(const std::string& db) {
  static const JsonFields<IndexerStats> kStats = {
      {"schema_version", &IndexerStats::schema_version},
      {"blocks_in_memory", &IndexerStats::blocks_in_memory},
      {"entries_in_memory", &IndexerStats::entries_in_memory},
      {"memory_bytes", &IndexerStats::memory_bytes},
      {"memory_budget_bytes", &IndexerStats::memory_budget_bytes},
      {"log_rows_pending", &IndexerStats::log_rows_pending},
      {"sqlite_bytes", &IndexerStats::sqlite_bytes},
  };
  static const JsonFields<StreamStats> kStream = {
      {"source", &StreamStats::source},
      {"dp_rank", &StreamStats::dp_rank},
      {"last_sequence",
       [](const StreamStats& st) { return st.has_seq ? OJson(st.last_seq) : OJson(); }},
      {"durable_sequence",
       [](const StreamStats& st) { return st.has_seq ? OJson(st.durable_seq) : OJson(); }},
      {"last_event_ts", &StreamStats::last_event_ts},
  };
  static const JsonFields<IndexerCounters> kCounters = {
      {"batches_applied", &IndexerCounters::batches_applied},
      {"stores", &IndexerCounters::stores},
      {"duplicate_stores", &IndexerCounters::duplicate_stores},
      {"removals", &IndexerCounters::removals},
      {"unknown_removals", &IndexerCounters::unknown_removals},
      {"clears", &IndexerCounters::clears},
      {"placeholders_resolved", &IndexerCounters::placeholders_resolved},
      {"placeholders_unresolved", &IndexerCounters::placeholders_unresolved},
      {"dropped_by_budget", &IndexerCounters::dropped_by_budget},
  };
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<Indexer> index, OpenReadOnly(db));
  IndexerStats s = index->Stats();
  OJson j;
  j["db"] = db;
  kStats.AppendTo(s, &j);
  OJson streams = OJson::array();
  for (const StreamStats& st : s.streams) {
    OJson x = kStream.ToJson(st);
    OJson media = OJson::object();
    for (const MediumStats& m : s.per_medium) {
      if (m.source == st.source && m.dp_rank == st.dp_rank) media[m.medium] = m.blocks;
    }
    x["blocks_per_medium"] = std::move(media);
    streams.push_back(std::move(x));
  }
  j["streams"] = std::move(streams);
  j["counters"] = kCounters.ToJson(s.counters);
  PrintLine(Dump(j));
  return Status::Ok();
}

// One line of `kvo index dump`; "ownership" only for a copy a secondary tier owns.
const JsonFields<DumpEntry> kDumpEntry = {
    {"source", &DumpEntry::source},
    {"dp_rank", &DumpEntry::dp_rank},
    {"medium", &DumpEntry::medium},
    {"ownership",
     [](const DumpEntry& e) {
       return e.ownership.empty() ? std::nullopt : std::optional<std::string>(e.ownership);
     }},
    {"group", &DumpEntry::group},
    {"engine_hash", &DumpEntry::engine_hash},
    {"content_key", &DumpEntry::content_key},
    {"block_size", &DumpEntry::block_size},
    {"refcount", &DumpEntry::refcount},
    {"since_seq", &DumpEntry::since_seq},
};

Status RunDump(const std::string& db, const std::string& source, int64_t limit) {
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<Indexer> index, OpenReadOnly(db));
  int64_t n = 0;
  index->Dump([&](const DumpEntry& e) {
    if (!source.empty() && e.source != source) return true;
    PrintLine(Dump(kDumpEntry.ToJson(e)));
    ++n;
    return limit <= 0 || n < limit;
  });
  return Status::Ok();
}

std::string Hex64(uint64_t v) { return HexU64(v); }

Status RunExplain(const std::string& db, const QueryArgs& a, bool json) {
  KVO_ASSIGN_OR_RETURN(ScoreQuery q, BuildQuery(a));
  KVO_ASSIGN_OR_RETURN(std::unique_ptr<Indexer> index, OpenReadOnly(db));
  KVO_ASSIGN_OR_RETURN(ExplainResult r, index->Explain(q));
  int64_t tokens = q.token_ids.empty() ? r.score.query_blocks * r.score.block_size
                                       : static_cast<int64_t>(q.token_ids.size());
  if (json) {
    PrintLine(RenderExplainResponse(r, tokens));
    return Status::Ok();
  }
  std::string out;
  out += "query: " + std::to_string(r.score.query_blocks) + " blocks of " +
         std::to_string(r.score.block_size) + " tokens (" + std::to_string(tokens) + " tokens)\n\n";
  out += "block  content_key       engine_hash       holders (source/rank medium since seq)\n";
  for (const ExplainBlock& b : r.blocks) {
    char head[96];
    std::snprintf(head, sizeof head, "%5lld  %s  %s  ", static_cast<long long>(b.index),
                  b.content_key ? Hex64(b.content_key).c_str() : "-               ",
                  b.engine_hash ? Hex64(b.engine_hash).c_str() : "-               ");
    out += head;
    if (!b.known) {
      out += "(unknown to the index)";
    } else if (b.holders.empty()) {
      out += "(held by no instance)";
    }
    for (size_t i = 0; i < b.holders.size(); ++i) {
      const ExplainHolder& h = b.holders[i];
      out += (i ? ", " : "") + h.source + "/" + std::to_string(h.dp_rank) + " " + h.medium +
             (h.group ? " g" + std::to_string(h.group) : "") + " since " +
             std::to_string(h.since_seq) +
             (h.refcount > 1 ? " x" + std::to_string(h.refcount) : "");
    }
    out += "\n";
  }
  out += "\ninstance            prefix  tokens     score  media            prefix ends because\n";
  for (const InstanceScore& s : r.score.instances) {
    std::string why;
    for (const ExplainInstance& e : r.instances) {
      if (e.source == s.source && e.dp_rank == s.dp_rank) why = e.break_reason;
    }
    std::string media;
    for (const auto& [m, n] : s.blocks_per_medium) {
      media += (media.empty() ? "" : " ") + m + "=" + std::to_string(n);
    }
    char line[256];
    std::snprintf(line, sizeof line, "%-18s  %6lld  %6lld  %8.3f  %-15s  ",
                  (s.source + "/" + std::to_string(s.dp_rank)).c_str(),
                  static_cast<long long>(s.prefix_blocks), static_cast<long long>(s.prefix_tokens),
                  s.score, media.empty() ? "-" : media.c_str());
    out += line + why + "\n";
  }
  PrintLine(out);
  return Status::Ok();
}

}  // namespace

void AddIndexCommands(CLI::App& app, CommandTable& commands) {
  CLI::App* index = app.add_subcommand(
      "index",
      "Prefix indexer: serve, query, doctor, and audit an index file (stats, dump, explain)");
  index->require_subcommand(1);

  auto serve_args = std::make_shared<ServeArgs>();
  CLI::App* serve =
      index->add_subcommand("serve",
                            "Follow KV-event publishers (--source, --config, --discover, and those "
                            "registered with POST /register, "
                            "resumed at start) into a SQLite index and answer the HTTP API");
  serve->add_option("--db", serve_args->db, "SQLite index file (created when missing)");
  serve->add_option("--config", serve_args->config, "indexer JSON config (sources, http, ...)");
  serve->add_option("--source", serve_args->sources,
                    "NAME=ENDPOINT[,replay=EP][,topic=T][,dp_ranks=N][,dp_rank_start=K]"
                    "[,bind=true][,hash_algo=A][,hash_seed=S][,block_size=B] (repeatable)");
  serve->add_option("--discover", serve_args->discover,
                    "http://HOST:PORT of a vLLM API server: follow the KV-event endpoints it "
                    "reports at GET /kv_event_sources, each DP rank registered as "
                    "<instance_id>|<tenant_id>|<rank> "
                    "[,instance_id=ID][,tenant_id=T][,model=M][,lora_name=L][,block_size=B]"
                    "[,additionalsalt=S] (repeatable; model default: GET /v1/models)");
  serve->add_option("--http", serve_args->http,
                    "HOST:PORT of the HTTP API (default 127.0.0.1:8080; port 0: any)");
  serve->add_flag(
      "--allow-remote", serve_args->allow_remote,
      "allow an HTTP address beyond loopback, and POST /register of publishers on other "
      "hosts (no authentication!)");
  serve->add_option("--max-query-tokens", serve_args->max_query_tokens,
                    "reject /v1/score and /query requests with more tokens (default 1048576)");
  serve
      ->add_option("--max-sources", serve_args->max_sources,
                   "refuse POST /register (429) beyond this many followed streams (default 4096)")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}));
  serve->add_option("--memory-budget-mb", serve_args->memory_budget_mb,
                    "byte budget of the in-memory index, MiB (default 1024)");
  serve
      ->add_option("--max-early-requests", serve_args->max_early_requests,
                   "large /query, /query_by_hash and /v1/score bodies followed by a worker while "
                   "they arrive, at once (each holds one of the 4 HTTP workers; others are read "
                   "whole first; 0: none; default 1)")
      ->check(CLI::Range(0, 3));
  commands.AddStatus(serve, [serve_args] { return RunServe(*serve_args); });

  auto client_args = std::make_shared<ClientArgs>();
  auto query_args = std::make_shared<QueryArgs>();
  auto explain_http = std::make_shared<bool>(false);
  CLI::App* query = index->add_subcommand("query", "Ask a running indexer (POST /v1/score)");
  query->add_option("--http", client_args->http, "HOST:PORT of the daemon")->required();
  query->add_option("--timeout-ms", client_args->timeout_ms, "request timeout")
      ->capture_default_str();
  query->add_flag("--explain", *explain_http, "POST /v1/explain instead");
  AddQueryOptions(query, query_args.get());
  commands.AddStatus(query, [client_args, query_args, explain_http] {
    return RunQuery(*client_args, *query_args, *explain_http);
  });

  auto doctor_args = std::make_shared<DoctorArgs>();
  CLI::App* doctor = index->add_subcommand(
      "doctor",
      "Hash parity: a daemon's per-source verdicts (--http), or check one publisher's "
      "self-describing events against an algorithm, seed and block size (--endpoint). Exit 1 on "
      "a mismatch");
  doctor->add_option("--http", doctor_args->http, "HOST:PORT of a running daemon");
  doctor->add_option("--endpoint", doctor_args->endpoint, "a publisher's PUB endpoint");
  doctor->add_option("--replay", doctor_args->replay, "its replay endpoint (check what it has)");
  doctor->add_option("--topic", doctor_args->topic, "topic prefix filter");
  doctor
      ->add_option("--hash-algo", doctor_args->algo, "sha256 | sha256_cbor | xxhash | xxhash_cbor")
      ->capture_default_str();
  doctor->add_option("--hash-seed", doctor_args->seed,
                     "the engine's PYTHONHASHSEED; unset: \"vllm-none-hash\" for sha256*, "
                     "required for xxhash*");
  doctor->add_option("--block-size", doctor_args->block_size, "hash block size in tokens")
      ->capture_default_str();
  doctor->add_option("--blocks", doctor_args->blocks, "stop after verifying this many blocks")
      ->capture_default_str();
  doctor->add_option("--timeout-ms", doctor_args->timeout_ms, "give up after this long")
      ->capture_default_str();
  commands.Add(doctor, [doctor_args] { return RunDoctor(*doctor_args); });

  auto db_stats = std::make_shared<std::string>();
  CLI::App* stats = index->add_subcommand("stats", "Summarise an index file (JSON)");
  stats->add_option("--db", *db_stats, "SQLite index file")->required();
  commands.AddStatus(stats, [db_stats] { return RunStats(*db_stats); });

  auto dump_db = std::make_shared<std::string>();
  auto dump_source = std::make_shared<std::string>();
  auto dump_limit = std::make_shared<int64_t>(0);
  CLI::App* dump = index->add_subcommand("dump", "Print every held entry (JSON lines)");
  dump->add_option("--db", *dump_db, "SQLite index file")->required();
  dump->add_option("--source", *dump_source, "only this source");
  dump->add_option("--limit", *dump_limit, "at most this many entries");
  commands.AddStatus(dump, [dump_db, dump_source, dump_limit] {
    return RunDump(*dump_db, *dump_source, *dump_limit);
  });

  auto explain_db = std::make_shared<std::string>();
  auto explain_args = std::make_shared<QueryArgs>();
  auto explain_json = std::make_shared<bool>(false);
  CLI::App* explain = index->add_subcommand(
      "explain",
      "Explain one routing answer block by block: who holds each block on which tier since which "
      "sequence, and where and why each instance's prefix breaks");
  explain->add_option("--db", *explain_db, "SQLite index file")->required();
  explain->add_flag("--json", *explain_json, "JSON instead of a table");
  AddQueryOptions(explain, explain_args.get());
  commands.AddStatus(explain, [explain_db, explain_args, explain_json] {
    return RunExplain(*explain_db, *explain_args, *explain_json);
  });
}

}  // namespace kvo::cli
